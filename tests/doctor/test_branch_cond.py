"""A data-dependent branch whose sides are not one torch.where, read as torch.cond: which shapes are read and how,
why the others are not, and that the rewrite on a copy of the model computes what the method did with no graph
break left."""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap
from types import SimpleNamespace

import pytest
import torch

from turbotrain.doctor.rules.compile._branch_rewrite import branch_form, form_at, with_rewrite
from turbotrain.doctor.sites import Site

pytestmark = pytest.mark.reads_no_time  # it asserts that a trial ran, not what it measured: the shared lane


def _form(source: str):
    function = ast.parse(textwrap.dedent(source)).body[0]
    branch = next(n for n in ast.walk(function) if isinstance(n, ast.If))
    return branch_form(branch, function)


TWO_NAMES = """
def forward(self, x):
    if x.mean() > 0:
        h = self.a(x)
        h = torch.relu(h)
        scale = h.std()
    else:
        h = self.b(x) * 2
        scale = h.mean()
    return h * scale
"""

WITHOUT_ELSE = """
def forward(self, x):
    h = self.lin(x)
    if h.sum() > 0:
        t = h * 2
        h += t
    return h
"""

RETURNS = """
def forward(self, x):
    if x.sum() > 0:
        y = self.a(x)
        return y + 1
    else:
        return x
"""


def test_sides_that_set_several_names_return_the_ones_read_after_the_branch():
    form = _form(TWO_NAMES)
    assert form.label == "torch.cond" and form.outputs == ("h", "scale") and form.operands == ()
    assert form.code().splitlines()[-1] == "h, scale = torch.cond(x.mean() > 0, _if_true, _if_false, ())"


def test_a_name_one_side_leaves_is_handed_in_and_returned_as_a_copy():
    """torch.cond may neither change its inputs (`+=` is written out) nor return them (the untouched side copies)."""
    assert _form(WITHOUT_ELSE).code() == (
        "def _if_true(h):\n    t = h * 2\n    h = h + t\n    return h\n"
        "def _if_false(h):\n    return h.clone()\n"
        "h = torch.cond(h.sum() > 0, _if_true, _if_false, (h,))"
    )


def test_sides_that_each_return_return_the_cond_and_copy_what_they_did_not_make():
    code = _form(RETURNS).code().splitlines()
    assert code[-1] == "return torch.cond(x.sum() > 0, _if_true, _if_false, ())"
    assert "    return y + 1" in code and "    return x.clone()" in code


def test_an_elif_is_a_cond_of_its_own_inside_the_other_side():
    form = _form("""
        def forward(self, x):
            if x.sum() > 0:
                y = x * 2
            elif x.sum() < -1:
                y = x * 3
            else:
                y = x.view(-1)
            return y
        """)
    code = form.code()
    assert code.count("torch.cond(") == 2 and "        return y.clone()" in code  # a view of x, copied


@pytest.mark.parametrize(("source", "why"), [
    ("if x.sum() > 0:\n        self.count = 1\n        x = x + 1", "changes `self.count`"),
    ("if x.sum() > 0:\n        x.mul_(2)\n        x = x + 1", "in place (`x.mul_(2)`)"),
    ("if x.sum() > 0:\n        return x\n        x = x + 1", "returns before its end"),
    ("if x.sum() > 0:\n        y = x * 2\n        return y", "one side returns and the other goes on"),
    ("if x.sum() > 0:\n        y = x * 2\n        z = y", "neither side sets a name the code after it reads"),
])  # fmt: skip
def test_sides_torch_cond_cannot_take_say_why(source, why):
    assert why in _form(f"def forward(self, x):\n    {source}\n    return x\n")


class _TwoWays(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        if h.mean() > 0:
            g = torch.tanh(h)
            h = g * 3
        else:
            h = self.b(h)
        return h.sum(dim=1)


def test_the_cond_rewrite_computes_the_same_values_and_gradients_with_no_break_left():
    from turbotrain.doctor.analysis.source import SourceIndex

    lines, first = inspect.getsourcelines(_TwoWays.forward)
    line = first + next(i for i, text in enumerate(lines) if "if h.mean()" in text)
    form = form_at(SourceIndex.parse(__file__), line)
    assert form.label == "torch.cond" and form.outputs == ("h",)
    torch.manual_seed(0)
    model = _TwoWays()
    rewritten = with_rewrite(copy.deepcopy(model), Site(__file__, line), form)
    compiled = torch.compile(rewritten, backend="eager", fullgraph=True)  # fullgraph: a break would raise
    sides = set()
    for bias in (10.0, -10.0):  # each side of the branch taken
        with torch.no_grad():
            model.a.bias.fill_(bias), rewritten.a.bias.fill_(bias)
        x = torch.randn(3, 4)
        sides.add(bool(model.a(x).mean() > 0))
        expected, got = model(x), compiled(x)
        torch.testing.assert_close(got, expected)
        expected.sum().backward()
        got.sum().backward()
        for mine, theirs in zip(model.parameters(), rewritten.parameters()):
            # the side not taken: no gradient in the method, zeros through torch.cond
            torch.testing.assert_close(theirs.grad, torch.zeros_like(mine) if mine.grad is None else mine.grad)
        model.zero_grad(), rewritten.zero_grad()
    assert sides == {True, False}
    torch._dynamo.reset()


class _FloatKept(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        scale = 1.0
        if h.mean() > 0:
            h = h * 2
            scale = h.std()
        return h * scale


def _break_context(module_class, text: str):
    """A Context for a run that compiled ``module_class`` and broke at its ``if`` (``text``), as the rule reads it:
    torch's record of the break, the script's source, the compiled model and a captured batch."""
    from turbotrain.doctor.analysis.breakdown import compute_breakdown
    from turbotrain.doctor.analysis.context import Context
    from turbotrain.doctor.analysis.source import SourceIndex
    from turbotrain.doctor.record.compile_watch import CompileFacts, CompiledCode, GraphBreak
    from turbotrain.hardware import detect

    lines, first = inspect.getsourcelines(module_class.forward)
    line = first + next(i for i, said in enumerate(lines) if text in said)
    at = Site(__file__, line, "forward")
    code = CompiledCode("forward", Site(__file__, first, "forward"), Site(__file__, first, "forward"), compiles=2,
                        graphs=2, breaks=(GraphBreak(at, "Data-dependent branching", "GB0170", "", count=1),),
                        recompiles=(), first_compile_s=0.5)
    recording = SimpleNamespace(compiled=CompileFacts(codes=(code,), graphs=2, breaks=1), driver=None, job=(),
                                planned_loop=())
    torch.manual_seed(0)
    compiled = torch.compile(module_class(), backend="aot_eager")
    capture = SimpleNamespace(args=(torch.randn(8, 4),), kwargs={}, module=compiled)
    return Context(script=__file__, base=None, hw=detect("cpu"), device="cpu", breakdown=compute_breakdown([], 1),
                   measured_steps=[], capture=capture, sources={__file__: SourceIndex.parse(__file__)},
                   recording=recording)  # type: ignore[arg-type]  # a stand-in Recording


def test_the_rule_times_a_branch_as_torch_cond_on_a_copy_of_the_compiled_model():
    from turbotrain.doctor.results import CompileResult
    from turbotrain.doctor.rules.compile.compile_graph_break import graph_breaks, measure
    from turbotrain.doctor.whatif.common import Budget

    ctx = _break_context(_TwoWays, "if h.mean()")
    [finding] = graph_breaks(ctx)
    assert finding.evidence.cond.endswith("h = torch.cond(h.mean() > 0, _if_true, _if_false, (h,))")
    assert finding.evidence.where is None and finding.request is not None
    measured = measure(ctx, finding, Budget(30.0))
    assert measured is not None, finding.note  # the note says why nothing was timed (a rewrite torch refused)
    assert isinstance(measured.what_if, CompileResult) and len(measured.what_if.rounds) >= 2
    assert measured.what_if.candidate == "compiled with the branch as torch.cond"
    assert "only the side taken runs" in measured.note and "zero gradients, not None" in measured.note
    torch._dynamo.reset()


def test_a_python_number_handed_to_torch_cond_is_said_and_not_timed():
    """``scale = 1.0`` would be handed to torch.cond on the side that leaves it: a Python float, which it refuses."""
    from turbotrain.doctor.rules.compile.compile_graph_break import graph_breaks

    [finding] = graph_breaks(_break_context(_FloatKept, "if h.mean()"))
    assert finding.evidence.cond is None and finding.request is None
    assert "This branch is not timed: `scale` is a Python number where the branch starts (`scale = 1.0`" in (
        finding.note
    )
    torch._dynamo.reset()


class _NestedBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        if h.mean() > 0:
            g = h * 2
            if g.sum() > 1:
                g = g + 1
            h = g
        return h


def test_a_cond_rewrite_torch_refuses_is_said_in_the_findings_note():
    """A second branch on a tensor inside a side: torch.cond cannot trace it, and the note says torch's reason."""
    from turbotrain.doctor.rules.compile.compile_graph_break import graph_breaks, measure
    from turbotrain.doctor.whatif.common import Budget

    ctx = _break_context(_NestedBranch, "if h.mean()")
    [finding] = graph_breaks(ctx)
    assert finding.evidence.cond is not None and finding.request is not None
    assert measure(ctx, finding, Budget(30.0)) is None
    assert "Timed as torch.cond, the rewrite did not compile:" in finding.note
    torch._dynamo.reset()
