"""What the compile rules share: the user's part of what torch.compile did, and the script's compiled model run
two ways on its captured batch, interleaved.

Not a rule (the leading ``_`` keeps it out of the rule registry).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ContextManager, Literal

import torch

from ....measure import copy_for_trial
from ...edits import PRECISION, ByHand, EditSpec
from ...analysis.replay import script_loss
from ...record.memory_watch import LossFn
from ...analysis.source import dotted_name
from ...record.compile_watch import CompiledCode, GraphBreak, Recompile
from ...results import CompileResult
from ._compile_calls import IN_PLACE, compile_calls_that_ran, in_place_compiled

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...analysis.source import SourceIndex
    from ...sites import Site
    from ..rule import Measured, TimeLeft

__all__ = [
    "compile_calls",
    "one_compile_call",
    "compile_site",
    "compile_edit",
    "user_codes",
    "user_breaks",
    "compiled_model",
    "compiled_in_place",
    "in_place_site",
    "Variant",
    "PairTiming",
    "time_variants",
    "seconds_text",
    "backend_name",
    "script_backend_config",
    "recompiled",
    "compiled_like",
    "script_dynamic",
    "trade_off",
    "pair_text",
    "cached_compile",
    "inductor_cache_dir",
    "CachedCompile",
    "measured_pair",
    "eager_copy",
    "regionally_compiled",
    "compile_seconds",
    "model_calls_per_step",
    "user_recompiles",
    "is_item_break",
    "submodule_path",
]

Batch = tuple[tuple[Any, ...], dict[str, Any]]  # a forward's (args, kwargs)
_PROBE_CALLS = ("get_ident", "_getframe")  # the builtins the doctor's probes call
ROUNDS = 2  # interleaved rounds; a third when the two disagree about the direction
STEPS = 5  # timed steps per variant per round (at least; more for a short step)
ROUND_S = 0.1  # the least time one variant's steps span in a round


def _doctor_made(b: GraphBreak) -> bool:
    """A break on the doctor's probes: they call ``threading.get_ident`` and ``sys._getframe``, which dynamo
    cannot trace, where the user's code calls them.

    The recorder's hooks run inside the compiled forward; until they are hidden from dynamo, their breaks are the
    doctor's, not the script's (a script that calls either in its forward is rare)."""
    return b.gb_id == "GB0007" and any(f"qualname: {name}," in b.reason for name in _PROBE_CALLS)


def user_codes(ctx: Context) -> list[CompiledCode]:
    """The compiled codes of the script (the recording leaves the doctor's own hooks out)."""
    facts = ctx.compiled
    return list(facts.codes) if facts is not None else []


def user_breaks(code: CompiledCode) -> list[GraphBreak]:
    """The code's graph breaks that the script made (at a user line, not on the doctor's probes)."""
    return [b for b in code.breaks if b.site is not None and not _doctor_made(b)]


def user_recompiles(code: CompiledCode) -> list[Recompile]:
    """The code's recompiles, less the one a ``.item()`` break brings (torch specialises on the float it read:
    a changed value recompiles once; the break's finding covers it)."""
    items = sum(1 for b in user_breaks(code) if is_item_break(b))
    kept = []
    for r in code.recompiles:
        if items and r.kind == "changed-value":
            items -= 1
            continue
        kept.append(r)
    return kept


def is_item_break(b: GraphBreak) -> bool:
    """A break on ``Tensor.item()`` (torch's GB0124), which capture_scalar_outputs=True keeps in the graph."""
    return b.gb_id == "GB0124" or "item()" in b.title


def compile_calls(ctx: Context) -> list[tuple[SourceIndex, ast.Call]]:
    """The ``torch.compile(...)`` calls in the script's files, with the file each is in."""
    return [(index, call) for index in ctx.sources.values() for call, _ in index.calls("torch.compile")]


def compile_site(ctx: Context) -> Site | None:
    """Where a fix of the compile goes: the script's one ``torch.compile(...)`` call, else the captured call."""
    calls = compile_calls(ctx)
    return calls[0][0].site(calls[0][1]) if len(calls) == 1 else ctx.capture.site if ctx.capture is not None else None


def one_compile_call(ctx: Context, fix: str, compiles: str) -> tuple[SourceIndex, ast.Call]:
    """The script's one ``torch.compile(...)`` call, where ``fix`` goes; ByHand naming the calls where the
    script's files have none or several (``compiles``: what the call compiles, in words)."""
    calls = compile_calls(ctx)
    if len(calls) != 1:
        where = ", ".join(index.site(call).where(ctx.base) for index, call in calls) or "none in the script's files"
        raise ByHand(f"{fix} at the call that compiles {compiles} ({where})")
    return calls[0]


def compile_decorator(ctx: Context, code_at: str) -> tuple[SourceIndex, ast.expr] | None:
    """The ``@torch.compile`` or ``@torch.compile(...)`` decorator of the function whose code starts at ``code_at``
    ("/path/train.py:64": a decorated function's code starts at its first decorator), with its file."""
    path, _, line = code_at.rpartition(":")
    index = next((i for i in ctx.sources.values() if i.path == path), None)
    if index is None or not line.isdigit():
        return None
    for node in ast.walk(index.tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.decorator_list:
            continue
        if int(line) not in (node.lineno, node.decorator_list[0].lineno):
            continue
        for decorator in node.decorator_list:
            named = decorator.func if isinstance(decorator, ast.Call) else decorator
            head, dot, rest = dotted_name(named).partition(".")
            if index.imported_as.get(head, head) + dot + rest == "torch.compile":
                return index, decorator
    return None


def compile_edit(index: SourceIndex, call: ast.expr, fix: str, keywords: dict[str, Any]) -> EditSpec:
    """``keywords`` set at the script's ``torch.compile(...)`` call (or bare ``@torch.compile`` decorator)."""
    return compile_edit_at(index.path, call.lineno, fix, keywords)


def compile_edit_at(file: str, line: int, fix: str, keywords: dict[str, Any]) -> EditSpec:
    """``keywords`` set at the compile call at ``file:line`` (``torch.compile(...)``, ``model.compile(...)`` or a
    decorator): other kernels, so the loss is held to the numerics guard, not bitwise."""
    return EditSpec("compile", fix, params={"keywords": keywords}, numerics=PRECISION, file=file, line=line)


def compiled_model(ctx: Context) -> torch.nn.Module | None:
    """The captured model where the script compiled it (an OptimizedModule, its eager original ``_orig_mod``)."""
    module = ctx.capture.module if ctx.capture is not None else None
    return module if module is not None and isinstance(getattr(module, "_orig_mod", None), torch.nn.Module) else None


def compiled_in_place(ctx: Context) -> torch.nn.Module | None:
    """The captured model where the script compiled it in place (``model.compile(mode=...)``): a module whose call
    runs its compiled call, with the settings torch kept for it."""
    module = ctx.capture.module if ctx.capture is not None else None
    if module is None or compiled_model(ctx) is not None or getattr(module, "_compiled_call_impl", None) is None:
        return None
    return module if dynamo_context(module) is not None else None


def in_place_site(ctx: Context, module: torch.nn.Module | None) -> Site | None:
    """Where the script compiled ``module`` in place (``model.compile()``), where it did: a fix of it goes there."""
    if module is None or not in_place_compiled(module):
        return None
    return next((site for site, form in compile_calls_that_ran(ctx) if form is not None and form[0] == IN_PLACE), None)


def called_from_compiled_code(ctx: Context) -> torch.nn.Module | None:
    """The captured model where the script compiled a function that calls it (Lightning compiles ``training_step``)
    and Inductor compiled that function (its graph cache was read or written): the eager module itself; None
    otherwise (a compiled model, or another backend, which the what-ifs would not know how to compile alike)."""
    if ctx.capture is None or not ctx.facts.compiled or compiled_model(ctx) is not None:
        return None
    return ctx.capture.module if any(c.cache_hits + c.cache_misses for c in user_codes(ctx)) else None


def seconds_text(seconds: float) -> str:
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s" if seconds >= 0.1 else f"{seconds * 1e3:.0f} ms"


def _fresh_backend(backend: Any) -> Any:
    """The script's backend under a new identity: torch guards each compiled entry on its backend's id, so two
    copies compiled with different settings never run each other's code."""
    fresh = copy.copy(backend)
    if fresh is not backend:
        return fresh

    @functools.wraps(backend)
    def again(*args: Any, **kwargs: Any) -> Any:
        return backend(*args, **kwargs)

    return again


def dynamo_context(model: torch.nn.Module) -> Any:
    """The settings torch.compile kept for ``model``: an OptimizedModule's ``dynamo_ctx``, or for a module compiled
    in place (``model.compile(mode=...)``) the one its compiled call closes over; None where there is none."""
    found = getattr(model, "dynamo_ctx", None)
    if found is not None:
        return found
    call = getattr(model, "_compiled_call_impl", None)
    # torch keeps it in the compiled function's closure only: private, no other way to read it.
    cells = [c.cell_contents for c in getattr(call, "__closure__", None) or ()]
    return next((c for c in cells if hasattr(c, "callback") and hasattr(c, "_dynamic")), None)


def _script_backend(model: torch.nn.Module) -> Any:
    """The backend the script gave torch.compile (mode and options inside), None where torch does not say."""
    callback = getattr(dynamo_context(model), "callback", None)
    # torch keeps it on the frame converter: private, no other way to read it.
    return getattr(getattr(callback, "_torchdynamo_orig_backend", None), "_torchdynamo_orig_backend", None)


def script_backend_config(model: torch.nn.Module) -> dict[str, Any]:
    """The Inductor settings the script's ``mode=``/``options=`` made (``max_autotune``, ``triton.cudagraphs``),
    {} for another backend or where torch does not say."""
    config = getattr(_script_backend(model), "config", None)
    return dict(config) if isinstance(config, dict) else {}


def backend_name(model: torch.nn.Module) -> str:
    """The name of the script's torch.compile backend ("inductor", "eager", ...), "" where torch does not say."""
    return str(getattr(_script_backend(model), "_compiler_name", "") or "")


def script_dynamic(model: torch.nn.Module) -> bool | None:
    """The ``dynamic=`` the script compiled its model with (None: torch's default, dynamic after one new shape)."""
    return getattr(dynamo_context(model), "_dynamic", None)


def recompiled(model: torch.nn.Module, dynamic: bool | None | Literal["script"] = "script") -> torch.nn.Module:
    """A copy of the script's compiled model compiled again from scratch, as the script compiled it (its backend,
    mode, ``dynamic`` and ``fullgraph``); ``dynamic``: another ``dynamic=`` than the script's."""
    return compiled_like(model, eager_copy(model), dynamic)


def compiled_like(
    model: torch.nn.Module, module: torch.nn.Module, dynamic: bool | None | Literal["script"] = "script"
) -> torch.nn.Module:
    """``module`` compiled as the script compiled ``model`` (its backend, mode, ``dynamic`` and ``fullgraph``),
    under a backend of its own (nothing compiled for another variant is reused)."""
    backend = _script_backend(model)
    # torch.compile is typed for functions; given a Module it returns an OptimizedModule, a Module.
    return torch.compile(  # type: ignore[return-value]  # a Module in, a Module out
        module,
        backend=_fresh_backend(backend) if backend is not None else "inductor",
        dynamic=script_dynamic(model) if dynamic == "script" else dynamic,
        fullgraph=bool(getattr(dynamo_context(model), "fullgraph", False)),
    )


def regionally_compiled(model: torch.nn.Module, container: str) -> torch.nn.Module:
    """A copy of the compiled model's eager original with each module of ``container`` (its repeated blocks)
    compiled as the script compiled the model (its backend), the rest eager: regional compilation. A block of the
    script's own class is compiled in place (``block.compile()``); one of torch's (:func:`torch_builtin`) is replaced
    by ``torch.compile(block)``."""
    script_backend = _script_backend(model)
    # One backend for every block: torch guards a compiled entry on its backend, and only a shared one lets the
    # blocks reuse the code compiled for the first.
    backend = _fresh_backend(script_backend) if script_backend is not None else "inductor"
    copy = eager_copy(model)
    blocks = copy.get_submodule(container)
    for name, block in list(blocks.named_children()):
        if torch_builtin(type(block)):
            setattr(blocks, name, torch.compile(block, backend=backend))  # the same child, compiled
        else:
            block.compile(backend=backend)
    return copy


def submodule_path(name: str) -> str:
    """A submodule's name as Python reaches it from its model: ``0.layers`` is ``[0].layers`` (a Sequential's child)."""
    return "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in name.split(".") if part)


def torch_builtin(cls: type) -> bool:
    """Whether ``cls`` is one of torch's own modules (``nn.Linear``, ``nn.TransformerEncoderLayer``): its code is in
    Dynamo's skip list, so ``block.compile()`` compiles nothing (every frame of its call is skipped), while
    ``torch.compile(block)`` traces it."""
    return cls.__module__.split(".")[0] == "torch"


def compile_seconds(ctx: Context, codes: Sequence[CompiledCode] | None = None) -> tuple[float, float]:
    """(first compiles, recompiles) in seconds, the script's codes only (``codes``: those of them)."""
    codes = user_codes(ctx) if codes is None else codes
    return sum(c.first_compile_s for c in codes), sum(r.seconds for c in codes for r in user_recompiles(c))


def is_forward_of(model: torch.nn.Module, code: CompiledCode) -> bool:
    """Whether ``code`` is the compiled model's own forward (an OptimizedModule's original's, or a module's compiled
    in place), not a function the script compiled apart, such as an optimizer step; True where the forward's code
    cannot be read."""
    forward = getattr(getattr(type(getattr(model, "_orig_mod", model)), "forward", None), "__code__", None)
    return forward is None or (code.code.file, code.code.line) == (forward.co_filename, forward.co_firstlineno)


def eager_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the compiled model's eager original (of a module compiled in place, the module: a copy leaves the
    compiled call behind, ``Module.__getstate__`` drops it)."""
    original = getattr(model, "_orig_mod", model)
    assert isinstance(original, torch.nn.Module)  # compiled_model checked it
    return copy_for_trial(original)


@dataclass
class Variant:
    """One way of running the model: the module and the torch settings it compiles and runs under."""

    label: str
    module: torch.nn.Module
    settings: Callable[[], ContextManager[Any]] = contextlib.nullcontext
    compiles: bool = True  # False: an eager variant, whose first call costs no compile


@dataclass(frozen=True)
class PairTiming:
    """Seconds of two variants, interleaved: per-round ratios (a / b) and each side's best round, a step's (the
    model's calls in one training step)."""

    ratios: tuple[float, ...]
    a_s: float
    b_s: float
    warm_s: tuple[float, float]  # the seconds each variant's first calls took (their compile, for a compiled one)
    other_s: tuple[float, ...] = ()  # b's first step on each of the other batches, after its warm-up
    other_graphs: int = 0  # the graphs torch compiled for those steps


def _step(module: torch.nn.Module, batch: Batch, cuda: bool, loss_fn: LossFn) -> Callable[[], float]:
    def run() -> float:
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        loss = loss_fn(module, batch)  # the forward under the script's autocast (build-nanogpt, nanochat)
        # torch's Tensor.backward is untyped.
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
        if cuda:
            torch.cuda.synchronize()
        module.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    return run


def _timed(variant: Variant, step: Callable[[], float], steps: int) -> float:
    """Seconds per step: the lower quartile of ``steps`` (other processes only ever add time)."""
    with variant.settings():
        times = sorted(step() for _ in range(steps))
    return times[(len(times) - 1) // 4]


@contextlib.contextmanager
def _fresh_dynamo() -> Iterator[None]:
    """torch.compile with nothing left of the script's run: the code torch marked to skip (a break in a loop) and
    its compiled entries are dropped, so each variant compiles as a fresh process would. Inductor's on-disk graph
    caches are off too: the script's own graphs are in them, and a variant compiling the graph the script did
    read its compile from the cache (0.5 s for nanoGPT's whole model against 5.1 s for its blocks, uncached)."""
    import torch._dynamo
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    try:
        with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
            yield
    finally:
        torch._dynamo.reset()


# What a ratio over a run of known length is of: its training steps and its compiling.
RUN_UNIT = "whole run's time, compiling included"


@dataclass(frozen=True)
class RunLength:
    """The steps of the whole run: where the script ended by itself (``ended``), or where its stepping loop's
    length was read (``loop``: what ends it and where, as said)."""

    steps: int
    ended: bool
    loop: str = ""


def run_length(ctx: Context) -> RunLength | None:
    if ctx.run_steps:
        return RunLength(ctx.run_steps, ended=True)
    planned = ctx.planned_steps
    if planned is None:
        return None
    steps, loop = planned
    return RunLength(steps, ended=False, loop=f"`{loop.code}` at {ctx.where(loop.site)}")


def time_variants(
    ctx: Context, budget: TimeLeft, a: Variant, b: Variant, compile_s: float, other_batches: Sequence[Batch] = ()
) -> PairTiming | None:
    """``a`` and ``b`` on the captured batch, warmed (compiled) first, then timed in interleaved rounds; None when
    the budget cannot hold compiling those that compile (``compile_s``: the run's first compiles, what one fresh
    compile of the model for one batch costs; recompiles for other inputs are not paid here) or a round.
    ``other_batches``: ``b`` steps once on each after its warm-up, each timed, the graphs compiled for them counted."""
    from torch._dynamo.utils import counters

    assert ctx.capture is not None  # the callers check it
    batch = (ctx.capture.args, ctx.capture.kwargs)
    cuda = ctx.on_gpu
    if not budget.allows((a.compiles + b.compiles) * compile_s + 1.0):
        return None
    loss_fn = script_loss(ctx.facts, ctx.on_gpu)
    with _fresh_dynamo():
        runs = (_step(a.module, batch, cuda, loss_fn), _step(b.module, batch, cuda, loss_fn))
        warm, compiled_s = [], []
        for variant, run in zip((a, b), runs):
            with variant.settings():
                first = run()  # compiles
                compiled_s.append(run())  # runs what the first compiled: the step a round is sized by
                warm.append(first + compiled_s[-1])
        graphs_before = counters["stats"]["unique_graphs"]
        with b.settings():
            other_s = tuple(_step(b.module, other, cuda, loss_fn)() for other in other_batches)
        other_graphs = counters["stats"]["unique_graphs"] - graphs_before
        # Sized by the steps after the compile, not the warm-up's mean: a compile of seconds is in that.
        steps = max(STEPS, min(50, int(ROUND_S / max(1e-5, min(compiled_s)))))
        round_cost = 2 * steps * max(max(compiled_s), 1e-4) * 3
        ratios: list[float] = []
        best = [float("inf"), float("inf")]
        while budget.allows(round_cost) and (
            len(ratios) < ROUNDS or (len(ratios) == ROUNDS and (ratios[0] > 1) != (ratios[1] > 1))
        ):
            a_s, b_s = _timed(a, runs[0], steps), _timed(b, runs[1], steps)
            best = [min(best[0], a_s), min(best[1], b_s)]
            ratios.append(a_s / b_s if b_s > 0 else 0.0)
    if not ratios:
        return None
    # A step of several micro-batches runs the model that many times: the step saves each call's difference.
    calls = model_calls_per_step(ctx)
    return PairTiming(tuple(ratios), best[0] * calls, best[1] * calls, (warm[0], warm[1]), other_s, other_graphs)


def model_calls_per_step(ctx: Context) -> int:
    """The training forwards a measured step runs (its micro-batches; the median, at least 1)."""
    measured = set(ctx.measured_steps)
    counts = sorted(s.forwards for s in ctx.step_records if s.index in measured and s.forwards)
    return counts[len(counts) // 2] if counts else 1


def measured_pair(
    ctx: Context,
    budget: TimeLeft,
    a: Variant,
    b: Variant,
    say: Callable[[PairTiming, bool], str],
    compile_s: float,
    result_compile_s: float | None = None,
    other_batches: Sequence[Batch] = (),
    over_run: bool = True,
) -> Measured | None:
    """``a`` (the script's way) against ``b`` (the fix) timed by :func:`time_variants`, judged, as the finding's
    result; ``say(timing, steps_differ)`` words it (``steps_differ``: the rounds called the steps apart). None when
    the budget could not hold them. ``result_compile_s``: the compile seconds the result reports (the run's).
    ``over_run``: a fix whose first calls compile longer, in a run of known length too short for its faster step to
    win that back, rates low (off where the fix's compiling is paid on other inputs than the one batch timed)."""
    from ....measure import judge
    from ..rule import Measured

    timing = time_variants(ctx, budget, a, b, compile_s, other_batches)
    if timing is None:
        return None
    verdict = judge(list(timing.ratios), noise_floor=ctx.noise_floor)
    short = _too_short_to_pay(run_length(ctx), timing) if over_run else ""
    return Measured(
        what_if=compile_result(a, b, timing, compile_s if result_compile_s is None else result_compile_s),
        verdict=verdict,
        applies_to=ctx.share("compute") + ctx.share("python_overhead"),
        note=say(timing, verdict.called) + short,
        low=bool(short),
    )


def _too_short_to_pay(length: RunLength | None, timing: PairTiming) -> str:
    """Where the fix (``b``) compiles longer than the script's way and the run's steps are too few for its faster
    step to win that back: the sentence that says so; "" otherwise."""
    extra_s, saved_s = timing.warm_s[1] - timing.warm_s[0], timing.a_s - timing.b_s
    if length is None or extra_s <= 0 or saved_s <= 0 or extra_s / saved_s <= length.steps:
        return ""
    run = f"This run ended after {length.steps:,} steps" if length.ended else f"The script runs {length.steps:,} steps"
    loop = f" ({length.loop})" if length.loop else ""
    return f" {run}{loop}: too few to win back its compiling, so it rates low here."


def inductor_cache_dir() -> str:
    """Where Inductor keeps its on-disk caches (``TORCHINDUCTOR_CACHE_DIR``, default /tmp/torchinductor_<user>)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return str(cache_dir())


@dataclass(frozen=True)
class CachedCompile:
    """A fresh compile that read Inductor's caches, as a rerun on this machine does: its seconds (the first call
    less a step) and the graphs it read from the FX graph cache."""

    seconds: float
    graphs_read: int


def cached_compile(ctx: Context, model: torch.nn.Module, budget: TimeLeft) -> CachedCompile | None:
    """The script's model compiled again as the script compiles it, with Inductor's caches on (the run filled
    them), timed on the captured batch; None where the budget cannot hold a compile as long as the run's first."""
    from torch._dynamo.utils import counters

    assert ctx.capture is not None  # compiled_model checked it
    if not budget.allows(compile_seconds(ctx)[0] + 1.0):
        return None
    torch._dynamo.reset()  # nothing compiled in memory: only the on-disk caches
    try:
        hits = counters["inductor"]["fxgraph_cache_hit"]
        batch = (ctx.capture.args, ctx.capture.kwargs)
        run = _step(recompiled(model), batch, ctx.on_gpu, script_loss(ctx.facts, ctx.on_gpu))
        first = run()
        step = run()
        read = counters["inductor"]["fxgraph_cache_hit"] - hits
    finally:
        torch._dynamo.reset()
    return CachedCompile(max(0.0, first - step), read)


def compile_result(
    a: Variant, b: Variant, timing: PairTiming, compile_s: float, pays_after_steps: int | None = None
) -> CompileResult:
    """What two variants timed against each other measured, as the finding's result (``a`` the baseline)."""
    return CompileResult(
        baseline=a.label,
        candidate=b.label,
        rounds=tuple(round(r, 3) for r in timing.ratios),
        baseline_ms=round(timing.a_s * 1e3, 3),
        candidate_ms=round(timing.b_s * 1e3, 3),
        compile_s=round(compile_s, 3),
        pays_after_steps=pays_after_steps,
        baseline_first_calls_s=round(timing.warm_s[0], 3),
        candidate_first_calls_s=round(timing.warm_s[1], 3),
        other_lengths=len(timing.other_s) or None,
        graphs_for_other_lengths=timing.other_graphs if timing.other_s else None,
    )


def pair_text(timing: PairTiming, a: str, b: str, fix: str) -> str:
    """Two compiled variants' first calls (their compiling) and step, ``a`` the script's way and ``b`` the fix's
    ("whole", "block by block"), and what ``fix`` trades over a run."""
    (a_s, b_s), step = timing.warm_s, timing.a_s - timing.b_s
    return (
        f"First calls (compiling) {seconds_text(a_s)} {a} against {seconds_text(b_s)} {b}; "
        f"the step {timing.a_s * 1e3:.2f} ms against {timing.b_s * 1e3:.2f} ms "
        f"({'slower' if step < 0 else 'faster'} by {abs(step) * 1e3:.2f} ms {b}). " + trade_off(a_s - b_s, step, fix)
    )


def trade_off(compile_saved_s: float, step_saved_s: float, fix: str) -> str:
    """What ``fix`` buys over a run, from the compile seconds and the step time it saves (either may be < 0)."""
    if compile_saved_s > 0 and step_saved_s >= 0:
        return f"It saves both: {fix}."
    if compile_saved_s <= 0 and step_saved_s <= 0:
        return "It saves neither here: keep compiling as the script does."
    if compile_saved_s > 0:
        steps = math.ceil(compile_saved_s / -step_saved_s)
        return f"It saves compiling and costs step time: worth it for runs (or restarts) of under {steps:,} steps."
    steps = math.ceil(-compile_saved_s / step_saved_s)
    return f"It costs compiling and saves step time: worth it for runs of over {steps:,} steps."
