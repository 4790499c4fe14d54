"""The edit that recomputes a block in the backward: its call wrapped in ``torch.utils.checkpoint.checkpoint``."""

from __future__ import annotations

from typing import Callable

import libcst as cst

from ..cst_tools import Source, code_of
from ..cst_tools import replace as replace_nodes
from .model import ByHand, EditRequest

__all__ = ["checkpoint_calls"]

_NO_SPACE_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _names_block(source: Source, call: cst.Call, block: str) -> bool:
    """``call`` calls the submodule ``block`` from a forward above it: ``self.wide(...)`` for ``wide`` (or
    ``enc.wide``); for an element of a list (``blocks.0``), ``self.blocks[0](...)`` or the variable of a ``for``
    over ``self.blocks``. A forward further up reaches it by more of its path: nanoGPT's model calls
    ``transformer.h.0`` as the variable of ``for block in self.transformer.h`` (its ``ModuleDict`` never runs)."""
    *path, last = block.split(".")
    callee = code_of(call.func)
    if not last.isdigit():
        return callee in {f"self.{'.'.join([*path[i:], last])}" for i in range(len(path) + 1)}
    if not path:
        return False
    holders = {f"self.{'.'.join(path[i:])}" for i in range(len(path))}
    if any(callee == f"{holder}[{last}]" for holder in holders):
        return True
    for loop in (a for a in source.ancestors(call) if isinstance(a, cst.For)):
        iterated = code_of(loop.iter)
        if isinstance(loop.target, cst.Name) and loop.target.value == callee and iterated in holders:
            return True
    return False


def _block_call(source: Source, line: int, blocks: list[str]) -> cst.Call | None:
    """The call starting at ``line`` that calls one of ``blocks``."""
    for call in source.nodes(cst.Call):
        if source.lines(call)[0] == line and any(_names_block(source, call, b) for b in blocks):
            return call
    return None


def _checkpointed(call: cst.CSTNode, torch_name: str) -> cst.Call:
    assert isinstance(call, cst.Call)  # checkpoint_calls hands over calls only
    args = [cst.Arg(call.func), *call.args]
    return call.with_changes(
        func=cst.parse_expression(f"{torch_name}.utils.checkpoint.checkpoint"),
        args=[*args, cst.Arg(cst.Name("False"), keyword=cst.Name("use_reentrant"), equal=_NO_SPACE_EQUAL)],
    )


def checkpoint_calls(source: Source, req: EditRequest) -> str:
    """``x = torch.utils.checkpoint.checkpoint(self.wide, x, use_reentrant=False)`` for ``x = self.wide(x)`` at each
    line that calls one of the blocks (``params["blocks"]``: their qualified names in the model)."""
    torch_name = source.alias_of("torch")
    if torch_name is None:
        raise ByHand(
            f"{req.where}: the file does not `import torch`; wrap the block's call in "
            "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) by hand"
        )
    blocks = [str(b) for b in req.params.get("blocks") or ()]
    edits: dict[cst.CSTNode, Callable[[cst.CSTNode], object]] = {}
    for line in (req.line, *req.lines):
        call = _block_call(source, line, blocks)
        if call is None:
            raise ByHand(
                f"{source.name}:{line}: no call of {' or '.join(blocks)} starts here to recompute (the "
                "line changed since the run?)"
            )
        if any(a.star or (a.keyword is not None and a.keyword.value == "use_reentrant") for a in call.args):
            raise ByHand(
                f"{source.name}:{line}: `{code_of(call)}` passes arguments built at run time; wrap it in "
                "torch.utils.checkpoint.checkpoint by hand"
            )
        edits[call] = lambda node: _checkpointed(node, torch_name)
    return replace_nodes(source, edits)
