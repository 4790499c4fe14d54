"""Autograd graphs kept alive across training steps: a loss kept in a list, a running sum without
``.detach()``. :class:`GraphWatch` counts the graphs alive at a few step boundaries and names the user's variable
whose count grows, and the line that adds to it; at the same boundaries, the tensors each of the user's containers
holds (graph or not): one that keeps a tensor every step is memory that grows with the run."""

from __future__ import annotations

import ast
import gc
import inspect
import sys
import textwrap
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..sites import Site, is_user_file
from .memory_watch import storages

__all__ = ["GraphGrowth", "TensorGrowth", "GraphWatch", "sampling_at_optimizer_steps"]


@dataclass(frozen=True, slots=True)
class GraphGrowth:
    """Autograd graphs alive at sampled step boundaries: tensors that have a ``grad_fn``, the graph nodes they
    keep, and the bytes of those tensors and of the saved tensors their graphs still hold."""

    steps: tuple[int, ...]
    tensors: tuple[int, ...]
    nodes: tuple[int, ...]
    bytes: tuple[int, ...]
    growing: bool  # more tensors with a grad_fn at every sample than at the one before
    # The least growth per step over the intervals between samples (0 when any interval did not grow).
    tensors_per_step: float
    nodes_per_step: float
    bytes_per_step: float
    holder: str = ""  # the user's variable whose count grew, e.g. "losses"
    site: Site | None = None  # the line that adds to it (or the holder's frame's line)


@dataclass(frozen=True, slots=True)
class TensorGrowth:
    """A container of the user's (a list, a dict, a deque) holding more tensors at every sampled step boundary:
    how many and their bytes at each, the least growth per step, and the line that adds to it."""

    holder: str
    steps: tuple[int, ...]
    tensors: tuple[int, ...]
    bytes: tuple[int, ...]
    bytes_per_step: float
    device: str  # where the tensors it keeps are ("cpu", "cuda:0")
    with_graphs: bool  # the tensors carry autograd graphs (graph-kept-alive's case)
    site: Site | None = None


_GROWS = frozenset({"append", "extend", "insert", "add", "appendleft", "update", "setdefault"})
_SAVED_NAMES: dict[type, tuple[str, ...]] = {}  # node type -> its "_saved_*" attributes (dir() is slow per node)


@dataclass
class _Census:
    tensors: int
    nodes: int
    bytes: int
    holders: dict[tuple[CodeType, str], int] = field(default_factory=dict)
    # Every container of the user's frames that holds tensors: (tensors, bytes of their distinct storages, device).
    kept: dict[tuple[CodeType, str], tuple[int, int, str]] = field(default_factory=dict)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


class GraphWatch:
    """Counts the autograd graphs alive at step boundaries (``sample`` at three or more), then says whether they
    grow: a clean loop holds the same few (this step's loss) at every boundary, a loop that keeps its losses
    holds one more each step. Each sample walks the garbage collector's objects: sample a few steps only."""

    def __init__(self) -> None:
        self._samples: list[tuple[int, _Census]] = []
        self._frames: dict[CodeType, int] = {}  # a holder's frame's line at its last sample

    @property
    def samples(self) -> int:
        """How many boundaries were counted."""
        return len(self._samples)

    def sample(self, step: int, frame: FrameType | None = None) -> None:
        """Count now; ``frame`` (default: the caller's) and the frames above it are searched for holders."""
        frame = frame if frame is not None else sys._getframe(1)
        self._samples.append((step, self._census(frame)))

    def _census(self, frame: FrameType | None) -> _Census:
        # type(), not isinstance(): a deprecated proxy among the objects warns when asked its __class__. Plain
        # tensors and parameters only: torch.compile's fake tensors carry graphs of their own tracing, not the loop's.
        roots = [o for o in gc.get_objects() if type(o) in _PLAIN and _grad_fn(o) is not None]
        nodes, saved = _walk(_grad_fn(t) for t in roots)
        census = _Census(len(roots), nodes, sum({**storages(roots), **storages(saved)}.values()))
        while frame is not None:
            if is_user_file(frame.f_code.co_filename):
                self._frames[frame.f_code] = frame.f_lineno
                for name, value in list(frame.f_locals.items()):
                    count = _grad_tensors_in(value)
                    if count:
                        census.holders[(frame.f_code, name)] = count
                    tensors = _tensors_in(value)
                    if tensors:
                        kept = storages(tensors)
                        census.kept[(frame.f_code, name)] = (len(tensors), sum(kept.values()), str(tensors[0].device))
            frame = frame.f_back
        return census

    def result(self) -> GraphGrowth | None:
        """The growth between the samples; None before three."""
        if len(self._samples) < 3:
            return None
        steps = tuple(s for s, _ in self._samples)
        counts = [c for _, c in self._samples]
        tensors = tuple(c.tensors for c in counts)
        growing = _grows(steps, tensors)
        holder, site = self._holder(steps, counts) if growing else ("", None)
        nodes, nbytes = tuple(c.nodes for c in counts), tuple(c.bytes for c in counts)
        rates = (_least_rate(steps, tensors), _least_rate(steps, nodes), _least_rate(steps, nbytes))
        return GraphGrowth(steps, tensors, nodes, nbytes, growing, *rates, holder=holder, site=site)

    def kept_result(self) -> TensorGrowth | None:
        """The user's container whose tensors grow at every sample (the one that grows most in bytes); None before
        three samples or where none does."""
        if len(self._samples) < 3:
            return None
        steps = tuple(s for s, _ in self._samples)
        counts = [c for _, c in self._samples]
        found = []
        for key in counts[-1].kept:
            tensors = tuple(c.kept.get(key, (0, 0, ""))[0] for c in counts)
            nbytes = tuple(c.kept.get(key, (0, 0, ""))[1] for c in counts)
            if _grows(steps, tensors) and _grows(steps, nbytes):
                found.append((_least_rate(steps, nbytes), key, tensors, nbytes))
        if not found:
            return None
        rate, (code, name), tensors, nbytes = max(found, key=lambda f: f[0])
        graphs = any(c.holders.get((code, name), 0) for c in counts)
        line = _line_adding_to(code, name) or self._frames[code]
        device = counts[-1].kept[(code, name)][2]
        return TensorGrowth(
            name, steps, tensors, nbytes, rate, device, graphs, Site(code.co_filename, line, code.co_name)
        )

    def _holder(self, steps: tuple[int, ...], counts: list[_Census]) -> tuple[str, Site | None]:
        growing = [key for key in counts[-1].holders if _grows(steps, tuple(c.holders.get(key, 0) for c in counts))]
        if not growing:
            return "", None
        code, name = growing[0]
        line = _line_adding_to(code, name) or self._frames[code]
        return name, Site(code.co_filename, line, code.co_name)


def _intervals(steps: tuple[int, ...], values: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(steps apart, before, after) of consecutive samples. Two samples one boundary apart may fall in the same
    training step: the first step closes only at the second step's optimizer.step (the tracker waits to see
    whether another optimizer steps), so boundaries 1 and 2 both fall in step 1: no growth between those two says
    nothing, and that interval counts only where it grew."""
    pairs = [(s, t - s, a, b) for s, t, a, b in zip(steps, steps[1:], values, values[1:])]
    return [(apart, a, b) for first, apart, a, b in pairs if not (first == 1 and apart == 1 and b <= a)]


def _grows(steps: tuple[int, ...], values: tuple[int, ...]) -> bool:
    """More at every sample than at the one before (boundaries 1 and 2 may hold as many) and more at the end."""
    never_less = all(b >= a for a, b in zip(values, values[1:]))
    return never_less and values[-1] > values[0] and all(b > a for _, a, b in _intervals(steps, values))


def _least_rate(steps: tuple[int, ...], values: tuple[int, ...]) -> float:
    """The least growth per step between samples: a leak's every interval, not a one-off rise."""
    kept = _intervals(steps, values)
    return max(0.0, min((b - a) / max(apart, 1) for apart, a, b in kept)) if kept else 0.0


def _grad_fn(tensor: torch.Tensor) -> Any:
    """``tensor.grad_fn``, or None where torch refuses to give it (a view whose base a later op changed in place
    raises on the attribute itself: FSDP's flat parameters do)."""
    try:
        return tensor.grad_fn
    except RuntimeError:
        return None


def _walk(grad_fns: Iterable[Any], limit: int = 200_000) -> tuple[int, list[torch.Tensor]]:
    """How many distinct graph nodes are reachable from ``grad_fns``, and the saved tensors they still hold."""
    seen: dict[int, Any] = {}  # id -> node, kept alive so that no id is reused during the walk
    saved: list[torch.Tensor] = []
    todo = deque(grad_fns)
    while todo and len(seen) < limit:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        saved += _saved_tensors(node)
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return len(seen), saved


def _saved_tensors(node: Any) -> list[torch.Tensor]:
    names = _SAVED_NAMES.get(type(node))
    if names is None:
        names = _SAVED_NAMES[type(node)] = tuple(n for n in dir(node) if n.startswith("_saved_"))
    out = []
    for name in names:
        try:
            value = getattr(node, name)
        except RuntimeError:
            continue  # freed by the backward that already ran through this node
        out += [v for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, torch.Tensor)]
    return out


def _tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors a container holds directly (a list, a tuple, a set, a deque, a dict's values); [] for anything
    else, a tensor itself included (one variable rebound every step does not grow)."""
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple, set, deque)):
        return []
    return [v for v in value if type(v) in _PLAIN]


def _grad_tensors_in(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(_grad_fn(value) is not None)
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple, set, deque)):
        return 0
    return sum(1 for v in value if isinstance(v, torch.Tensor) and _grad_fn(v) is not None)


def _line_adding_to(code: CodeType, name: str) -> int | None:
    """The first line of ``code``'s function that appends to ``name`` or adds to it in place."""
    try:
        lines, first = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    found = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.stmt | ast.expr) and _adds_to(node, name)]
    return min(found) + max(first, 1) - 1 if found else None


def _adds_to(node: ast.AST, name: str) -> bool:
    if isinstance(node, ast.AugAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _GROWS:
        return isinstance(node.func.value, ast.Name) and node.func.value.id == name
    if isinstance(node, ast.Assign):
        return any(
            isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == name for t in node.targets
        )
    return False


@contextmanager
def sampling_at_optimizer_steps(watch: GraphWatch, steps: Iterable[int] = (2, 3, 4, 5)) -> Iterator[GraphWatch]:
    """Sample ``watch`` after the given optimizer steps (1-based; of the first optimizer that steps)."""
    wanted = set(steps)
    first: list[int] = []  # the id of the first optimizer that steps
    count = 0

    def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        nonlocal count
        first[:] = first or [id(optimizer)]
        if id(optimizer) == first[0]:
            count += 1
            if count in wanted:
                watch.sample(count, sys._getframe(1))

    handle = register_optimizer_step_post_hook(hook)
    try:
        yield watch
    finally:
        handle.remove()
