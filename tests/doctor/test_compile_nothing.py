"""``model.compile()`` on a model whose call is all torch's own code (an ``nn.Sequential`` of torch's layers)
compiles nothing on torch 2.13: Dynamo skips every frame of it. The run is recorded as eager, the finding names the
``.compile()`` line, times ``torch.compile(model)`` against what ran, and its edit writes that call."""

from __future__ import annotations

import textwrap

import pytest

from turbotrain.doctor.analysis.context import build_context
from turbotrain.doctor.edits import EditRequest
from turbotrain.doctor.record.recorder import Recorder
from turbotrain.doctor.record.runner import run_script
from turbotrain.doctor.rules import evaluate

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

SCRIPT = """
    import torch
    from torch import nn

    {model}
    {compile}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    for step in range(40):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        loss = nn.functional.cross_entropy({called}(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
SEQUENTIAL = "model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))"
OWN_CLASS = """class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))

        def forward(self, x):
            return self.body(x)


    model = Net()"""


def _recorded(tmp_path, model: str, compile: str = "model.compile()", called: str = "model"):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(model=model, compile=compile, called=called)))
    recorder = Recorder(measure=3, warmup=2, profile=1)
    run = run_script(script, [], recorder)
    assert run.status == "stopped", run
    return script, build_context(recorder.recording(), recorder.live_objects(), str(script))


def test_a_sequential_compiled_in_place_ran_eagerly_and_is_named_at_its_compile_line(tmp_path, monkeypatch):
    import functools

    import torch
    from torch._dynamo import eval_frame

    from turbotrain.doctor.rules.compile.compile_nothing import RULE
    from turbotrain.doctor.whatif.common import Budget

    script, ctx = _recorded(tmp_path, SEQUENTIAL)
    # Torch compiled none of the script's code (the doctor's own hooks, which it traced, are not the script's): the
    # model's facts say eager, so its switches are timed on it as on any eager model.
    assert ctx.compiled is None and ctx.capture is not None and not ctx.facts.compiled, ctx.compiled
    assert eval_frame._stance.stance == "default"
    failed: list = []
    (f,) = evaluate(ctx, only=["compile-nothing"], failed=failed)
    assert failed == []
    line = script.read_text().splitlines().index("model.compile()") + 1
    assert f.site.line == line and f.message.startswith("`model.compile()` compiled nothing"), f
    assert f.fix.pytorch.startswith("`model = torch.compile(model)`")
    # Timed: the model as it ran against a copy torch.compile traced, whose first calls compiled it (traced by AOT
    # autograd and run eagerly: Inductor's code generation, seconds on a CPU, is the what-if's to pay, not this test's).
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    measured = RULE.measure(ctx, f, Budget(60.0))
    assert measured is not None
    result = measured.what_if
    assert result.compile_s > 0 and result.candidate_first_calls_s > result.baseline_first_calls_s, result
    assert result.run_steps == 40 and len(result.rounds) >= 2 and measured.verdict.speedup > 0, result
    assert ctx.capture.module._compiled_call_impl is not None  # the script's model is left as it was


def test_a_model_class_of_the_scripts_own_compiled_in_place_compiles_and_is_not_named(tmp_path):
    script, ctx = _recorded(tmp_path, OWN_CLASS)
    assert ctx.compiled is not None and ctx.compiled.graphs >= 1 and ctx.facts.compiled, ctx.compiled
    assert evaluate(ctx, only=["compile-nothing"], failed=[]) == []
    # Whether compiling pays is said where the fix goes: the model.compile() line, not the forward it compiled.
    (pays,) = evaluate(ctx, only=["compile-pays-back"], failed=[])
    assert pays.site.line == script.read_text().splitlines().index("model.compile()") + 1, pays.site


@pytest.mark.parametrize("statement, form", [("torch.compile(model)", "dropped"),
                                             ("compiled = torch.compile(model)", "unused")])
def test_a_compiled_model_the_steps_never_call_is_named_at_the_compile_line(tmp_path, statement, form):
    script, ctx = _recorded(tmp_path, OWN_CLASS, compile=statement)
    assert ctx.compiled is None and not ctx.facts.compiled, ctx.compiled
    (f,) = evaluate(ctx, only=["compile-nothing"], failed=[])
    assert f.site.line == script.read_text().splitlines().index(statement) + 1, f
    assert (f.evidence.form, f.evidence.target, f.evidence.module) == (form, "model", "Net"), f.evidence
    said = {"dropped": "returns the compiled model, and the script drops it",
            "unused": "makes a compiled model that the steps never call: they call model (Net, at train.py:"}
    assert said[form] in f.message, f.message


@pytest.mark.parametrize(
    "line, form, written",
    [
        ("model.compile()", "in-place", "model = torch.compile(model)"),
        ("net.encoder.compile(mode='max-autotune')  # compile it", "in-place",
         "net.encoder = torch.compile(net.encoder, mode='max-autotune')  # compile it"),
        ("torch.compile(model, dynamic=False)", "dropped", "model = torch.compile(model, dynamic=False)"),
    ],
)
def test_the_compile_statement_is_written_as_an_assignment_with_its_arguments_and_comment(line, form, written):
    pytest.importorskip("libcst", reason="doctor --fix needs libcst: pip install -e '.[fix]'")
    from turbotrain.doctor.cst_tools import Source
    from turbotrain.doctor.rules.compile.compile_nothing import rewrite

    text = f"import torch\n\n# the model\n{line}\nprint('ok')\n"
    target = line.split(".compile")[0] if form == "in-place" else "model"
    req = EditRequest("compile-nothing", "rule", "train.py", 4, "train.py:4", "label",
                      params={"form": form, "target": target})
    assert rewrite(Source(text, "train.py"), req) == f"import torch\n\n# the model\n{written}\nprint('ok')\n"


@pytest.mark.parametrize(
    "statement, form",
    [
        ("net.compile()", ("in-place", "net", "")),
        ("torch.compile(model, mode='max-autotune')", ("dropped", "model", "")),
        ("compiled = torch.compile(model)", ("unused", "model", "compiled")),
        ("model = torch.compile(model)", None),  # the model compiled: not this rule's
        ("fast = torch.compile(model)", None),  # where the steps call fast: (below) compiled
        ("re.compile('a+')", None),  # a module the file imports
        ("re.compile(pattern)", None),  # ... its own compile, not torch's, whatever it is handed
        ("torch.compile(make_model())", None),  # no name to assign it to
    ],
)
def test_how_a_compile_statement_leaves_the_model_eager_is_read_from_the_line(statement, form):
    import ast

    from turbotrain.doctor.analysis.source import SourceIndex
    from turbotrain.doctor.rules.compile._compile_calls import compile_form

    text = f"import re\nimport torch\n{statement}\n"
    index = SourceIndex(path="train.py", text=text, tree=ast.parse(text))
    called = {"fast"} if statement.startswith("fast") else {"model"}
    assert compile_form(index, 3, called) == form
