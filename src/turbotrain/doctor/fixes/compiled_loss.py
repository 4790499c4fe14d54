"""The edit that compiles a loss with the compiled model it is computed on: the loss's call (``F.cross_entropy(
compiled(x), y)``) moved into a function compiled as the script compiles its model, defined before the top-level
statement that holds the call, and called in its place. Compiled as one, the graph holds the model's last ops and
the loss together (torch.compile inlines the compiled model it is given)."""

from __future__ import annotations

from typing import cast

import libcst as cst

from ..cst_tools import Source, code_of
from ..cst_tools import replace as replace_nodes
from .model import ByHand, EditRequest

__all__ = ["compile_loss"]

_NAME = "model_and_loss"


def _bound_by_imports(source: Source) -> set[str]:
    """The names the file's imports bind (``torch``, ``F``, ``nn``): the function reads them as the call does."""
    names = set()
    for alias in source.nodes(cst.ImportAlias):
        if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
            names.add(alias.asname.name.value)
        else:
            names.add(code_of(alias.name).split(".")[0])
    return names


def _free_names(call: cst.Call, imported: set[str]) -> list[str]:
    """The plain names the call's arguments read (``compiled``, ``x``, ``y``, ``self``), in order: the compiled
    function's parameters."""
    found: list[str] = []

    class _Names(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)  # ``self.model``: ``self``, not ``model``
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            if node.star:
                raise ByHand(f"`{code_of(call)}` passes arguments built at run time; compile the loss by hand")
            node.value.visit(self)  # a keyword's name is not read
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            raise ByHand(f"`{code_of(call)}` holds a lambda; compile the loss with the model by hand")

        def visit_Name(self, node: cst.Name) -> None:
            if node.value not in imported and node.value not in found and node.value not in ("True", "False", "None"):
                found.append(node.value)

    for arg in call.args:
        arg.visit(_Names())
    return found


def compile_loss(source: Source, req: EditRequest) -> str:
    """``params``: ``loss``, the loss function's name (``cross_entropy``); ``compile``, the keywords of the
    script's ``torch.compile`` call as written (``backend=args.backend``), given to the new one."""
    loss = req.params["loss"]
    call = source.call_at(req.line, loss, what=f"{loss}(...)")
    torch = source.alias_of("torch")
    if torch is None:
        raise ByHand(f"{source.name} does not `import torch`; compile the loss with the model by hand")
    names = _free_names(call, _bound_by_imports(source))
    if not names:
        raise ByHand(f"`{code_of(call)}` reads no model or batch; compile the loss with the model by hand")
    taken = {n.value for n in source.nodes(cst.Name)}
    name = next(f"{_NAME}{i or ''}" for i in range(len(taken) + 1) if f"{_NAME}{i or ''}" not in taken)
    params = ", ".join(names)
    keywords = req.params.get("compile", "")
    definition = cst.parse_module(
        f"@{torch}.compile({keywords})\n"
        f"def {name}({params}):\n"
        f'    """{loss} compiled with the model it is computed on, as one graph (turbotrain doctor: '
        'compile-loss-eager)."""\n'
        f"    return {code_of(call)}\n"
    ).body
    assert len(definition) == 1  # the decorated function
    top: cst.CSTNode = source.statement(call)
    while (parent := source.parent(top)) is not None and not isinstance(parent, cst.Module):
        top = source.statement(parent)  # the top-level statement that holds the call

    blank = [cst.EmptyLine(), cst.EmptyLine()]  # two blank lines around a top-level function, as PEP 8 has them
    function = definition[0].with_changes(leading_lines=blank)

    def defined_before(node: cst.CSTNode) -> cst.FlattenSentinel:
        # The top-level statement is a line or a compound statement; both keep their comments above in leading_lines.
        statement = cast("cst.SimpleStatementLine | cst.BaseCompoundStatement", node)
        return cst.FlattenSentinel([function, statement.with_changes(leading_lines=[*blank, *statement.leading_lines])])

    return replace_nodes(
        source,
        {call: lambda _node: cst.parse_expression(f"{name}({params})"), top: defined_before},
    )
