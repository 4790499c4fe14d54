"""Rules on what the run measured: the breakdown and the per-line events (syncs, copies, saves)."""

from __future__ import annotations

import ast
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from ...data import stats as data_stats
from ..findings import Finding, Fix, speedup_for_rule
from ..analysis.periodic import PERIODIC_TARGET_SHARE, periodic_table
from .ranks import on_a_job
from .registry import rule
from ..rank_change import RankChange
from ..record.cadence import syntax_tree
from ..sites import Site
from ..requests import CopyRequest, EvalGradRequest, JobRequest, LoaderRequest, PlanRequest

if TYPE_CHECKING:
    from ..analysis.context import Context, SiteStat

_SYNC_NAMES = {
    "item": ".item()",
    "tolist": ".tolist()",
    "numpy": ".numpy()",
    "cpu": ".cpu()",
    "nonzero": ".nonzero()",
    "bool": "bool()/if on a tensor",
    "float": "float(tensor)",
    "int": "int(tensor)",
    "repr": "print/str of a tensor",
    "format": "an f-string of a tensor",
    "to_cpu": ".to('cpu')",
    "cuda": "a synchronizing CUDA call",
}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


def loader_fix(num_workers: int) -> str:
    """The DataLoader line for ``num_workers``: PyTorch refuses persistent_workers=True without workers."""
    persistent = ", persistent_workers=True" if num_workers > 0 else ""
    return f"DataLoader(..., num_workers={num_workers}{persistent})"


@rule("num-workers", "runtime")
def num_workers(ctx: Context) -> Iterator[Finding]:
    share = ctx.share("data_loading")
    if share < 0.10:
        return
    data_s = ctx.seconds("data_loading")
    record = ctx.main_loader
    cores = max(1, ctx.hw.cpu_cores)
    if record is None:
        # Without a DataLoader nothing can be timed with workers; a batch built in well under a
        # millisecond would not pay for a worker's inter-process hand-off either. Time the run
        # already pinned on a line (torch.tensor copies) has its own finding and fix.
        data_s -= sum(stat.seconds_per_step for stat in ctx.site_stats("tensor_copy"))
        share = data_s / ctx.step_s if ctx.step_s else 0.0
        if share < 0.20 or data_s < 1e-3:
            return
        busiest = max(ctx.gap_samples.items(), key=lambda kv: kv[1], default=(None, 0))[0]
        if busiest is not None and _in_periodic_branch(busiest):
            return  # work the script runs every N steps (a plot, a log), not batch building: periodic-work's
        site = busiest or (ctx.capture.site if ctx.capture else None)
        f = Finding(
            "num-workers",
            site=site,
            category="data_loading",
            message=(
                f"{share:.0%} of each step ({_ms(data_s)}) goes to making the next batch in the training "
                "process itself (no DataLoader): the model waits while the batch is built."
            ),
            fix=Fix(
                "Move the per-batch work into a torch.utils.data.Dataset and iterate "
                f"DataLoader(dataset, batch_size=..., num_workers={min(4, cores)}, persistent_workers=True), so "
                "worker processes build batches while the model trains; or precompute the data once."
            ),
            evidence={
                "data_ms_per_step": round(data_s * 1e3, 3),
                "sampled_lines": {
                    ctx.where(k): v for k, v in sorted(ctx.gap_samples.items(), key=lambda kv: -kv[1])[:5]
                },
            },
        )
        f.set_gain(share, measured=False)
        f.note = "est_speedup is the upper bound: all of the batch preparation hidden behind compute."
        if busiest is None:
            f.note += " No line was caught building a batch (the sampler saw none): the site is the model's call."
        yield f
        return
    workers = record.settings["num_workers"]
    suggest = max(2, min(4, cores)) if workers == 0 else workers * 2
    f = Finding(
        "num-workers",
        site=record.site,
        category="data_loading",
        speedup=speedup_for_rule("num-workers"),
        message=(
            f"{share:.0%} of step time ({_ms(data_s)} per step) waits on the DataLoader, "
            + (
                "which loads every batch in the training process (num_workers=0)."
                if workers == 0
                else f"even with num_workers={workers}."
            )
        ),
        fix=Fix(
            loader_fix(suggest),
            plan={"num_workers": suggest},
            lightning=f"DataLoader(..., num_workers={suggest}) (Lightning passes your loader through)",
            accelerate=f"DataLoader(..., num_workers={suggest}) before accelerator.prepare(...)",
            hf_trainer=f"TrainingArguments(dataloader_num_workers={suggest})",
        ),
        evidence={"data_ms_per_step": round(data_s * 1e3, 3), "num_workers": workers},
        request=LoaderRequest(),
    )
    f.set_gain(share, measured=False)
    f.note = "est_speedup is the upper bound until the worker counts are timed."
    if data_s < 1e-3:
        # Handing a batch over from a worker process costs about this much itself.
        f.cap("low", "Each batch loads in under a millisecond; workers may not win it back.")
    yield f


def _in_periodic_branch(site: Site) -> bool:
    """Whether ``site`` lies in an ``if`` whose test takes a remainder (``if step % 50 == 0:``), its test's line
    included: a sampler can catch a one-line branch, or a body that calls into a library, there."""
    tree = syntax_tree(site.file)
    if tree is None:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and any(
            isinstance(t, ast.BinOp) and isinstance(t.op, ast.Mod) for t in ast.walk(node.test)
        ):
            body = node.body  # the branch that runs every N steps, from its test (``if step % 50 == 0: plot()``)
            if node.lineno <= site.line <= (body[-1].end_lineno or body[-1].lineno):
                return True
    return False


@rule("persistent-workers", "runtime")
def persistent_workers(ctx: Context) -> Iterator[Finding]:
    record = ctx.main_loader
    if record is None or record.settings["num_workers"] == 0 or record.settings["persistent_workers"]:
        return
    starts = [seconds for _, seconds in record.starts]
    if not starts:
        return
    startup = statistics.median(starts)
    per_epoch = record.settings.get("batches_per_epoch") or max(1, len(ctx.measured_steps))
    epoch_s = per_epoch * ctx.step_s
    share = startup / (epoch_s + startup) if epoch_s + startup > 0 else 0.0
    f = Finding(
        "persistent-workers",
        site=record.site,
        category="data_loading",
        speedup=speedup_for_rule("persistent-workers"),
        message=(
            f"Each epoch starts {record.settings['num_workers']} worker processes anew: "
            f"{_ms(startup)} before its first batch, {share:.0%} of an epoch of {per_epoch} steps."
        ),
        fix=Fix(
            "DataLoader(..., persistent_workers=True)",
            plan={"persistent_workers": True},
            lightning="DataLoader(..., persistent_workers=True)",
            accelerate="DataLoader(..., persistent_workers=True)",
            hf_trainer="TrainingArguments(dataloader_persistent_workers=True)",
        ),
        evidence={"startup_ms": round(startup * 1e3, 2), "epochs_started": len(starts), "batches_per_epoch": per_epoch},
    )
    f.set_gain(share, measured=True)
    yield f


@rule("pin-memory", "runtime")
def pin_memory(ctx: Context) -> Iterator[Finding]:
    record = ctx.main_loader
    if record is None or record.settings["pin_memory"]:
        return
    copies = ctx.site_stats("h2d")
    if ctx.on_gpu:
        share = ctx.share("host_to_device")
        if share < 0.01 or not copies:
            return
    elif not ctx.written_for_gpu:
        return
    else:
        share = None
    f = Finding(
        "pin-memory",
        site=record.site,
        category="host_to_device",
        speedup=speedup_for_rule("pin-memory"),
        message=(
            "The DataLoader hands out pageable memory: each copy to the GPU is staged through a pinned "
            "buffer first and cannot overlap compute." + (f" Copies take {share:.0%} of step time." if share else "")
        ),
        fix=Fix(
            "DataLoader(..., pin_memory=True), then batch.to(device, non_blocking=True)",
            plan={"pin_memory": True},
            lightning="DataLoader(..., pin_memory=True)",
            accelerate="DataLoader(..., pin_memory=True) before accelerator.prepare(...)",
            hf_trainer="TrainingArguments(dataloader_pin_memory=True)",
        ),
        request=CopyRequest() if share else None,
    )
    if share:
        f.set_gain(share, measured=False)
        f.note = "est_speedup is the upper bound: all copy time hidden."
    yield f.on_cpu(ctx)


@rule("non-blocking", "runtime")
def non_blocking(ctx: Context) -> Iterator[Finding]:
    if not ctx.on_gpu:
        return  # on the CPU there is no copy; the static rule notes GPU scripts
    blocking = [s for s in ctx.ran_sites("h2d") if not s.detail.get("non_blocking")]
    total = sum(s.seconds_per_step for s in ctx.site_stats("h2d")) or 1e-12
    for stat in blocking[:3]:
        share = ctx.share("host_to_device") * stat.seconds_per_step / total
        pinned = stat.detail.get("pinned")
        f = Finding(
            "non-blocking",
            site=stat.site,
            category="host_to_device",
            speedup=speedup_for_rule("non-blocking", "device_prefetch"),
            message=(
                f"This copy to the GPU blocks the host {stat.per_step:g}x per step "
                f"({stat.bytes_per_step / 2**20:.1f} MiB, {_ms(stat.seconds_per_step)} per step)"
                + ("." if pinned else "; its source is pageable memory, so pin it first (pin-memory).")
            ),
            fix=Fix(
                "tensor.to(device, non_blocking=True) from pinned memory; or prefetch the next batch on a side stream",
                plan={"device_prefetch": True, "pin_memory": True},
                lightning="automatic (Lightning moves batches with non_blocking when pinned)",
                accelerate="Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))",
            ),
            evidence={"per_step": stat.per_step, "mib_per_step": round(stat.bytes_per_step / 2**20, 3)},
        )
        f.set_gain(share, measured=False)
        f.note = "est_speedup is the upper bound: the copy fully overlapped with compute."
        yield f


@dataclass
class _Syncs:
    """The host syncs at one line: which calls, how many per step, their seconds per step."""

    kinds: set[str] = field(default_factory=set)
    per_step: float = 0.0
    seconds: float = 0.0


@rule("host-sync-in-loop", "runtime")
def host_sync(ctx: Context) -> Iterator[Finding]:
    by_site: defaultdict[Site, _Syncs] = defaultdict(_Syncs)
    for stat in ctx.ran_sites("sync:"):
        entry = by_site[stat.site]
        entry.kinds.add(stat.kind.split(":", 1)[1])
        entry.per_step = max(entry.per_step, stat.per_step)
        entry.seconds += stat.seconds_per_step
    if not by_site:
        return
    total_sync = sum(e.seconds for e in by_site.values()) or 1e-12
    sync_share = ctx.share("host_sync")
    ranked = sorted(by_site.items(), key=lambda kv: (-kv[1].seconds, -kv[1].per_step))
    for site, entry in ranked[:6]:
        names = ", ".join(sorted(_SYNC_NAMES.get(k, k) for k in entry.kinds))
        share = sync_share * entry.seconds / total_sync
        f = Finding(
            "host-sync-in-loop",
            site=site,
            category="host_sync",
            message=(
                f"{names} here makes the host wait for the device {entry.per_step:g}x per step "
                f"({_ms(entry.seconds)} per step, {share:.1%} of step time)."
            ),
            fix=Fix(
                "Keep values on the device inside the step (e.g. running_loss += loss.detach()) and read them "
                "with .item() only every N steps; no print/f-string/if on tensors in the step.",
                lightning="self.log(name, value) (logged lazily) with Trainer(log_every_n_steps=N)",
                accelerate="accelerator.gather(...) and .item() only on logging steps",
                hf_trainer="TrainingArguments(logging_steps=N): the Trainer reads the loss on logging steps",
            ),
            evidence={
                "per_step": entry.per_step,
                "kinds": sorted(entry.kinds),
                "ms_per_step": round(entry.seconds * 1e3, 4),
            },
        )
        f.set_gain(share, measured=True)
        if not ctx.on_gpu:
            f.note = (
                "On this CPU run the call itself is cheap; on a GPU each one stalls the host until every "
                "queued kernel has finished, so the host can no longer run ahead."
            )
        yield f


def _timed_sites(ctx: Context, kind: str) -> Iterator[tuple[SiteStat, float]]:
    """(per-site stats, share of step time) of events of ``kind`` that ran in the measured steps."""
    for stat in ctx.ran_sites(kind):
        yield stat, (stat.seconds_per_step / ctx.step_s if ctx.step_s else 0.0)


@rule("tensor-from-numpy-copy", "runtime")
def tensor_from_numpy(ctx: Context) -> Iterator[Finding]:
    for stat, share in _timed_sites(ctx, "tensor_copy"):
        f = Finding(
            "tensor-from-numpy-copy",
            site=stat.site,
            category="data_loading",
            message=(
                f"torch.tensor() copies a NumPy array here {stat.per_step:g}x per step "
                f"({stat.bytes_per_step / 2**20:.2f} MiB, {_ms(stat.seconds_per_step)} per step)."
            ),
            fix=Fix(
                "torch.from_numpy(array) (or torch.as_tensor(array)) shares the array's memory instead of "
                "copying it; when the data never changes, convert it once before the loop."
            ),
            evidence={
                "per_step": stat.per_step,
                "mib_per_step": round(stat.bytes_per_step / 2**20, 4),
                "ms_per_step": round(stat.seconds_per_step * 1e3, 4),
            },
        )
        f.set_gain(share, measured=True)
        yield f


@rule("save-in-loop", "runtime")
def save_in_loop(ctx: Context) -> Iterator[Finding]:
    for stat, share in _timed_sites(ctx, "save"):
        f = Finding(
            "save-in-loop",
            site=stat.site,
            category="outside_step",
            message=(
                f"torch.save runs {stat.per_step:g}x per step here ({_ms(stat.seconds_per_step / stat.per_step)} "
                f"each, {share:.0%} of step time)."
            ),
            fix=Fix(
                "Checkpoint every N steps or once per epoch, in the background when it is large "
                "(turbotrain.train.checkpoint writes atomically)",
                lightning="ModelCheckpoint(every_n_train_steps=N)",
                accelerate="accelerator.save_state(...) every N steps",
                fabric="fabric.save(path, state) every N steps",
                hf_trainer="TrainingArguments(save_steps=N)",
            ),
            evidence={"per_step": stat.per_step, "ms_per_step": round(stat.seconds_per_step * 1e3, 3)},
        )
        f.set_gain(share, measured=True)
        yield f


@rule("empty-cache-in-loop", "runtime")
def empty_cache(ctx: Context) -> Iterator[Finding]:
    for stat in ctx.ran_sites("empty_cache"):
        f = Finding(
            "empty-cache-in-loop",
            site=stat.site,
            category="compute",
            message=(
                f"torch.cuda.empty_cache() runs {stat.per_step:g}x per step: it hands the caching allocator's "
                "free blocks back to the driver, so the next step allocates them again with slow, "
                "synchronizing cudaMalloc calls."
            ),
            fix=Fix(
                "Remove it from the loop (call it at most once, e.g. before evaluation of a different model); "
                "use torch.cuda.memory_summary() to find what really holds memory."
            ),
            evidence={"per_step": stat.per_step},
        )
        f.provisional("medium")
        yield f.on_cpu(ctx)


@rule("grad-in-validation", "runtime")
def grad_in_validation(ctx: Context) -> Iterator[Finding]:
    for _kind, site, tally in ctx.seen("eval_grad_forward"):
        count, seconds, _ = tally.total(ctx.measured_steps)
        all_count, all_seconds, _ = tally.total(tally.by_step.keys())
        total_s = sum(s.duration for s in ctx.step_records) or 1.0
        share = seconds / (ctx.step_s * max(1, len(ctx.measured_steps))) if count else all_seconds / total_s
        f = Finding(
            "grad-in-validation",
            site=site,
            category="outside_step",
            message=(
                f"The model runs in eval mode with autograd on here ({all_count} forward(s), none followed by "
                f"a backward): every activation is kept for a backward that never comes "
                f"({share:.0%} of run time)."
            ),
            fix=Fix(
                "Wrap validation/inference in `with torch.inference_mode():` (or torch.no_grad())",
                lightning="automatic: validation_step already runs under inference_mode",
                accelerate="`with torch.no_grad():` around the evaluation loop",
                hf_trainer="automatic: Trainer.evaluate() runs under torch.no_grad()",
            ),
            evidence={"forwards": all_count, "ms_total": round(all_seconds * 1e3, 2), "share_of_run": share},
            request=EvalGradRequest(share),
        )
        f.provisional("low")  # what autograd costs here is measured by the what-if
        yield f


@rule("accumulation-syncs", "runtime")
def accumulation_syncs(ctx: Context) -> Iterator[Finding]:
    from torch.nn.parallel import DistributedDataParallel

    synced = [c.passes for c in ctx.recording.communication] if ctx.recording is not None else []
    if not synced and not any(isinstance(m, DistributedDataParallel) for m in ctx.modules + [ctx.model]):
        return
    backwards = ctx.backwards_per_step()
    if backwards <= 1.01 or ctx.seen("no_sync") or (synced and max(synced) <= 1):
        return
    site = ctx.capture.site if ctx.capture else None
    fsdp = any(c.kind == "fsdp" and c.passes > 1 for c in ctx.recording.communication) if ctx.recording else False
    sync = "FSDP reduce-scatters them in every one" if fsdp else "DDP all-reduces them after every one"
    f = Finding(
        "accumulation-syncs",
        site=site,
        category="compute",
        speedup=speedup_for_rule("accumulation-syncs"),
        message=(
            f"Gradients are accumulated over {backwards:.0f} backward passes per optimizer step, and {sync} of "
            f"them: {backwards - 1:.0f} of {backwards:.0f} {'reduce-scatters' if fsdp else 'all-reduces'} per step "
            "are wasted."
        ),
        fix=_accumulation_fix(round(backwards), fsdp),
        evidence={"backwards_per_step": backwards, "world_size": ctx.world_size, "kind": "fsdp" if fsdp else "ddp"},
    )
    if on_a_job(ctx):
        # Timed on every rank: each forward of a micro-batch but the last runs as under no_sync() (DDP) or
        # set_requires_gradient_sync(False) (FSDP).
        f.request = JobRequest(RankChange(sync_every=round(backwards)))
    if ctx.world_size > 1:
        f.provisional("medium")
    else:
        f.provisional("low")
        f.note = "This run has one process, where the all-reduce is cheap; it costs real time with several."
    yield f


def _accumulation_fix(k: int, fsdp: bool) -> Fix:
    accelerate = f"Accelerator(gradient_accumulation_steps={k}) and `with accelerator.accumulate(model):`"
    hf_trainer = f"TrainingArguments(gradient_accumulation_steps={k})"
    if fsdp:
        return Fix(
            "fully_shard: model.set_requires_gradient_sync(False) before every micro-batch but the last, True "
            "before the last; FullyShardedDataParallel: `with model.no_sync():` around every micro-batch but the "
            "last (both keep unsharded gradients until then: more memory)",
            accelerate=accelerate,
            hf_trainer=hf_trainer,
        )
    return Fix(
        "`with model.no_sync():` around the backward of every micro-batch but the last",
        plan={"grad_accum_steps": k},
        lightning=f"Trainer(accumulate_grad_batches={k}) (skips the sync for you)",
        accelerate=accelerate,
        fabric="`with fabric.no_backward_sync(model):` around the backward of every micro-batch but the last",
        hf_trainer=hf_trainer,
    )


@rule("jit-script", "runtime")
def fuse_with_compile(ctx: Context) -> Iterator[Finding]:
    if ctx.facts.compiled or ctx.seen("compile") or ctx.model is None:
        return
    overhead, compute = ctx.dispatch_share(), ctx.share("compute") + ctx.share("python_overhead")
    pointwise = ctx.profile.get("pointwise_share", 0.0)
    if not (overhead >= 0.3 or (compute >= 0.4 and pointwise >= 0.3)):
        return
    mode = "reduce-overhead" if ctx.on_gpu and overhead >= 0.3 else True
    why = (
        f"{overhead:.0%} of step time is per-op dispatch overhead"
        if overhead >= 0.3
        else f"{pointwise:.0%} of op time is elementwise ops, each its own kernel and memory round trip"
    )
    f = Finding(
        "jit-script",
        site=ctx.module_site(ctx.model),
        category="compute",
        speedup=speedup_for_rule("jit-script"),
        message=f"{why}; torch.compile fuses them into fewer kernels"
        + (" and CUDA graphs replay the step without per-op launches." if mode == "reduce-overhead" else "."),
        fix=Fix(
            f"model = torch.compile(model{', mode=' + repr(mode) if mode != True else ''})",  # noqa: E712 - mode is a name or True
            plan={"compile": mode},
            lightning="model = torch.compile(model) before trainer.fit(model)",
            accelerate='Accelerator(dynamo_backend="inductor")',
            fabric="model = torch.compile(model) before fabric.setup(model)",
            hf_trainer="TrainingArguments(torch_compile=True)",
        ),
        evidence={"python_overhead_share": round(overhead, 3), "pointwise_share": round(pointwise, 3)},
        request=PlanRequest({"compile": mode}, compile=True),
    )
    f.provisional("low")
    f.note = "Not measured by default (compiling takes a while); run the doctor with --compile to time it."
    yield f


@rule("slow-storage", "runtime")
def slow_storage(ctx: Context) -> Iterator[Finding]:
    """Data wait dominated by storage reads through ``turbotrain.data`` (the data layer decides)."""
    if ctx.storage_stats is None:
        return
    data_wait_s = ctx.seconds("data_loading") * len(ctx.measured_steps)
    total_s = ctx.step_s * len(ctx.measured_steps)
    found = data_stats.slow_storage_finding(ctx.storage_stats, data_wait_s, total_s)
    if not found:
        return
    record = ctx.main_loader
    f = Finding(
        "slow-storage",
        message=found["message"],
        fix=Fix(found["fix"]),
        category="data_loading",
        site=record.site if record else None,
        where=found.get("where"),
        evidence={k: v for k, v in found.items() if k in ("scheme", "mb_per_s")},
    )
    est = found.get("est_speedup")
    f.set_gain(1.0 - 1.0 / est if est else None, measured=bool(found.get("measured")))
    f.severity = found.get("severity", f.severity)
    yield f


@rule("periodic-work", "runtime")
def periodic_work(ctx: Context) -> Iterator[Finding]:
    for row in periodic_table(ctx):
        share = row["share"]
        if share is None or share < PERIODIC_TARGET_SHARE or not row["every"] or row["every"] < 2:
            continue  # seen once (its period unknown), cheap enough, or every step's own cost: not periodic
        kind, every, better = row["kind"], row["every"], row["suggested_every"]
        if kind == "work between steps" and row["site"] is None:
            yield _unexplained_slow_steps(row)
            continue
        f = Finding(
            "periodic-work",
            site=row["site"],
            category="outside_step",
            message=(
                f"{kind.capitalize()} every {every} steps costs {_ms(row['cost_ms'] / 1e3)} each time: "
                f"{share:.0%} of training time."
            ),
            fix=Fix(
                f"run the {kind} every {better} steps (under {PERIODIC_TARGET_SHARE:.0%} of training time)"
                + (", and under torch.inference_mode()" if kind == "validation" else ""),
                lightning=f"Trainer(val_check_interval={better})" if kind == "validation" else None,
                hf_trainer=(
                    f"TrainingArguments(eval_strategy='steps', eval_steps={better})"
                    if kind == "validation"
                    else f"TrainingArguments(save_steps={better})"
                    if kind == "checkpoint"
                    else None
                ),
            ),
            evidence={k: row[k] for k in ("every", "cost_ms", "share", "steps")},
        )
        # Moving to the suggested cadence saves all but its own (under 5%) share.
        saved = share * (1 - every / better) if better else 0.0
        f.set_gain(max(0.0, saved), measured=True)
        f.note = f"Measured over {len(row['steps'])} occurrence(s); the numbers above spread it over its period."
        if row.get("note"):  # found beyond the window: how (analysis/periodic.py)
            f.note = f"{f.note} {row['note']}"
        yield f


def _unexplained_slow_steps(row: dict[str, Any]) -> Finding:
    """Slow steps at a period with nothing of the script's own seen in them (no line, no validation, no save): on
    a shared machine, the scheduler's doing as often as the script's. Said, never rated above low, never timed."""
    f = Finding(
        "periodic-work",
        site=None,
        category="outside_step",
        message=(
            f"Steps {', '.join(str(i) for i in row['steps'][:6])} ran {_ms(row['cost_ms'] / 1e3)} over the ordinary "
            "step with no work of the script's own seen in them (no line, validation or checkpoint): other "
            "processes taking the CPU look the same."
        ),
        fix=Fix("nothing to change in the script unless it does work every few steps the doctor did not see"),
        evidence={k: row[k] for k in ("every", "cost_ms", "share", "steps")},
    )
    f.set_gain(None, measured=False)
    f.cap("low", "No evidence of work: counted as noise, not as a cost of the script.")
    return f
