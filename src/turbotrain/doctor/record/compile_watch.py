"""What torch.compile did while a script ran: graphs, graph breaks, recompilations, fallbacks, compile time.

:class:`CompileWatch` is installed around a run in the same process and ends in :class:`CompileFacts`, frozen
plain data (numbers, strings, tuples, :class:`~turbotrain.doctor.sites.Site`) that pickles. It reads torch's own
records and times nothing itself:

* ``torch._dynamo.utils.get_compilation_metrics()``: one entry per frame compile (and one per backward compiled
  lazily) with the code, its compile seconds, whether it captured a graph, the guard that failed when it is a
  recompilation, and the "recompile limit exceeded" failure after which the code runs eagerly. Torch keeps the
  last 64; the watch raises that bound while it runs and puts it back.
  Each entry's start (wall clock) is kept on the step clock (``time.perf_counter``), so a job's analysis can
  tell which step a compile ran in.
* the ``graph_breaks`` log artifact (``TORCH_LOGS=graph_breaks``): each break's reason and the user stack it
  happened in. A filter on its loggers reads the records and drops them, so nothing reaches the terminal unless
  the user asked for that artifact.
* ``torch._dynamo.callback_handler``'s compile-start callback and torch's "hit config.recompile_limit" warning:
  the user line that called the code being compiled, read from the live Python stack, and the class of the
  compiled module being called (the name of a code that is torch's own, as wrap_inline's ``inner`` for a
  ``torch.compile(nn.Sequential(...))``, or the frames torch compiles while a wrapper such as DDP runs eagerly).

A break inside a library's code (torch's DDP, a package the user calls) is kept at the user's line that ran it,
with the library's frame where torch broke; a break inside the doctor's own code is not the script's and is left out.

Importing ``torch._dynamo`` takes seconds, so the watch never imports it: an import hook that finds nothing
finishes the setup once the script has imported it, and a script that never compiles costs a few attribute
writes. Torch counts compile-time events only: a break or a recompile is seen once per compile that met it, not
per call of the compiled code.
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, ModuleType, TracebackType
from typing import Any, Callable, Literal

from ..sites import Site, is_user_file

__all__ = [
    "CompileWatch",
    "CompileFacts",
    "CompiledCode",
    "CompileSpan",
    "GraphBreak",
    "Recompile",
    "Fallback",
    "NEW_SHAPE",
    "NEW_DTYPE",
    "CHANGED_VALUE",
    "NEW_INSTANCE",
    "GRAD_MODE",
    "OTHER",
    "classify_guard",
]

# What made torch recompile, from the guard that failed.
NEW_SHAPE = "new-shape"
NEW_DTYPE = "new-dtype"
CHANGED_VALUE = "changed-value"  # a Python int, float, str, bool or length the graph was specialised on
NEW_INSTANCE = "new-instance"  # another object (or another type) where the graph saw a given one
GRAD_MODE = "grad-mode"  # called under torch.no_grad() (evaluation) where the graph was compiled with grad, or back
OTHER = "other"  # requires_grad, device, grad mode, ... or a reason torch did not give

_DYNAMO = "torch._dynamo"
_EVAL_FRAME = "torch._dynamo.eval_frame"  # defines OptimizedModule, what torch.compile(module) returns
_MODULE_CALLS = frozenset(("__call__", "_wrapped_call_impl", "_call_impl"))  # frames whose self is the module called
_COMPILER_CODE = f"{os.sep}torch{os.sep}_dynamo{os.sep}"  # torch.compile's own frames (polyfills), not the library's
_OWN_PACKAGE = str(Path(__file__).resolve().parents[2])  # the turbotrain package: the doctor's own code
_UTILS = "torch._dynamo.utils"
# The loggers torch creates for the graph_breaks artifact (in torch._dynamo.exc, convert_frame, symbolic_convert).
_BREAK_LOGGERS = tuple(f"torch._dynamo.{m}.__graph_breaks" for m in ("exc", "convert_frame", "symbolic_convert"))
_LIMIT_LOGGER = "torch._dynamo.convert_frame"  # warns "torch._dynamo hit config.recompile_limit"
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<name>.+)_at_(?P<line>\d+)$")
_COMPILE_ID = re.compile(r"^(?P<frame>\d+)/(?P<attempt>\d+)")
_STACK_LINE = re.compile(r"^Line: (?P<line>\d+), Name: (?P<name>.*), Filename: (?P<file>.*)$")
_FILE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')
_BREAK_AT = re.compile(r"in user code at (?P<file>.+?):(?P<line>\d+)\n")
_GB_ID = re.compile(r"/gb/gb(?P<id>\d{4})\.html")
_LIMIT_GB_ID = "GB0039"  # torch's "Dynamo recompile limit exceeded": reported as a Fallback, not a break
_LIMIT = re.compile(r"Limit type: (?P<name>\w+)")
_LIMIT_VALUE = re.compile(r"currently set to (?P<value>\d+)")
# Lines torch puts before the kind of break, and its words for a break that made it run a whole function eagerly.
_PREAMBLES = ("Encountered graph break when attempting to trace", "Failed to handle graph break gracefully")
_SKIPPED = ("Skipping the function and falling back to eager", "will skip tracing the frame")
_METRICS_BOUND = 100_000  # compile entries kept while watching (torch keeps 64)
_CACHES = ("local", "remote")  # where Inductor looked a graph up (CompilationMetrics counts each)
_STACK_DEPTH = 8  # user frames kept per compile


@dataclass(frozen=True, slots=True)
class GraphBreak:
    """One place torch.compile ended a graph to run Python, with torch's reason."""

    site: Site | None  # the user's line it broke on (None: torch named only its own code)
    title: str  # torch's kind of break, e.g. "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    gb_id: str  # its id in torch's graph-break registry ("GB0124"), "" when torch gave none
    reason: str  # the reason as torch states it (explanation and hints included)
    count: int  # compiles that met it (a recompile meets its breaks again)
    skipped: bool = False  # torch could not resume after it and ran the whole function eagerly (a break in a loop)
    # Where torch broke when it is not at the user's line: the frame of the library code that line ran (torch's,
    # a package's) and that library's top-level name ("torch", "logging"); None and "" at the user's own line.
    inside: Site | None = None
    library: str = ""


@dataclass(frozen=True, slots=True)
class Recompile:
    """One recompilation: the guard that failed and what it cost."""

    compile_id: str  # torch's "frame/attempt" id, e.g. "0/2"
    kind: str  # NEW_SHAPE, NEW_DTYPE, CHANGED_VALUE, NEW_INSTANCE, GRAD_MODE or OTHER
    guard: str  # the failed guard, e.g. "tensor 'x' size mismatch at index 1. expected 12, actual 13"
    reason: str  # torch's whole text for it (the source line and any hint it adds)
    site: Site | None  # the user line torch names for the guard, else ``caller``
    caller: Site | None  # the user line that called the code with what failed the guard
    seconds: float  # compile seconds, a backward compiled for it included


@dataclass(frozen=True, slots=True)
class Fallback:
    """The recompile limit was hit: torch runs the code eagerly from then on."""

    limit: str  # "recompile_limit" or "accumulated_recompile_limit" (torch._dynamo.config)
    value: int  # the limit then (0: torch did not say)
    kind: str  # what the last failed guard was (as Recompile.kind)
    guard: str  # the last failed guard
    caller: Site | None  # the user line whose call asked for one compile too many


@dataclass(frozen=True, slots=True)
class CompiledCode:
    """One function torch.compile compiled, its resume functions after graph breaks folded in; codes of torch's own
    (or a library's) folded into the compiled module whose call compiled them."""

    # The code's name: "forward", or the compiled function's; for code that is not the user's, the class of the
    # compiled module ("Sequential" for wrap_inline's "inner", "DistributedDataParallel" for DDP's frames).
    name: str
    code: Site  # where the code is (file, first line): may be torch's own, as for a compiled nn.Sequential
    site: Site | None  # the user's: the code itself when it is the user's, else the user line that called it
    compiles: int  # frame compiles that produced code (resume functions and recompiles included)
    graphs: int  # graphs captured (one per compile that captured operations)
    breaks: tuple[GraphBreak, ...]
    recompiles: tuple[Recompile, ...]
    first_compile_s: float  # the compiles that were no recompilation: paid once per run (backward included)
    fallback: Fallback | None = None  # the recompile limit hit: the rest of the run was eager
    # Inductor's FX graph cache (local and remote), forward and backward graphs: read from it, or compiled anew.
    cache_hits: int = 0
    cache_misses: int = 0

    @property
    def recompile_s(self) -> float:
        return sum(r.seconds for r in self.recompiles)

    @property
    def compile_s(self) -> float:
        return self.first_compile_s + self.recompile_s


@dataclass(frozen=True, slots=True)
class GraphTime:
    """Milliseconds per step of the profiler window spent running torch.compile's graphs, forward and backward,
    and the whole step: the rest is Python and eager ops between and around the graphs."""

    forward_ms: float
    backward_ms: float
    step_ms: float

    @property
    def outside_ms(self) -> float:
        return max(0.0, self.step_ms - self.forward_ms - self.backward_ms)


@dataclass(frozen=True, slots=True)
class CompileSpan:
    """One compile (forward, or a backward compiled for it) on the recorder's step clock: which step paid it."""

    compile_id: str  # torch's "frame/attempt" id, as in Recompile.compile_id
    start: float  # time.perf_counter() seconds, the clock StepRecord.start and .end are on
    seconds: float
    kind: Literal["first", "recompile", "limit"]  # limit: the compile that hit the recompile limit


@dataclass(frozen=True, slots=True)
class CompileFacts:
    """Everything torch.compile did in one run, per compiled code and in total."""

    codes: tuple[CompiledCode, ...] = ()
    graphs: int = 0
    breaks: int = 0  # distinct (user line, kind of break): a break inside a nested call also breaks its caller
    recompiles: int = 0
    compile_s: float = 0.0  # every compile's seconds, failed ones included
    fell_back: int = 0  # codes that hit the recompile limit
    in_graphs: GraphTime | None = None  # the profiler window's steps in and out of the graphs (none: not profiled)
    spans: tuple[CompileSpan, ...] = ()  # every compile's start and seconds (none where torch kept no start)

    @property
    def compiled(self) -> bool:
        return bool(self.codes)


@dataclass(frozen=True, slots=True)
class _BreakRecord:
    compile_id: str
    site: Site | None
    title: str
    gb_id: str
    reason: str
    skipped: bool
    inside: Site | None
    library: str


@dataclass(slots=True)
class _Entry:
    """One of torch's compilation-metrics entries, reduced to what the facts need."""

    compile_id: str
    frame: int
    forward: bool
    code: tuple[str, int, str] | None  # (file, first line, name); torch leaves it out on a failed compile
    seconds: float
    graph: bool
    recompile_reason: str | None
    fail_reason: str
    stack: tuple[Site, ...]  # user frames calling it, innermost first
    cache_hits: int = 0  # Inductor's FX graph cache
    cache_misses: int = 0
    start: float | None = None  # wall-clock seconds the compile started (None: torch did not say)


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a graph break is: the user's line, and the library frame below it where torch broke (if any)."""

    site: Site | None
    inside: Site | None = None
    library: str = ""


@dataclass(slots=True)
class _Live:
    """What the watch reads while the script runs, per compile id."""

    breaks: list[_BreakRecord] = field(default_factory=list)
    callers: dict[str, tuple[Site, ...]] = field(default_factory=dict)  # user frames, innermost first
    modules: dict[str, str] = field(default_factory=dict)  # the class of the compiled module being called
    # torch's break location -> the user line, the library frame and library (torch names a repeat by location only)
    resolved: dict[tuple[str, int], _Place] = field(default_factory=dict)


def classify_guard(guard: str) -> str:
    """NEW_SHAPE, NEW_DTYPE, CHANGED_VALUE, NEW_INSTANCE, GRAD_MODE or OTHER for a failed guard as torch words it."""
    if "GLOBAL_STATE changed: grad_mode" in guard:
        return GRAD_MODE
    if "dtype mismatch" in guard:
        return NEW_DTYPE
    if re.search(r"(size|stride|rank) mismatch|\.size\(\)|\.stride\(\)|storage_offset", guard):
        return NEW_SHAPE
    if re.search(r"___check_(obj|type)_id\(|ID_MATCH|TYPE_MATCH", guard):
        return NEW_INSTANCE
    if re.search(r"==|!=|<=|>=| < | > |\blen\(| is ", guard):
        return CHANGED_VALUE
    return OTHER


def _current_compile_id() -> str | None:
    import torch

    compile_id = torch._guards.CompileContext.current_compile_id()
    return None if compile_id is None else str(compile_id)


def _user_stack(frame: FrameType | None) -> tuple[Site, ...]:
    """The user frames at and above ``frame``, innermost first (at most _STACK_DEPTH)."""
    sites: list[Site] = []
    while frame is not None and len(sites) < _STACK_DEPTH:
        if is_user_file(frame.f_code.co_filename):
            sites.append(Site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return tuple(sites)


class _BreakFilter(logging.Filter):
    """Reads the graph_breaks artifact's records; lets them through only when the user enabled that artifact."""

    def __init__(self, live: _Live) -> None:
        super().__init__()
        self.live = live

    def filter(self, record: logging.LogRecord) -> bool:
        compile_id = _current_compile_id()
        if compile_id is not None:  # torch logs every break while compiling; this is only a safeguard
            _record_break(compile_id, record, self.live)
        # torch._logging's own state (private): whether TORCH_LOGS or set_logs asked for graph_breaks.
        from torch._logging._internal import log_state

        return bool(log_state.is_artifact_enabled("graph_breaks"))


class _LimitFilter(logging.Filter):
    """Notes who called when torch warns that a code hit the recompile limit; lets every record through."""

    def __init__(self, live: _Live) -> None:
        super().__init__()
        self.live = live

    def filter(self, record: logging.LogRecord) -> bool:
        compile_id = _current_compile_id()
        if compile_id is not None and str(record.msg).startswith("torch._dynamo hit config."):
            self.live.callers[compile_id] = _user_stack(sys._getframe(1))
        return True


def _record_break(compile_id: str, record: logging.LogRecord, live: _Live) -> None:
    """Notes the graph break a ``graph_breaks`` log record describes (a recompile-limit failure is none, nor a
    break inside the doctor's own code)."""
    message = record.getMessage()
    reason = _break_reason(message, record)
    gb_id = f"GB{m.group('id')}" if (m := _GB_ID.search(reason)) else ""
    if gb_id == _LIMIT_GB_ID:
        return
    place = _break_place(message, live.resolved)
    if place is None:  # the doctor's own code broke (a probe or a range inlined into the compiled code)
        return
    skipped = any(words in reason for words in _SKIPPED)
    live.breaks.append(
        _BreakRecord(compile_id, place.site, _title(reason), gb_id, reason, skipped, place.inside, place.library)
    )


def _break_reason(message: str, record: logging.LogRecord) -> str:
    if "Graph Break Reason: " in message:
        reason = message.split("Graph Break Reason: ", 1)[1]
        for tail in ("\nStack variable source attribution:", "\nUser code traceback:"):
            reason = reason.split(tail, 1)[0]
        return reason.strip()
    if record.exc_info and record.exc_info[1] is not None:  # a frame torch skipped: the reason is the exception
        return str(record.exc_info[1]).strip()
    return message.strip()


def _title(reason: str) -> str:
    """The first line that names the kind of break (torch puts what it was tracing or doing before some)."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    kept = [line for line in lines if not line.startswith(_PREAMBLES)]
    return (kept or lines or [""])[0]


def _break_place(message: str, resolved: dict[tuple[str, int], _Place]) -> _Place | None:
    """The innermost user frame of the stack torch printed (else the location torch named if it is the user's),
    with the library frame below it where torch broke; None where the innermost frame is the doctor's own."""
    frames = _traceback_sites(message)
    at = _BREAK_AT.search(message)
    location = (at.group("file"), int(at.group("line"))) if at else None
    innermost = frames[-1].file if frames else location[0] if location else ""
    if innermost.startswith(_OWN_PACKAGE):
        return None
    users = [i for i, s in enumerate(frames) if is_user_file(s.file)]
    if users:
        below = [s for s in frames[users[-1] + 1 :] if not s.file.startswith(_OWN_PACKAGE)]
        place = _Place(frames[users[-1]], *_library_frame(below))
        if location is not None:
            resolved[location] = place
        return place
    if location is None:
        return _Place(None)
    # Torch prints the stack once per break; repeats name only where it broke, which may be torch's own code.
    if location in resolved:
        return resolved[location]
    return _Place(Site(location[0], location[1]) if is_user_file(location[0]) else None)


def _library_frame(below: Sequence[Site]) -> tuple[Site | None, str]:
    """Where in the library the user's line called torch broke, and that library's top-level name: its innermost
    frame there that is not torch.compile's own (a polyfill it traces in place of Python), else the innermost."""
    if not below:
        return None, ""
    library = _top_module(below[0].file)
    own = [s for s in below if _top_module(s.file) == library and _COMPILER_CODE not in s.file]
    return (own or list(below))[-1], library


def _top_module(file: str) -> str:
    """The top-level module a source file belongs to ("torch", "logging"), by the longest import root holding it."""
    if not file or file.startswith("<"):  # <frozen ...>, <string>: no file
        return ""
    path = os.path.realpath(file)
    roots = [r for r in (os.path.realpath(p) for p in sys.path if p) if path.startswith(r + os.sep)]
    if not roots:
        return ""
    first = path[len(max(roots, key=len)) + 1 :].split(os.sep, 1)[0]
    return first[:-3] if first.endswith(".py") else first


def _traceback_sites(text: str) -> list[Site]:
    """The frames of a Python traceback in ``text``, outermost first, a resume function named as the one it resumes."""
    return [Site(m.group("file"), int(m.group("line")), _resumed(m.group("name"))) for m in _FILE_LINE.finditer(text)]


def _resumed(name: str) -> str:
    """The function a resume function torch made after a graph break resumes ("forward" for its resumes)."""
    while match := _RESUME.match(name):
        name = match.group("name")
    return name


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` at the first import after ``name`` has defined ``attribute``; finds nothing itself."""

    def __init__(self, name: str, attribute: str, then: Any) -> None:
        self.name, self.attribute, self.then = name, attribute, then

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        module = sys.modules.get(self.name)
        if module is not None and hasattr(module, self.attribute):  # the attribute: its import got that far
            self.remove()
            self.then(module)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


class CompileWatch:
    """Watches torch.compile over a run in this process: ``with CompileWatch() as watch: ...``, then ``watch.facts``.

    On exit it restores what it changed (the graph_breaks loggers' level and filter, a filter on torch's
    convert_frame logger, torch's bound on kept compile entries, its compile-start callback and import hook); it
    changes no torch._dynamo.config setting and resets no counter.
    """

    def __init__(self, on_compiling: Callable[[bool], None] | None = None) -> None:
        self._on_compiling = on_compiling  # told True when a compile starts, False when it ends
        self._live = _Live()
        self._break_filter = _BreakFilter(self._live)
        self._limit_filter = _LimitFilter(self._live)
        self._levels: dict[str, int] = {}
        self._seen: set[int] = set()  # ids of the compile entries torch held before the watch
        self._bound: int | None = None  # torch's bound on kept entries before the watch raised it
        self._hook = _AfterImport(_DYNAMO, "reset", self._install)  # reset: defined after everything it needs
        self._facts: CompileFacts | None = None

    @property
    def facts(self) -> CompileFacts:
        if self._facts is None:
            raise RuntimeError("CompileWatch.facts is read before the watch ended")
        return self._facts

    def __enter__(self) -> CompileWatch:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Begins watching: call once, then :meth:`stop`."""
        for name in _BREAK_LOGGERS:
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            logger.addFilter(self._break_filter)
            logger.setLevel(logging.DEBUG)  # torch formats and logs a break only when its logger is enabled
        logging.getLogger(_LIMIT_LOGGER).addFilter(self._limit_filter)
        dynamo = sys.modules.get(_DYNAMO)
        if dynamo is not None and hasattr(dynamo, "reset"):
            self._seen = {id(m) for m in sys.modules[_UTILS].get_compilation_metrics()}
            self._install(dynamo)
        else:  # torch._dynamo not imported yet: finish when the script imports it
            sys.meta_path.insert(0, self._hook)

    def stop(self) -> CompileFacts:
        """Ends watching, restores what it changed and returns (and keeps, as ``facts``) what torch.compile did."""
        self._hook.remove()
        for name, level in self._levels.items():
            logger = logging.getLogger(name)
            logger.removeFilter(self._break_filter)
            logger.setLevel(level)
        logging.getLogger(_LIMIT_LOGGER).removeFilter(self._limit_filter)
        entries: list[_Entry] = []
        dynamo = sys.modules.get(_DYNAMO)
        if dynamo is not None and hasattr(dynamo, "reset"):
            handler = dynamo.callback_handler  # torch._dynamo.reset() clears every callback
            for callbacks, mine in (
                (handler.start_callbacks, self._on_compile_start),
                (handler.end_callbacks, self._on_compile_end),
            ):
                if mine in callbacks:
                    callbacks.remove(mine)
            utils = sys.modules[_UTILS]
            kept = [m for m in utils.get_compilation_metrics() if id(m) not in self._seen]
            entries = [e for e in (_entry(m, self._live.callers) for m in kept) if e is not None and not _doctors(e)]
            if self._bound is not None:
                utils.set_compilation_metrics_limit(self._bound)
        # torch stamps entries with time.time(); the steps are timed on perf_counter.
        offset = time.time() - time.perf_counter()
        self._facts = _build_facts(entries, self._live.breaks, self._live.modules, offset)
        return self._facts

    def _install(self, dynamo: ModuleType) -> None:
        """Keeps every compile entry and notes who calls each compile (torch._dynamo is imported by now)."""
        utils = sys.modules[_UTILS]
        # The deque's bound is private; reading it is the only way to put the user's own bound back.
        self._bound = utils._compilation_metrics.maxlen
        utils.set_compilation_metrics_limit(max(self._bound or 0, _METRICS_BOUND))
        dynamo.callback_handler.register_start_callback(self._on_compile_start)
        dynamo.callback_handler.register_end_callback(self._on_compile_end)

    def _on_compile_end(self, args: Any) -> None:
        if self._on_compiling is not None:
            self._on_compiling(False)

    def _on_compile_start(self, args: Any) -> None:
        if self._on_compiling is not None:  # any trigger: a lazy backward compiles as long as a forward
            self._on_compiling(True)
        if args.callback_trigger.name == "DYNAMO":  # not a lazy backward or an autotune: they have no new caller
            self._live.callers[args.compile_id] = _user_stack(sys._getframe(1))
            module = _compiled_module(sys._getframe(1))
            if module:
                self._live.modules[args.compile_id] = module


def _compiled_module(frame: FrameType | None) -> str:
    """The class of the innermost module torch.compile wrapped that is being called on the stack ("" for none):
    the module a compiled code that is torch's own belongs to."""
    optimized = getattr(sys.modules.get(_EVAL_FRAME), "OptimizedModule", None)
    while frame is not None and optimized is not None:
        if frame.f_code.co_name in _MODULE_CALLS and "self" in frame.f_code.co_varnames:
            module = frame.f_locals.get("self")
            if isinstance(module, optimized):
                return type(module._orig_mod).__name__
        frame = frame.f_back
    return ""


def _entry(metrics: Any, callers: dict[str, tuple[Site, ...]]) -> _Entry | None:
    """A compilation-metrics entry as an _Entry (None for compiled autograd's, whose ids start with "!")."""
    compile_id = str(getattr(metrics, "compile_id", None) or "")
    match = _COMPILE_ID.match(compile_id)
    if match is None:
        return None
    forward = getattr(metrics, "is_forward", True) is not False
    name = getattr(metrics, "co_name", None)
    code = (metrics.co_filename, int(metrics.co_firstlineno), name) if name else None
    seconds = getattr(metrics, "entire_frame_compile_time_s", None) if forward else None
    if seconds is None:
        seconds = (getattr(metrics, "duration_us", None) or 0) / 1e6
    stack = callers.get(compile_id) or _metrics_stack(getattr(metrics, "stack_trace", None) or ())
    return _Entry(
        compile_id=compile_id,
        frame=int(match.group("frame")),
        forward=forward,
        code=code,
        seconds=float(seconds),
        graph=bool(getattr(metrics, "graph_op_count", None)),
        recompile_reason=getattr(metrics, "recompile_reason", None),
        fail_reason=str(getattr(metrics, "fail_reason", None) or ""),
        stack=stack,
        cache_hits=_count(metrics, "hit"),
        cache_misses=_count(metrics, "miss"),
        start=_start(metrics),
    )


def _start(metrics: Any) -> float | None:
    """When the compile started, wall-clock seconds (torch 2.5+: ``start_time_us``; before: ``start_time``)."""
    start_us = getattr(metrics, "start_time_us", None)
    if start_us is not None:
        return float(start_us) / 1e6
    start = getattr(metrics, "start_time", None)
    return None if start is None else float(start)


def _count(metrics: Any, outcome: str) -> int:
    """Inductor's FX graph cache hits or misses of one entry, local and remote (None where no lookup ran)."""
    return sum(int(getattr(metrics, f"inductor_fx_{where}_cache_{outcome}_count", None) or 0) for where in _CACHES)


def _doctors(entry: _Entry) -> bool:
    """A compile of the doctor's own hooks: dynamo converts every frame a compiled script calls, the recorder's
    hooks among them (no graph; the compile time is the doctor's, not the script's)."""
    return entry.code is not None and entry.code[0].startswith(_OWN_PACKAGE)


def _metrics_stack(lines: Iterable[str]) -> tuple[Site, ...]:
    """The user frames of torch's recorded stack, innermost first, the compiled code's own (last) line left out.

    Used when no live stack was read (torch._dynamo.reset() dropped the callback); torch's stack can lack frames.
    """
    sites = [Site(m.group("file"), int(m.group("line")), m.group("name")) for m in map(_STACK_LINE.match, lines) if m]
    return tuple(s for s in reversed(sites[:-1]) if is_user_file(s.file))


@dataclass(slots=True)
class _Code:
    """One compiled code's entries while the facts are built."""

    key: tuple[str, int, str]  # (file, first line, name); for codes of torch's own under a module: ("", 0, class)
    code: tuple[str, int, str]  # the first code compiled in the group (the same as key for the user's code)
    entries: list[_Entry] = field(default_factory=list)
    frames: set[int] = field(default_factory=set)


def _build_facts(
    entries: Sequence[_Entry],
    breaks: Sequence[_BreakRecord],
    modules: dict[str, str] | None = None,
    offset: float = 0.0,
) -> CompileFacts:
    """The facts from torch's compile entries and the graph breaks it logged, grouped per compiled code."""
    codes = _group(entries, modules or {})
    built = tuple(_compiled_code(code, [b for b in breaks if _frame_of(b.compile_id) in code.frames]) for code in codes)
    return CompileFacts(
        codes=built,
        graphs=sum(c.graphs for c in built),
        breaks=len({(b.site, b.title) for c in built for b in c.breaks}),
        recompiles=sum(len(c.recompiles) for c in built),
        compile_s=sum(e.seconds for e in entries),
        fell_back=sum(c.fallback is not None for c in built),
        spans=_spans(entries, offset),
    )


def _spans(entries: Sequence[_Entry], offset: float) -> tuple[CompileSpan, ...]:
    """Each timed compile on the step clock (wall clock less ``offset``); a backward takes its forward's kind."""
    kinds: dict[str, Literal["first", "recompile", "limit"]] = {}
    for e in entries:
        if e.forward:
            kinds[e.compile_id] = "limit" if _limit(e) else "recompile" if e.recompile_reason else "first"
    return tuple(
        CompileSpan(e.compile_id, e.start - offset, e.seconds, kinds.get(e.compile_id, "first"))
        for e in entries
        if e.start is not None
    )


def _frame_of(compile_id: str) -> int | None:
    match = _COMPILE_ID.match(compile_id)
    return int(match.group("frame")) if match else None


def _group(entries: Sequence[_Entry], modules: dict[str, str]) -> list[_Code]:
    """Entries per compiled code: a frame's by torch's frame id, a resume function's under the code it resumes,
    and a code of torch's own (or a library's) under the user's compiled code that called it at a break, else
    under the compiled module whose call compiled it."""
    named = {e.frame: e.code for e in entries if e.code is not None}
    parents = sorted({code for code in named.values() if not _RESUME.match(code[2])}, key=lambda c: -c[1])
    homes: dict[int, tuple[tuple[str, int, str], tuple[str, int, str]]] = {}  # frame -> (its group, its code)
    codes: dict[tuple[str, int, str], _Code] = {}
    for entry in entries:
        code = named.get(entry.frame)
        if code is None:  # only failed compiles of a code first compiled before the watch: nothing names it
            continue
        if entry.frame not in homes:  # its first compile: who called it
            parent = _parent(code, parents)
            home = parent if is_user_file(parent[0]) else _home(entry, parents, modules) or parent
            homes[entry.frame] = (home, home if is_user_file(home[0]) else parent)
        key, first = homes[entry.frame]
        group = codes.setdefault(key, _Code(key, first))
        group.entries.append(entry)
        group.frames.add(entry.frame)
    return list(codes.values())


def _home(
    entry: _Entry, parents: Sequence[tuple[str, int, str]], modules: dict[str, str]
) -> tuple[str, int, str] | None:
    """Where a compile of code that is not the user's belongs: the user's compiled code its innermost user frame
    is in (it ran the library call at a break), else ``("", 0, class)`` of the compiled module being called."""
    for site in entry.stack[:1]:
        name = _resumed(site.function)
        for parent in parents:  # latest first line first
            if parent[0] == site.file and parent[2] == name and parent[1] <= site.line:
                return parent
    module = modules.get(entry.compile_id)
    return ("", 0, module) if module else None


def _parent(code: tuple[str, int, str], parents: Sequence[tuple[str, int, str]]) -> tuple[str, int, str]:
    """The code a resume function resumes: the same file and name, the last one starting above the break."""
    file, _, name = code
    while match := _RESUME.match(name):
        name, line = match.group("name"), int(match.group("line"))
        for parent in parents:  # latest first line first
            if parent[0] == file and parent[2] == name and parent[1] <= line:
                return parent
    return code


def _compiled_code(code: _Code, breaks: Sequence[_BreakRecord]) -> CompiledCode:
    file, first_line, name = code.code
    forward = [e for e in code.entries if e.forward]
    backward_s: dict[str, float] = {}
    for e in code.entries:
        if not e.forward:
            backward_s[e.compile_id] = backward_s.get(e.compile_id, 0.0) + e.seconds
    done = [e for e in forward if not _limit(e)]
    limit_hit = next((e for e in forward if _limit(e)), None)
    own = Site(file, first_line, name)
    return CompiledCode(
        name=code.key[2],
        code=own,
        site=own if is_user_file(file) else _caller(code.key, forward[0]) if forward else None,
        compiles=len(done),
        graphs=sum(e.graph for e in done),
        breaks=_breaks(breaks),
        recompiles=tuple(
            _recompile(code.key, e, backward_s.get(e.compile_id, 0.0)) for e in done if e.recompile_reason
        ),
        first_compile_s=sum(e.seconds + backward_s.get(e.compile_id, 0.0) for e in done if not e.recompile_reason),
        fallback=_fallback(code.key, limit_hit) if limit_hit is not None else None,
        cache_hits=sum(e.cache_hits for e in code.entries),
        cache_misses=sum(e.cache_misses for e in code.entries),
    )


def _limit(entry: _Entry) -> str:
    """The limit this compile hit ("" when none)."""
    if "recompile limit exceeded" not in entry.fail_reason and "cache limit exceeded" not in entry.fail_reason:
        return ""
    match = _LIMIT.search(entry.fail_reason)
    return match.group("name") if match else "recompile_limit"


def _recompile(key: tuple[str, int, str], entry: _Entry, backward_s: float) -> Recompile:
    guard, reason, named = _guard(entry)
    caller = _caller(key, entry)
    return Recompile(
        entry.compile_id, classify_guard(guard), guard, reason, named or caller, caller, entry.seconds + backward_s
    )


def _fallback(key: tuple[str, int, str], entry: _Entry) -> Fallback:
    guard, _, _ = _guard(entry)
    value = _LIMIT_VALUE.search(entry.fail_reason)
    limit_value = int(value.group("value")) if value else 0
    return Fallback(_limit(entry), limit_value, classify_guard(guard), guard, _caller(key, entry))


def _guard(entry: _Entry) -> tuple[str, str, Site | None]:
    """The failed guard, torch's whole text for it, and the user line torch names for it (if any)."""
    reason = re.sub(r"^\d+/\d+: ", "", entry.recompile_reason or "").strip()
    first = reason.split("\n", 1)[0]
    guard = re.split(r"\s{2,}#\s", first, maxsplit=1)[0].strip()  # torch pads the guard, then "# <source line>"
    frames = _traceback_sites(reason)
    named = next((s for s in reversed(frames) if is_user_file(s.file)), None)
    return guard, reason, named


def _caller(key: tuple[str, int, str], entry: _Entry) -> Site | None:
    """The innermost user frame calling the code that is not the code itself (a resume runs inside its parent)."""
    file, _, name = key
    for site in entry.stack:
        if not (site.file == file and (site.function == name or _RESUME.match(site.function))):
            return site
    return None


def _breaks(records: Sequence[_BreakRecord]) -> tuple[GraphBreak, ...]:
    """One GraphBreak per (site, kind of break), counted once per compile that met it."""
    compiles: dict[tuple[Site | None, str], set[str]] = {}
    first: dict[tuple[Site | None, str], _BreakRecord] = {}
    for r in records:
        key = (r.site, r.title)
        compiles.setdefault(key, set()).add(r.compile_id)
        first.setdefault(key, r)
    return tuple(
        GraphBreak(site, title, r.gb_id, r.reason, len(ids), r.skipped, r.inside, r.library)
        for (site, title), ids in compiles.items()
        for r in (first[site, title],)
    )
