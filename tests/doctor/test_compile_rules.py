"""The compile rules on synthetic CompileFacts: each break, recompile and compile second at the user's line, with
the fix by kind; the doctor's own probes left out; "compile is slower than eager" said plainly. No compiling here:
the corpus runs (test_corpus.py) are the end-to-end ones."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.record.measurements import EventCounts
from turbotrain.doctor.record.compile_watch import (
    CHANGED_VALUE,
    NEW_SHAPE,
    CompiledCode,
    CompileFacts,
    CompileSpan,
    Fallback,
    GraphBreak,
    Recompile,
)
from turbotrain.doctor.report.model import Report, compiled_json
from turbotrain.doctor.report.terminal import compiled_lines
from turbotrain.doctor.requests import OwnTrial
from turbotrain.doctor.rules import evaluate
from turbotrain.doctor.rules.compile import _common
from turbotrain.doctor.rules.compile.compile_graph_break import BRANCH, ITEM, PRINT, UNSUPPORTED, break_kind
from turbotrain.doctor.rules.compile.compile_pays_back import _said, pays_after
from turbotrain.doctor.sites import Site
from turbotrain.hardware import detect

USER = "/home/me/train.py"
HW = detect("cpu")


def site(line: int, function: str = "forward") -> Site:
    return Site(USER, line, function)


def a_break(line: int, title: str, gb_id: str = "", reason: str = "", skipped: bool = False) -> GraphBreak:
    return GraphBreak(site(line), title, gb_id, reason or title, count=2, skipped=skipped)


ITEM_BREAK = a_break(18, "Unsupported Tensor.item() call with capture_scalar_outputs=False", "GB0124")
PROBE_BREAK = a_break(30, "Attempted to call function marked as skipped", "GB0007",
                      "Developer debug context: module: _thread, qualname: get_ident, skip reason: builtin")


def recompile(kind: str, guard: str, line: int = 41, seconds: float = 0.5) -> Recompile:
    return Recompile("0/1", kind, guard, guard, site(line, "main"), site(line, "main"), seconds)


def code(breaks=(), recompiles=(), fallback=None, file: str = USER, name: str = "forward",
         first_compile_s: float = 1.5) -> CompiledCode:
    return CompiledCode(name, Site(file, 16, name), Site(file, 16, name), compiles=1 + len(recompiles),
                        graphs=2, breaks=tuple(breaks), recompiles=tuple(recompiles), first_compile_s=first_compile_s,
                        fallback=fallback)


def context(*codes: CompiledCode) -> Context:
    facts = CompileFacts(codes=codes, graphs=sum(c.graphs for c in codes),
                         breaks=sum(len(c.breaks) for c in codes), recompiles=sum(len(c.recompiles) for c in codes),
                         compile_s=sum(c.compile_s for c in codes),
                         fell_back=sum(c.fallback is not None for c in codes))
    recording = SimpleNamespace(compiled=facts, driver=None, job=(), planned_loop=())  # what rules read of a Recording
    return Context(script=USER, base="/home/me", hw=HW, device="cpu", breakdown=compute_breakdown([], 1),
                   measured_steps=[], recording=recording)  # type: ignore[arg-type]  # a stand-in Recording


def findings(ctx: Context, rule: str):
    failed: list = []
    found = evaluate(ctx, only=[rule], failed=failed)
    assert failed == []
    return found


def test_an_item_break_is_found_at_the_users_line_with_torchs_reason_and_the_flag_as_fix():
    [f] = findings(context(code([ITEM_BREAK])), "compile-graph-break")
    assert (f.site.file, f.site.line) == (USER, 18) and f.severity == "medium" and not f.measured
    assert "Unsupported Tensor.item()" in f.message and "2 compile(s)" in f.message
    assert "capture_scalar_outputs = True" in f.fix.pytorch and "torch.where" in f.fix.pytorch
    assert f.evidence.kind == ITEM
    # No captured compiled model in this context: nothing can be timed, so nothing is asked for.
    assert f.request is None


def test_only_the_first_item_break_asks_for_the_trial(monkeypatch):
    monkeypatch.setattr("turbotrain.doctor.rules.compile.compile_graph_break.compiled_model", lambda ctx: object())
    second = a_break(24, ITEM_BREAK.title, "GB0124")
    found = findings(context(code([ITEM_BREAK, second])), "compile-graph-break")
    assert [isinstance(f.request, OwnTrial) for f in sorted(found, key=lambda f: f.site.line)] == [True, False]


def test_each_kind_of_break_gets_its_own_fix():
    assert break_kind(a_break(5, "Data-dependent branching")) == BRANCH
    assert break_kind(a_break(5, "Failed to trace builtin operator", reason="builtin print")) == PRINT
    assert break_kind(a_break(5, "Unsupported context manager")) == UNSUPPORTED
    ctx = context(code([a_break(5, "Data-dependent branching"), a_break(6, "Logger not supported: logging.info"),
                        a_break(7, "Unsupported context manager")]))
    fixes = {f.site.line: f.fix.pytorch for f in findings(ctx, "compile-graph-break")}
    assert "torch.cond" in fixes[5] and "Move the print/logging out" in fixes[6] and "custom op" in fixes[7]


def test_a_break_in_a_loop_that_made_the_function_eager_says_so():
    [f] = findings(context(code([a_break(30, ITEM_BREAK.title, "GB0124", skipped=True)])), "compile-graph-break")
    assert "ran the whole enclosing function eagerly" in f.message and f.severity == "medium"


def test_a_break_on_the_doctors_own_probes_is_not_the_scripts():
    """A probe inlined into the user's compiled forward breaks at the user's line, on a builtin the doctor calls
    (the recording already leaves the compiles of the doctor's own frames out: test_compile_watch.py)."""
    assert findings(context(code([PROBE_BREAK])), "compile-graph-break") == []
    assert findings(context(code([PROBE_BREAK, ITEM_BREAK])), "compile-graph-break")


# torch's words (2.13) for DDP's own breaks under torch.compile(DistributedDataParallel(model)).
DDP_LOGGER = ("Unsupported method call\n  Explanation: Dynamo does not know how to trace method "
              "`set_runtime_stats_and_log` of class `Logger`\n  Hint: Avoid calling `Logger.set_runtime_stats_and_log` "
              "in your code.\n  Developer debug context: call_method UserDefinedObjectVariable(Logger) "
              "set_runtime_stats_and_log [] {}")
DDP_SKIPPED = ("Attempted to call function marked as skipped\n  Explanation: Dynamo developers have intentionally "
               "marked that the function `DistributedDataParallel._inside_ddp_forward` in file `torch/_compile.py` "
               "should not be traced.")
TORCH = "/venv/lib/python3.11/site-packages/torch"


def in_torch(title: str, reason: str, line: int, function: str, gb_id: str) -> GraphBreak:
    """A break torch met in DDP's code, run from the user's line 19."""
    return GraphBreak(site(19, "<module>"), title, gb_id, reason, count=1,
                      inside=Site(f"{TORCH}/nn/parallel/distributed.py", line, function), library="torch")


def ddp(*breaks: GraphBreak, graphs: int = 0) -> CompiledCode:
    """torch.compile(DistributedDataParallel(...)): torch's wrap_inline code, named after the module."""
    return CompiledCode("DistributedDataParallel", Site(f"{TORCH}/_dynamo/external_utils.py", 67, "inner"),
                        site(19, "<module>"), compiles=4, graphs=graphs, breaks=breaks, recompiles=(),
                        first_compile_s=0.6)


def test_a_break_in_torchs_own_code_is_torchs_not_a_print_of_the_script():
    """DDP's C++ Logger is no logging call: the breaks in DDP's code are named as torch's, at the user's call of
    the module, in one finding; with no graph captured, the fix compiles the module DDP runs."""
    from turbotrain.doctor.edits import ByHand
    from turbotrain.doctor.rules.compile.compile_graph_break import LIBRARY, edit

    logger = in_torch("Unsupported method call", DDP_LOGGER, 1757, "_pre_forward", "GB0156")
    skipped = in_torch("Attempted to call function marked as skipped", DDP_SKIPPED, 1714, "_run_ddp_forward", "GB0007")
    assert break_kind(logger) == break_kind(skipped) == LIBRARY
    ctx = context(ddp(logger, skipped))
    [f] = findings(ctx, "compile-graph-break")
    assert (f.site.line, f.evidence.kind, f.evidence.code) == (19, LIBRARY, "DistributedDataParallel")
    assert f.evidence.inside == "torch/nn/parallel/distributed.py:1757 in _pre_forward"
    assert "print" not in f.message and "print" not in f.fix.pytorch
    assert "inside torch's code, not at a line of the script" in f.message
    assert "_pre_forward() (torch/nn/parallel/distributed.py:1757)" in f.message and "class `Logger`" in f.message
    assert "_run_ddp_forward() (torch/nn/parallel/distributed.py:1714)" in f.message
    assert "captured no graph" in f.message and f.severity == "low"
    assert "DistributedDataParallel(torch.compile(model))" in f.fix.pytorch
    with pytest.raises(ByHand, match="library's code"):
        edit(ctx, f)
    # The model's own forward compiled (a module class of the user's inside DDP): the breaks are left to torch.
    [f] = findings(context(ddp(logger), code()), "compile-graph-break")
    assert "captured no graph" not in f.message and "leave it" in f.fix.pytorch
    facts = context(ddp(logger)).compiled
    report = Report(status="ok", breakdown=None, findings=[], compiled=facts, base="/home/me")
    assert compiled_lines(report)[1].startswith("  DistributedDataParallel (train.py:19): 0 graphs, 1 breaks")
    [brk] = compiled_json(facts, "/home/me")["codes"][0]["breaks"]
    assert brk["where"] == "train.py:19" and brk["inside"] == f"{TORCH}/nn/parallel/distributed.py:1757"


def test_a_print_or_a_log_is_said_only_on_evidence_of_one():
    """torch's hint names print for every builtin it cannot trace: the builtin it names decides. A logging call
    is the user's whether torch breaks at the line or inside logging's code the line called."""
    builtin = ("Failed to trace builtin operator\n  Explanation: Dynamo does not know how to trace builtin operator "
               "`{}` with argument types ['Tensor']\n  Hint: If you are attempting to call a logging function "
               "(e.g. `print`), you can try adding it to `torch._dynamo.config.reorderable_logging_functions`.")
    assert break_kind(a_break(5, "Failed to trace builtin operator", "GB0059", builtin.format("print"))) == PRINT
    assert break_kind(a_break(5, "Failed to trace builtin operator", "GB0059", builtin.format("id"))) == UNSUPPORTED
    assert break_kind(a_break(5, "logging.Logger method not supported for non-export cases", "GB0291")) == PRINT
    assert break_kind(a_break(5, "Unsupported method call", "GB0156", DDP_LOGGER)) == UNSUPPORTED
    into_logging = GraphBreak(site(12), "Unsupported python_type() call", "GB4841",
                              "Developer debug context: GetAttrVariable(LoggingLoggerVariable(), handlers)", count=1,
                              inside=Site("/usr/lib/python3.11/logging/__init__.py", 2131, "warning"),
                              library="logging")
    assert break_kind(into_logging) == PRINT
    [f] = findings(context(code([into_logging])), "compile-graph-break")
    assert "prints or logs" in f.message and "Move the print/logging out" in f.fix.pytorch


def test_the_first_item_break_is_fixed_by_the_flag_in_the_script_and_the_others_by_hand():
    from turbotrain.doctor.edits import ByHand
    from turbotrain.doctor.rules.compile.compile_graph_break import edit

    second = a_break(25, "Unsupported Tensor.item() call with capture_scalar_outputs=False", "GB0124")
    ctx = context(code([ITEM_BREAK, second, a_break(40, "Data-dependent branching", "GB0170")]))
    first, other, branch = findings(ctx, "compile-graph-break")
    spec = edit(ctx, first)
    assert (spec.kind, spec.file, spec.params) == ("dynamo_config", USER, {"name": "capture_scalar_outputs",
                                                                         "value": True})
    assert spec.numerics == "precision"  # other graphs, other fused kernels
    with pytest.raises(ByHand, match="keeps this one in the graph too"):
        edit(ctx, other)
    with pytest.raises(ByHand, match="torch.where"):
        edit(ctx, branch)


def test_new_shapes_get_dynamic_at_the_one_compile_call(tmp_path):
    from turbotrain.doctor.analysis.source import load_sources
    from turbotrain.doctor.edits import ByHand
    from turbotrain.doctor.rules.compile.compile_recompile import edit

    script = tmp_path / "train.py"
    script.write_text("import torch as th\nmodel = th.compile(net)\n")
    shapes = [recompile(NEW_SHAPE, f"size mismatch at index 1. expected 16, actual {n}") for n in (21, 26)]
    ctx = context(code(recompiles=shapes))
    ctx.sources = load_sources([str(script)])
    [f] = findings(ctx, "compile-recompile")
    spec = edit(ctx, f)
    assert (spec.kind, spec.file, spec.line) == ("compile", str(script), 2)
    assert spec.params == {"keywords": {"dynamic": True}}
    script.write_text("import torch\nmodel = torch.compile(net)\nhead = torch.compile(head)\n")
    ctx.sources = load_sources([str(script)])
    with pytest.raises(ByHand, match="train.py:2, .*train.py:3"):
        edit(ctx, f)
    [value] = findings(context(code(recompiles=[recompile(CHANGED_VALUE, "L['n'] == 3")] * 2)), "compile-recompile")
    with pytest.raises(ByHand, match="as a tensor"):
        edit(ctx, value)
    # dynamic=False is what made one graph per length: the fix turns it over; another value is the user's.
    script.write_text("import torch\nmodel = torch.compile(net, dynamic=False)\n")
    ctx.sources = load_sources([str(script)])
    assert edit(ctx, f).params == {"keywords": {"dynamic": True}}
    script.write_text("import torch\nmodel = torch.compile(net, dynamic=cfg.dynamic)\n")
    ctx.sources = load_sources([str(script)])
    with pytest.raises(ByHand, match="sets dynamic= already"):
        edit(ctx, f)


def test_the_lengths_a_run_met_are_read_from_its_failed_size_guards():
    from turbotrain.doctor.rules.compile.compile_recompile import size_guards

    guards = [recompile(NEW_SHAPE, f"tensor 'tokens' size mismatch at index 1. expected {a}, actual {b}")
              for a, b in ((16, 21), (21, 26), (26, 21))]
    guards.append(recompile(NEW_SHAPE, "tensor 'tokens' size mismatch at index 0. expected 16, actual 8"))
    assert size_guards(guards) == ("tokens", 1, [16, 21, 26])
    assert size_guards([recompile(NEW_SHAPE, "tensor 'L['x']' size mismatch at index 0. expected 4, actual 5")]) \
        == ("x", 0, [4, 5])
    assert size_guards([recompile(CHANGED_VALUE, "L['n'] == 3")]) is None


def test_the_captured_batch_is_cut_or_extended_to_each_length_with_the_tensors_that_share_it():
    from torch import nn

    from turbotrain.doctor.rules.compile.compile_recompile import other_lengths

    class Tagger(nn.Module):
        def forward(self, tokens, mask=None, scale=1.0):
            return tokens

    tokens = torch.arange(24).reshape(2, 12)
    mask = torch.ones(2, 12, dtype=torch.bool)
    bias = torch.zeros(12, 2)  # 12 long on dimension 0, not 1: left alone
    batches = other_lengths(Tagger(), ((tokens,), {"mask": mask, "scale": bias}), "tokens", 1, [12, 5, 30])
    assert [b[0][0].shape[1] for b in batches] == [5, 30]  # the captured length is not run again
    short, long = batches
    assert torch.equal(short[0][0], tokens[:, :5]) and short[1]["mask"].shape == (2, 5)
    assert torch.equal(long[0][0][:, 12:24], tokens) and long[0][0].max() == tokens.max()  # its own values
    assert short[1]["scale"] is bias
    assert other_lengths(Tagger(), ((tokens,), {}), "inputs", 1, [5]) == []  # a name that is no argument


def test_dynamic_is_priced_against_what_the_script_paid_and_what_it_ran_after_the_limit():
    from turbotrain.doctor.rules.compile.compile_recompile import dynamic_note

    # 0.5 s of first calls of which 2 steps are 1 ms each: 0.498 s of compiling; two other lengths, no new graph.
    timing = _common.PairTiming((1.5, 1.5), a_s=0.0015, b_s=0.001, warm_s=(0.9, 0.5),
                                other_s=(0.001, 0.001), other_graphs=0)
    note = dynamic_note(timing, True, 4.0, 7, 2, fell_back=True)
    assert note.startswith("With dynamic=True: one compile of 0.5 s, and on 2 other length(s) the run met it "
                           "compiled 0 more graph(s); a step 1.00 ms against 1.50 ms as the script runs it.")
    assert note.endswith("(7 recompile(s)) and ran it eagerly after the limit, which is slower than compiled with "
                         "dynamic=True.")
    assert "does not beat" in dynamic_note(timing, False, 4.0, 7, 2, fell_back=True)
    assert dynamic_note(timing, False, 4.0, 1, 2, fell_back=False).endswith(
        "alike within the noise: dynamic=True saves 3.5 s of compiling a run.")
    slower = _common.PairTiming((0.8, 0.8), a_s=0.001, b_s=0.00125, warm_s=(0.9, 0.5))
    assert dynamic_note(slower, True, 4.0, 1, 0, fell_back=False).endswith(
        "It saves compiling and costs step time: worth it for runs (or restarts) of under 14,010 steps.")


def test_repeated_blocks_are_the_container_of_one_class_holding_most_parameters():
    from torch import nn

    from turbotrain.doctor.rules.compile.compile_regional import repeated_blocks

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(16, 16)

    class Net(nn.Module):
        def __init__(self, depth, head=16):
            super().__init__()
            self.embed = nn.Linear(16, 16)
            self.trunk = nn.Sequential(nn.Identity(), nn.ModuleList(Block() for _ in range(depth)))
            self.head = nn.Linear(16, head)

    assert repeated_blocks(Net(6)) == ("trunk.1", "Block", 6)
    assert repeated_blocks(Net(2)) is None  # too few to compile one by one
    assert repeated_blocks(Net(4, head=4096)) is None  # the blocks hold a small part of the model
    assert repeated_blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))) is None  # mixed classes


def test_block_by_block_compiling_is_weighed_over_the_run():
    from turbotrain.doctor.rules.compile._common import trade_off

    assert trade_off(0.11, -0.00023, "compile block by block") == (
        "It saves compiling and costs step time: worth it for runs (or restarts) of under 479 steps.")
    assert trade_off(-0.5, 0.001, "compile block by block").endswith("of over 500 steps.")
    assert trade_off(2.0, 0.0, "compile block by block") == "It saves both: compile block by block."
    assert "neither" in trade_off(-0.1, -0.001, "compile block by block")


def test_new_lengths_every_step_are_priced_in_compile_seconds_at_the_calling_line():
    shapes = [recompile(NEW_SHAPE, f"tensor 'tokens' size mismatch at index 1. expected 16, actual {n}")
              for n in (21, 26)]
    [f] = findings(context(code(recompiles=shapes)), "compile-recompile")
    assert (f.site.line, f.severity) == (41, "medium")
    assert "2 more time(s) (2 for a new shape)" in f.message and "1.0 s of compiling" in f.message
    assert "dynamic=True" in f.fix.pytorch and "mark_dynamic" in f.fix.pytorch and "bucket" in f.fix.pytorch
    assert f.evidence.recompile_s == 1.0


def test_one_new_length_is_low_and_the_value_an_item_break_read_is_the_breaks():
    [f] = findings(context(code(recompiles=[recompile(NEW_SHAPE, "size mismatch")])), "compile-recompile")
    assert f.severity == "low" and "dynamic" in (f.note or "")
    folded = code([ITEM_BREAK], [recompile(CHANGED_VALUE, "L['peak'] == 0.98")])
    assert findings(context(folded), "compile-recompile") == []


def test_the_recompile_limit_hit_is_high_and_says_the_rest_ran_eagerly():
    limit = Fallback("recompile_limit", 8, NEW_SHAPE, "size mismatch at index 1", site(41, "main"))
    [f] = findings(context(code(recompiles=[recompile(NEW_SHAPE, "size mismatch")], fallback=limit)),
                   "compile-recompile")
    assert f.severity == "high" and "recompile_limit=8" in f.message and "eagerly" in f.message
    assert f.site.line == 41 and "dynamic=True" in f.fix.pytorch


def test_compile_seconds_are_reported_and_timed_only_with_a_compiled_model():
    [f] = findings(context(code(recompiles=[recompile(NEW_SHAPE, "size mismatch", seconds=0.5)])),
                   "compile-pays-back")
    assert "2.0 s compiling forward" in f.message and "1.5 s first compiles, 0.5 s recompiles" in f.message
    assert f.request is None and f.severity == "low"  # the script compiled no captured model here


def test_compile_pays_back_after_the_steps_it_saves_and_says_plainly_when_it_is_slower():
    assert pays_after(10.0, eager_s=0.004, compiled_s=0.003) == 10_000
    assert pays_after(10.0, eager_s=0.003, compiled_s=0.004) is None
    ctx = context(code([ITEM_BREAK]))
    faster = _common.PairTiming((0.75, 0.75), a_s=0.003, b_s=0.004, warm_s=(1.0, 0.0))
    note, fix = _said(ctx, faster, 10.0, "inductor")
    assert "Compile costs 10.0 s and saves 1.00 ms a step" in note and "pays after 10,000 steps" in note
    slower = _common.PairTiming((1.3, 1.3), a_s=0.0052, b_s=0.004, warm_s=(1.0, 0.0))
    note, fix = _said(ctx, slower, 10.0, "eager")
    assert note.startswith("The compiled step is slower than eager: 5.20 ms compiled against 4.00 ms eager")
    assert "backend='eager'" in note and "1 graph break(s)" in note and "eagerly" in fix.pytorch
    # airbench's conv net, max-autotune, 72 ms a step compiled: no break, no recompile of the model's, no small ops.
    long = _common.PairTiming((1.25, 1.25), a_s=0.0719, b_s=0.0574, warm_s=(9.3, 0.2))
    note, _ = _said(context(code()), long, 3.7, "inductor")
    assert "its compiled kernels themselves are slower" in note and "small ops" not in note
    note, _ = _said(context(code()), slower, 3.7, "inductor")
    assert "small ops" in note


def _ended_after(ctx: Context, steps: int, step_s: float) -> Context:
    """``ctx`` as a run that ended by itself after ``steps`` steps of ``step_s`` seconds (all compute)."""
    from turbotrain.doctor.record.measurements import StepRecord

    records = [StepRecord(i, i * step_s, (i + 1) * step_s, {"forward": step_s}) for i in range(steps)]
    return ctx.replace(breakdown=compute_breakdown(records, 1), run_steps=steps)


def test_a_run_too_short_for_compile_to_pay_back_says_so_with_both_runs_seconds():
    # llm.c's train_gpt2.py --compile 1 on a 2-core Xeon: 72.8 s compiling, 10 steps of 1.4 s.
    ctx = _ended_after(context(code(first_compile_s=72.8)), 10, 1.4)
    [f] = findings(ctx, "compile-pays-back")
    assert "ended by itself after 10 steps of 1.4 s: compiling was 83.9% of its 86.8 s" in f.message
    assert "eager steps would have to take 8.7 s, 6.20x the compiled step" in f.message
    assert f.severity == "medium" and not f.measured  # untimed, but compiling dwarfs the run
    assert f.request is None  # no captured compiled model in this context; with one, OwnTrial(first=True)
    faster = _common.PairTiming((0.77, 0.8), a_s=0.85, b_s=1.1, warm_s=(20.0, 2.0))
    note, fix = _said(ctx, faster, 72.8, "inductor")
    assert "it pays after 292 steps, and this run ended after 10" in note
    # Eager, each of the 10 steps is longer by what the model's step took eager beyond compiled.
    assert "Compiled it took about 86.8 s; eager it would have taken about 16.5 s" in note
    assert fix.pytorch == "Train runs of 10 steps eagerly (drop torch.compile); keep compiling for runs of over 292"
    # A run the doctor stopped has no known length: when it pays is all that is said.
    note, fix = _said(ctx.replace(run_steps=None), faster, 72.8, "inductor")
    assert "pays after 292 steps. Running eagerly instead would be slower." in note
    # ... unless its loop is a for over range() whose bounds the recorder read (record/cadence.py).
    from turbotrain.doctor.record.cadence import PlannedLoop

    loop = [PlannedLoop(Site(USER, 796, "main"), "range(args.num_iterations + 1)", 5001, n) for n in (3, 23)]
    planned = ctx.replace(run_steps=None)
    planned.recording.planned_loop = ((3, loop[0]), (23, loop[1]))
    [f] = findings(planned, "compile-pays-back")
    assert ("The script's loop runs 5,001 steps (`range(args.num_iterations + 1)` at train.py:796) of 1.4 s: "
            "compiling is 1.0% of its 117.9 min") in f.message and f.severity == "low"
    note, fix = _said(planned, faster, 72.8, "inductor")
    assert "it pays after 292 steps, and the script runs 5,001. Running eagerly instead would be slower." in note
    # nanoGPT's `while True:` ... `if iter_num > max_iters: break`, read with the iterations it has left.
    ends = "if iter_num > max_iters: break"
    planned.recording.planned_loop = tuple(
        (done, PlannedLoop(Site(USER, 333, "<module>"), ends, 5002 - done, done - 1, left=True)) for done in (3, 23)
    )
    [f] = findings(planned, "compile-pays-back")
    assert f"The script's loop runs 5,001 steps (`{ends}` at train.py:333) of 1.4 s" in f.message


def test_whether_compiling_pays_is_timed_first_wherever_the_compiled_model_was_captured():
    """nanoGPT --compile=True (3.3 s of compiling, a run of unknown length): the fused optimizer's and the memory
    fixes' trials went first and took the budget, and the question the report leads with was left "Not timed"."""
    ctx = context(code(first_compile_s=3.3))
    ctx.capture = SimpleNamespace(module=torch.compile(torch.nn.Linear(4, 4)), site=site(300, "<module>"))
    [f] = findings(ctx, "compile-pays-back")
    assert f.request == OwnTrial(first=True) and f.severity == "low"  # first, whatever it is rated before timing


def test_a_run_that_ended_during_the_watch_counts_the_watched_steps():
    """nanoGPT at max_iters=60: the window measured 25 steps, the watch after it (for its eval every 1000 steps)
    saw the rest until the script ended at 61: the run was 61 steps, not 25."""
    from turbotrain.doctor.record.measurements import StepRecord
    from turbotrain.doctor.record.recording import Recording, Window
    from turbotrain.doctor.record.watch import WatchedRun

    steps = tuple(StepRecord(i, i * 0.1, (i + 1) * 0.1, {"forward": 0.1}) for i in range(25))
    recording = Recording(window=Window(3, 20, 20, 1), steps=steps, step_delimiter="optimizer.step()", events=(),
                          loaders=(), optimizer_sites=(), module_sites=(), matmul_shapes=(), gap_samples=())
    assert recording.steps_run == 25
    watched = WatchedRun(25, 60, 5.2, 0.15, (), (), "script")
    assert dataclasses.replace(recording, watched=watched).steps_run == 61


COMPILE_OPTION = """
import argparse
import torch
parser = argparse.ArgumentParser()
parser.add_argument("--compile", type=int, default={default})
args = parser.parse_args()
model = torch.nn.Linear(4, 4)
if args.compile:
    model = torch.compile(model)
"""


@pytest.mark.parametrize("default, named", [("0", True), ("1", False)])
def test_a_run_too_short_for_compile_names_the_option_that_turns_it_on(tmp_path, default, named):
    # llm.c: `parser.add_argument("--compile", type=int, default=0)`, `if args.compile: model = torch.compile(model)`.
    from turbotrain.doctor.analysis.source import load_sources

    script = tmp_path / "train.py"
    script.write_text(COMPILE_OPTION.format(default=default))
    ctx = _ended_after(context(code(first_compile_s=72.8)), 10, 1.4).replace(sources=load_sources([str(script)]))
    faster = _common.PairTiming((0.77, 0.8), a_s=0.85, b_s=1.1, warm_s=(20.0, 2.0))
    _, fix = _said(ctx, faster, 72.8, "inductor")
    said = "run the script without --compile, its default is 0, at train.py:5"
    assert (said in fix.pytorch) is named, fix.pytorch  # on by default: turning it off is not "without" it
    assert ("drop torch.compile" in fix.pytorch) is not named


def test_the_report_carries_what_compile_did():
    ctx = context(code([ITEM_BREAK], [recompile(NEW_SHAPE, "size mismatch")]))
    data = compiled_json(ctx.compiled, "/home/me")
    assert data["codes"][0]["breaks"][0]["where"] == "train.py:18" and data["recompiles"] == 1
    report = Report(status="ok", breakdown=None, findings=[], compiled=ctx.compiled, base="/home/me")
    assert report.to_dict()["compiled"] == data
    lines = compiled_lines(report)
    assert lines[0].startswith("torch.compile: 2.0 s compiling; 2 graphs, 1 graph breaks, 1 recompiles")
    assert "forward (train.py:16)" in lines[1]


def test_inductors_cache_is_said_for_a_run_that_read_it_and_for_one_that_filled_it():
    from turbotrain.doctor.rules.compile.compile_pays_back import cache_note

    folder = "/tmp/torchinductor_me"
    assert cache_note(0, 3, 40.0, None, folder) == ""  # compiled anew, no rerun measured
    assert cache_note(0, 3, 40.0, _common.CachedCompile(2.0, 0), folder) == ""  # the rerun read nothing: no claim
    read = cache_note(3, 4, 9.5, None, folder)
    assert read.startswith("This run read 3 of 4 graph(s) from Inductor's cache (/tmp/torchinductor_me): its 9.5 s "
                           "of compiling is what a rerun on this machine pays.")
    filled = cache_note(0, 3, 40.0, _common.CachedCompile(0.7, 2), folder)
    assert "a fresh compile of one batch here read 2 graph(s) from it in 0.7 s" in filled
    assert "reads them instead of compiling them anew" in filled and "part of this run's 40.0 s" in filled
    assert "save_cache_artifacts()" in filled and "load_cache_artifacts()" in filled and "save_cache" in read


def _compiled_as(mode: str | None, in_place: bool) -> torch.nn.Module:
    if not in_place:
        return torch.compile(torch.nn.Linear(4, 4), mode=mode)  # type: ignore[return-value]  # a Module in, a Module out
    module = torch.nn.Linear(4, 4)
    module.compile(mode=mode)
    return module


@pytest.mark.parametrize("in_place", [False, True], ids=["torch.compile(model)", "model.compile()"])
@pytest.mark.parametrize("mode, said", [("max-autotune", "max-autotune"),
                                        ("max-autotune-no-cudagraphs", "max-autotune"),
                                        ("reduce-overhead", "cuda-graphs-without-cuda"), (None, None)])
def test_a_mode_that_costs_compile_time_is_timed_and_cuda_graphs_on_a_cpu_run_are_said(mode, said, in_place):
    ctx = context(code())
    ctx.capture = SimpleNamespace(module=_compiled_as(mode, in_place), site=site(40, "main"))
    found = findings(ctx, "compile-mode")
    assert [f.evidence.mode for f in found] == ([said] if said else [])
    if said == "max-autotune":
        (f,) = found
        assert isinstance(f.request, OwnTrial) and "mode='max-autotune'" in f.message and f.site.line == 40
        assert "default mode" in f.fix.pytorch and f.fix.hf_trainer == "TrainingArguments(torch_compile_mode='default')"
    elif said:
        assert found[0].request is None and "CUDA graphs need a CUDA device" in found[0].message


def test_the_default_mode_is_written_at_the_one_compile_call(tmp_path):
    from turbotrain.doctor.analysis.source import load_sources
    from turbotrain.doctor.rules.compile.compile_mode import edit

    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.compile(net, mode='max-autotune')\n")
    ctx = context(code())
    ctx.sources = load_sources([str(script)])
    spec = edit(ctx, SimpleNamespace(evidence={"mode": "max-autotune"}))
    assert (spec.kind, spec.line, spec.params) == ("compile", 2, {"keywords": {"mode": "default"}})


def test_a_model_compiled_in_place_is_timed_on_copies_compiled_in_its_mode_and_in_the_default_one():
    from turbotrain.doctor.rules.compile._common import _script_backend, recompiled
    from turbotrain.doctor.rules.compile.compile_mode import default_mode

    model = _compiled_as("max-autotune", in_place=True)
    tuned, default = recompiled(model), default_mode(model)
    # The tuned copy is compiled with a copy of the script's backend, which torch wraps as it wraps any callable one.
    assert _script_backend(tuned).compiler_fn.config.get("max_autotune")
    assert not _script_backend(default).config.get("max_autotune")
    for copy in (tuned, default):
        # each a compiled copy of its own, never a call back into the script's module
        original = copy._orig_mod
        assert original is not model and original._compiled_call_impl is None
        assert original.weight.data_ptr() != model.weight.data_ptr()
        assert torch.equal(original.weight, model.weight)


def test_the_default_mode_is_written_at_the_models_compile_call_where_it_compiles_in_place(tmp_path):
    from turbotrain.doctor.analysis.source import load_sources
    from turbotrain.doctor.rules.compile import compile_mode

    script = tmp_path / "train.py"
    script.write_text("import torch\nnet = torch.nn.Linear(4, 4)\nnet.compile(mode='max-autotune')\n"
                      "model = torch.compile(other)\n")
    ctx = context(code())
    ctx.sources = load_sources([str(script)])
    ctx.capture = SimpleNamespace(module=_compiled_as("max-autotune", in_place=True), site=site(40, "main"))
    ran_from = Site(str(script), 3, "<module>")  # where the recorder saw torch.compile called
    ctx.tallies = {("compile", ran_from): EventCounts("compile", ran_from, ((0, 1, 0.0, 0),))}
    spec = compile_mode.edit(ctx, SimpleNamespace(evidence={"mode": "max-autotune"}))
    assert (spec.kind, spec.file, spec.line, spec.params) == ("compile", str(script), 3,
                                                              {"keywords": {"mode": "default"}})


def test_the_default_mode_is_weighed_against_max_autotune_over_the_run():
    from turbotrain.doctor.rules.compile.compile_mode import mode_note

    tuned_faster = mode_note((40.0, 10.0), 0.003, 0.004, step_differs=True)
    assert tuned_faster.startswith("First calls (compiling) 40.0 s in max-autotune against 10.0 s in the default mode;")
    assert tuned_faster.endswith("worth it for runs (or restarts) of under 30,000 steps.")
    assert mode_note((40.0, 10.0), 0.004, 0.004, step_differs=False).endswith(
        "the default mode saves 30.0 s of compiling a run.")
    assert mode_note((1.0, 1.9), 0.0005, 0.0005, step_differs=False).endswith(
        "compiled no slower here, and bought nothing.")


def test_two_compiled_forwards_are_told_apart_by_where_their_code_is():
    """Two compiled modules' codes are both "forward": each finding names its own by file and first line, which is
    how the dynamic=True trial finds the code whose guards it reads."""
    import dataclasses

    shapes = [recompile(NEW_SHAPE, f"tensor 'x' size mismatch at index 0. expected 8, actual {n}") for n in (9, 10)]
    values = [recompile(CHANGED_VALUE, "L['n'] == 3", line=52)] * 2  # another calling line: two findings
    first = code(recompiles=shapes)
    second = dataclasses.replace(code(recompiles=values), code=Site(USER, 30, "forward"))
    by_kind = {f.evidence.kind: f.evidence for f in findings(context(first, second), "compile-recompile")}
    assert by_kind[NEW_SHAPE].code_at == f"{USER}:16" and by_kind[CHANGED_VALUE].code_at == f"{USER}:30"
    assert by_kind[NEW_SHAPE].code == by_kind[CHANGED_VALUE].code == "forward"


def test_the_loss_is_compiled_as_the_call_that_compiled_its_model(tmp_path):
    """compile-loss-eager's edit takes the keywords of the torch.compile call whose result the loss's line calls,
    the script's one, or of several the one assigned to that name; by hand where that says nothing."""
    from turbotrain.doctor.analysis.source import load_sources
    from turbotrain.doctor.edits import ByHand
    from turbotrain.doctor.findings import Finding, Fix
    from turbotrain.doctor.rules.compile.compile_loss_eager import EagerLossEvidence, edit

    script = tmp_path / "train.py"
    script.write_text("import torch\nfast = torch.compile(model, backend='aot_eager', dynamic=False)\n"
                      "head = torch.compile(head)\nloss = F.cross_entropy(fast(x), y)\n")
    ctx = context()
    ctx.sources = load_sources([str(script)])
    f = Finding("compile-loss-eager", site=Site(str(script), 4, "<module>"), message="", fix=Fix("compile both"),
                evidence=EagerLossEvidence(loss="cross_entropy", between=(), input_shape=(4, 5)))
    spec = edit(ctx, f)
    assert (spec.kind, spec.numerics) == ("compile_loss", "precision")
    assert spec.params == {"loss": "cross_entropy", "compile": "backend='aot_eager', dynamic=False"}
    script.write_text(script.read_text().replace("F.cross_entropy(fast(x), y)", "F.cross_entropy(out, y)"))
    ctx.sources = load_sources([str(script)])
    with pytest.raises(ByHand, match="train.py:2, .*train.py:3"):
        edit(ctx, f)


def test_a_loss_called_through_an_nn_loss_module_is_named_as_written_and_moved_by_hand(tmp_path):
    """Lightning's template calls `self.criterion(logits, y)`: the finding says that call, and the edit (which moves
    an `F.<loss>(...)` call) says by hand why, instead of "the line changed since the run?"."""
    from turbotrain.doctor.analysis.source import load_sources
    from turbotrain.doctor.edits import ByHand
    from turbotrain.doctor.findings import Finding, Fix
    from turbotrain.doctor.rules.compile.compile_loss_eager import EagerLossEvidence, _loss_as_written, edit

    script = tmp_path / "module.py"
    script.write_text("import torch\nnet = torch.compile(net)\nloss = self.criterion(net(x), y)\n")
    ctx = context()
    ctx.sources = load_sources([str(script)])
    site = Site(str(script), 3, "<module>")
    assert _loss_as_written(ctx, site, "cross_entropy") == ("`self.criterion(net(x), y)` (F.cross_entropy)", False)
    f = Finding("compile-loss-eager", site=site, message="", fix=Fix("compile both"),
                evidence=EagerLossEvidence(loss="cross_entropy", between=(), input_shape=(4, 5)))
    with pytest.raises(ByHand, match=r"self\.criterion\(net\(x\), y\).*not as F\.cross_entropy"):
        edit(ctx, f)


def test_recompiles_of_a_decorated_function_get_dynamic_at_its_own_decorator(tmp_path):
    """airbench compiles its Muon step with a bare `@torch.compile` and its model with `model.compile(...)`: the
    recompiles of the step (one per weight shape) are fixed at the step's decorator, not "none in the script's
    files"."""
    from turbotrain.doctor.analysis.source import load_sources
    from turbotrain.doctor.rules.compile.compile_recompile import edit

    script = tmp_path / "train.py"
    script.write_text("import torch\n\n\n@torch.compile\ndef zeropower(G):\n    return G @ G.T\n\n\n"
                      "model.compile(mode='max-autotune')\n")
    ctx = context()
    ctx.sources = load_sources([str(script)])
    [f] = findings(context(code(recompiles=[recompile(NEW_SHAPE, "size mismatch")])), "compile-recompile")
    f.evidence = dataclasses.replace(f.evidence, code="zeropower", code_at=f"{script}:4")
    spec = edit(ctx, f)
    assert (spec.kind, spec.file, spec.line) == ("compile", str(script), 4)
    assert spec.params == {"keywords": {"dynamic": True}}


def test_a_module_compiled_in_place_gives_up_its_settings():
    """airbench compiles its model with `model.compile(mode="max-autotune")`: compile-pays-back's trial compiled it
    with Inductor's defaults, for want of the settings an OptimizedModule keeps as dynamo_ctx."""
    from turbotrain.doctor.rules.compile._common import (
        backend_name, dynamo_context, script_backend_config, script_dynamic)

    model = torch.nn.Linear(3, 3)
    assert dynamo_context(model) is None
    model.compile(mode="max-autotune", dynamic=False)
    assert dynamo_context(model) is not None and script_dynamic(model) is False
    assert backend_name(model) == "inductor" and script_backend_config(model)["max_autotune"] is True
    wrapped = torch.compile(torch.nn.Linear(3, 3), dynamic=True)
    assert dynamo_context(wrapped) is wrapped.dynamo_ctx and script_dynamic(wrapped) is True


def test_recompiles_of_one_code_for_two_reasons_are_two_findings_each_with_its_fix():
    """modded-nanogpt's compiled forward recompiled four times for evaluation under no_grad and once (17 s) for a
    rotary cache that is None until the first call: one finding gave the grad-mode fix for both."""
    from turbotrain.doctor.record.compile_watch import GRAD_MODE

    rotary = "self._modules['rotary'].seq_len_cached is None"
    rows = [recompile(GRAD_MODE, "GLOBAL_STATE changed: grad_mode", line=553)] * 4 + [
        recompile(CHANGED_VALUE, rotary, line=586)]
    grad, cache = findings(context(code(recompiles=rows)), "compile-recompile")
    assert (grad.evidence.kind, len(grad.evidence.recompiles), cache.evidence.kind) == (GRAD_MODE, 4, CHANGED_VALUE)
    assert (grad.site.line, cache.site.line) == (553, 586)
    assert "Nothing per step" in grad.fix.pytorch and "1 more at other lines, said apart" in grad.message
    assert grad.note.startswith("A graph per grad mode, each compiled once")  # not "for a new length"
    assert cache.fix.pytorch.startswith("The module fills this attribute on its first call")
    assert f"First failed guard: {rotary}." in cache.message and cache.severity == "low"
    [value] = findings(context(code(recompiles=[recompile(CHANGED_VALUE, "L['n'] == 3")] * 2)), "compile-recompile")
    assert "as a tensor" in value.fix.pytorch and value.severity == "medium"
    # Two reasons at one line stay one finding (one per rule and line), its fix the most frequent reason's.
    same_line = [dataclasses.replace(r, site=site(41, "main"), caller=site(41, "main")) for r in rows]
    [one] = findings(context(code(recompiles=same_line)), "compile-recompile")
    assert one.evidence.kind == GRAD_MODE and len(one.evidence.recompiles) == 5


@pytest.mark.parametrize("last_paid_in", [0, 5])
def test_a_value_whose_graphs_were_all_compiled_early_costs_compile_time_not_step_time(last_paid_in):
    """nanochat's Muon step recompiled three times on its `red_dim` (-2 or -1, a dimension index), all in its first
    step, and never again: "pass it as a tensor" is no fix for a dimension, and nothing is paid per step. A value
    recompiled for in the measured steps keeps costing, and keeps the fix it had."""
    from turbotrain.doctor.record.measurements import StepRecord

    rows = [Recompile(f"4/{i}", CHANGED_VALUE, f"red_dim == {value}", "", site(395, "step"), site(395, "step"), 0.3)
            for i, value in ((1, -2), (2, -1), (3, -2))]
    ctx = context(code(recompiles=rows, name="muon_step_fused"))
    spans = [CompileSpan(r.compile_id, 0.1 + i * 0.3, 0.3, "recompile") for i, r in enumerate(rows[:2])]
    spans.append(CompileSpan("4/3", last_paid_in + 0.2, 0.3, "recompile"))
    ctx.recording.compiled = dataclasses.replace(ctx.recording.compiled, spans=tuple(spans))
    ctx.recording.steps = [StepRecord(i, float(i), i + 1.0, {"forward": 1.0}) for i in range(20)]
    ctx.measured_steps = list(range(3, 20))
    [f] = findings(ctx, "compile-recompile")
    if last_paid_in == 0:
        assert f.fix.pytorch.startswith("Nothing per step: the calls pass a few values of red_dim (the guards name -2, "
                                        "-1), a graph compiled once for each by step 0, and none recompiled in the 17 "
                                        "steps measured after.")
        assert "as a tensor" not in f.fix.pytorch and f.severity == "low"
        assert f.note.startswith("A graph per value met, each compiled once")
    else:
        assert "as a tensor" in f.fix.pytorch and f.severity == "medium"


def test_dynamic_true_is_timed_on_the_model_only_for_the_models_own_recompiles():
    """modded-nanogpt's Muon step (a compiled function of its own) recompiled per weight shape: the trial timed the
    captured GPT with dynamic=True against it as compiled, x1.01, which says nothing of the Muon step."""
    from types import SimpleNamespace

    from turbotrain.doctor.rules.compile.compile_recompile import _trial

    model = torch.compile(torch.nn.Linear(2, 2))  # nothing compiles until it is called
    forward = type(model._orig_mod).forward.__code__
    ctx = SimpleNamespace(capture=SimpleNamespace(module=model))
    own = dataclasses.replace(code(), code=Site(forward.co_filename, forward.co_firstlineno, "forward"))
    assert _trial(ctx, NEW_SHAPE, own) is not None
    assert _trial(ctx, NEW_SHAPE, code(name="zeropower_via_newtonschulz5")) is None
    assert _trial(ctx, CHANGED_VALUE, own) is None


def test_running_the_model_eagerly_saves_only_its_own_compiling():
    """nanochat compiles its model and, apart, its AdamW and Muon steps: compile-pays-back priced all 6.4 s against
    an eager model, which still compiles the steps (its twin ran slower eagerly, where the doctor said x1.07)."""
    from turbotrain.doctor.rules.compile.compile_pays_back import priced_codes

    model = torch.compile(torch.nn.Linear(2, 2))
    forward = type(model._orig_mod).forward.__code__
    own = dataclasses.replace(code(), code=Site(forward.co_filename, forward.co_firstlineno, "forward"))
    steps = [code(name="adamw_step_fused"), code(name="muon_step_fused")]
    assert priced_codes([own, *steps], model) == ([own], ["adamw_step_fused", "muon_step_fused"])
    assert priced_codes(steps, model) == (steps, [])  # none is its forward: a function that calls it, say
    assert priced_codes([own, *steps], None) == ([own, *steps], [])
    in_place = torch.nn.Linear(2, 2)  # airbench's model.compile(mode=...): the module itself, no _orig_mod
    assert priced_codes([own, *steps], in_place) == ([own], ["adamw_step_fused", "muon_step_fused"])


def test_a_run_about_even_either_way_keeps_compiling():
    from turbotrain.doctor.rules.compile._common import RunLength
    from turbotrain.doctor.rules.compile.compile_pays_back import _about_even

    fix = _about_even(RunLength(40, ended=True), 44, eager_faster=False)
    assert fix is not None and fix.pytorch.startswith("Keep torch.compile: over 40 steps")
    assert "compiled is ahead from step 44 on" in fix.pytorch
    assert _about_even(RunLength(40, ended=True), 292, eager_faster=True) is None  # then: train it eagerly
    assert _about_even(None, 44, eager_faster=False) is None
    assert _about_even(RunLength(40, ended=True), None, eager_faster=False) is None  # compiled never pays
    # build-nanogpt: compile pays after 5 of its 25 steps, eager x0.64 over the run: no "about even" there.
    assert _about_even(RunLength(25, ended=True), 5, eager_faster=False) is None


def test_recompiles_for_new_tensor_ranks_are_not_given_dynamic_true():
    """nanochat's fused AdamW, compiled with dynamic=False, is called on its 1-D and its 2-D parameters: each rank
    compiles once, and dynamic=True would not share a graph across ranks."""
    from turbotrain.doctor.edits import ByHand
    from turbotrain.doctor.rules.compile.compile_recompile import edit

    ranks = [recompile(NEW_SHAPE, f"tensor 'p' rank mismatch. expected {a}, actual {b}") for a, b in ((2, 1), (1, 2))]
    [f] = findings(context(code(recompiles=ranks)), "compile-recompile")
    assert "different ranks" in f.fix.pytorch and "dynamic=True cannot" in f.fix.pytorch and f.severity == "low"
    with pytest.raises(ByHand, match="new tensor ranks"):
        edit(context(), f)
    sizes = [recompile(NEW_SHAPE, "tensor 'G' size mismatch at index 1. expected 216, actual 288")]
    [f] = findings(context(code(recompiles=ranks + sizes)), "compile-recompile")
    assert f.fix.pytorch.startswith("torch.compile(model, dynamic=True)")


def test_a_fix_that_compiles_longer_rates_low_where_the_run_is_too_short_to_win_it_back():
    """The lightning template's loss compiled in: 2.4 s more compiling for 0.12 ms a step pays after ~20,800 steps;
    its run has 430. Compiling less, a slower step, or a long enough run: nothing to say."""
    from turbotrain.doctor.rules.compile._common import PairTiming, RunLength, _too_short_to_pay

    timing = PairTiming((1.12, 1.15), 1.07e-3, 0.953e-3, (1.13, 3.545))
    said = _too_short_to_pay(RunLength(430, ended=False, loop="`Trainer(max_epochs=1)` at train.py:60"), timing)
    assert "430 steps (`Trainer(max_epochs=1)` at train.py:60): too few" in said
    assert _too_short_to_pay(RunLength(430, ended=True), timing).startswith(" This run ended after 430 steps")
    assert _too_short_to_pay(RunLength(30_000, ended=True), timing) == ""
    assert _too_short_to_pay(None, timing) == ""
    assert _too_short_to_pay(RunLength(430, ended=True), dataclasses.replace(timing, warm_s=(3.5, 1.1))) == ""
    assert _too_short_to_pay(RunLength(430, ended=True), dataclasses.replace(timing, b_s=2e-3)) == ""


BRANCHES = {  # the branch as written -> the one torch.where it says (None: no such statement)
    "if h.sum() > 0:\n    h = h * 2": "h = torch.where(h.sum() > 0, h * 2, h)",
    "if h.sum() > 0:\n    h = h * 2\nelse:\n    h = -h": "h = torch.where(h.sum() > 0, h * 2, -h)",
    "if h.sum() > 0:\n    return h * 2\nelse:\n    return h": "return torch.where(h.sum() > 0, h * 2, h)",
    "if h.sum() > 0:\n    h = h * 2\nelse:\n    g = -h": None,  # two names
    "if h.sum() > 0:\n    h = h * 2\n    h = h + 1": None,  # two statements
    "if h.sum() > 0:\n    return h * 2": None,  # the other side falls through
}


@pytest.mark.parametrize("branch", sorted(BRANCHES))
def test_a_branch_that_sets_one_name_or_returns_on_both_sides_is_one_torch_where(branch):
    import ast

    from turbotrain.doctor.rules.compile._branch_where import where_form

    form = where_form(ast.parse(branch).body[0])
    assert (form.code() if form else None) == BRANCHES[branch]
    if form is not None and form.target == "h":  # a module that does not name torch: the tensor's own method
        assert form.code(None) == f"h = ({form.taken}).where({form.test}, {form.other})"


class _Branching(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.linear(x)
        if h.sum() > 0:
            h = h * 2
        return h


def test_the_branch_is_rewritten_on_each_instance_of_a_copy_and_computes_the_same(tmp_path):
    import copy
    import inspect

    from turbotrain.doctor.analysis.source import SourceIndex
    from turbotrain.doctor.rules.compile._branch_rewrite import form_at, with_rewrite

    lines, first = inspect.getsourcelines(_Branching.forward)
    line = first + next(i for i, text in enumerate(lines) if "if h.sum()" in text)
    form = form_at(SourceIndex.parse(__file__), line)
    assert form.label == "torch.where"
    model = torch.nn.Sequential(_Branching(), _Branching())
    rewritten = with_rewrite(copy.deepcopy(model), Site(__file__, line), form)
    assert all("forward" in vars(m) for m in rewritten) and not any("forward" in vars(m) for m in model)
    assert _Branching.forward.__code__.co_firstlineno == first  # the class keeps its own method
    for sign in (1.0, -1.0):  # each side of the branch taken
        x = sign * torch.ones(3, 4) * 10
        assert torch.equal(model(x), rewritten(x))
    compiled = torch.compile(rewritten, backend="eager", fullgraph=True)  # no break left
    assert torch.equal(compiled(torch.ones(3, 4)), model(torch.ones(3, 4)))


class _BranchingViaSuper(_Branching):
    def forward(self, x):
        h = super().forward(x)
        if h.sum() > 0:
            h = h * 2
        return h


def test_a_branch_that_cannot_be_rewritten_says_why_and_leaves_the_model_as_it_is():
    import inspect

    from turbotrain.doctor.rules.compile._branch_rewrite import why_not_rewritten
    from turbotrain.doctor.rules.compile._branch_where import WhereForm

    lines, first = inspect.getsourcelines(_BranchingViaSuper.forward)
    line = first + next(i for i, text in enumerate(lines) if "if h.sum()" in text)
    model = torch.nn.Sequential(_BranchingViaSuper())
    form = WhereForm("h.sum() > 0", "h * 2", "h", "h")
    assert "enclosing scope (super()" in why_not_rewritten(model, Site(__file__, line), form)
    assert not any("forward" in vars(m) for m in model.modules())
    assert "no module of the model" in why_not_rewritten(torch.nn.Linear(2, 2), Site(__file__, line), form)


class _InPlace(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_the_note_says_whether_the_model_itself_or_a_function_around_it_was_compiled():
    """compile-pays-back times a model found inside compiled code compiled alone: the model compiled in place
    (its own forward the compiled code) is timed as it is; a function around it held the loss too, said so."""
    from turbotrain.doctor.rules.compile.compile_pays_back import _compiled_alike

    forward = _InPlace.forward.__code__
    own = dataclasses.replace(code(file=forward.co_filename), code=Site(forward.co_filename, forward.co_firstlineno))
    assert "(the script compiles it in place)" in _compiled_alike(_InPlace(), [own])
    around = code(name="training_step")
    said = _compiled_alike(_InPlace(), [around])
    assert "the model training_step calls, compiled alone" in said and "the loss" in said


def test_regional_compilation_of_torchs_own_blocks_replaces_each_with_its_compiled_self():
    """block.compile() on a block of torch's own class (nn.TransformerEncoderLayer) compiles nothing, Dynamo skipping
    its code: the fix says torch.compile(block) for each, and why."""
    from turbotrain.doctor.record.recording import Capture

    nn = torch.nn
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    # Inside a Sequential, as a model with a head often is: its child is reached by index, model[0].
    model = torch.compile(nn.Sequential(nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)), backend="eager")
    ctx = dataclasses.replace(context(code()), capture=Capture(model, (torch.randn(2, 3, 8),), {}, 2), model=model)
    [f] = findings(ctx, "compile-regional")
    assert "`for i, block in enumerate(model[0].layers): model[0].layers[i] = torch.compile(block)`" in f.fix.pytorch
    assert "compiles nothing" in f.fix.pytorch
    assert "self[0].layers[i] = torch.compile(block)" in f.fix.lightning
