"""The cadences of the loop that is running: the ``if step % N == 0:`` tests of the loops around the user's
lines on the stack, with ``N`` read from the source, or for a name (``eval_interval``, ``args.eval_every``) from
the running frame's variables: read, never evaluated, so nothing of the script runs.

The window reads them when it ends, to know how long to keep watching the step clock for work that recurs
at a period far longer than the window (an evaluation every 300 steps).
"""

from __future__ import annotations

import ast
import inspect
import os
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any, Iterator, TypeGuard

from ..sites import Site, is_user_file

__all__ = ["Cadence", "running_cadences", "in_steps", "syntax_tree"]

_NO_VALUE = object()


@dataclass(frozen=True, slots=True)
class Cadence:
    """An ``if`` whose test holds ``... % every``: what its body runs comes back every ``every`` steps.

    An ``if`` in a loop around the one that steps (``if epoch % 10 == 0:`` around the batches) counts that
    loop's iterations: it is ``outer`` until :func:`in_steps` turns ``every`` into steps (``per_count`` steps
    an iteration, from two readings of its ``count``)."""

    site: Site  # the ``if``
    every: int
    calls: tuple[str, ...] = ()  # the functions its body calls (``estimate_loss``, ``save``), by name
    outer: bool = False  # counts the iterations of a loop around the stepping one, not steps
    count: int | None = None  # the tested counter's value when read (None: not a plain variable)
    per_count: float = 1.0  # steps per unit of the counter


_TREES: dict[str, tuple[float, ast.Module | None]] = {}


def syntax_tree(filename: str) -> ast.Module | None:
    """The file's syntax tree, parsed once per modification time (None: unreadable or not Python)."""
    try:
        mtime = os.stat(filename).st_mtime
    except OSError:
        return None
    cached = _TREES.get(filename)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    try:
        with open(filename, encoding="utf-8") as fh:
            tree: ast.Module | None = ast.parse(fh.read(), filename)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        tree = None
    _TREES[filename] = (mtime, tree)
    return tree


def _loops_around(tree: ast.AST, line: int) -> list[ast.For | ast.While | ast.AsyncFor]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor))
        and node.lineno <= line <= (node.end_lineno or node.lineno)
    ]


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_LOOPS = (ast.For, ast.While, ast.AsyncFor)


def _body_nodes(loop: ast.AST, into_loops: bool = True) -> Iterator[ast.AST]:
    """The nodes under a loop, not those of functions or classes defined inside it, nor, ``into_loops=False``,
    those of the loops inside it (where a ``break`` ends that loop, not this one)."""
    stack = list(ast.iter_child_nodes(loop))
    while stack:
        node = stack.pop()
        if isinstance(node, _SCOPES) or (not into_loops and isinstance(node, _LOOPS)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _ifs_in(loop: ast.AST, into_loops: bool = True) -> list[ast.If]:
    """The ``if`` statements of a loop's body (:func:`_body_nodes`)."""
    return [node for node in _body_nodes(loop, into_loops) if isinstance(node, ast.If)]


def _lookup(frame: FrameType, name: str) -> Any:
    local = frame.f_locals
    if name in local:
        return local[name]
    return frame.f_globals.get(name, _NO_VALUE)


def _value(node: ast.expr, frame: FrameType) -> Any:
    """A literal, a name or a chain of attributes, read from the frame without running anything."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return _lookup(frame, node.id)
    if isinstance(node, ast.Attribute):
        base = _value(node.value, frame)
        if base is _NO_VALUE:
            return _NO_VALUE
        found = _static(base, node.attr)
        return found if isinstance(found, int) else _NO_VALUE
    return _NO_VALUE


def _count(node: ast.expr, frame: FrameType) -> int | None:
    """The counter a ``%`` tests (``step``, ``epoch + 1``, ``self.it``), read from the frame; None otherwise."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left, right = _count(node.left, frame), _value(node.right, frame)
        if left is None or not isinstance(right, int) or isinstance(right, bool):
            return None
        return left + right if isinstance(node.op, ast.Add) else left - right
    value = _value(node, frame)
    return value if _plain_int(value) else None


def _periods(test: ast.expr, frame: FrameType) -> list[tuple[int, int | None]]:
    """``(every, the counter's value now)`` of each ``counter % every`` in ``test``."""
    out = []
    for node in ast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            value = _value(node.right, frame)
            if _plain_int(value) and value >= 2:
                out.append((value, _count(node.left, frame)))
    return out


def _called(body: list[ast.stmt]) -> tuple[str, ...]:
    names = []
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
                if name:
                    names.append(name)
    return tuple(dict.fromkeys(names))


def _at(frame: FrameType) -> list[Cadence]:
    code = frame.f_code
    tree = syntax_tree(code.co_filename)
    if tree is None:
        return []
    out = []
    loops = _loops_around(tree, frame.f_lineno)
    stepping = max(loops, key=lambda loop: loop.lineno, default=None)  # the innermost: it holds the step
    for loop in loops:
        for node in _ifs_in(loop):
            outer = stepping is not None and not (stepping.lineno <= node.lineno <= (stepping.end_lineno or 0))
            for every, count in _periods(node.test, frame):
                site = Site(code.co_filename, node.lineno, code.co_name)
                out.append(Cadence(site, every, _called(node.body), outer=outer, count=count))
    return out


def in_steps(now: tuple[Cadence, ...], before: tuple[Cadence, ...], steps_between: int) -> tuple[Cadence, ...]:
    """``now``'s cadences with every period in steps: an outer loop's, from how far its counter moved over
    ``steps_between`` steps since ``before`` was read. One whose counter did not move (its iterations are longer
    than that) or could not be read is left out: its period in steps is not known."""
    earlier = {(c.site, c.every): c.count for c in before}
    out = []
    for cadence in now:
        if not cadence.outer:
            out.append(cadence)
            continue
        start = earlier.get((cadence.site, cadence.every))
        if cadence.count is None or start is None or cadence.count <= start or steps_between <= 0:
            continue
        per = steps_between / (cadence.count - start)
        out.append(replace(cadence, every=max(2, round(cadence.every * per)), per_count=round(per, 2)))
    return tuple(out)


def running_cadences(frame: FrameType | None, max_depth: int = 64) -> tuple[Cadence, ...]:
    """Every cadence of the loops that hold the user's frames at or above ``frame`` (the training loop and the
    loops around it), innermost frame first."""
    out: list[Cadence] = []
    depth = 0
    while frame is not None and depth < max_depth:
        if is_user_file(frame.f_code.co_filename):
            try:
                out += _at(frame)
            except Exception:  # noqa: BLE001 - reading the user's source must never cost the recording
                pass
        frame = frame.f_back
        depth += 1
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class PlannedLoop:
    """The loop that steps, where its length is read from its frame: a ``for ... in range(...)`` (how many
    iterations it runs in all), or a ``while`` its counter ends (``left``: the iterations from the current one on,
    the current one included); with its counter's value when read (to tell iterations from steps)."""

    site: Site  # the ``for``, or what ends the ``while`` (its test, or the ``if ...: break``)
    code: str  # as written ("range(args.num_iterations + 1)", "if iter_num > max_iters: break")
    iterations: int
    counter: int | None  # the loop variable's value when read; None where it is not a plain int
    left: bool = False  # ``iterations`` counts those left, not the whole loop's
    by: int = 1  # what an iteration adds to the counter (a range's step)


def planned_loop(frame: FrameType | None, max_depth: int = 64) -> PlannedLoop | None:
    """The innermost loop of the first user frame at or above ``frame`` that runs inside one, when it is
    ``for name in range(...)`` with bounds read from the frame without running anything, times the loops of that
    frame around it, each such a ``for`` too (epochs of steps); or a ``while`` that a counter it adds to ends
    (:func:`_counted_while`), alone in its frame; or a framework trainer's run (:func:`_trainer_run`). None
    otherwise (a loop over a DataLoader, bounds that are calls, or a loop in a frame further up, which would repeat
    it)."""
    trainer = _trainer_run(frame, max_depth)
    if trainer is not None:
        return trainer
    found: PlannedLoop | None = None
    depth = 0
    while frame is not None and depth < max_depth:
        if is_user_file(frame.f_code.co_filename):
            try:
                tree = syntax_tree(frame.f_code.co_filename)
                loops = _loops_around(tree, frame.f_lineno) if tree is not None else []
            except Exception:  # noqa: BLE001 - reading the user's source must never cost the recording
                return None
            if loops and found is not None:
                return None  # the stepping loop runs again on each iteration of a loop further up
            if loops:
                found = _ranged(sorted(loops, key=lambda loop: loop.lineno), frame)
                if found is None:
                    return None
        frame = frame.f_back
        depth += 1
    return found


def _ranged(loops: list[ast.For | ast.While | ast.AsyncFor], frame: FrameType) -> PlannedLoop | None:
    """The innermost of ``loops`` (outermost first) as a PlannedLoop, its iterations times the outer ones'."""
    if isinstance(loops[-1], ast.While):
        return _counted_while(loops[-1], frame) if len(loops) == 1 else None
    iterations = 1
    for loop in loops:
        call = loop.iter if isinstance(loop, ast.For) else None
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "range"):
            return None
        bounds = [_count(arg, frame) for arg in call.args]
        if call.keywords or not 1 <= len(bounds) <= 3 or any(b is None for b in bounds):
            return None
        if len(bounds) == 3 and not bounds[2]:
            return None
        steps = range(*bounds)  # type: ignore[arg-type]  # ints: None was ruled out above
        iterations *= len(steps)
    innermost = loops[-1]
    assert isinstance(innermost, ast.For) and isinstance(innermost.iter, ast.Call)
    counter = _count(innermost.target, frame) if isinstance(innermost.target, ast.Name) else None
    site = Site(frame.f_code.co_filename, innermost.lineno, frame.f_code.co_name)
    code = " x ".join(ast.unparse(loop.iter) for loop in loops if isinstance(loop, ast.For))
    return PlannedLoop(site, code, iterations, counter, by=steps.step)  # the innermost range's step


# How a comparison that ends a loop, ``counter OP bound``, sets the counter's value at the end (its bound plus this):
# when it breaks out (``if it > max_iters: break``) and when it is the ``while``'s own test (``while it < n:``).
_BREAKS_AT = {ast.Gt: 1, ast.GtE: 0, ast.Eq: 0}
_RUNS_WHILE = {ast.Lt: 0, ast.LtE: 1, ast.NotEq: 0}
_MIRRORED: dict[type[ast.cmpop], type[ast.cmpop]] = {ast.Gt: ast.Lt, ast.Lt: ast.Gt, ast.GtE: ast.LtE, ast.LtE: ast.GtE}


def _counted_while(loop: ast.While, frame: FrameType) -> PlannedLoop | None:
    """A ``while`` whose end a counter sets: the loop adds a constant to it (``iter_num += 1``) and its test, or an
    ``if`` in its body that only breaks, compares it with a bound read from the frame (nanoGPT: ``while True:``
    ... ``if iter_num > max_iters: break``); the iterations left from the counter's value now. None otherwise."""
    added = _added_each_iteration(loop)
    ends: list[tuple[ast.expr, dict[type[ast.cmpop], int], ast.stmt, str]] = []
    if not (isinstance(loop.test, ast.Constant) and loop.test.value):
        ends.append((loop.test, _RUNS_WHILE, loop, f"while {ast.unparse(loop.test)}"))
    for node in _ifs_in(loop, into_loops=False):
        if _spent(node.test, added, frame):
            continue  # it cannot break any more
        if any(isinstance(stmt, ast.Break) for stmt in node.body):
            ends.append((node.test, _BREAKS_AT, node, f"if {ast.unparse(node.test)}: break"))
    if len(ends) != 1:
        return None  # several ways out: the first to come is not known
    test, offsets, where, code = ends[0]
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    op, left, right = type(test.ops[0]), test.left, test.comparators[0]
    key = _target_key(left)
    if key not in added:
        op, left, right = _MIRRORED.get(op, op), right, left
        key = _target_key(left)
    if key not in added or op not in offsets:
        return None
    counter, bound, (by, added_at) = _count(left, frame), _count(right, frame), added[key]
    if counter is None or bound is None:
        return None
    # The value this iteration started with: where the loop adds to its counter before the line running now, less.
    started = counter - by if added_at < frame.f_lineno else counter
    left_over = -(-(bound + offsets[op] - started) // by)  # iterations from this one on, rounded up
    if left_over < 1:
        return None
    site = Site(frame.f_code.co_filename, where.lineno, frame.f_code.co_name)
    return PlannedLoop(site, code, left_over, counter, left=True, by=by)


def _spent(test: ast.expr, added: dict[str, tuple[int, int]], frame: FrameType) -> bool:
    """Whether a test that breaks out can no longer hold: one of its ``and``-ed parts is a flag that is False now
    (nanoGPT's ``if iter_num == 0 and eval_only: break``), or asks a counter that only grows to equal a value it
    has passed."""
    for part in test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]:
        if isinstance(part, (ast.Name, ast.Attribute)) and _value(part, frame) is False:
            return True
        if isinstance(part, ast.Compare) and len(part.ops) == 1 and isinstance(part.ops[0], ast.Eq):
            for counter, value in ((part.left, part.comparators[0]), (part.comparators[0], part.left)):
                now, target = _count(counter, frame), _count(value, frame)
                if _target_key(counter) in added and now is not None and target is not None and now > target:
                    return True
    return False


def _added_each_iteration(loop: ast.While) -> dict[str, tuple[int, int]]:
    """``name += k`` (k a positive int literal) in the loop's body outside inner loops and functions, as (k, its
    line) by the target's :func:`_target_key`; a target also assigned otherwise there is left out (its progress
    is not known)."""
    added: dict[str, tuple[int, int]] = {}
    other: set[str] = set()
    for node in _body_nodes(loop, into_loops=False):
        if isinstance(node, ast.AugAssign):
            key = _target_key(node.target)
            step = node.value.value if isinstance(node.value, ast.Constant) else None
            if isinstance(node.op, ast.Add) and _plain_int(step) and step > 0 and key not in added:
                added[key] = (step, node.lineno)
            else:
                other.add(key)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            other.update(_target_key(t) for t in targets)
    return {key: step for key, step in added.items() if key not in other}


def _target_key(node: ast.expr) -> str:
    """A counter's identity: the same name or attribute chain read (Load) and written (Store) dumps alike."""
    return ast.dump(_as_load(node))


def _as_load(node: ast.expr) -> ast.expr:
    if isinstance(node, ast.Name):
        return ast.Name(node.id, ast.Load())
    if isinstance(node, ast.Attribute):
        return ast.Attribute(_as_load(node.value), node.attr, ast.Load())
    return node


def _trainer_run(frame: FrameType | None, max_depth: int) -> PlannedLoop | None:
    """A framework's trainer training on the stack (a Hugging Face ``Trainer``, a Lightning ``Trainer``): the steps
    it has left, from attributes read statically (nothing called), at the script's line that called it (the first
    user frame out of the trainer's own methods); None otherwise, or where its settings leave the length open."""
    depth, owner, steps = 0, None, None
    while frame is not None and depth < max_depth and owner is None:
        candidate = frame.f_locals.get("self")
        if candidate is not None and _is_class(candidate, "Trainer", ("transformers.trainer",)):
            owner, steps = candidate, _hf_trainer_steps(candidate)
        elif candidate is not None and _is_class(candidate, "Trainer", _LIGHTNING):
            owner, steps = candidate, _lightning_steps(candidate)
        frame, depth = frame.f_back, depth + 1
    if steps is None or not steps[0] > steps[1] >= 0:
        return None
    while frame is not None and depth < max_depth:
        if is_user_file(frame.f_code.co_filename) and frame.f_locals.get("self") is not owner:
            total, done, said = steps
            site = Site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
            return PlannedLoop(site, said, total - done, done, left=True)
        frame, depth = frame.f_back, depth + 1
    return None


_LIGHTNING = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")


def _is_class(obj: object, name: str, modules: tuple[str, ...]) -> bool:
    return any(cls.__name__ == name and cls.__module__ in modules for cls in type(obj).__mro__)


def _hf_trainer_steps(trainer: object) -> tuple[int, int, str] | None:
    """``state.max_steps`` and ``state.global_step``: it counts the optimizer steps before this one (it is added
    to after the step)."""
    state = _static(trainer, "state")
    total, done = _static(state, "max_steps"), _static(state, "global_step")
    return (total, done, "Trainer.state.max_steps") if _plain_int(total) and _plain_int(done) else None


def _lightning_steps(trainer: object) -> tuple[int, int, str] | None:
    """``max_steps``, or ``max_epochs`` of the epoch's batches over ``accumulate_grad_batches`` (the fewer where
    both are set), and the batches that stepped before this one (added to after the step)."""
    fit = _static(trainer, "fit_loop")
    epoch = _static(fit, "epoch_loop")
    max_steps, max_epochs = _static(epoch, "max_steps"), _static(fit, "max_epochs")
    batches, every = _static(fit, "max_batches"), _static(trainer, "accumulate_grad_batches")
    done = _static(epoch, "_batches_that_stepped")
    limits = []
    if _plain_int(max_steps) and max_steps > 0:
        limits.append((max_steps, f"Trainer(max_steps={max_steps})"))
    if _plain_int(max_epochs) and max_epochs > 0 and _plain_int(batches) and _plain_int(every) and every > 0:
        limits.append((max_epochs * -(-batches // every), f"Trainer(max_epochs={max_epochs})"))
    if not limits or not _plain_int(done):
        return None
    total, said = min(limits)
    return total, done, said


def _static(obj: object, name: str) -> Any:
    """``obj.name`` without running anything (no property, no ``__getattr__``); None where it has none."""
    try:
        return inspect.getattr_static(obj, name)
    except AttributeError:
        return None


def _plain_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
