"""Rules on the script's source: patterns a run may not show (or shows only on a GPU).

Static findings are ``low`` unless the run confirms the line ran during the measured steps
(then the runtime evidence sets the severity).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, Iterator

from ..findings import Finding, Fix, lightning_call, speedup_for_rule
from ..analysis.source import SourceIndex, dotted_name, is_const, keyword
from .registry import rule
from ..requests import AttentionRequest
from .nccl import check_nccl_env
from ..sites import Site

if TYPE_CHECKING:
    from ..analysis.context import Context

FACTORIES = (
    "zeros",
    "ones",
    "empty",
    "full",
    "rand",
    "randn",
    "randint",
    "arange",
    "eye",
    "linspace",
    "tensor",
    "zeros_like",
    "ones_like",
    "rand_like",
    "randn_like",
    "full_like",
)


def _sources(ctx: Context) -> list[SourceIndex]:
    return list(ctx.sources.values())


def _static(rule_id: str, index: SourceIndex, node: ast.AST, message: str, fix: Fix, **kw: Any) -> Finding:
    f = Finding(rule_id, site=index.site(node), message=message, fix=fix, **kw)
    f.provisional("low")
    return f


def _ran(ctx: Context, kind: str, site: Site) -> float:
    """Per-step count of events of ``kind`` recorded at ``site``'s line during the measured steps."""
    stat = ctx.stat_at(kind, site)
    return stat.per_step if stat else 0.0


@rule("jit-script", "static")
def jit_script(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        for call, name in index.calls("torch.jit.script", "torch.jit.trace", "jit.script", "jit.trace"):
            yield _static(
                "jit-script",
                index,
                call,
                f"{name} compiles with TorchScript, which is in maintenance mode and fuses less than torch.compile.",
                Fix("torch.compile(fn_or_model)", plan={"compile": True}),
                speedup=speedup_for_rule("jit-script"),
            )
        for node in ast.walk(index.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for deco in node.decorator_list:
                    if dotted_name(deco).endswith(("jit.script", "jit.trace")):
                        yield _static(
                            "jit-script",
                            index,
                            deco,
                            f"@{dotted_name(deco)} compiles {node.name} with TorchScript, which is in "
                            "maintenance mode and fuses less than torch.compile.",
                            Fix("@torch.compile", plan={"compile": True}),
                            speedup=speedup_for_rule("jit-script"),
                        )


@rule("empty-cache-in-loop", "static")
def empty_cache_static(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        for call, _ in index.calls("cuda.empty_cache"):
            if index.runs_per_step(call):
                yield _static(
                    "empty-cache-in-loop",
                    index,
                    call,
                    "torch.cuda.empty_cache() runs inside the training loop: each call returns cached "
                    "blocks to the driver, so the next allocations are slow cudaMalloc calls again.",
                    Fix("remove it from the loop"),
                )


@rule("zero-grad-not-none", "static")
def zero_grad_static(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        for call, _ in index.calls("zero_grad"):
            arg = keyword(call, "set_to_none") or (call.args[0] if call.args else None)
            if is_const(arg, False):
                yield _static(
                    "zero-grad-not-none",
                    index,
                    call,
                    "zero_grad(set_to_none=False) writes zeros into every gradient instead of dropping it.",
                    Fix("optimizer.zero_grad()", plan={"set_to_none": True}),
                    speedup=speedup_for_rule("zero-grad-not-none"),
                )
        for call, name in index.calls("zero_"):
            if (name.endswith(".grad.zero_") or name.endswith(".grad.data.zero_")) and index.runs_per_step(call):
                yield _static(
                    "zero-grad-not-none",
                    index,
                    call,
                    f"{name}() zeroes a gradient in place every step instead of dropping it.",
                    Fix("param.grad = None (or optimizer.zero_grad())", plan={"set_to_none": True}),
                    speedup=speedup_for_rule("zero-grad-not-none"),
                )


@rule("tensor-created-off-device", "static")
def created_off_device(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        for node in ast.walk(index.tree):
            # torch.zeros(...).to(device) / .cuda(): made on the host, then copied.
            if not (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("to", "cuda")
            ):
                continue
            inner = node.func.value
            if not isinstance(inner, ast.Call):
                continue
            name = dotted_name(inner.func)
            if not (name.startswith("torch.") and name.split(".")[-1] in FACTORIES):
                continue
            if keyword(inner, "device") is not None or not index.runs_per_step(node):
                continue
            f = _static(
                "tensor-created-off-device",
                index,
                node,
                f"{name}(...) builds the tensor in host memory and then copies it to the device, every step.",
                Fix(f"{name}(..., device=device)"),
            )
            yield f.on_cpu(ctx)


@rule("non-blocking", "static")
def non_blocking_static(ctx: Context) -> Iterator[Finding]:
    if ctx.on_gpu:
        return  # measured by the runtime rule
    for index in _sources(ctx):
        if not index.mentions_cuda:
            continue
        for call, name in index.calls("to", "cuda"):
            if not isinstance(call.func, ast.Attribute) or not index.in_direct_loop(call):
                continue
            if call.func.attr == "to" and not call.args:
                continue
            if (
                call.func.attr == "to"
                and isinstance(call.args[0], ast.Attribute)
                and "dtype" not in dotted_name(call.args[0])
                and dotted_name(call.args[0]).startswith("torch.")
            ):
                continue  # .to(torch.float16): a dtype, not a device
            nb = keyword(call, "non_blocking")
            if nb is None or is_const(nb, False):
                f = _static(
                    "non-blocking",
                    index,
                    call,
                    f"{name}(...) copies to the GPU synchronously inside the loop: the host waits for each "
                    "copy instead of queuing it behind the running kernels.",
                    Fix(
                        ".to(device, non_blocking=True) with DataLoader(pin_memory=True)",
                        plan={"non_blocking": True, "pin_memory": True},
                    ),
                    speedup=speedup_for_rule("non-blocking", "non_blocking"),
                )
                yield f.on_cpu(ctx)


@rule("tensor-from-numpy-copy", "static")
def numpy_copy_static(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        for call, _name in index.calls("torch.tensor"):
            if not call.args or isinstance(call.args[0], (ast.Constant, ast.List, ast.Tuple, ast.ListComp)):
                continue
            if not index.runs_per_step(call):
                continue
            site = index.site(call)
            if _ran(ctx, "tensor_copy", site) or any(
                seen.file == site.file and seen.line == site.line for _, seen, _ in ctx.seen("tensor_")
            ):
                continue  # the runtime rule measured it, or the run saw what this line passes (not an array)
            yield _static(
                "tensor-from-numpy-copy",
                index,
                call,
                "torch.tensor(...) always copies its input; for a NumPy array torch.from_numpy shares the memory.",
                Fix("torch.from_numpy(array) or torch.as_tensor(array)"),
            )


def _grad_disabled(index: SourceIndex, node: ast.AST) -> bool:
    """Inside `with torch.no_grad()/inference_mode()` or a function decorated with them."""
    parent = index.parents.get(node)
    while parent is not None:
        if isinstance(parent, (ast.With, ast.AsyncWith)):
            if any(
                dotted_name(
                    item.context_expr.func if isinstance(item.context_expr, ast.Call) else item.context_expr
                ).endswith(("no_grad", "inference_mode"))
                for item in parent.items
            ):
                return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and _turns_grad_off(parent.decorator_list):
            return True
        parent = index.parents.get(parent)
    return False


def _turns_grad_off(decorators: list[ast.expr]) -> bool:
    return any(
        dotted_name(d.func if isinstance(d, ast.Call) else d).endswith(("no_grad", "inference_mode"))
        for d in decorators
    )


def _decorator_named(index: SourceIndex, func: ast.AST | None) -> str | None:
    """The decorator ``func`` is the wrapper of (``eval_decorator`` for its ``inner``), or None: a function
    defined inside another that returns it, followed up through decorator factories."""
    name = None
    while isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        outer = index.enclosing_function(func)
        if not isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)) or not any(
            isinstance(node, ast.Return) and isinstance(node.value, ast.Name) and node.value.id == func.name
            for node in outer.body
        ):
            break
        name, func = outer.name, outer
    return name


def _decorated_with(ctx: Context, decorator: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions of the script's files decorated with ``decorator`` (``@decorator``, ``@mod.decorator``)."""
    found = []
    for index in _sources(ctx):
        for node in ast.walk(index.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                dotted_name(d.func if isinstance(d, ast.Call) else d).split(".")[-1] == decorator
                for d in node.decorator_list
            ):
                found.append(node)
    return found


def _called_without_grad(ctx: Context, index: SourceIndex, call: ast.Call) -> bool:
    """How the code that ran called this ``.eval()``: a wrapper (a decorator's ``inner``) whose every use is stacked
    under ``@torch.no_grad()``, or a function that ran while the run's eval-mode forwards all ran without autograd."""
    decorator = _decorator_named(index, index.enclosing_function(call))
    if decorator is not None:
        uses = _decorated_with(ctx, decorator)
        if uses and all(_turns_grad_off(use.decorator_list) for use in uses):
            return True
    return bool(ctx.function_ran(index.site(call)) and ctx.seen("eval_forward") and not ctx.seen("eval_grad_forward"))


@rule("grad-in-validation", "static")
def grad_in_validation_static(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        for call, name in index.calls("eval"):
            if not isinstance(call.func, ast.Attribute) or call.args or _grad_disabled(index, call):
                continue
            func = index.enclosing_function(call)
            scope = func if func is not None else index.tree
            text = ast.unparse(scope)
            if "no_grad" in text or "inference_mode" in text or _called_without_grad(ctx, index, call):
                continue
            yield _static(
                "grad-in-validation",
                index,
                call,
                f"{name}() switches to evaluation, but nothing here turns autograd off: the forward "
                "passes that follow keep activations for a backward that never comes.",
                Fix("`with torch.inference_mode():` around the evaluation"),
            )


@rule("save-in-loop", "static")
def save_in_loop_static(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        for call, _ in index.calls("torch.save"):
            if not index.in_direct_loop(call):
                continue
            guarded = False
            parent = index.parents.get(call)
            while parent is not None and not isinstance(parent, (ast.For, ast.While)):
                if isinstance(parent, ast.If):
                    guarded = True
                parent = index.parents.get(parent)
            if not guarded and not _ran(ctx, "save", index.site(call)):
                yield _static(
                    "save-in-loop",
                    index,
                    call,
                    "torch.save runs on every iteration of this loop.",
                    Fix("save every N steps or once per epoch"),
                )


def _has_transposed_matmul(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.MatMult):
            text = ast.unparse(sub)
        elif isinstance(sub, ast.Call) and dotted_name(sub.func).split(".")[-1] in ("matmul", "bmm", "einsum"):
            text = ast.unparse(sub)
        else:
            continue
        if any(t in text for t in (".transpose(", ".mT", ".T", ".permute(", "->")):
            return True
    return False


@rule("manual-attention", "static")
def manual_attention(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        for func in ast.walk(index.tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = ast.Module(body=func.body, type_ignores=[])
            names = {dotted_name(c.func).split(".")[-1] for c in ast.walk(body) if isinstance(c, ast.Call)}
            if "softmax" not in names or "scaled_dot_product_attention" in names:
                continue
            if not _has_transposed_matmul(body):
                continue
            softmax = next(
                c for c in ast.walk(body) if isinstance(c, ast.Call) and dotted_name(c.func).split(".")[-1] == "softmax"
            )
            site = index.site(softmax)
            per_step = _ran(ctx, "softmax", site)
            lines = (func.lineno, func.end_lineno or func.lineno)
            source = ast.unparse(func)
            causal = any(word in source for word in ("triu", "tril", "causal"))
            f = Finding(
                "manual-attention",
                site=site,
                category="compute",
                message=(
                    f"{func.name}() computes attention by hand (matmul, softmax, matmul): the full score "
                    "matrix is written to memory and read back, and no fused flash/memory-efficient kernel "
                    "can run." + (f" It runs {per_step:g}x per step." if per_step else "")
                ),
                fix=Fix("torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=..., is_causal=...)"),
                evidence={"function": func.name, "per_step": per_step},
                request=AttentionRequest(index.path, lines, site, per_step, bool(causal)),
            )
            f.provisional("medium" if per_step else "low")
            if not per_step:
                f.note = "Not seen running during the measured steps."
            yield f


@rule("data-parallel", "static")
def data_parallel_static(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        for call, _ in index.calls("DataParallel"):
            yield _static(
                "data-parallel",
                index,
                call,
                "nn.DataParallel drives all GPUs from one process (replicate, scatter, gather every step).",
                Fix(
                    "DistributedDataParallel with one process per GPU (torchrun / turbotrain launch)",
                    plan={"strategy": "ddp"},
                ),
                speedup=speedup_for_rule("data-parallel"),
            ).on_cpu(ctx)


@rule("syncbn-with-compile", "static")
def syncbn_static(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        syncbn = list(index.calls("convert_sync_batchnorm", "SyncBatchNorm"))
        compiled = list(index.calls("torch.compile"))
        if syncbn and compiled:
            yield _static(
                "syncbn-with-compile",
                index,
                compiled[0][0],
                "The script both converts to SyncBatchNorm and compiles: each SyncBatchNorm breaks the compiled graph.",
                Fix("drop one of the two"),
                speedup=speedup_for_rule("syncbn-with-compile"),
            ).on_cpu(ctx)


@rule("accumulation-syncs", "static")
def accumulation_static(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        if "DistributedDataParallel" not in index.text or "no_sync" in index.text:
            continue
        for call, _ in index.calls("step"):
            parent = index.parents.get(call)
            while parent is not None and not isinstance(parent, ast.If):
                parent = index.parents.get(parent)
            if parent is not None and "%" in ast.unparse(parent.test) and index.in_direct_loop(call):
                yield _static(
                    "accumulation-syncs",
                    index,
                    call,
                    "Gradients are accumulated (optimizer step every few iterations) under DDP without "
                    "no_sync(): every micro-batch's backward all-reduces the gradients.",
                    Fix("`with model.no_sync():` for all micro-batches but the last", plan={"grad_accum_steps": 2}),
                    speedup=speedup_for_rule("accumulation-syncs"),
                )
                break


@rule("nccl-env", "static")
def nccl_env_static(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        for node in ast.walk(index.tree):
            name = None
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
                target = node.targets[0]
                if dotted_name(target.value).endswith("environ") and isinstance(target.slice, ast.Constant):
                    name = target.slice.value
            elif isinstance(node, ast.Call) and dotted_name(node.func).endswith(("environ.setdefault", "putenv")):
                if node.args and isinstance(node.args[0], ast.Constant):
                    name = node.args[0].value
            if not isinstance(name, str) or not name.startswith("NCCL_"):
                continue
            for _var, kind, message, fix in check_nccl_env({name: "1"}):
                if kind in ("typo", "unknown", "renamed"):
                    f = _static("nccl-env", index, node, message, Fix(fix), speedup=speedup_for_rule("nccl-env"))
                    if kind == "typo" and (ctx.on_gpu or ctx.world_size > 1):
                        f.provisional("medium")
                    yield f


@rule("cudnn-benchmark-off", "static")
def cudnn_static(ctx: Context) -> Iterator[Finding]:
    for index in _sources(ctx):
        for node in ast.walk(index.tree):
            if (
                isinstance(node, ast.Assign)
                and dotted_name(node.targets[0]).endswith("cudnn.benchmark")
                and is_const(node.value, False)
            ):
                yield _static(
                    "cudnn-benchmark-off",
                    index,
                    node,
                    "cudnn.benchmark is switched off explicitly.",
                    Fix(
                        "torch.backends.cudnn.benchmark = True (fixed input shapes)",
                        plan={"cudnn_benchmark": True},
                        lightning=lightning_call(cudnn_benchmark=True),
                    ),
                    speedup=speedup_for_rule("cudnn-benchmark-off"),
                ).on_cpu(ctx)
