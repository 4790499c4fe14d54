"""The ``if`` in a training loop that runs a piece of work (``if rank == 0 and step % 2 == 0: evaluate()``): the
branch a lower cadence makes rarer, found from the line the work was measured at."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ..sites import Site
from .source import SourceIndex, dotted_name

__all__ = ["Branch", "RANK_TEST", "branch_running"]

# Names a test of which process this is: ``rank == 0``, ``dist.get_rank() == 0``, ``is_main_process``, ...
RANK_TEST = re.compile(
    r"\b(rank|local_rank|global_rank|node_rank|get_rank|is_main_process|is_local_main_process|master_process"
    r"|is_master|is_global_zero|main_process)\b"
)


@dataclass(frozen=True)
class Branch:
    """An ``if`` of a loop whose body runs the work, and whose test is a period or a rank (no other condition:
    making ``if val_loss < best:`` rarer would drop work the script means to do)."""

    site: Site  # the ``if``'s own line
    call: str | None  # the function its body calls to run the work (None: the work's line is in its body)
    call_line: int  # the line of that call, or of the work itself
    period: int | None  # K of ``step % K`` in its test (a literal, or one top-level ``K = <int>``); None: not known


def _body_span(node: ast.If) -> tuple[int, int]:
    return node.body[0].lineno, max(getattr(n, "end_lineno", None) or n.lineno for n in node.body)


def _call_of(node: ast.If, function: str) -> ast.Call | None:
    return next(
        (
            n
            for stmt in node.body
            for n in ast.walk(stmt)
            if isinstance(n, ast.Call) and dotted_name(n.func).split(".")[-1] == function
        ),
        None,
    )


def _top_level_int(index: SourceIndex, name: str) -> int | None:
    """The value of ``name`` when the module binds it once, at top level, to an integer literal."""
    bound = [
        n
        for n in ast.walk(index.tree)
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        and any(isinstance(t, ast.Name) and t.id == name for t in getattr(n, "targets", [getattr(n, "target", None)]))
    ]
    if len(bound) != 1 or bound[0] not in index.tree.body or not isinstance(bound[0], ast.Assign):
        return None
    value = bound[0].value
    return value.value if isinstance(value, ast.Constant) and type(value.value) is int else None


def _divisors(test: ast.expr) -> list[ast.expr]:
    """The right-hand sides of the ``%`` in ``test``: ``EVERY`` of ``step % EVERY == 0``."""
    return [n.right for n in ast.walk(test) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)]


def _period(index: SourceIndex, divisors: list[ast.expr]) -> int | None:
    """The period of one ``%``'s divisor: a literal, or one top-level ``NAME = <int>``."""
    if len(divisors) != 1:
        return None
    divisor = divisors[0]
    if isinstance(divisor, ast.Constant) and type(divisor.value) is int:
        return divisor.value
    return _top_level_int(index, divisor.id) if isinstance(divisor, ast.Name) else None


def _function_at(sources: dict[str, SourceIndex], site: Site) -> str | None:
    """The ``def`` that holds ``site``'s line: its own name, or for a generator expression, comprehension or
    lambda (``<genexpr>``) the function around it."""
    if site.function and not site.function.startswith("<"):
        return site.function
    index = sources.get(site.file)
    if index is None:
        return None
    defs = [
        n
        for n in ast.walk(index.tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.lineno <= site.line <= (n.end_lineno or 0)
    ]
    return min(defs, key=lambda n: (n.end_lineno or 0) - n.lineno).name if defs else None


def branch_running(sources: dict[str, SourceIndex], site: Site) -> Branch | None:
    """The innermost ``if`` of a loop whose body holds ``site``'s line or calls its function, when exactly one does
    and its test is a period (``%``) or a rank test; else None."""
    function = _function_at(sources, site)
    holding: list[tuple[SourceIndex, ast.If, ast.Call | None]] = []
    for index in sources.values():
        for node in ast.walk(index.tree):
            if not isinstance(node, ast.If) or not index.in_direct_loop(node):
                continue
            first, last = _body_span(node)
            if index.path == site.file and first <= site.line <= last:
                holding.append((index, node, None))
            elif function is not None:
                call = _call_of(node, function)
                if call is not None:
                    holding.append((index, node, call))
    # An ``if`` that holds another of them is not the innermost.
    innermost = [
        h
        for h in holding
        if not any(o is not h and o[0] is h[0] and o[1] is not h[1] and _inside(o[1], h[1]) for o in holding)
    ]
    if len(innermost) != 1:
        return None
    index, node, call = innermost[0]
    text = ast.get_source_segment(index.text, node.test) or ""
    divisors = _divisors(node.test)
    if not divisors and not RANK_TEST.search(text):
        return None
    period = _period(index, divisors)
    return Branch(
        site=index.site(node),
        call=function if call is not None else None,
        call_line=call.lineno if call is not None else site.line,
        period=period if period is not None and period >= 1 else None,
    )


def _inside(inner: ast.If, outer: ast.If) -> bool:
    first, last = _body_span(outer)
    return first <= inner.lineno <= last
