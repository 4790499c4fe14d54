"""A batch built one sample at a time in Python, read from the line the gap sampler caught building batches.

``torch.stack([data[i:i + block] for i in ix])`` runs one indexing op, one tensor and one Python iteration per
sample; ``data[ix[:, None] + torch.arange(block)]`` builds the same batch with one gather. The patterns: a list
comprehension (or generator) handed to ``torch.stack``/``torch.cat``/``torch.tensor``/``np.stack``/``np.array``
and their kin, each element a slice of one name by the loop variable (``slices``: the what-if can build it with
one op) or anything else per sample (``rows``: a per-row ``torch.tensor(...)``, a NumPy round trip).
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass

from ..record.cadence import syntax_tree
from ..sites import Site
from .source import dotted_name

__all__ = ["PerSampleBuild", "per_sample_build", "offset_text"]

_BUILDERS = frozenset(
    {
        "stack",
        "cat",
        "concat",
        "concatenate",
        "vstack",
        "hstack",
        "tensor",
        "as_tensor",
        "array",
        "asarray",
        "from_numpy",
        "LongTensor",
        "FloatTensor",
        "Tensor",
    }
)


@dataclass(frozen=True)
class PerSampleBuild:
    """One per-sample batch build at a line."""

    site: Site
    call: str  # the builder called on the comprehension ("torch.stack")
    element: str  # one sample, as written ("data[i:i + block]")
    var: str  # the comprehension's variable ("i")
    indices: str  # what it iterates ("ix")
    kind: str  # "slices" (a slice of ``data`` by ``var``) or "rows" (anything else)
    data: str | None = None  # the name sliced, for "slices"
    start: ast.expr | None = None  # the slice's bounds, for "slices"
    stop: ast.expr | None = None
    indices_tensor: bool = False  # ``indices`` was assigned from a torch call in the same function

    def one_op(self) -> str:
        """The batch built with one indexing op, as the fix says it."""
        if self.kind != "slices" or self.start is None or self.stop is None:
            return (
                "convert the data to one tensor once, before the loop, then index the whole batch at once "
                f"(data[{self.indices}] or a gather), instead of {self.call}([... for {self.var} in "
                f"{self.indices}])"
            )
        lo, hi = offset_text(self.start, self.var), offset_text(self.stop, self.var)
        arange = f"torch.arange({hi})" if lo == "0" else f"torch.arange({lo}, {hi})"
        ix = self.indices if self.indices_tensor else f"torch.as_tensor({self.indices})"
        return f"{self.data}[{ix}[:, None] + {arange}]"


def _terms(node: ast.expr) -> list[ast.expr]:
    """The terms of a sum (``i + block + 1`` -> i, block, 1)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _terms(node.left) + _terms(node.right)
    return [node]


def offset_text(bound: ast.expr, var: str) -> str:
    """A slice bound without the loop variable: ``i + block + 1`` -> ``block + 1``, ``i`` -> ``0``."""
    rest = [t for t in _terms(bound) if not (isinstance(t, ast.Name) and t.id == var)]
    return " + ".join(ast.unparse(t) for t in rest) if rest else "0"


def _uses_only_var_once(bound: ast.expr | None, var: str) -> bool:
    """``var`` plus terms without it: the slice moves with the loop variable, one row per sample."""
    if bound is None:
        return False
    terms = _terms(bound)
    hits = [t for t in terms if isinstance(t, ast.Name) and t.id == var]
    others_free = all(
        not any(isinstance(n, ast.Name) and n.id == var for n in ast.walk(t)) for t in terms if t not in hits
    )
    return len(hits) == 1 and others_free


def _assigned_from_torch(tree: ast.Module, line: int, name: str) -> bool:
    """Whether ``name`` is assigned from a ``torch.*`` call in the function (or module) holding ``line``."""
    scopes = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.lineno <= line <= (n.end_lineno or n.lineno)
    ]
    scope: ast.AST = min(scopes, key=lambda n: (n.end_lineno or n.lineno) - n.lineno) if scopes else tree
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.Call) and dotted_name(node.value.func).startswith("torch."):
                return True
    return False


def per_sample_build(site: Site) -> PerSampleBuild | None:
    """The per-sample batch build at ``site``'s line, if the line holds one (the innermost)."""
    tree = syntax_tree(site.file)
    if tree is None:
        return None
    found: list[tuple[int, ast.Call, ast.ListComp | ast.GeneratorExp]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args and node.lineno <= site.line <= (node.end_lineno or 0)):
            continue
        name = dotted_name(node.func)
        comp = node.args[0]
        if (
            name.rsplit(".", 1)[-1] in _BUILDERS
            and isinstance(comp, (ast.ListComp, ast.GeneratorExp))
            and len(comp.generators) == 1
            and isinstance(comp.generators[0].target, ast.Name)
        ):
            found.append(((node.end_lineno or node.lineno) - node.lineno, node, comp))
    if not found:
        return None
    _, call, comp = min(found, key=lambda item: item[0])
    gen = comp.generators[0]
    assert isinstance(gen.target, ast.Name)
    var, indices = gen.target.id, ast.unparse(gen.iter)
    build = PerSampleBuild(
        site,
        dotted_name(call.func),
        ast.unparse(comp.elt),
        var,
        indices,
        "rows",
        indices_tensor=isinstance(gen.iter, ast.Name) and _assigned_from_torch(tree, site.line, indices),
    )
    elt = comp.elt
    if (
        isinstance(elt, ast.Subscript)
        and isinstance(elt.value, ast.Name)
        and isinstance(elt.slice, ast.Slice)
        and elt.slice.step is None
        and not gen.ifs
        and _uses_only_var_once(elt.slice.lower, var)
        and _uses_only_var_once(elt.slice.upper, var)
    ):
        return dataclasses.replace(build, kind="slices", data=elt.value.id, start=elt.slice.lower, stop=elt.slice.upper)
    return build
