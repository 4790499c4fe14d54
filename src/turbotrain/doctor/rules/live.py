"""Rules on the objects the script built: the model, its optimizers, the batch, the hardware, the env."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, cast

from torch import nn

from ...plan import Plan, Precision
from ...speedups import fused_optimizer
from ...speedups.policy import call_text
from ...speedups.registry import by_field
from ..findings import Finding, Fix, lightning_call, speedup_for_rule
from .registry import rule
from ..rank_change import RankChange
from ..requests import BatchRequest, JobRequest, PlanRequest
from .ranks import on_a_job
from .nccl import check_nccl_env

if TYPE_CHECKING:
    from ...hardware import Hardware
    from ..analysis.context import Context


def _for_this_model(ctx: Context, field: str) -> bool:
    """Whether the speed-up switching Plan.``field`` is for this model (its declared ``applies_to``)."""
    return by_field(field).applies_to(ctx.info)


def _precision_for(hw: Hardware) -> Precision | None:
    if hw.bf16:
        return "bf16-mixed"
    if hw.fp16:
        return "fp16-mixed"
    return None


@rule("small-batch", "live")
def small_batch(ctx: Context) -> Iterator[Finding]:
    batch = ctx.facts.batch_size or (ctx.capture.batch_size if ctx.capture else None)
    overhead = ctx.dispatch_share()
    if not batch or ctx.capture is None or batch > 32 or overhead < 0.25:
        return
    f = Finding(
        "small-batch",
        site=ctx.main_loader.site if ctx.main_loader else ctx.capture.site,
        category="compute",
        speedup=speedup_for_rule("small-batch"),
        message=(
            f"Batches of {batch} sample(s) leave the step bound by per-op overhead ({overhead:.0%} of step "
            "time is dispatching ops, not computing): a larger batch does more work per op."
        ),
        fix=Fix(
            "Raise the batch size (the largest that fits; rescale the learning rate) or accumulate several "
            "samples per forward",
            plan={"batch_size": 8 * max(1, batch)},
            lightning="DataLoader(batch_size=...); Trainer(accumulate_grad_batches=k) keeps the effective size",
            accelerate="DataLoader(batch_size=...)",
            hf_trainer="TrainingArguments(per_device_train_batch_size=...); gradient_accumulation_steps=k keeps "
            "the effective size",
        ),
        evidence={"batch_size": batch, "python_overhead_share": round(overhead, 3)},
        request=BatchRequest(),
    )
    f.provisional("medium")
    f.note = "A larger batch changes the optimisation (rescale the learning rate); est_speedup is samples/s."
    yield f


@rule("no-mixed-precision", "live")
def no_mixed_precision(ctx: Context) -> Iterator[Finding]:
    facts = ctx.facts
    job = on_a_job(ctx)  # the ranks' model is not in this process: the fix is timed on every rank
    if (ctx.model is None and not job) or facts.autocast or "16" in facts.param_dtype:
        return
    precision = _precision_for(ctx.hw)
    if precision is None or ctx.share("compute") + ctx.share("python_overhead") < 0.25:
        return
    dtype = "torch.bfloat16" if precision == "bf16-mixed" else "torch.float16"
    # Autocast leaves float64 ops in float64: on a float64 model the switch changes nothing until the model is
    # float32, which only its author can say its numerics allow. Kept for the reports, folded in the terminal.
    float64 = facts.param_dtype == "torch.float64"
    f = Finding(
        "no-mixed-precision",
        site=ctx.capture.site if ctx.capture else None,
        category="compute",
        speedup=speedup_for_rule("no-mixed-precision", "precision"),
        message=(
            f"The model computes in {facts.param_dtype.replace('torch.', '')} without autocast; "
            f"{ctx.hw.device_name} runs {dtype.replace('torch.', '')} matmuls and convolutions faster."
        ),
        fix=Fix(
            f"with torch.autocast('{ctx.device}', dtype={dtype}): around forward and loss"
            + (" plus torch.amp.GradScaler for float16" if precision == "fp16-mixed" else ""),
            plan={"precision": precision},
            lightning=lightning_call(precision=precision),
            accelerate=call_text(
                "Accelerator", by_field("precision").export.accelerate_keys(Plan(precision=precision))
            ),
            fabric=call_text("Fabric", by_field("precision").export.lightning_flags(Plan(precision=precision))),
            hf_trainer=call_text("TrainingArguments", {"bf16" if precision == "bf16-mixed" else "fp16": True}),
        ),
        request=None if float64 else _precision_request(precision, job),
    )
    if float64:
        f.provisional("low")
        f.fold = "float64"
        f.note = (
            "The model computes in float64, which autocast leaves as it is: mixed precision needs the model in "
            "float32 first (model.float()), if its numerics allow; float32 alone is then faster than float64."
        )
        yield f
        return
    f.provisional("medium" if ctx.on_gpu else "low")
    f.note = "Changes numerics slightly (bf16 keeps fp32's range); check the loss curve."
    yield f


def _precision_request(precision: Precision, job: bool) -> PlanRequest | JobRequest | None:
    if not job:
        return PlanRequest({"precision": precision})
    # bf16 only: float16 needs a GradScaler around the backward and the step, which a forward's wrapper is not.
    return JobRequest(RankChange(autocast="bfloat16")) if precision == "bf16-mixed" else None


@rule("zero-grad-not-none", "live")
def zero_grad_not_none(ctx: Context) -> Iterator[Finding]:
    for stat in ctx.ran_sites("zero_grad_zeros"):
        f = Finding(
            "zero-grad-not-none",
            site=stat.site,
            category="optimizer",
            speedup=speedup_for_rule("zero-grad-not-none"),
            message="zero_grad(set_to_none=False) writes zeros into every gradient each step (a memset per "
            "parameter) instead of dropping them.",
            fix=Fix(
                "optimizer.zero_grad() (set_to_none=True is the default since torch 2.0)", plan={"set_to_none": True}
            ),
            evidence={"per_step": stat.per_step},
            request=PlanRequest({"set_to_none": True}, baseline={"set_to_none": False}),
        )
        f.provisional("low")
        yield f


@rule("non-foreach-optimizer", "live")
def non_foreach_optimizer(ctx: Context) -> Iterator[Finding]:
    for opt, site in ctx.optimizers:
        if "foreach" not in opt.defaults and "fused" not in opt.defaults:
            continue  # not a torch optimizer with vectorised kernels
        impl = fused_optimizer.implementation(opt)
        n = sum(len(g["params"]) for g in opt.param_groups)
        if impl != "for-loop" or n < 16:
            continue
        fused = fused_optimizer.best_implementation(opt) == "fused"  # what Plan.fused_optimizer would switch to
        share = ctx.timed_share("optimizer")
        f = Finding(
            "non-foreach-optimizer",
            site=site,
            category="optimizer",
            speedup=speedup_for_rule("non-foreach-optimizer"),
            message=(
                f"{type(opt).__name__} updates its {n} parameter tensors one by one (a Python loop of small "
                f"kernels); the optimizer takes {share:.0%} of step time."
            ),
            fix=Fix(
                f"{type(opt).__name__}(..., {'fused=True' if fused else 'foreach=True'})",
                plan={"fused_optimizer": True},
            ),
            evidence={"param_tensors": n, "implementation": impl, "optimizer_share": round(share, 3)},
            request=PlanRequest({"fused_optimizer": True}),
        )
        f.provisional("medium" if share >= 0.2 and n >= 100 else "low")
        yield f


_SHAPED = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _dims(module: nn.Module) -> tuple[int, int]:
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if isinstance(module, nn.Embedding):
        return module.num_embeddings, module.embedding_dim
    conv = cast("nn.Conv1d | nn.Conv2d | nn.Conv3d", module)  # the rest of _SHAPED
    return conv.in_channels, conv.out_channels


@rule("dims-not-multiple-of-8", "live")
def dims_not_multiple_of_8(ctx: Context) -> Iterator[Finding]:
    model = ctx.model
    if model is None:
        return
    total = sum(p.numel() for p in model.parameters()) or 1
    reported = 0
    for name, module in model.named_modules():
        if not isinstance(module, _SHAPED) or reported >= 3:
            continue
        dims = _dims(module)
        odd = [d for d in dims if d >= 64 and d % 8]
        weight = module.weight.numel() if getattr(module, "weight", None) is not None else 0
        if not odd or weight / total < 0.05:
            continue
        padded = [-(-d // 64) * 64 for d in odd]
        f = Finding(
            "dims-not-multiple-of-8",
            site=ctx.module_site(module),
            category="compute",
            message=(
                f"{name or type(module).__name__} ({type(module).__name__}{dims}) has "
                f"{', '.join(map(str, odd))} as a matrix dimension, not a multiple of 8: tensor cores then "
                f"fall back to slower kernels ({weight / total:.0%} of the model's weights)."
            ),
            fix=Fix(
                f"pad it to {', '.join(map(str, padded))} (a multiple of 64), e.g. a vocabulary padded with "
                "unused tokens"
            ),
            evidence={"module": name, "dims": list(dims)},
        )
        f.provisional("medium" if ctx.on_gpu and (ctx.facts.autocast or ctx.hw.tf32) else "low")
        reported += 1
        yield f.on_cpu(ctx, " with tensor cores")


@rule("batch-size-not-multiple-of-8", "live")
def batch_size_not_multiple_of_8(ctx: Context) -> Iterator[Finding]:
    loader = ctx.main_loader
    # The loader says what a batch is; the model's input only guesses at its dimension (sequences, images).
    batch = (loader.settings.get("batch_size") if loader else None) or ctx.facts.batch_size
    if not batch or batch < 8 or batch % 8 == 0:
        return
    site = ctx.main_loader.site if ctx.main_loader else (ctx.capture.site if ctx.capture else None)
    f = Finding(
        "batch-size-not-multiple-of-8",
        site=site,
        category="compute",
        speedup=speedup_for_rule("batch-size-not-multiple-of-8"),
        message=f"The batch size is {batch}, not a multiple of 8: the batch is a matrix dimension of every layer.",
        fix=Fix(
            f"batch_size={batch // 8 * 8 or 8} or {(batch // 8 + 1) * 8}", plan={"batch_size": (batch // 8 + 1) * 8}
        ),
        evidence={"batch_size": batch},
    )
    f.provisional("medium" if ctx.on_gpu and ctx.breakdown.bottleneck == "compute" and ctx.facts.autocast else "low")
    yield f.on_cpu(ctx, " with tensor cores")


def _switch_finding(ctx: Context, rule_id: str, message: str, fix: Fix, measurable: bool = True) -> Finding:
    """A finding about the model that one Plan switch answers, timed by a what-if on the captured batch."""
    plan = fix.plan
    assert plan is not None  # a Plan switch's fix
    field = next(iter(plan))
    return Finding(
        rule_id,
        site=ctx.capture.site if ctx.capture else None,
        category="compute",
        message=message,
        fix=fix,
        speedup=speedup_for_rule(rule_id, field),
        request=PlanRequest(dict(plan)) if measurable else None,
    )


@rule("cudnn-benchmark-off", "live")
def cudnn_benchmark_off(ctx: Context) -> Iterator[Finding]:
    if not _for_this_model(ctx, "cudnn_benchmark") or ctx.facts.cudnn_benchmark:
        return
    if not ctx.on_gpu and not ctx.written_for_gpu:
        return
    f = _switch_finding(
        ctx,
        "cudnn-benchmark-off",
        "torch.backends.cudnn.benchmark is off for a convolutional net: cuDNN uses a heuristic algorithm "
        "instead of timing the candidates once per input shape.",
        Fix(
            "torch.backends.cudnn.benchmark = True (input shapes fixed from step to step)",
            plan={"cudnn_benchmark": True},
            lightning=lightning_call(cudnn_benchmark=True),
        ),
        measurable=ctx.on_gpu,
    )
    f.provisional("medium" if ctx.on_gpu else "low")
    yield f.on_cpu(ctx)


@rule("channels-last", "live")
def channels_last(ctx: Context) -> Iterator[Finding]:
    if not _for_this_model(ctx, "channels_last") or ctx.facts.input_channels_last:
        return
    if not any(len(s) == 4 for s in ctx.facts.input_shapes):
        return
    f = _switch_finding(
        ctx,
        "channels-last",
        "The conv net runs in NCHW (channels-first) layout; convolution kernels, tensor cores and oneDNN on "
        "CPUs read NHWC (channels_last) faster.",
        Fix(
            "model = model.to(memory_format=torch.channels_last); "
            "images = images.to(memory_format=torch.channels_last)",
            plan={"channels_last": True},
        ),
    )
    f.provisional("medium" if ctx.on_gpu and ctx.facts.autocast else "low")
    yield f


@rule("conv-bias-before-bn", "live")
def conv_bias_before_bn(ctx: Context) -> Iterator[Finding]:
    pairs = ctx.info.conv_bn_pairs
    if not _for_this_model(ctx, "drop_conv_bias") or ctx.model is None:
        return
    modules = dict(ctx.model.named_modules())
    first = modules.get(pairs[0][0])
    f = Finding(
        "conv-bias-before-bn",
        site=ctx.module_site(first),
        category="compute",
        speedup=speedup_for_rule("conv-bias-before-bn"),
        message=(
            f"{len(pairs)} convolution(s) add a bias right before a BatchNorm, which subtracts the mean and "
            f"so cancels it: wasted adds, gradients and optimizer work ({', '.join(c for c, _ in pairs[:4])}"
            f"{', ...' if len(pairs) > 4 else ''})."
        ),
        fix=Fix("nn.Conv2d(..., bias=False) before each BatchNorm", plan={"drop_conv_bias": True}),
        evidence={"pairs": [list(p) for p in pairs]},
        request=PlanRequest({"drop_conv_bias": True}),
    )
    f.provisional("low")
    yield f


@rule("data-parallel", "live")
def data_parallel(ctx: Context) -> Iterator[Finding]:
    for module in [ctx.model, *ctx.modules]:
        if isinstance(module, nn.DataParallel):
            gpus = ctx.hw.device_count if ctx.on_gpu else 0
            f = Finding(
                "data-parallel",
                site=ctx.module_site(module),
                category="compute",
                speedup=speedup_for_rule("data-parallel"),
                message=(
                    "nn.DataParallel runs all GPUs from one Python process: every step it replicates the model, "
                    "scatters the batch and gathers the outputs on GPU 0, all under one GIL."
                ),
                fix=Fix(
                    "DistributedDataParallel, one process per GPU: `turbotrain launch --nproc-per-node N "
                    "train.py` or `torchrun --nproc-per-node N train.py` with DDP(model)",
                    plan={"strategy": "ddp"},
                    lightning="Trainer(strategy='ddp', devices=N)",
                    accelerate="accelerate launch --multi_gpu --num_processes N train.py",
                    fabric="Fabric(strategy='ddp', devices=N)",
                    hf_trainer="torchrun --nproc-per-node N train.py (the Trainer then runs DDP itself)",
                ),
                evidence={"gpus": gpus},
            )
            f.provisional("high" if gpus >= 2 else "medium")
            yield f.on_cpu(ctx)
            return


@rule("syncbn-with-compile", "live")
def syncbn_with_compile(ctx: Context) -> Iterator[Finding]:
    model = ctx.model
    if model is None or not any(isinstance(m, nn.SyncBatchNorm) for m in model.modules()):
        return
    if not (ctx.facts.compiled or ctx.seen("compile")):
        return
    f = Finding(
        "syncbn-with-compile",
        site=ctx.module_site(model),
        category="compute",
        speedup=speedup_for_rule("syncbn-with-compile"),
        message="The compiled model contains SyncBatchNorm: every SyncBatchNorm is a cross-process collective that "
        "breaks the compiled graph, giving back much of what compile buys.",
        fix=Fix(
            "use plain BatchNorm with compile (or keep SyncBatchNorm and drop compile)",
            plan={"sync_batchnorm": False},
            lightning="Trainer(sync_batchnorm=False) with a compiled model",
        ),
    )
    f.provisional("medium")
    yield f.on_cpu(ctx)


@rule("nccl-env", "live")
def nccl_env(ctx: Context) -> Iterator[Finding]:
    for name, kind, message, fix in check_nccl_env(ctx.env):
        f = Finding(
            "nccl-env",
            where=f"env {name}",
            message=message,
            fix=Fix(fix),
            category="compute",
            speedup=speedup_for_rule("nccl-env"),
            evidence={"variable": name, "kind": kind},
        )
        f.provisional("medium" if kind in ("typo", "disabled") and (ctx.on_gpu or ctx.world_size > 1) else "low")
        if f.severity == "low" and kind in ("typo", "disabled"):
            f.note = "This run does not use NCCL (no GPU or process group); it matters on multi-GPU runs."
        yield f
