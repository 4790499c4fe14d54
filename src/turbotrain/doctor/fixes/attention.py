"""``F.scaled_dot_product_attention(q, k, v, ...)`` for attention written by hand, where the code allows it.

Recognised: ``softmax((q @ k.transpose(-2, -1)) * scale [masked], dim=-1) @ v``, the pieces written in one
expression or through assignments in the same block (``scores = ...``; ``scores = scores.masked_fill(mask,
float("-inf"))``; ``weights = scores.softmax(-1)``; ``weights @ v``). The scale is kept (``scale=`` unless it
is SDPA's own ``1/sqrt(head dim)``); a ``triu(1)`` mask of ones over ``(t, t)``, or the top-left corner of a
buffer of ones made causal (nanoGPT's ``self.bias[:, :, :T, :T] == 0`` over ``tril``), becomes ``is_causal=True``,
any other boolean mask ``attn_mask=mask.logical_not()``, an added mask ``attn_mask=mask``; dropout on the
weights becomes ``dropout_p``: a dropout module's ``p`` while that module is training (``self.attn_dropout(att)``),
``F.dropout``'s ``p`` under its ``training``. Scores masked in place (``scores.masked_fill_(mask, -inf)`` on a line of
its own) count as masked; ``transpose(2, 3)`` counts as the last two dimensions where the run saw 4-d operands
(``params["ndim"]``). Anything else (weights used elsewhere, a transpose whose dims the code
does not spell as -2/-1) is by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, cast

import libcst as cst
import libcst.matchers as matchers

from ..cst_tools import Source, callee, code_of, dotted, replace
from .model import ByHand, EditRequest

__all__ = ["sdpa"]

_NEG_INF = {
    "float('-inf')",
    'float("-inf")',
    "-float('inf')",
    '-float("inf")',
    "-math.inf",
    "-torch.inf",
    "-np.inf",
    "-numpy.inf",
}
_LAST_TWO = {("-2", "-1"), ("-1", "-2")}


class _NoMatch(Exception):
    pass


@dataclass
class _Chain:
    """What resolving names back through the block met: the statements it used, in the block."""

    block: list
    before: int  # resolve among block[:before]
    used: list = field(default_factory=list)  # statements whose assignment was followed
    fills: list = field(default_factory=list)  # ``name.masked_fill_(mask, value)`` statements met on the way back

    def probe(self) -> "_Chain":
        """A resolver from the same place whose findings are taken over (adopt) only if they fit."""
        return _Chain(self.block, self.before)

    def adopt(self, probe: "_Chain") -> None:
        self.before = probe.before
        self.used.extend(probe.used)
        self.fills.extend(probe.fills)

    def resolve(self, expr: cst.BaseExpression) -> cst.BaseExpression:
        """``expr``, with a bare name replaced by the value of its latest assignment before (one level)."""
        if not isinstance(expr, cst.Name):
            return expr
        for i in range(self.before - 1, -1, -1):
            if _fills_in_place(self.block[i], expr.value):
                self.used.append(self.block[i])
                self.fills.append(self.block[i])
                continue
            target = _assigned(self.block[i])
            if target is not None and target[0] == expr.value:
                self.before = i
                self.used.append(self.block[i])
                return target[1]
            if expr.value in _bound_names(self.block[i]):
                raise _NoMatch(f"`{expr.value}` is set by `{code_of(self.block[i]).strip()}`")
        return expr


def _assigned(statement: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """``(name, value)`` of a line that is just ``name = value``."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        node = statement.body[0]
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            return node.targets[0].target.value, node.value
    return None


def _fills_in_place(statement: cst.CSTNode, name: str) -> bool:
    """A line that is just ``name.masked_fill_(mask, value)`` (LLMs-from-scratch masks its scores so)."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return False
    node = statement.body[0]
    call = node.value if isinstance(node, cst.Expr) else None
    return (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "masked_fill_"
        and isinstance(call.func.value, cst.Name)
        and call.func.value.value == name
    )


def _bound_names(node: cst.CSTNode) -> set[str]:
    names: set[str] = set()

    class _Find(cst.CSTVisitor):
        def visit_AssignTarget(self, t: cst.AssignTarget) -> None:
            names.update(n.value for n in _names(t.target))

        def visit_AugAssign(self, t: cst.AugAssign) -> None:
            names.update(n.value for n in _names(t.target))

        def visit_For(self, t: cst.For) -> None:
            names.update(n.value for n in _names(t.target))

    node.visit(_Find())
    return names


def _names(node: cst.CSTNode) -> list[cst.Name]:
    found: list[cst.Name] = []

    class _Find(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            found.append(n)

    node.visit(_Find())
    return found


def _args(call: cst.Call) -> list[str]:
    return [code_of(a.value) for a in call.args]


def _softmax_input(chain: _Chain, expr: cst.BaseExpression) -> cst.BaseExpression:
    expr = chain.resolve(expr)
    if not isinstance(expr, cst.Call) or callee(expr) != "softmax":
        raise _NoMatch("the weights are not a softmax's output")
    args = list(expr.args)
    if isinstance(expr.func, cst.Attribute) and not dotted(expr.func).endswith(
        ("torch.softmax", "functional.softmax", "F.softmax")
    ):
        source = expr.func.value
    else:
        if not args:
            raise _NoMatch("softmax of nothing")
        source, args = args[0].value, args[1:]
    if (
        len(args) != 1
        or code_of(args[0].value).replace(" ", "") != "-1"
        or (args[0].keyword is not None and args[0].keyword.value != "dim")
    ):
        raise _NoMatch("softmax over another dimension than the last, or with a dtype")
    return source


def _dropout(
    source: Source, chain: _Chain, expr: cst.BaseExpression, modules: list[str] | None
) -> tuple[cst.BaseExpression, str]:
    """``(weights, dropout argument)`` of weights that go through dropout (``self.attn_dropout(att)``,
    ``F.dropout(att, p, training)``); the argument is '' for none. ``modules``: the attribute names of the model's
    dropout modules, where the run captured the model (else a module is taken for dropout by its name)."""
    probe = chain.probe()
    call = probe.resolve(expr)
    if not isinstance(call, cst.Call) or not call.args or call.args[0].keyword is not None:
        return expr, ""
    name = dotted(call.func)
    functional = {
        f"{alias}.dropout" for alias in (source.alias_of("torch.nn.functional"), "torch.nn.functional") if alias
    }
    if name in functional:
        p, training = _argument(call, 1, "p", "0.5"), _argument(call, 2, "training", "True")
    elif name == "torch.dropout" and len(call.args) == 3:
        p, training = _argument(call, 1, "p", ""), _argument(call, 2, "train", "")
    elif isinstance(call.func, cst.Attribute) and len(call.args) == 1 and _is_dropout(call.func.attr.value, modules):
        module = code_of(call.func)  # an nn.Dropout: its p, while it is training (model.train() / .eval())
        p, training = f"{module}.p", f"{module}.training"
    else:
        return expr, ""
    chain.adopt(probe)
    if training == "True":
        return call.args[0].value, f", dropout_p={p}"
    return call.args[0].value, f", dropout_p={_grouped(p)} if {_grouped(training)} else 0.0"


def _is_dropout(attribute: str, modules: list[str] | None) -> bool:
    """Whether ``self.<attribute>(...)`` is a dropout module; one named so that is not raises :class:`_NoMatch`
    (its ``p`` would fail when the patched script runs)."""
    if modules is None:
        return "dropout" in attribute.lower()
    if attribute not in modules and "dropout" in attribute.lower():
        raise _NoMatch(f"`{attribute}` is not one of the model's nn.Dropout modules")
    return attribute in modules


def _grouped(code: str) -> str:
    """``code`` in parentheses unless it is an atom (a name, a number, an attribute, a call, an index): so that it
    stays one operand of the conditional expression it is put in (``a or b`` would not)."""
    atoms = (cst.Name, cst.Attribute, cst.Integer, cst.Float, cst.Call, cst.Subscript)
    try:
        return code if isinstance(cst.parse_expression(code), atoms) else f"({code})"
    except cst.ParserSyntaxError:  # an argument over several lines parses only inside the parentheses it had
        return f"({code})"


def _argument(call: cst.Call, position: int, keyword: str, default: str) -> str:
    """The code of ``call``'s argument at ``position`` or named ``keyword``, else ``default``."""
    for i, arg in enumerate(call.args):
        if (arg.keyword is None and i == position) or (arg.keyword is not None and arg.keyword.value == keyword):
            return code_of(arg.value)
    return default


def _mask(source: Source, chain: _Chain, expr: cst.BaseExpression) -> tuple[cst.BaseExpression, str]:
    """``(scores, mask argument)`` of a masked score matrix; the mask argument is '' for none."""
    expr = chain.resolve(expr)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "masked_fill":
        return expr.func.value, _mask_argument(source, chain, _filled_mask(expr))
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        return expr.left, f", attn_mask={code_of(expr.right)}"
    return expr, ""


def _filled_mask(fill: cst.Call) -> cst.BaseExpression:
    """The mask of ``scores.masked_fill(mask, -inf)`` (or ``masked_fill_``)."""
    if len(fill.args) != 2 or code_of(fill.args[1].value).replace(" ", "") not in _NEG_INF:
        raise _NoMatch("the scores are filled with something else than -inf")
    return fill.args[0].value


def _in_place_mask(source: Source, chain: _Chain, mask: str) -> str:
    """The mask argument of a ``scores.masked_fill_(mask, -inf)`` line the scores' resolution went past, where
    there is one; its mask is resolved from that line (``mask_bool = ...`` comes after the scores)."""
    if not chain.fills:
        return mask
    if mask or len(chain.fills) > 1:
        raise _NoMatch("the scores are masked more than once")
    statement = chain.fills[0]
    fill = cast(cst.Call, cast(cst.Expr, statement.body[0]).value)  # _fills_in_place: the line is this call
    at = _Chain(chain.block, chain.block.index(statement))
    filled = at.probe().resolve(cast(cst.Attribute, fill.func).value)
    if any(isinstance(c, cst.Call) and callee(c) == "softmax" for c in matchers.findall(filled, matchers.Call())):
        raise _NoMatch("the attention weights are filled in place after the softmax")
    argument = _mask_argument(source, at, _filled_mask(fill))
    chain.used.extend(at.used)
    return argument


def _mask_argument(source: Source, chain: _Chain, mask: cst.BaseExpression) -> str:
    """``is_causal=True`` for ``ones(t, t).triu(1)`` or a causal buffer's top-left corner; otherwise the mask,
    negated (SDPA's True means attend)."""
    resolved = mask
    if isinstance(mask, cst.Name):
        probe = chain.probe()
        resolved = probe.resolve(mask)
        if probe.used and (_causal(resolved) or _causal_buffer(source, resolved)):
            chain.used.extend(probe.used)  # the mask's line goes too; the scores are still looked up from here
            return ", is_causal=True"
    if _causal(resolved) or _causal_buffer(source, resolved):
        return ", is_causal=True"
    text = code_of(mask)
    if not isinstance(mask, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        text = f"({text})"  # `bias == 0`: the negation is of the whole comparison
    return f", attn_mask={text}.logical_not()"


def _causal(expr: cst.BaseExpression) -> bool:
    """``torch.ones(t, t, dtype=torch.bool).triu(1)`` or ``torch.triu(torch.ones(t, t), diagonal=1).bool()``."""
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "bool"
        and not expr.args
    ):
        expr = expr.func.value
    parts = _triangle(expr, "triu")
    return parts is not None and parts[1] == ["1"] and _square_ones(parts[0])


def _triangle(expr: cst.BaseExpression, kind: str) -> tuple[cst.BaseExpression, list[str]] | None:
    """``(x, [diagonal])`` of ``torch.<kind>(x, diagonal)`` or ``x.<kind>(diagonal)`` (kind: triu or tril)."""
    if not isinstance(expr, cst.Call):
        return None
    if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == kind and dotted(expr.func) != f"torch.{kind}":
        return expr.func.value, _args(expr)
    if dotted(expr.func) == f"torch.{kind}" and expr.args:
        return expr.args[0].value, _args(expr)[1:]
    return None


def _square_ones(expr: cst.BaseExpression) -> bool:
    """``torch.ones(n, n, ...)``."""
    if not isinstance(expr, cst.Call) or dotted(expr.func).split(".")[-1] != "ones":
        return False
    dims = [a for a in expr.args if a.keyword is None]
    return len(dims) == 2 and code_of(dims[0].value) == code_of(dims[1].value)


def _causal_buffer(source: Source, mask: cst.BaseExpression) -> bool:
    """The mask nanoGPT, minGPT and their copies write: a buffer of ones over (n, n) made lower-triangular
    (``register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))``), its top-left ``[:t, :t]`` compared
    ``== 0``; or made strictly upper-triangular (``torch.triu(torch.ones(n, n), diagonal=1)``), its corner taken as
    it is (``self.mask.bool()[:t, :t]``). Either hides the keys after each query: SDPA's ``is_causal=True``."""
    lower = isinstance(mask, cst.Comparison)
    if lower:
        comparison = cast(cst.Comparison, mask)
        if len(comparison.comparisons) != 1 or not isinstance(comparison.comparisons[0].operator, cst.Equal):
            return False
        if code_of(comparison.comparisons[0].comparator) not in ("0", "0.0", "False"):
            return False
        mask = comparison.left
    name = _buffer_corner(mask)
    if name is None:
        return False
    owner = next((a for a in source.ancestors(mask) if isinstance(a, cst.ClassDef)), None)
    made = _buffers(source, owner).get(name, []) if owner is not None else []
    return bool(made) and all((_lower_ones(e) if lower else _causal(e)) for e in made)


def _buffer_corner(expr: cst.BaseExpression) -> str | None:
    """``NAME`` of ``self.NAME`` read whole or as its top-left corner (``[:, :, :t, :t]``, ``.bool()`` on either
    side); None for anything else."""
    while True:
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "bool":
            if expr.args:
                return None
            expr = expr.func.value
        elif isinstance(expr, cst.Subscript):
            if not _top_left(expr):
                return None
            expr = expr.value
        else:
            break
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
        return expr.attr.value
    return None


def _top_left(subscript: cst.Subscript) -> bool:
    """``[:, ..., :t, :t]``: whole leading dimensions and the same length from 0 on the last two."""
    slices = [e.slice for e in subscript.slice]
    if len(slices) < 2 or not all(isinstance(s, cst.Slice) and s.lower is None and s.step is None for s in slices):
        return False
    uppers = [cast(cst.Slice, s).upper for s in slices]
    if any(u is not None for u in uppers[:-2]):
        return False
    last = [code_of(u) if u is not None else "" for u in uppers[-2:]]
    return last[0] == last[1]


def _buffers(source: Source, owner: cst.ClassDef) -> dict[str, list[cst.BaseExpression]]:
    """What each ``self.NAME`` is made of in the class ``owner``: ``self.register_buffer("NAME", value)`` and
    ``self.NAME = value``, with ``.view``/``.reshape``/``.bool()`` peeled off the value. Another class's ``self.bias``
    (nanoGPT's LayerNorm's parameter) is another attribute."""
    made: dict[str, list[cst.BaseExpression]] = {}
    for call in source.nodes(cst.Call):
        if not any(a is owner for a in source.ancestors(call)):
            continue
        if dotted(call.func) == "self.register_buffer" and len(call.args) >= 2:
            key = call.args[0].value
            if isinstance(key, cst.SimpleString):
                made.setdefault(str(key.evaluated_value), []).append(_peeled(call.args[1].value))
    for target in source.nodes(cst.AssignTarget):
        if not any(a is owner for a in source.ancestors(target)):
            continue
        attr = target.target
        if isinstance(attr, cst.Attribute) and isinstance(attr.value, cst.Name) and attr.value.value == "self":
            assign = source.parent(target)
            if isinstance(assign, cst.Assign):
                made.setdefault(attr.attr.value, []).append(_peeled(assign.value))
    return made


def _peeled(expr: cst.BaseExpression) -> cst.BaseExpression:
    while (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in ("view", "reshape", "bool", "float")
    ):
        expr = expr.func.value
    return expr


def _lower_ones(expr: cst.BaseExpression) -> bool:
    """``torch.tril(torch.ones(n, n))`` or ``torch.ones(n, n).tril()`` (the diagonal kept)."""
    parts = _triangle(expr, "tril")
    return parts is not None and parts[1] in ([], ["0"]) and _square_ones(parts[0])


def _scores(
    chain: _Chain, expr: cst.BaseExpression, ndim: int | None
) -> tuple[cst.BaseExpression, cst.BaseExpression, str]:
    """``(q, k, scale text)`` of ``(q @ k.transpose(-2, -1)) * scale`` (or ``/ d``, or no scale); ``ndim``, the
    operands' dimensions where the run saw them (``transpose(2, 3)`` of a 4-d tensor is the last two)."""
    expr = chain.resolve(expr)
    scale = "1.0"
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Multiply, cst.Divide)):
        # A product may be written either way round (scale * scores); a quotient only scores / d.
        orders = [(expr.left, expr.right)] + (
            [(expr.right, expr.left)] if isinstance(expr.operator, cst.Multiply) else []
        )
        for product, factor in orders:
            probe = chain.probe()
            resolved = probe.resolve(product)
            if _is_matmul(resolved):
                chain.adopt(probe)
                scale = code_of(factor) if isinstance(expr.operator, cst.Multiply) else f"1 / {code_of(factor)}"
                expr = resolved
                break
    if not _is_matmul(expr):
        raise _NoMatch("the scores are not q @ k.transpose(-2, -1)")
    q, kt = _operands(expr)
    return q, _untransposed(kt, ndim), scale


def _is_matmul(expr: cst.BaseExpression) -> bool:
    return (isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.MatrixMultiply)) or (
        isinstance(expr, cst.Call) and dotted(expr.func) in ("torch.matmul", "torch.bmm") and len(expr.args) == 2
    )


def _operands(expr: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    if isinstance(expr, cst.BinaryOperation):
        return expr.left, expr.right
    call = cast(cst.Call, expr)  # _is_matmul: a matmul that is no operator is a call
    return call.args[0].value, call.args[1].value


def _untransposed(kt: cst.BaseExpression, ndim: int | None) -> cst.BaseExpression:
    if isinstance(kt, cst.Attribute) and kt.attr.value == "mT":
        return kt.value
    last_two = _LAST_TWO | ({(str(ndim - 2), str(ndim - 1)), (str(ndim - 1), str(ndim - 2))} if ndim else set())
    if (
        isinstance(kt, cst.Call)
        and isinstance(kt.func, cst.Attribute)
        and kt.func.attr.value == "transpose"
        and tuple(a.replace(" ", "") for a in _args(kt)) in last_two
    ):
        return kt.func.value
    raise _NoMatch("the keys are not transposed over their last two dimensions (-2, -1)")


def _default_scale(q: cst.BaseExpression, scale: str) -> bool:
    """Whether ``scale`` is SDPA's own, ``1 / sqrt(q.size(-1))``."""
    name = code_of(q)
    dim = {f"{name}.shape[-1]", f"{name}.size(-1)"}
    text = scale.replace(" ", "")
    return any(text in (f"{d}**-0.5", f"1/math.sqrt({d})", f"1/{d}**0.5") for d in {d.replace(" ", "") for d in dim})


def _functional(source: Source) -> str:
    alias = source.alias_of("torch.nn.functional")
    if alias:
        return alias
    torch = source.alias_of("torch")
    if torch is None:
        raise ByHand(f"{source.name} does not import torch; scaled_dot_product_attention needs it")
    return f"{torch}.nn.functional"


def _attempt(source: Source, matmul: cst.BaseExpression, req: EditRequest) -> str:
    statement = source.statement(matmul)
    _, body = source.block_of(statement)
    block = list(body)
    chain = _Chain(block, block.index(statement))
    weights, v = _operands(matmul)
    dropped, dropout = _dropout(source, chain, weights, req.params.get("dropout_modules"))
    scores, mask = _mask(source, chain, _softmax_input(chain, dropped))
    q, k, scale = _scores(chain, scores, req.params.get("ndim"))
    mask = _in_place_mask(source, chain, mask)
    keep_scale = "" if _default_scale(q, scale) else f", scale={scale}"
    call = (
        f"{_functional(source)}.scaled_dot_product_attention({code_of(q)}, {code_of(k)}, {code_of(v)}"
        f"{mask}{dropout}{keep_scale})"
    )
    removed = set(map(id, chain.used))
    moved = {n.value for part in (q, k) for n in _names(part)}
    first = min((block.index(s) for s in chain.used), default=block.index(statement))
    for node in block[first : block.index(statement)]:
        if id(node) not in removed and moved & _bound_names(node):
            raise _NoMatch(f"`{code_of(node).strip()}` changes q or k between the scores and the output")
    dead = {assigned[0] for s in chain.used if (assigned := _assigned(s)) is not None}  # not the in-place fills
    function = source.function_of(statement) or source.module
    inside = {id(n) for s in [*chain.used] for n in _names(s)} | {id(n) for n in _names(weights)}
    for name in _names(function):
        if name.value in dead and id(name) not in inside and not _is_target(source, name):
            raise _NoMatch(f"`{name.value}` is used elsewhere in the function")
    edits: dict[cst.CSTNode, Callable[[cst.CSTNode], object]] = {matmul: lambda _: cst.parse_expression(call)}
    for used in chain.used:
        edits[used] = lambda _: cst.RemoveFromParent()
    # The comment lines above the lines removed are the user's ("# causal self-attention"): they go above the call.
    above = _comment_lines(sorted(chain.used, key=block.index))
    if above:
        # A line or a compound statement: both carry leading_lines.
        edits[statement] = lambda node: cast(cst.SimpleStatementLine, node).with_changes(
            leading_lines=(*above, *cast(cst.SimpleStatementLine, node).leading_lines)
        )
    return replace(source, edits)


def _comment_lines(statements: list) -> list[cst.EmptyLine]:
    """The leading lines of ``statements`` that hold a comment, and a blank line where the first had one."""
    lines = [line for s in statements for line in s.leading_lines if line.comment is not None]
    if lines and statements[0].leading_lines and statements[0].leading_lines[0].comment is None:
        lines.insert(0, statements[0].leading_lines[0])
    return lines


def _is_target(source: Source, name: cst.Name) -> bool:
    parent = source.parent(name)
    return isinstance(parent, cst.AssignTarget)


def sdpa(source: Source, req: EditRequest) -> str:
    """The hand-written attention of the function holding the finding's softmax, as one SDPA call."""
    functions = [f for f in source.nodes(cst.FunctionDef) if source.lines(f)[0] <= req.line <= source.lines(f)[1]]
    if not functions:
        raise ByHand(f"{req.where}: no function around the softmax")
    function = min(functions, key=lambda f: source.lines(f)[1] - source.lines(f)[0])
    reasons = []
    candidates = [
        n
        for n in source.nodes(cst.BaseExpression)  # type: ignore[type-abstract]  # an isinstance filter
        if _is_matmul(n) and source.function_of(n) is function
    ]
    # The output (weights @ v) comes after the scores (q @ k^T): the last matmul first, and its reason.
    for matmul in sorted(candidates, key=lambda n: source.lines(n), reverse=True):
        try:
            return _attempt(source, matmul, req)
        except _NoMatch as exc:
            reasons.append(str(exc))
    why = reasons[0] if reasons else "no matmul by the values"
    raise ByHand(
        f"{req.where}: the attention in {function.name.value}() cannot be rewritten safely ({why}); "
        "use F.scaled_dot_product_attention(q, k, v, ...) by hand"
    )
