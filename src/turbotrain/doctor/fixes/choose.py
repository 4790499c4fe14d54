"""From findings to edit requests: which rule's fix is which edit, at which lines, with which values.

The values come from what the run measured: the what-if's best ``num_workers``, the cadence the
periodic-work row suggests, the checkpoint period that keeps ``torch.save`` under 5% of the step,
every convolution (by where it was built) that a BatchNorm follows.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

from torch import nn

from ..findings import Finding
from ..analysis.periodic import periodic_table, suggested_every
from ..sites import relative_where
from ..requests import AttentionRequest, JobRequest, LoaderRequest
from .model import EXACT, PRECISION, REINITIALISED, ByHand, EditRequest
from ..report.fix_results import FixResult

if TYPE_CHECKING:
    from ..analysis.context import Context

__all__ = ["plan_fixes", "FIXABLE_RULES", "check_rules"]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _loader(ctx: Context, f: Finding) -> dict[str, Any]:
    if f.rule == "num-workers":
        if not isinstance(f.request, LoaderRequest):
            raise ByHand(
                "the batches are built in the loop, not by a DataLoader: move that work into a Dataset "
                "read by DataLoader(..., num_workers=N)"
            )
        workers = int((f.fix.plan or {}).get("num_workers", 2))
        params: dict[str, Any] = {"num_workers": workers}
        if workers > 0:
            params["persistent_workers"] = True
        return _loader_spec(params)
    name = "persistent_workers" if f.rule == "persistent-workers" else "pin_memory"
    return {"kind": "loader", "params": {name: True}, "label": f"DataLoader({name}=True)"}


def _loader_spec(params: dict[str, Any], where: str = "") -> dict[str, Any]:
    return {
        "kind": "loader",
        "params": params,
        "label": "DataLoader(" + ", ".join(f"{k}={v!r}" for k, v in params.items()) + ")" + where,
    }


def _optimizer(ctx: Context, f: Finding) -> dict[str, Any]:
    opt = next((o for o, site in ctx.optimizers if site == f.site), None)
    if opt is None:
        raise ByHand("the optimizer the finding names was not seen being built")
    switch = "fused" if "fused=True" in f.fix.pytorch else "foreach"
    cls = type(opt).__name__
    return {"kind": "optimizer", "params": {"class": cls, "switch": switch}, "label": f"{cls}(..., {switch}=True)"}


def _zero_grad(ctx: Context, f: Finding) -> dict[str, Any]:
    return {"kind": "zero_grad", "label": "zero_grad(set_to_none=True)"}


def _eval(ctx: Context, f: Finding) -> dict[str, Any]:
    return {"kind": "inference_mode", "label": "with torch.inference_mode(): around the validation"}


def _numpy(ctx: Context, f: Finding) -> dict[str, Any]:
    if f.source == "static":
        raise ByHand("the run did not see what this line passes; torch.from_numpy takes only a NumPy array")
    return {"kind": "from_numpy", "label": "torch.from_numpy(array) for torch.tensor(array)"}


def _cudnn(ctx: Context, f: Finding) -> dict[str, Any]:
    # The flag is process-wide: the script itself is where it goes, whichever file built the model.
    site = f.site if f.source == "static" else None
    return {
        "kind": "cudnn_benchmark",
        "label": "torch.backends.cudnn.benchmark = True",
        "file": site.file if site is not None else ctx.script,
        "line": site.line if site is not None else 0,
    }


def _cadence(ctx: Context, f: Finding) -> dict[str, Any]:
    assert f.site is not None  # plan_fixes plans only findings with a site (but cudnn-benchmark-off)
    row = next((r for r in periodic_table(ctx) if r["site"] == f.site and r["every"]), None)
    if row is None or not row["suggested_every"]:
        raise ByHand("the period of the recurring work is not known")
    every, better, kind = row["every"], row["suggested_every"], row["kind"]
    return {
        "kind": "cadence",
        "label": f"{kind} every {better} steps (was {every})",
        "params": {"every": every, "new_every": better, "kind": kind, "function": f.site.function},
    }


def _save(ctx: Context, f: Finding) -> dict[str, Any]:
    per_step = f.evidence.get("per_step") or 1.0
    if per_step > 1.0:
        raise ByHand("torch.save runs more than once per step here; checkpoint less often by hand")
    cost_s = f.evidence.get("ms_per_step", 0.0) / 1e3 / per_step
    every = max(2, suggested_every(cost_s, max(ctx.step_s - cost_s, 1e-6), 1))
    return {
        "kind": "save_every",
        "params": {"every": every},
        "label": f"torch.save every {every} steps (was every step)",
    }


def _conv_bias(ctx: Context, f: Finding) -> dict[str, Any]:
    assert f.site is not None  # plan_fixes plans only findings with a site (but cudnn-benchmark-off)
    modules = dict(ctx.model.named_modules()) if ctx.model is not None else {}
    paired = {name for name, _ in f.evidence.get("pairs", [])}
    sites: dict = {}
    for name, module in modules.items():
        if isinstance(module, _CONVS):
            site = ctx.module_site(module)
            if site is None:
                raise ByHand(f"where {name} was built is not known; add bias=False to each conv before a BatchNorm")
            sites.setdefault(site, []).append(name)
    lines: list[int] = []
    classes: set[str] = set()
    for site, names in sites.items():
        if not set(names) & paired:
            continue
        unpaired = [n for n in names if n not in paired]
        if unpaired or site.file != f.site.file:
            raise ByHand(
                f"{site.where(ctx.base)} also builds {', '.join(unpaired) or 'convs in another file'}, "
                "which no BatchNorm follows; add bias=False to the right ones by hand"
            )
        lines.append(site.line)
        classes.update(type(modules[n]).__name__ for n in names)
    extra = tuple(sorted(set(lines) - {f.site.line}))
    return {
        "kind": "conv_bias",
        "params": {"classes": sorted(classes)},
        "lines": extra,
        "numerics": REINITIALISED,
        "label": f"bias=False in {len(paired)} conv(s) before a BatchNorm",
    }


def _attention(ctx: Context, f: Finding) -> dict[str, Any]:
    assert f.site is not None  # plan_fixes plans only findings with a site (but cudnn-benchmark-off)
    name = f.evidence.get("function", "the attention")
    line = f.request.softmax.line if isinstance(f.request, AttentionRequest) else f.site.line
    return {
        "kind": "sdpa",
        "numerics": PRECISION,
        "line": line,
        "label": f"scaled_dot_product_attention for the attention in {name}()",
    }


def _autocast(ctx: Context, f: Finding) -> dict[str, Any]:
    precision = (f.fix.plan or {}).get("precision")
    if precision != "bf16-mixed":
        raise ByHand(
            "float16 needs a torch.amp.GradScaler around the backward and the step as well; add "
            "autocast and the scaler by hand"
        )
    return {
        "kind": "autocast",
        "numerics": PRECISION,
        "params": {"device": ctx.device, "dtype": "bfloat16"},
        "label": f"torch.autocast({ctx.device!r}, dtype=torch.bfloat16) around the forward and loss (changes numerics)",
    }


def _rank_change(ctx: Context, f: Finding) -> dict[str, Any]:
    """A job's fix timed on every rank, as the edit of the line it names: DDP's or FSDP's keywords, the thread
    count, the checkpoint's cadence, a branch's period or the loader's workers."""
    change = f.request.change if isinstance(f.request, JobRequest) else None
    if change is None:
        raise ByHand(f.fix.pytorch)
    if change.ddp:
        keywords = ", ".join(f"{k}={v!r}" for k, v in change.ddp.items())
        return {
            "kind": "ddp",
            "params": {"keywords": dict(change.ddp)},
            "label": f"DistributedDataParallel(..., {keywords})",
        }
    if change.fsdp:
        keywords = ", ".join(f"{k}={v!r}" for k, v in change.fsdp.items())
        return {"kind": "fsdp", "params": {"keywords": dict(change.fsdp)}, "label": f"fully_shard(..., {keywords})"}
    if change.save_every is not None:
        return {
            "kind": "save_every",
            "params": {"every": change.save_every},
            "label": f"torch.save every {change.save_every} steps (was every step)",
        }
    if change.branch_every is not None:
        return _rarer_branch(f, change.branch_every)
    if change.loader_workers is not None:
        return _loader_spec({"num_workers": change.loader_workers, "persistent_workers": True}, " on every rank")
    if change.threads is not None:
        return {
            "kind": "threads",
            "params": {"threads": change.threads},
            "label": f"torch.set_num_threads({change.threads}) on every rank",
        }
    raise ByHand(f.fix.pytorch)


def _rarer_branch(f: Finding, every: int) -> dict[str, Any]:
    """The straggler's work run ``every`` times less often: the period of its ``if`` (``step % 2`` to ``step %
    2N``), or, under a rank test alone, ``if (step + 1) % N == 0:`` around the call that runs it."""
    branch = f.evidence.get("branch") or {}
    period, call = branch.get("period"), branch.get("call")
    if period:
        return {
            "kind": "cadence",
            "label": f"rank {f.evidence.get('rank')}'s work every {period * every} steps (was {period})",
            "params": {"every": period, "new_every": period * every, "kind": "work", "function": call},
        }
    if call and branch.get("call_line"):
        return {
            "kind": "save_every",
            "line": branch["call_line"],
            "file": branch["file"],
            "params": {"every": every, "call": call},
            "label": f"{call}() every {every} steps (was every step)",
        }
    raise ByHand(f.fix.pytorch)


_PLANNERS: dict[str, Callable[[Context, Finding], dict[str, Any]]] = {
    "num-workers": _loader,
    "persistent-workers": _loader,
    "pin-memory": _loader,
    "non-foreach-optimizer": _optimizer,
    "zero-grad-not-none": _zero_grad,
    "grad-in-validation": _eval,
    "tensor-from-numpy-copy": _numpy,
    "cudnn-benchmark-off": _cudnn,
    "periodic-work": _cadence,
    "save-in-loop": _save,
    "conv-bias-before-bn": _conv_bias,
    "manual-attention": _attention,
    "no-mixed-precision": _autocast,
    "ddp-find-unused-parameters": _rank_change,
    "ddp-static-graph": _rank_change,
    "ddp-bucket-settings": _rank_change,
    "exposed-gradient-sync": _rank_change,
    "cpu-oversubscribed": _rank_change,
    "straggler": _rank_change,
}
FIXABLE_RULES = frozenset(_PLANNERS)


def check_rules(rules: list[str] | tuple[str, ...]) -> None:
    """Every rule named is one whose fix is an edit; the error names the rest and lists the fixable ones."""
    from ...config import ConfigError

    unknown = [r for r in rules if r not in FIXABLE_RULES]
    if unknown:
        raise ConfigError(
            f"doctor --fix-only: {', '.join(unknown)} is not a rule whose fix the doctor can edit; "
            f"fixable rules: {', '.join(sorted(FIXABLE_RULES))}"
        )


def _inside(path: str, base: str) -> bool:
    return os.path.commonpath([os.path.realpath(path), os.path.realpath(base)]) == os.path.realpath(base)


def plan_fixes(
    ctx: Context, findings: list[Finding], base: str, rules: tuple[str, ...] | None = None
) -> list[FixResult]:
    """One :class:`FixResult` per finding whose rule has an edit kind (of ``rules``, when given): with its
    request, or why it is by hand."""
    if rules is not None:
        check_rules(rules)
    out = []
    for f in findings:
        planner = _PLANNERS.get(f.rule)
        if rules is not None and f.rule not in rules:
            continue
        if planner is None or (f.site is None and f.rule != "cudnn-benchmark-off"):
            continue
        where = f.where or (f.site.where(base) if f.site else "")
        result = FixResult(rule=f.rule, where=where, label=f.fix.pytorch, predicted=f.est_speedup)
        out.append(result)
        try:
            spec = planner(ctx, f)
            path = spec.get("file")
            if not path:
                assert f.site is not None  # the one planner for a finding without a site names the file
                path = f.site.file
            if not path or not _inside(path, base):
                raise ByHand(f"{path} is outside the script's folder; the patch edits only files under it")
            line = spec.get("line", f.site.line if f.site else 0)
            result.request = EditRequest(
                rule=f.rule,
                kind=spec["kind"],
                file=os.path.realpath(path),
                line=line,
                where=f"{relative_where(path, base)}:{line}" if line else relative_where(path, base),
                label=spec["label"],
                numerics=spec.get("numerics", EXACT),
                params=spec.get("params", {}),
                lines=spec.get("lines", ()),
                predicted=f.est_speedup,
                gain_share=f.gain_share,
                category=f.category,
            )
            result.label, result.numerics = spec["label"], result.request.numerics
        except ByHand as exc:
            result.by_hand = str(exc)
            continue
        verdict = f.what_if.verdict if f.what_if is not None else None
        ratio = (f.what_if.ratio if f.what_if is not None else None) or 0.0
        if verdict == "slower":
            result.doubt = f"the what-if measured it slower here (x{ratio:.2f})"
        elif verdict is not None and verdict != "faster" and result.numerics != EXACT:
            # Changing numerics for no measured gain is not worth it (the what-ifs' own rule, doctor.whatif).
            result.doubt = f"the what-if measured no gain for this change of numerics (x{ratio:.2f}, {verdict})"
    return out
