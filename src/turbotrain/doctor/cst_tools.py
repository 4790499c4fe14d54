"""LibCST helpers the edit kinds share: find the node a finding names, replace it, wrap statements.

Edits work on a concrete syntax tree, so comments, quotes and line breaks the edit does not touch
come out exactly as they went in (a regex on the source would not know a call from a comment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, TypeVar, cast

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from .edits import ByHand

__all__ = [
    "Source",
    "dotted",
    "callee",
    "is_literal",
    "set_keyword",
    "keyword_value",
    "is_docstring",
    "with_block",
    "wrap",
    "replace",
    "Replacer",
    "code_of",
    "STATEMENTS",
]

STATEMENTS = (cst.SimpleStatementLine, cst.BaseCompoundStatement)
_EMPTY = cst.Module(body=[])
_Node = TypeVar("_Node", bound=cst.CSTNode)


def code_of(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def dotted(node: cst.BaseExpression) -> str:
    """``torch.utils.data.DataLoader`` for that expression; ``''`` for anything but names and attributes."""
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return ""
    parts.append(node.value)
    return ".".join(reversed(parts))


def callee(call: cst.Call) -> str:
    """The called function's or method's own name: ``backward`` for ``loss_fn(out, y).backward()``."""
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else ""


def is_literal(node: cst.BaseExpression) -> bool:
    """A value written in place (a number, True/False/None, a string): safe to replace with another."""
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return is_literal(node.expression)
    return isinstance(node, cst.Name) and node.value in ("True", "False", "None")


@dataclass(frozen=True)
class CommandLineOption:
    """An argparse option the file declares: its long flag, its default as written ("" where none) and where."""

    flag: str
    default: str
    where: str  # "train.py:603"

    @property
    def said(self) -> str:
        """``its default is 4, at train.py:603``."""
        return f"{f'its default is {self.default}, ' if self.default else ''}at {self.where}"


class Source:
    """One file parsed once, with each node's lines and parent, for finding what a finding names."""

    def __init__(self, text: str, name: str = "<script>") -> None:
        try:
            self.wrapper = MetadataWrapper(cst.parse_module(text))
        except cst.ParserSyntaxError as exc:
            raise ByHand(f"{name} does not parse ({exc.message} at line {exc.raw_line}); nothing was edited") from exc
        self.name = name
        self.module = self.wrapper.module
        self.positions = self.wrapper.resolve(PositionProvider)
        self.parents = self.wrapper.resolve(ParentNodeProvider)

    def lines(self, node: cst.CSTNode) -> tuple[int, int]:
        pos = self.positions[node]
        return pos.start.line, pos.end.line

    def nodes(self, kind: type[_Node]) -> Iterable[_Node]:
        return (n for n in self.positions if isinstance(n, kind))

    def calls_at(self, line: int, *names: str) -> list[cst.Call]:
        """Calls to a function or method whose name ends in one of ``names`` and that span ``line``:
        those starting on it first, then the innermost."""
        found: list[cst.Call] = []
        for call in self.nodes(cst.Call):
            first, last = self.lines(call)
            name = dotted(call.func)
            if first <= line <= last and any(name == n or name.endswith("." + n) for n in names):
                found.append(call)
        return sorted(found, key=lambda c: (self.lines(c)[0] != line, self.lines(c)[1] - self.lines(c)[0]))

    def call_at(self, line: int, *names: str, what: str) -> cst.Call:
        calls = self.calls_at(line, *names)
        if not calls:
            raise ByHand(f"no {what} call at {self.name}:{line} (the line changed since the run?)")
        return calls[0]

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(node)

    def statement(self, node: cst.CSTNode) -> cst.BaseStatement:
        """The statement (a line, or a compound statement) that holds ``node``."""
        while not isinstance(node, STATEMENTS):
            node = self.parents[node]
        return node

    def ancestors(self, node: cst.CSTNode) -> Iterable[cst.CSTNode]:
        parent = self.parents.get(node)
        while parent is not None:
            yield parent
            parent = self.parents.get(parent)

    def command_line_option(self, value: cst.BaseExpression) -> CommandLineOption | None:
        """The option ``value`` reads where it is ``args.num_workers``, ``args`` bound to a ``parse_args()`` in
        this file and the file declaring that option with argparse; None otherwise (a config object's attribute)."""
        if not isinstance(value, cst.Attribute) or not isinstance(value.value, cst.Name):
            return None
        parsed = {
            t.target.value
            for assign in self.nodes(cst.Assign)
            if isinstance(assign.value, cst.Call) and dotted(assign.value.func).endswith(".parse_args")
            for t in assign.targets
            if isinstance(t.target, cst.Name)
        }
        if value.value.value not in parsed:
            return None
        for call in self.nodes(cst.Call):
            if not dotted(call.func).endswith(".add_argument"):
                continue
            names = [a.value for a in call.args if a.keyword is None]
            flags = [str(n.evaluated_value) for n in names if isinstance(n, cst.SimpleString)]
            longs = [f for f in flags if f.startswith("--")]
            dest = keyword_value(call, "dest")
            own = (
                code_of(dest.value).strip("'\"")
                if dest is not None
                else longs[0][2:].replace("-", "_")
                if longs
                else ""
            )
            if longs and own == value.attr.value:
                default = keyword_value(call, "default")
                written = code_of(default.value) if default is not None else ""
                return CommandLineOption(longs[0], written, f"{self.name}:{self.lines(call)[0]}")
        return None

    def function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        return next((a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)), None)

    def one_assignment(self, name: cst.Name) -> cst.Assign | None:
        """The one ``name = ...`` in the function that reads ``name`` (in the file, outside any function), or None
        where there are none or several."""
        scope = self.function_of(name)
        found = [
            assign
            for assign in self.nodes(cst.Assign)
            if self.function_of(assign) is scope
            and any(isinstance(t.target, cst.Name) and t.target.value == name.value for t in assign.targets)
        ]
        return found[0] if len(found) == 1 else None

    def block_of(self, statement: cst.CSTNode) -> tuple[cst.CSTNode, Sequence[cst.CSTNode]]:
        """The node whose ``body`` lists ``statement`` (a block or the module), and that list."""
        # A statement's parent is the module or an indented block, both with a ``body``.
        owner = cast("cst.Module | cst.IndentedBlock", self.parents[statement])
        return owner, owner.body

    def statement_line(self, line: int) -> cst.BaseStatement:
        """The innermost statement that spans ``line``."""
        best = None
        for node in self.positions:
            if isinstance(node, STATEMENTS):
                first, last = self.lines(node)
                if first <= line <= last and (
                    best is None or last - first <= self.lines(best)[1] - self.lines(best)[0]
                ):
                    best = node
        if best is None:
            raise ByHand(f"no statement at {self.name}:{line}")
        return best

    def alias_of(self, module: str) -> str | None:
        """The name the file gives ``module`` (``F`` for ``import torch.nn.functional as F``) at its top level, or None:
        an import inside a function names it there only, and code written elsewhere would not see it."""
        for node in self.nodes(cst.ImportAlias):
            if any(isinstance(a, (cst.FunctionDef, cst.ClassDef)) for a in self.ancestors(node)):
                continue
            parent = self.parents[node]
            full = code_of(node.name)
            if isinstance(parent, cst.ImportFrom) and parent.module is not None:
                full = f"{code_of(parent.module)}.{full}"
            if full == module:
                # An import's ``as`` target is always a plain name.
                return (
                    cast(cst.Name, node.asname.name).value
                    if node.asname
                    else (full if isinstance(parent, cst.Import) else code_of(node.name))
                )
        return None


class Replacer(cst.CSTTransformer):
    """Rebuild the tree once, giving each targeted original node its replacement.

    A replacement is a function of the updated node (its children already rebuilt), so edits
    nested inside each other compose; it may return ``cst.RemoveFromParent()`` or a
    ``cst.FlattenSentinel`` of several statements.
    """

    def __init__(self, edits: dict[int, Callable[[cst.CSTNode], object]]) -> None:
        super().__init__()
        self.edits = edits
        self.done: set[int] = set()

    def on_leave(self, original_node, updated_node):  # libcst's own signature
        make = self.edits.get(id(original_node))
        if make is None:
            return updated_node
        self.done.add(id(original_node))
        return make(updated_node)


def replace(source: Source, edits: dict[cst.CSTNode, Callable[[cst.CSTNode], object]]) -> str:
    """The file's new text with ``edits`` (original node -> replacement function) made."""
    replacer = Replacer({id(node): make for node, make in edits.items()})
    new = source.wrapper.visit(replacer)
    missing = len(edits) - len(replacer.done)
    if missing:  # a node that is not in this tree: a bug in an edit kind, never a silent half-edit
        raise RuntimeError(f"{missing} edit(s) found no node to replace in {source.name}")
    return new.code


def is_docstring(node: cst.CSTNode) -> bool:
    """A statement that is a string literal alone: a module's, class's or function's docstring where it comes first."""
    return (
        isinstance(node, cst.SimpleStatementLine)
        and len(node.body) == 1
        and isinstance(node.body[0], cst.Expr)
        and isinstance(node.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def keyword_value(call: cst.Call, name: str) -> cst.Arg | None:
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def set_keyword(call: cst.Call, name: str, value: str, position: int | None = None, where: str = "") -> cst.Call:
    """``call`` with ``name=value``: the literal already there replaced, else the keyword appended.

    An argument that is not a literal (``num_workers=cfg.workers``) or arguments built at run time
    (``**kwargs``) are the user's to change: :class:`ByHand` says which.
    """
    new_value = cst.parse_expression(value)
    if any(a.star == "**" for a in call.args):
        raise ByHand(
            f"{where}: the call's arguments are built at run time (**kwargs); set {name}={value} where they are made"
        )
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if position is not None and len(positional) > position:
        arg = positional[position]
        if not is_literal(arg.value):
            raise ByHand(
                f"{where}: {name} is passed positionally as `{code_of(arg.value)}`; set it to {value} "
                "where that value is made"
            )
        return call.with_deep_changes(arg, value=new_value)
    existing = keyword_value(call, name)
    if existing is not None:
        if not is_literal(existing.value):
            raise ByHand(
                f"{where}: {name}=`{code_of(existing.value)}` comes from a variable or a config; set it "
                f"to {value} there"
            )
        return call.with_deep_changes(existing, value=new_value)
    if any(a.star == "*" for a in call.args) and position is not None:
        raise ByHand(f"{where}: positional arguments are unpacked at run time (*args); add {name}={value} by hand")
    args = list(call.args)
    new_arg = cst.Arg(
        value=new_value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    if not args:
        return call.with_changes(args=[new_arg])
    last, space = args[-1], cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if isinstance(last.comma, cst.Comma) and _breaks_line(last.comma):
        # One argument per line with a trailing comma: the new one takes a line of its own, in the same layout
        # (the argument before it gets the comma between arguments, the new one the comma before the ``)``).
        between = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else space
        args[-1] = last.with_changes(comma=between)
        new_arg = new_arg.with_changes(comma=last.comma)
    elif len(args) > 1 and isinstance(args[-2].comma, cst.Comma) and _breaks_line(args[-2].comma):
        # One argument per line without a trailing comma: the new one takes a line of its own, and the line break
        # before the ``)`` stays before it.
        args[-1] = last.with_changes(comma=args[-2].comma, whitespace_after_arg=cst.SimpleWhitespace(""))
        new_arg = new_arg.with_changes(whitespace_after_arg=last.whitespace_after_arg)
    else:
        args[-1] = last.with_changes(comma=space)
    return call.with_changes(args=[*args, new_arg])


def _breaks_line(comma: cst.Comma) -> bool:
    return isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace)


def with_block(item: str, statements: Sequence[cst.BaseStatement]) -> cst.With:
    """``with item:`` around ``statements``; the comments above the first stay above the ``with``."""
    first = statements[0]
    leading = getattr(first, "leading_lines", ())
    body = [first.with_changes(leading_lines=())] + list(statements[1:])
    return cst.With(
        items=[cst.WithItem(cst.parse_expression(item))], body=cst.IndentedBlock(body=body), leading_lines=leading
    )


def wrap(source: Source, statements: Sequence[cst.BaseStatement], item: str) -> str:
    """The file's text with ``statements`` (consecutive, in one block) inside ``with item:``."""
    block = with_block(item, statements)
    edits: dict[cst.CSTNode, Callable] = {statements[0]: lambda _: block}
    for other in statements[1:]:
        edits[other] = lambda _: cst.RemoveFromParent()
    return replace(source, edits)
