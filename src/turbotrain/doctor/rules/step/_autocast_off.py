"""slow-mixed-precision's edit: ``enabled=False`` on the autocast around the forward (libcst, only for --fix).

Not a rule (the leading ``_`` keeps it out of the rule registry): the rule module imports it when it edits, so a
doctor run without the ``fix`` extra never imports libcst.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import libcst as cst

from ...cst_tools import code_of, dotted, keyword_value, replace, set_keyword
from ...edits import ByHand

if TYPE_CHECKING:
    from ...cst_tools import Source
    from ...edits import EditRequest

__all__ = ["autocast_off"]


# torch's autocast entry points and where each takes ``enabled`` and ``dtype`` positionally. A framework's own
# ``accelerator.autocast()``/``fabric.autocast()`` takes neither: its precision flag is the fix there.
_POSITIONS = {
    "torch.autocast": (2, 1),
    "torch.amp.autocast": (2, 1),
    "amp.autocast": (2, 1),
    "autocast": (
        2,
        1,
    ),  # from torch import autocast (torch.cuda.amp's takes enabled first: positional ones are refused)
    "torch.cuda.amp.autocast": (0, 1),
    "torch.cpu.amp.autocast": (0, 1),
}


def _autocast_calls(node: cst.CSTNode) -> list[cst.Call]:
    """torch's autocast calls in ``node`` (``torch.autocast``, ``torch.amp.autocast``, ``torch.cuda.amp.autocast``,
    a bare imported ``autocast``)."""
    found: list[cst.Call] = []

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if dotted(call.func) in _POSITIONS:
                found.append(call)

    node.visit(_Calls())
    return found


def _bound_to(source: Source, name: str) -> list[cst.Call]:
    """The autocast calls in the values the file assigns to ``name`` (``ctx = nullcontext() if ... else
    torch.amp.autocast(...)``; ``with ctx:`` enters it)."""
    calls: list[cst.Call] = []
    for node in source.nodes(cst.Assign):
        if any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets):
            calls += _autocast_calls(node.value)
    for ann in source.nodes(cst.AnnAssign):
        if isinstance(ann.target, cst.Name) and ann.target.value == name and ann.value is not None:
            calls += _autocast_calls(ann.value)
    return calls


def _around(source: Source, req: EditRequest) -> list[cst.Call]:
    """The autocast calls the ``with`` statements around the finding's line enter, innermost first."""
    statement = source.statement_line(req.line)
    for node in [statement, *source.ancestors(statement)]:
        if not isinstance(node, cst.With):
            continue
        for item in node.items:
            value = item.item
            calls = _bound_to(source, value.value) if isinstance(value, cst.Name) else _autocast_calls(value)
            if calls:
                return calls
    return []


def _positional(call: cst.Call) -> list[cst.Arg]:
    return [a for a in call.args if a.keyword is None and not a.star]


def _dtype_of(call: cst.Call) -> str | None:
    arg = keyword_value(call, "dtype")
    if arg is None:
        at = _POSITIONS[dotted(call.func)][1]
        args = _positional(call)
        arg = args[at] if len(args) > at else None
    return code_of(arg.value) if arg is not None else None


def _off_already(call: cst.Call) -> bool:
    enabled = keyword_value(call, "enabled")
    return enabled is not None and code_of(enabled.value) == "False"


def autocast_off(source: Source, req: EditRequest) -> str:
    """``enabled=False`` on the autocast the training forward runs under, and on every other autocast call of the
    file written with the same ``dtype=`` (the same device, the same slow units); calls already off are left."""
    around = _around(source, req)
    if not around:
        raise ByHand(
            f"{req.where}: no `with torch.autocast(...)` around the forward in this file (a framework's precision "
            "setting, a decorator or a caller turns it on); switch it off there (float32 / precision='32-true')"
        )
    dtypes = {_dtype_of(c) for c in around}
    # A dtype left to the device's default says nothing of which other calls share it: only those around.
    likes = [c for c in _autocast_calls(source.module) if _dtype_of(c) in dtypes] if None not in dtypes else []
    calls = [c for c in {id(c): c for c in [*around, *likes]}.values() if not _off_already(c)]
    where = f"{source.name}:{req.line}"
    for call in calls:
        enabled = keyword_value(call, "enabled")
        if enabled is not None and code_of(enabled.value) != "True":
            raise ByHand(
                f"{source.name}:{source.lines(call)[0]}: autocast is turned on by `enabled={code_of(enabled.value)}`; "
                "turn that off on this machine"
            )
        name = dotted(call.func)
        if name == "autocast" and len(_positional(call)) > 1:
            raise ByHand(
                f"{source.name}:{source.lines(call)[0]}: `autocast` takes positional arguments here, and which "
                "autocast it is (torch's or torch.cuda.amp's) decides what they mean; add enabled=False by hand"
            )

    def off(node: cst.CSTNode) -> cst.Call:
        call = cast(cst.Call, node)
        return set_keyword(call, "enabled", "False", _POSITIONS[dotted(call.func)][0], where)

    if not calls:
        raise ByHand(f"{where}: the autocast around the forward is already off (enabled=False)")
    return replace(source, {call: off for call in calls})
