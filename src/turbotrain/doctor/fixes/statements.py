"""Edits around whole statements: ``with torch.inference_mode():`` around validation, ``torch.autocast``
around the forward and loss, process-wide flags (``torch.backends.cudnn.benchmark = True``) after the imports."""

from __future__ import annotations

import libcst as cst

from ..cst_tools import STATEMENTS, Source, callee, code_of, dotted, is_docstring, replace, wrap
from .model import ByHand, EditRequest

__all__ = ["inference_mode", "autocast", "cudnn_benchmark", "dynamo_config", "trains"]

# Calls that make a statement part of training: no autograd switch may go around them.
_TRAINING_CALLS = ("backward", "step", "zero_grad")
_GRAD_OFF = ("no_grad", "inference_mode")


def trains(node: cst.CSTNode) -> bool:
    """Whether ``node`` holds a backward, an optimizer step or a zero_grad."""
    found = []

    class _Find(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if callee(call) in _TRAINING_CALLS:
                found.append(call)

    node.visit(_Find())
    return bool(found)


def _torch(source: Source, req: EditRequest) -> str:
    name = source.alias_of("torch")
    if name is None:
        raise ByHand(f"{req.where}: the file does not `import torch`; the fix needs it")
    return name


def inference_mode(source: Source, req: EditRequest) -> str:
    """``with torch.inference_mode():`` around the validation code holding the finding's forward: the
    outermost statement around it, inside its function, that does no training."""
    torch = _torch(source, req)
    chosen = source.statement_line(req.line)
    for node in source.ancestors(chosen):
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            break
        if isinstance(node, cst.With) and any(
            dotted(getattr(i.item, "func", i.item)).endswith(_GRAD_OFF) for i in node.items
        ):
            raise ByHand(f"{req.where}: already under {code_of(node.items[0].item)}")
        if isinstance(node, STATEMENTS):
            if trains(node):
                break
            chosen = node
    if trains(chosen):
        raise ByHand(f"{req.where}: the validation forward shares its statement with a backward or a step")
    return wrap(source, [chosen], f"{torch}.inference_mode()")


def autocast(source: Source, req: EditRequest) -> str:
    """``with torch.autocast(device, dtype=...):`` around the training forward and the loss after it, up to
    (not including) the backward."""
    torch = _torch(source, req)
    first = source.statement_line(req.line)
    if not isinstance(first, cst.SimpleStatementLine):
        raise ByHand(
            f"{req.where}: the forward is in the header of a compound statement; put "
            "`with torch.autocast(...)` around the forward and the loss by hand"
        )
    if trains(first):
        raise ByHand(
            f"{req.where}: the forward and the backward are one statement; split them and put "
            "`with torch.autocast(...)` around the forward and the loss only"
        )
    _, body = source.block_of(first)
    run = [first]
    for node in list(body)[list(body).index(first) + 1 :]:
        if not isinstance(node, cst.SimpleStatementLine) or trains(node):
            break
        run.append(node)
    item = f"{torch}.autocast({req.params['device']!r}, dtype={torch}.{req.params['dtype']})"
    return wrap(source, run, item)


def _flag_assignment(source: Source, flag: str) -> cst.Assign | None:
    for node in source.nodes(cst.Assign):
        if len(node.targets) == 1 and dotted(node.targets[0].target).endswith(flag):
            return node
    return None


def _set_flag(source: Source, req: EditRequest, flag: str, value: str) -> str:
    """``<torch>.<flag> = <value>``: the script's own assignment of the flag changed, else a line after the imports
    at the top of the file (process-wide settings, read when the work starts)."""
    assigned = _flag_assignment(source, flag)
    if assigned is not None:
        if code_of(assigned.value) == value:
            raise ByHand(f"{req.where}: {flag} is already set to {value}")
        return replace(source, {assigned: lambda node: node.with_changes(value=cst.parse_expression(value))})
    torch = _torch(source, req)
    body = list(source.module.body)
    last_import = None
    for i, node in enumerate(body):
        small = node.body if isinstance(node, cst.SimpleStatementLine) else []
        if small and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in small):
            last_import = i
        elif last_import is not None or not is_docstring(node):
            break
    if last_import is None:
        raise ByHand(f"{source.name}: no imports at the top of the file to put {flag} after")
    line = cst.parse_statement(f"{torch}.{flag} = {value}\n")
    anchor = body[last_import]
    return replace(source, {anchor: lambda node: cst.FlattenSentinel([node, line])})


def cudnn_benchmark(source: Source, req: EditRequest) -> str:
    """``torch.backends.cudnn.benchmark = True``: the script's own ``= False`` flipped, else a line after the
    imports at the top of the file."""
    return _set_flag(source, req, "backends.cudnn.benchmark", "True")


def dynamo_config(source: Source, req: EditRequest) -> str:
    """``torch._dynamo.config.<name> = <value>`` (``capture_scalar_outputs = True``): before the script compiles
    anything, so after the imports."""
    return _set_flag(source, req, f"_dynamo.config.{req.params['name']}", repr(req.params["value"]))
