"""A rank runs one ``if`` of its script on fewer of its passes (the job what-if of a lower cadence): the script is
compiled with that ``if``'s test wrapped, so the body runs on one in N of the passes the test allows, as the same
test with a period N times longer would. Every other line compiles as it is, at its own line number."""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path
from types import CodeType
from typing import Any, Callable

from .change import APPLIED

__all__ = ["TAKE", "rarer_branch_code", "taking_one_in"]

# The name the wrapped test calls, bound in the script's globals (runner.run_script's ``init_globals``).
TAKE = "__turbotrain_rarer_branch__"


def rarer_branch_code(script: str, at: str, every: int) -> CodeType:
    """``script`` compiled with the ``if`` at ``at`` (``file:line``) calling :data:`TAKE` on its test."""
    file, _, line = at.rpartition(":")
    if os.path.realpath(file) != os.path.realpath(script) or not line.isdigit():
        raise ValueError(f"the branch to make rarer, {at}, is not a line of the script the rank runs ({script})")
    source = importlib.util.decode_source(Path(script).read_bytes())  # honours a coding cookie, as python does
    tree = ast.parse(source, filename=script)
    found = [n for n in ast.walk(tree) if isinstance(n, ast.If) and n.lineno == int(line)]
    if len(found) != 1:
        raise ValueError(f"{at}: no `if` starts on this line of {script} (the script changed since the run?)")
    node = found[0]
    node.test = ast.copy_location(ast.Call(ast.Name(TAKE, ast.Load()), [node.test], []), node.test)
    ast.fix_missing_locations(tree)
    # dont_inherit: the script's own __future__ imports, not this module's.
    return compile(tree, script, "exec", dont_inherit=True)


def taking_one_in(every: int) -> Callable[[Any], Any]:
    """The test's wrapper: of the passes its test allows, the body runs on every ``every``-th (the N-th, 2N-th...,
    as ``(step + 1) % N == 0`` would), the others see a false test."""
    allowed = 0

    def take(value: Any) -> Any:
        nonlocal allowed
        if not value:
            return value
        allowed += 1
        if allowed % every:
            APPLIED["branch passes skipped"] += 1
            return False
        APPLIED["branch passes taken"] += 1
        return value

    return take
