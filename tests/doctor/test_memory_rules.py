"""The memory rules on synthetic inputs (a StepMemory, a GraphGrowth, an OutOfMemory in a hand-built Context), in
milliseconds; and the out-of-memory corpus script end to end: the line, the step, the phase, and a fix that fits."""

from __future__ import annotations

import dataclasses
from functools import cached_property

import pytest
import torch

from doctor_helpers import cached_report, marked_lines, run_doctor, script
from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context, build_context
from turbotrain.doctor.analysis.replay import surrogate_step
from turbotrain.doctor.analysis.memory import blocks_to_checkpoint, fit_after_oom, measure_captured
from turbotrain.doctor.module_stacks import blocks_text, stacked
from turbotrain.doctor.record.graph_watch import GraphGrowth, TensorGrowth
from turbotrain.doctor.record.compile_watch import CompiledCode, CompileFacts
from turbotrain.doctor.record.measurements import ForwardFacts
from turbotrain.doctor.record.memory_watch import DeviceMemory, ModuleActivations, PeakSplit, StepMemory
from turbotrain.doctor.record.out_of_memory import OutOfMemory
from turbotrain.doctor.record.recorder import Recorder
from turbotrain.doctor.record.recording import Capture, Recording, Window
from turbotrain.doctor.record.runner import run_script
from turbotrain.doctor.report.memory import MemoryMeasured, MemoryNotMeasured, memory_lines, memory_section
from turbotrain.doctor.results import MeasuredFix
from turbotrain.doctor.rules import evaluate
from turbotrain.doctor.sites import Site
from turbotrain.hardware import detect

pytestmark = pytest.mark.one_core  # one process, one thread: run beside one other such test (tests/conftest.py)

MIB = 2**20


def _recording(**fields) -> Recording:
    return Recording(window=Window(1, 3, 3, 0), steps=(), step_delimiter="optimizer.step()", events=(), loaders=(),
                     optimizer_sites=(), module_sites=(), matmul_shapes=(), gap_samples=(), **fields)


def _context(recording: Recording | None = None, memory: StepMemory | None = None) -> Context:
    ctx = Context(script=None, base=None, hw=detect("cpu"), device="cpu", breakdown=compute_breakdown([], 1),
                  measured_steps=[], recording=recording)
    ctx.__dict__["step_memory"] = memory  # a cached_property: set as computed
    return ctx


def _memory(activations: int, params: int = MIB, total: int = 16 * 1024 * MIB) -> StepMemory:
    block = ModuleActivations("blocks.0", "Block", 0, activations, 4, Site("/u/train.py", 12, "Block.forward"))
    root = ModuleActivations("", "Net", 0, activations, 4)
    peak = PeakSplit(parameters=params, buffers=0, inputs=MIB, gradients=params, optimizer_state=2 * params,
                     activations=activations, temporaries=MIB)
    return StepMemory("cpu", params, 0, params, 2 * params, MIB, activations, (root, block), peak,
                      sum(dataclasses.astuple(peak)), "backward", None, None, None,
                      DeviceMemory("cpu", total, total // 2))


def test_cached_properties_can_be_set_by_a_test():
    assert isinstance(Context.__dict__["step_memory"], cached_property)


def test_graph_kept_alive_names_the_holder_and_what_it_keeps_per_step():
    site = Site("/u/train.py", 21, "main")
    growth = GraphGrowth(steps=(1, 2, 3), tensors=(2, 3, 4), nodes=(10, 20, 30), bytes=(8, 12, 16), growing=True,
                         tensors_per_step=1.0, nodes_per_step=10.0, bytes_per_step=4.0, holder="losses", site=site)
    [f] = evaluate(_context(_recording(graph_growth=growth)), only=["graph-kept-alive"])
    assert f.site == site and f.severity == "low" and "`losses`" in f.message and "10 graph node(s)" in f.message
    assert "loss.item()" in f.fix.pytorch and f.evidence.bytes_per_step == 4.0


def test_graph_kept_alive_is_silent_on_a_clean_loop():
    flat = GraphGrowth(steps=(1, 2, 3), tensors=(1, 1, 1), nodes=(9, 9, 9), bytes=(4, 4, 4), growing=False,
                       tensors_per_step=0.0, nodes_per_step=0.0, bytes_per_step=0.0)
    assert evaluate(_context(_recording(graph_growth=flat)), only=["graph-kept-alive"]) == []


def _kept(holder: str = "preds", with_graphs: bool = False, per_step: float = 40 * 1024) -> TensorGrowth:
    return TensorGrowth(holder, steps=(2, 3, 24, 25), tensors=(2, 3, 24, 25),
                        bytes=tuple(int(n * per_step) for n in (2, 3, 24, 25)), bytes_per_step=per_step,
                        device="cpu", with_graphs=with_graphs, site=Site("/u/train.py", 23, "main"))


def test_tensors_kept_every_step_are_named_with_the_line_and_the_growth():
    [f] = evaluate(_context(_recording(tensor_growth=_kept())), only=["tensors-kept"])
    assert f.site.line == 23 and f.severity == "low" and "`preds` keeps tensors from every step" in f.message
    assert "40.0 KiB a step on cpu" in f.message and "2 -> 3 -> 24 -> 25 tensors" in f.message
    assert "preds.clear()" in f.fix.pytorch and f.fix.lightning and f.evidence.bytes_per_step == 40 * 1024
    [big] = evaluate(_context(_recording(tensor_growth=_kept(per_step=4 * MIB))), only=["tensors-kept"])
    assert big.severity == "medium"


def test_tensors_kept_with_their_graphs_are_left_to_graph_kept_alive():
    graphs = GraphGrowth(steps=(2, 3, 24, 25), tensors=(2, 3, 24, 25), nodes=(2, 3, 24, 25), bytes=(8, 12, 96, 100),
                         growing=True, tensors_per_step=1.0, nodes_per_step=1.0, bytes_per_step=4.0, holder="losses")
    kept = _kept("losses", with_graphs=True, per_step=4.0)
    recording = _recording(graph_growth=graphs, tensor_growth=kept)
    assert evaluate(_context(recording), only=["tensors-kept"]) == []
    assert [f.rule for f in evaluate(_context(recording), only=["graph-kept-alive"])] == ["graph-kept-alive"]


def test_activation_memory_fires_where_activations_dominate_and_names_the_block():
    [f] = evaluate(_context(memory=_memory(activations=64 * MIB)), only=["activation-memory"])
    assert "blocks.0 (Block" in f.message and f.site.line == 12 and f.evidence.blocks == {"blocks.0": 64 * MIB}
    assert "checkpoint" in f.fix.pytorch and f.request is not None
    assert evaluate(_context(memory=_memory(activations=MIB // 2)), only=["activation-memory"]) == []


@pytest.mark.parametrize("device_mib, folded", [(16 * 1024, True), (200, False)])
def test_activation_memory_where_the_step_fits_with_room_is_folded_under_the_findings(device_mib, folded):
    """makemore: activations 78% of an 18-MiB peak with 22.6 GiB free read as "LOW activation-memory x0.66
    measured" among the speed findings; with room to spare it is one line under them, still in the JSON."""
    from turbotrain.doctor.report.terminal import folded_text

    [f] = evaluate(_context(memory=_memory(activations=64 * MIB, total=device_mib * MIB)), only=["activation-memory"])
    assert f.folded is folded and (f.to_dict().get("folded") == "fits") is folded
    text = "\n".join(folded_text([f]))
    assert ("memory fix the step does not need (it fits with room to spare): activation-memory" in text) is folded


def test_out_of_memory_says_step_phase_and_line_without_a_measurement():
    site = Site("/u/train.py", 19, "forward")
    oom = OutOfMemory("cpu", 128 * 2**30, "can't allocate memory", site, phase="forward", step=0)
    ctx = _context(_recording(out_of_memory=oom))
    ctx.__dict__["fit_after_oom"] = None
    [f] = evaluate(ctx, only=["out-of-memory"])
    assert f.severity == "high" and f.site == site
    assert "at step 1 in the forward, asking for 128.0 GiB" in f.message


def test_out_of_memory_in_the_scripts_set_up_is_said_to_come_before_training():
    # airbench94 under 150 MiB died in its whitening set-up (train.py:326, get_patches), before any training
    # forward: the finding said "at step 1" and the section "no halving of the captured batch fit".
    oom = OutOfMemory("cpu", 90 * MIB, "can't allocate memory", Site("/u/train.py", 326, "get_patches"), "", 0)
    ctx = _context(_recording(out_of_memory=oom))
    [f] = evaluate(ctx, only=["out-of-memory"])
    assert "memory before its first training forward (in the script's own set-up), asking for 90.0 MiB" in f.message
    assert "set-up work in pieces" in f.fix.pytorch and f.note is None  # no step was measured, nor is to be split
    section = memory_section(ctx)
    assert isinstance(section, MemoryNotMeasured) and "before a training forward was captured" in section.reason


def test_a_one_row_batch_that_ran_out_of_memory_says_why_no_smaller_batch_was_measured():
    # nanochat with --device-batch-size=1 under 500 MiB: "no halving of the captured batch fit", where none exists.
    oom = OutOfMemory("cpu", 64 * MIB, "can't allocate memory", Site("/u/train.py", 512, "forward"), "forward", 0)
    ctx = _context(_recording(out_of_memory=oom))
    ctx.capture = Capture(torch.nn.Linear(4, 4), (torch.randn(1, 512, 4),), {}, 1)
    section = memory_section(ctx)
    assert isinstance(section, MemoryNotMeasured) and "the captured batch is one row" in section.reason, section
    assert ctx.fit_after_oom is None  # no halving of one row to measure at
    ctx.capture = Capture(torch.nn.Linear(4, 4), (torch.randn(2, 512, 4),), {}, 2)
    ctx.__dict__["fit_after_oom"] = None  # as if no halving fit
    assert memory_section(ctx).reason == "no halving of the captured batch fit"


def test_the_batch_sized_part_scales_and_the_rest_stays():
    memory = _memory(activations=64 * MIB)
    resident = memory.peak.parameters + memory.peak.gradients + memory.peak.optimizer_state
    assert memory.at_rows(128, 256) == resident + 2 * (memory.peak_bytes - resident)
    assert blocks_to_checkpoint(memory.modules, memory.activation_bytes) == ["blocks.0"]


def test_the_memory_section_says_what_it_does_not_know():
    ctx = _context(memory=_memory(activations=64 * MIB))
    section = memory_section(ctx)
    assert isinstance(section, MemoryMeasured)
    assert section.allocator_beyond_live_bytes is None and section.parts.activations == 64 * MIB
    text = "\n".join(memory_lines(section))
    assert "allocator beyond live tensors: not known" in text and "blocks.0 (Block" in text
    ctx.memory_allowed = False
    assert memory_lines(memory_section(ctx)) == ["Memory: not measured (--no-what-if)."]


def test_a_script_that_runs_out_of_memory_is_explained_with_a_fix_that_fits_and_patched(tmp_path):
    pytest.importorskip("libcst", reason="doctor --fix needs libcst: pip install -e '.[fix]'")
    patch = tmp_path / "fixes.patch"
    report = run_doctor("memory_out_of_memory", fix=str(patch))
    [f] = [f for f in report.findings if f.rule == "out-of-memory"]
    [(_, line)] = marked_lines("memory_out_of_memory")
    assert f.to_dict(report.base)["where"] == f"memory_out_of_memory.py:{line}"
    assert "at step 1 in the forward" in f.message and f.evidence.fit.rows < f.evidence.fit.full_rows
    fits = [fix.measured for fix in f.evidence.fit.fixes if fix.fits]
    assert fits and fits[0].fix == "micro-batches" and "micro-batches" in f.fix.pytorch
    assert isinstance(report.memory, MemoryMeasured) and report.memory.parts.activations > 0
    # --fix writes the fix that fits fastest into the training loop: k micro-batches, each backward of loss / k.
    k = int(fits[0].detail.split(" x ")[0])
    [fix] = [r for r in report.fixes.fixes if r.rule == "out-of-memory"]
    assert fix.purpose == "memory" and fix.in_patch and not fix.by_hand, fix
    text = patch.read_text()
    assert f"+        for x_micro, y_micro in zip(x.chunk({k}), y.chunk({k})):" in text, text
    assert f"+            ({'loss'} / {k}).backward()" in text and "-        loss.backward()" in text, text
    # The patch's header names the line the edit changes (the loop), and the line the allocation failed at.
    edited = fix.request.where
    assert edited != fix.where and f"out-of-memory  {edited} (found at {fix.where})  " in text, text


class _Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 512), torch.nn.Linear(512, 16)

    def forward(self, x):
        return x + self.down(self.up(x).relu())


class _Blocks(torch.nn.Module):
    """Two blocks in a list and a head whose forwards say which autocast they ran under (in a list of the class, which
    the copies share)."""

    autocast: list[str | None] = []

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Wide() for _ in range(2))
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        on = torch.is_autocast_enabled("cpu")
        self.autocast.append(str(torch.get_autocast_dtype("cpu")) if on else None)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _compiled_bf16(autocast: bool) -> tuple[Context, _Blocks]:
    """A context of a script that compiled its model and trained it under bf16 autocast (or not)."""
    torch.manual_seed(0)
    model = _Blocks()
    _Blocks.autocast.clear()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # Dynamo's eager backend: the copies run eagerly anyway, and nothing is compiled here.
    capture = Capture(torch.compile(model, backend="eager"), (torch.randn(256, 16),), {}, 256)
    ctx = Context(script=None, base=None, hw=detect("cpu"), device="cpu", breakdown=compute_breakdown([], 1),
                  measured_steps=[], capture=capture, optimizers=[(opt, None)],
                  facts=ForwardFacts(autocast=autocast, autocast_dtype="torch.bfloat16" if autocast else None),
                  recording=_recording())
    return ctx, model


def test_the_step_of_a_compiled_bf16_script_is_measured_under_its_autocast_with_its_own_names():
    # build-nanogpt (torch.compile, bf16 autocast) was measured in fp32 (its logits twice the bytes) and its blocks
    # named `_orig_mod.transformer.h.0-3`; checkpointing was offered on `_orig_mod`, the whole model.
    ctx, model = _compiled_bf16(autocast=True)
    memory = ctx.step_memory
    assert memory is not None and set(model.autocast) == {"torch.bfloat16"}  # each copy's forward, under autocast
    names = {row.name for row in memory.modules}
    assert {"blocks.0", "blocks.1"} <= names and not any("_orig_mod" in n for n in names), names
    assert blocks_to_checkpoint(memory.modules, memory.activation_bytes) == ["blocks.0", "blocks.1"]
    fp32, _ = _compiled_bf16(autocast=False)
    assert fp32.step_memory is not None and memory.activation_bytes < fp32.step_memory.activation_bytes


@pytest.mark.parametrize("autocast", [True, False])
def test_fixes_after_out_of_memory_leave_out_the_autocast_the_script_has(autocast):
    ctx, model = _compiled_bf16(autocast)
    oom = OutOfMemory("cpu", 2 * MIB, "can't allocate memory", None, phase="forward", step=0)
    fit = fit_after_oom(ctx.capture, [ctx.optimizers[0][0]], oom, ctx.script_loss, autocasts=autocast, repeats=1)
    assert fit is not None and fit.rows == 128
    fixes = [f.cost.fix for f in fit.fixes]
    assert ("bf16-autocast" in fixes) is not autocast, fixes
    assert "checkpointing" in fixes
    assert (None in model.autocast) is not autocast  # every step under the script's autocast, where it has one


def test_micro_batches_after_out_of_memory_are_sized_for_the_whole_batch_and_measured_at_that_size(monkeypatch):
    # build-nanogpt's 4 rows under 400 MiB: measured at 2 rows, only "2 x 1" was tried (k was capped by the rows
    # measured), estimated at 2 rows a micro-batch, "does not fit"; micro-batches of 1 row, which fit, never came up.
    from turbotrain.doctor.analysis import memory as memory_module

    ctx, _ = _compiled_bf16(autocast=False)
    optimizers = [ctx.optimizers[0][0]]
    at_half = measure_captured(ctx.capture, optimizers, rows=128)
    # A step of 64 rows fits, with room for the gradients accumulated beside a micro-batch; of 128 rows, not.
    capacity = (at_half.at_rows(128, 64) + at_half.peak_bytes) // 2
    monkeypatch.setattr(memory_module, "capacity_bytes", lambda memory: capacity)
    oom = OutOfMemory("cpu", 2 * MIB, "can't allocate memory", None, phase="forward", step=0)
    fit = fit_after_oom(ctx.capture, optimizers, oom, repeats=1)
    assert fit is not None and (fit.rows, fit.full_rows) == (128, 256)
    [split] = [f for f in fit.fixes if f.cost.fix == "micro-batches"]
    assert split.cost.detail == "4 x 64" and split.fits  # 4 micro-batches of 64 rows make the whole batch
    assert split.estimated_bytes == split.cost.fixed.peak_bytes  # measured as 2 x 64 at 128 rows: no scaling
    # Where the batch that fits is the micro-batch itself (build-nanogpt fitted 1 of its 4 rows), two of it are
    # accumulated: the peak with the first one's gradients held, its seconds per micro-batch.
    at_micro = measure_captured(ctx.capture, optimizers, rows=64)
    trials = memory_module._Trials(ctx.script_loss, autocasts=False, repeats=1)
    batch = memory_module._batch(ctx.capture, 64)
    alone = memory_module._micro_batches_fix(ctx.capture, optimizers, batch, 64, at_micro, trials)
    assert alone.cost.detail == "4 x 64" and alone.fits and alone.estimated_bytes == alone.cost.fixed.peak_bytes
    assert alone.cost.fixed.peak_bytes > alone.cost.baseline.peak_bytes  # the gradients kept for the second


@pytest.mark.parametrize("call", ["model(x, gain=2.0)", "model(x=x, gain=2.0)"])
def test_a_model_called_with_keywords_that_runs_out_of_memory_in_its_first_step_is_measured(tmp_path, call):
    # modded-nanogpt, `model(x, y, attn_blocksize=...)`, died in its first step: the batch captured then (by the
    # global hooks, which torch hands the positional arguments only) lacked the keyword, and the doctor itself died
    # ("GPT.forward() missing 1 required positional argument: 'attn_blocksize'"); a model called with keywords only
    # (a Hugging Face `model(**batch)`) had no batch captured at all.
    from doctor_helpers import FAST
    from turbotrain.doctor import DoctorOptions, diagnose_script

    text = script("memory_out_of_memory").read_text()
    text = text.replace("    def forward(self, x):\n        return self.head(", "    def forward(self, x, *, gain):\n"
                        "        return gain * self.head(")
    text = text.replace("model(x), y)", f"{call}, y)")
    assert call in text and "*, gain" in text
    (tmp_path / "train.py").write_text(text)
    torch.set_num_threads(1)
    report = diagnose_script(tmp_path / "train.py", [], DoctorOptions(**FAST))
    [f] = [f for f in report.findings if f.rule == "out-of-memory"]
    assert "at step 1 in the forward" in f.message and f.evidence.fit is not None, f.message
    assert isinstance(report.memory, MemoryMeasured) and report.memory.fit is not None, report.memory


@pytest.mark.parametrize("name, rule", [("memory_loss_kept", "graph-kept-alive"),
                                        ("memory_big_activations", "activation-memory")])
def test_the_corpus_memory_findings_and_section(name, rule):
    report = cached_report(name)
    assert rule in report.rules()
    assert isinstance(report.memory, MemoryMeasured) and report.memory.measured and report.memory.peak_bytes > 0


def test_a_larger_batch_is_proposed_at_the_largest_multiple_that_fits():
    """``small-batch``'s larger batch against the memory the step measured: the batch-sized part of the peak (inputs,
    activations, temporaries: 66 MiB at 16 rows) scales with the rows, the rest (4 MiB) stays."""
    from turbotrain.doctor.rules.step.small_batch import _fitting, _memory_text, larger_factor

    assert (larger_factor(1), larger_factor(16), larger_factor(48)) == (8, 4, 2)
    roomy = _memory(activations=64 * MIB)  # 8 GiB of RAM available
    factor, said = _fitting(roomy, 16, 8)
    assert factor == 8 and said.fits and said.needs_bytes == 4 * MIB + 8 * 66 * MIB
    assert "A batch of 128 needs about 532.0 MiB" in _memory_text(said, 16) and "it fits" in _memory_text(said, 16)
    # 512 MiB available, 90% of it planned for: 6x (400 MiB) fits, 7x (466 MiB) does not.
    assert _fitting(_memory(activations=64 * MIB, total=1024 * MIB), 16, 8)[0] == 6
    factor, said = _fitting(_memory(activations=64 * MIB, total=128 * MIB), 16, 8)
    assert factor == 0 and not said.fits and said.batch_size == 32
    assert "does not fit; accumulate gradients" in _memory_text(said, 16)


@pytest.mark.parametrize("zeroes", [True, False])
def test_set_to_none_joins_the_measured_memory_fixes_where_the_script_zero_fills_gradients(zeroes):
    """A script calling zero_grad(set_to_none=False) keeps every gradient through the next forward: the activation
    finding's trial then measures set_to_none=True beside checkpointing, bf16 and micro-batches, on copies."""
    import runpy
    from types import SimpleNamespace

    import torch

    from doctor_helpers import script
    from turbotrain.doctor.findings import Finding, Fix
    from turbotrain.doctor.rules.memory.activation_memory import ActivationEvidence, measure

    ns = runpy.run_path(str(script("memory_big_activations")))
    torch.manual_seed(0)
    model, (x, _) = ns["Net"](), ns["make_batch"]()
    opt = torch.optim.Adam(model.parameters())
    capture = SimpleNamespace(module=model, args=(x,), kwargs={}, batch_size=x.shape[0], batch_dim=0)
    ctx = SimpleNamespace(capture=capture, step_memory=_memory(activations=64 * MIB), optimizers=[(opt, None)],
                          ran_sites=lambda kind: [object()] if zeroes and kind == "zero_grad_zeros" else [],
                          step_s=0.01, share=lambda category: 0.3, compiled=None, facts=ForwardFacts(),
                          script_loss=surrogate_step)

    class Roomy:
        left = 600.0

        def allows(self, cost_s):
            return True

    blocks = {"wide": 1}  # the block that saves the most
    evidence = ActivationEvidence(peak_bytes=2, activation_bytes=1, blocks=blocks, called_at={}, capacity_bytes=None,
                                  tight=False)
    measured = measure(ctx, Finding("activation-memory", message="", fix=Fix(""), evidence=evidence), Roomy())
    rows = {row.fix: row for row in measured.what_if.fixes}
    assert ("set-to-none" in rows) == zeroes, sorted(rows)
    if zeroes:  # zero-filled gradients are live through the forward, where the peak is
        assert rows["set-to-none"].fixed_bytes < rows["set-to-none"].baseline_bytes, rows["set-to-none"]
        assert "set-to-none zero_grad(set_to_none=True)" in measured.note


class _Answers:
    """A what-if budget that answers ``allows`` by ``rule(call number, cost)``."""

    left = 600.0

    def __init__(self, rule):
        self.rule, self.calls = rule, 0

    def allows(self, cost_s):
        self.calls += 1
        return self.rule(self.calls, cost_s)


def _activation_trial(budget):
    import runpy
    from types import SimpleNamespace

    import torch

    from doctor_helpers import script
    from turbotrain.doctor.findings import Finding, Fix
    from turbotrain.doctor.rules.memory.activation_memory import ActivationEvidence, measure

    ns = runpy.run_path(str(script("memory_big_activations")))
    model, (x, _) = ns["Net"](), ns["make_batch"]()
    capture = SimpleNamespace(module=model, args=(x,), kwargs={}, batch_size=x.shape[0], batch_dim=0)
    ctx = SimpleNamespace(capture=capture, step_memory=_memory(activations=64 * MIB),
                          optimizers=[(torch.optim.SGD(model.parameters(), lr=0.1), None)],
                          ran_sites=lambda kind: [], step_s=0.01, share=lambda category: 0.3, compiled=None,
                          facts=ForwardFacts(), script_loss=surrogate_step)
    evidence = ActivationEvidence(peak_bytes=2, activation_bytes=1, blocks={"wide": 1}, called_at={},
                                  capacity_bytes=None, tight=False)
    finding = Finding("activation-memory", message="", fix=Fix(""), evidence=evidence)
    return finding, measure(ctx, finding, budget)


def test_memory_fixes_the_budget_left_out_are_said_not_measured():
    # The first fix's turn and its warm-up pass; every check after them is refused.
    finding, measured = _activation_trial(_Answers(lambda call, cost: call <= 2))
    assert [row.fix for row in measured.what_if.fixes] == ["checkpointing"]
    assert measured.note.endswith(
        "Not measured: bf16-autocast, micro-batches: the what-if budget left could not hold 20 of the script's steps."
    )


def test_a_fix_whose_warm_up_shows_it_would_not_fit_is_said_not_measured():
    # Every fix's turn is allowed (20 steps of 10 ms), what its warm-up steps ask for never is.
    finding, measured = _activation_trial(_Answers(lambda call, cost: cost == pytest.approx(0.2)))
    assert measured is None
    assert "Not measured: checkpointing: a step took " in finding.note
    assert "; bf16-autocast: a step took " in finding.note and "; micro-batches: a step took " in finding.note


def _row(fix: str, detail: str, saves: float, costs: float) -> MeasuredFix:
    """A measured memory fix: its peak ``saves`` of its baseline's 100 MiB away, its step ``costs`` x 10 ms."""
    return MeasuredFix(fix=fix, detail=detail, baseline_bytes=100 * MIB, fixed_bytes=int((1 - saves) * 100 * MIB),
                       baseline_ms=10.0, fixed_ms=10.0 * costs)


RECOMPUTE = _row("checkpointing", "blocks.0", saves=0.4, costs=1.5)


@pytest.mark.parametrize("rows, order", [
    ([RECOMPUTE, _row("bf16-autocast", "cpu", 0.3, 0.8)], ["checkpointing"]),  # faster, but keeps more of the peak
    ([RECOMPUTE, _row("micro-batches", "2 x 32 rows", 0.45, 1.1), _row("bf16-autocast", "cpu", 0.5, 0.9)],
     ["bf16-autocast", "micro-batches", "checkpointing"]),  # as far down and faster: fastest first
    ([RECOMPUTE, _row("micro-batches", "2 x 32 rows", 0.45, 1.6)], ["checkpointing"]),  # further down, but slower
    ([_row("checkpointing", "blocks.0", 0.0, 1.5), _row("bf16-autocast", "cpu", 0.1, 2.0),
      _row("micro-batches", "2 x 32 rows", 0.3, 3.0)], ["micro-batches", "bf16-autocast"]),  # most saved first
    ([_row("checkpointing", "blocks.0", 0.01, 1.5)], []),  # nothing lowers the peak 2%
])
def test_the_memory_fixes_are_tried_checkpointing_last_after_those_that_beat_it_on_both(rows, order):
    from turbotrain.doctor.rules.memory.activation_memory import ranked

    assert [r.fix for r in ranked(rows)] == order


def test_a_faster_fix_as_far_down_is_written_into_the_loop_saying_why_with_the_next_instead():
    """activation-memory's edit of the fixes that beat checkpointing: micro-batches at the training forward's line,
    the measured trade in its label, bf16 autocast instead, then the recomputation; none lowering the peak is by
    hand, naming what each measured."""
    from turbotrain.doctor.edits import ByHand
    from turbotrain.doctor.results import MemoryResult
    from turbotrain.doctor.rules.memory.activation_memory import edit

    memory = _memory(activations=64 * MIB)
    root, block = memory.modules
    called = dataclasses.replace(block, call=Site("/u/train.py", 20, "Net.forward"))  # where its parent calls it
    ctx = _context(memory=dataclasses.replace(memory, modules=(root, called)))
    ctx.capture = Capture(module=None, args=(), kwargs={}, batch_size=64, site=Site("/u/train.py", 30, "main"))
    [f] = evaluate(ctx, only=["activation-memory"])
    f.what_if = MemoryResult(rows=64, fixes=(RECOMPUTE, _row("micro-batches", "4 x 16 rows", 0.5, 1.2),
                                            _row("bf16-autocast", "cpu", 0.45, 1.3)))
    spec = edit(ctx, f)
    assert (spec.kind, spec.line, spec.params, spec.purpose) == ("micro_batches", 30, {"k": 4, "dim": 0}, "memory")
    assert spec.label.startswith("4 micro-batches of 16 rows") and "50% down against checkpointing's 40%" in spec.label
    assert spec.instead.kind == "autocast" and spec.instead.instead.kind == "checkpoint"
    assert spec.instead.instead.line == 20 and spec.instead.instead.instead is None  # the block's call
    f.what_if = MemoryResult(rows=64, fixes=(_row("checkpointing", "blocks.0", 0.0, 1.5),))
    with pytest.raises(ByHand, match="none of the fixes measured on copies lowers the step's peak"):
        edit(ctx, f)


def test_a_run_dead_in_its_first_step_keeps_its_optimizer_and_the_fit_counts_its_state():
    # AdamW's state does not exist until its first step, which the run never finished; the script's frames, the
    # optimizer's only holders, went with the error. What a batch needs must count that state all the same.
    recorder = Recorder(measure=4, warmup=1, profile=1)
    run_script(script("memory_out_of_memory"), [str(2**18), "2048", "adamw"], recorder)
    ctx = build_context(recorder.recording(), recorder.live_objects(), str(script("memory_out_of_memory")))
    assert ctx.recording.out_of_memory is not None and ctx.recording.out_of_memory.step == 0  # the first
    assert [type(opt).__name__ for opt, _ in ctx.optimizers] == ["AdamW"]
    memory = measure_captured(ctx.capture, [opt for opt, _ in ctx.optimizers], rows=16)
    assert memory.peak.optimizer_state >= 2 * memory.peak.parameters > 0, memory.peak


def test_the_optimizer_state_counted_is_the_copies_own_where_an_lr_scheduler_wraps_the_step():
    # A scheduler replaces opt.step on the instance with a wrapper that steps the original: copied with it, the
    # copies' step moved the script's weights and the split counted no optimizer state made by it.
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(32, 64)
    memory = measure_captured(Capture(module=model, args=(x,), kwargs={}, batch_size=32), [opt])
    assert memory.peak.optimizer_state >= 2 * memory.peak.parameters > 0, memory.peak
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before)) and not opt.state


def test_the_memory_fixes_of_a_compiled_model_run_eagerly_and_compile_nothing():
    # airbench's copies of its max-autotune model compiled again for every fix and its baseline: 21 s a first step,
    # and no fix fitted the what-if budget.
    from turbotrain.doctor.analysis.memory_fixes import checkpointing

    compiles = []

    def backend(graph, example_inputs):
        compiles.append(graph)
        return graph.forward

    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cost = checkpointing(compiled, [opt], ((torch.randn(8, 16),), {}), ["0"], repeats=1)  # the eager module's name
    assert compiles == [] and cost.fixed.step_seconds > 0 and cost.baseline.step_seconds > 0


def test_a_stack_of_blocks_is_recomputed_whole_where_none_holds_a_quarter_alone():
    # nanoGPT's char model: four Blocks in transformer.h, each a hair under a quarter of the step's activations (the
    # embeddings and the head hold the rest); before, no block qualified and checkpointing was never measured.
    site = Site("/u/model.py", 103, "Block.forward")
    blocks = [ModuleActivations(f"transformer.h.{i}", "Block", 0, 16 * MIB, 40, site) for i in range(4)]
    mlps = [ModuleActivations(f"transformer.h.{i}.mlp", "MLP", 0, 9 * MIB, 4, site) for i in range(4)]
    rows = [*blocks, *mlps, ModuleActivations("lm_head", "Linear", 0, MIB, 1)]
    chosen = blocks_to_checkpoint(rows, 64 * MIB + 512)
    assert chosen == [f"transformer.h.{i}" for i in range(4)]
    assert blocks_text(chosen) == "transformer.h.0-3"
    assert blocks_text(["2", "3", "4"]) == "2-4"  # a root Sequential's blocks (airbench94's was ".2-4")
    # One wide submodule holding more than a stack of small ones is still chosen on its own.
    wide = ModuleActivations("wide", "Wide", 0, 40 * MIB, 2, site)
    small = [ModuleActivations(f"layers.{i}", "Small", 0, 5 * MIB, 2, site) for i in range(4)]
    assert blocks_to_checkpoint([wide, *small], 60 * MIB) == ["wide"]
    assert blocks_text(["blocks.1", "blocks.0", "head", "x.2", "x.3", "x.5"]) == "blocks.1, blocks.0, head, x.2-3, x.5"


def test_dropout_and_activation_modules_are_not_blocks_to_recompute():
    # pytorch/examples' GCN: gc1, dropout, gc2. "recompute dropout, gc2" named the Dropout, whose recomputation alone
    # keeps its input in place of its mask; a Sequential's activations (ReLU 1 and 3) are no stack of blocks either.
    # A module without parameters that computes (an attention core, an upsampling) still is one.
    from turbotrain.doctor.record.memory_watch import measure_step

    site = Site("/u/train.py", 46, "GraphConv.forward")
    rows = [ModuleActivations("dropout", "Dropout", 0, 40 * MIB, 1, elementwise=True),
            ModuleActivations("gc2", "GraphConv", 0, 30 * MIB, 2, site),
            ModuleActivations("gc1", "GraphConv", 0, 24 * MIB, 2, site)]
    assert blocks_to_checkpoint(rows, 90 * MIB) == ["gc2", "gc1"]
    net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                              torch.nn.Dropout(0.1), torch.nn.Upsample(scale_factor=2), torch.nn.Linear(128, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    step = measure_step(net, [opt], [torch.randn(256, 8, 8)], lambda m, x: m(x).square().mean())
    elementwise = {m.name: m.elementwise for m in step.modules}
    assert elementwise["1"] and elementwise["3"] and elementwise["4"], elementwise
    assert not elementwise[""] and not elementwise.get("5", False) and not elementwise.get("6", False), elementwise
    # The ReLUs hold what the Linears after them read (saved once, by the first): recomputing them frees nothing.
    assert not set(blocks_to_checkpoint(step.modules, step.activation_bytes)) & {"1", "3", "4"}


def test_a_fix_that_runs_out_of_memory_under_the_limit_is_said_so_and_the_others_are_still_measured(monkeypatch):
    # modded-nanogpt under 900 MiB: a fix measured at 128 rows ran out of memory under the limit, and every fix was
    # measured again at 64, then 32 rows (where micro-batches of one row were all that fitted, 23x slower a step).
    from turbotrain.doctor.analysis import memory as memory_module

    ctx, _ = _compiled_bf16(autocast=False)
    optimizers = [ctx.optimizers[0][0]]
    at_half = measure_captured(ctx.capture, optimizers, rows=128)
    room = at_half.at_rows(128, 64) + at_half.gradient_bytes  # micro-batches of 64 rows, as estimated, fit
    monkeypatch.setattr(memory_module, "capacity_bytes", lambda memory: room)
    refused = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4096 bytes")
    measured_micro = memory_module._micro_batches_at
    tried: list[int] = []

    def micro_at(capture, optimizers, batch, rows, micro, trials):
        tried.append(micro)
        if micro > 32:
            raise refused
        return measured_micro(capture, optimizers, batch, rows, micro, trials)

    def no_room(*args, **kwargs):
        raise refused

    monkeypatch.setattr(memory_module, "_micro_batches_at", micro_at)
    monkeypatch.setattr(memory_module, "bf16_autocast", no_room)
    oom = OutOfMemory("cpu", 2 * MIB, "can't allocate memory", None, phase="forward", step=0)
    fit = fit_after_oom(ctx.capture, optimizers, oom, repeats=1)
    assert fit is not None and fit.rows == 128 and fit.refused == ("bf16-autocast",)
    [split] = [f for f in fit.fixes if f.cost.fix == "micro-batches"]
    assert tried[-1] == 32 and all(m > 32 for m in tried[:-1]) and split.cost.detail == "8 x 32", tried
    assert [f.cost.fix for f in fit.fixes] == ["micro-batches", "checkpointing"]
    ctx.__dict__["fit_after_oom"] = fit
    ctx.recording = _recording(out_of_memory=oom)
    text = "\n".join(memory_lines(memory_section(ctx)))
    assert "bf16-autocast: ran out of memory at 128 rows (does not fit)" in text, text
    [eager] = evaluate(ctx, only=["out-of-memory"])
    assert "copies ran eagerly" not in (eager.note or "") and eager.evidence.compiled is None
    # A compiled script's copies ran eagerly: the fix said to fit is run compiled at the script's whole batch.
    code = CompiledCode("forward", Site("/u/train.py", 9), None, 1, 1, (), (), first_compile_s=1.0)
    ctx.recording = _recording(out_of_memory=oom, compiled=CompileFacts(codes=(code,)))
    [f] = evaluate(ctx, only=["out-of-memory"])
    [run] = f.evidence.compiled.runs
    assert run.fix == "micro-batches" and run.detail == "8 x 32" and run.ran and run.peak_bytes > 0, run
    assert "Run compiled at its 256 rows: 8 micro-batches of 32 rows ran (peak" in f.message, f.message
    assert "then run compiled" in f.note, f.note
    # Where compiling it again would take too long, it is not run; the finding says why, and how to check it.
    slow = dataclasses.replace(code, first_compile_s=1000.0)
    ctx.recording = _recording(out_of_memory=oom, compiled=CompileFacts(codes=(slow,)))
    [f] = evaluate(ctx, only=["out-of-memory"])
    assert not f.evidence.compiled.runs and "Run compiled" not in f.message
    assert "(not run compiled here: a compiled run of a fix would take about 1000 s" in f.note and "--verify" in f.note


def test_micro_batches_that_run_out_of_memory_compiled_are_run_again_at_half_their_rows(monkeypatch):
    # modded-nanogpt's twin: "4 x 256" said to fit eagerly died compiled; smaller micro-batches are the next to run,
    # then the next fix, and no more than MOST_RUNS compiles are paid.
    from types import SimpleNamespace

    from turbotrain.doctor.analysis.memory_fixes import Cost, FixCost
    from turbotrain.doctor.rules.memory import _compiled_fit

    ctx, _ = _compiled_bf16(autocast=False)
    code = CompiledCode("forward", Site("/u/train.py", 9), None, 1, 1, (), (), first_compile_s=1.0)
    ctx.recording = _recording(compiled=CompileFacts(codes=(code,)))
    fit = SimpleNamespace(rows=64, full_rows=256)
    micro = FixCost("micro-batches", "4 x 64", Cost(MIB, 0.01), Cost(MIB, 0.01))
    bf16 = FixCost("bf16-autocast", "cpu", Cost(MIB, 0.01), Cost(MIB, 0.02))
    fitting: set[str] = set()

    def run(ctx, model, fix, detail, full_rows):
        ran = detail in fitting
        return _compiled_fit.CompiledRun(fix, detail, ran, peak_bytes=MIB if ran else None)

    monkeypatch.setattr(_compiled_fit, "_run", run)
    fitting.add("16 x 16")
    check = _compiled_fit.compiled_check(ctx, fit, [micro, bf16])
    assert [(r.detail, r.ran) for r in check.runs] == [("4 x 64", False), ("8 x 32", False), ("16 x 16", True)]
    assert check.first_ran is check.runs[-1]
    fitting.clear()
    fitting.add("cpu")
    check = _compiled_fit.compiled_check(ctx, fit, [bf16, micro])
    assert [(r.fix, r.ran) for r in check.runs] == [("bf16-autocast", True)]
    fitting.clear()  # none fits: MOST_RUNS compiles, no more
    check = _compiled_fit.compiled_check(ctx, fit, [micro, bf16])
    assert len(check.runs) == _compiled_fit.MOST_RUNS and check.first_ran is None


def test_what_the_models_own_forward_saves_is_a_row_of_its_own():
    # build-nanogpt's cross-entropy over 50,304 logits in GPT.forward saved 49.1 MiB of 67.6; the section named only
    # lm_head and the blocks (the root's total holds them all, and was left out).
    site = Site("/u/train.py", 114, "GPT.forward")
    head = ModuleActivations("lm_head", "Linear", 12 * MIB, 12 * MIB, 1)
    blocks = [ModuleActivations(f"h.{i}", "Block", 0, 2 * MIB, 4, Site("/u/train.py", 70, "Block.forward"))
              for i in range(3)]
    root = ModuleActivations("", "GPT", 49 * MIB, 67 * MIB, 9, site)
    memory = dataclasses.replace(_memory(activations=67 * MIB), modules=(root, head, *blocks))
    section = memory_section(_context(memory=memory))
    assert [(m.name, m.class_name, m.bytes) for m in section.top_modules] == [
        ("", "GPT", 49 * MIB), ("lm_head", "Linear", 12 * MIB), ("h.0-2", "Block", 6 * MIB)]
    text = "\n".join(memory_lines(section)).replace("\n", " ")
    assert "saved for backward: GPT.forward itself (/u/train.py:114) 49.0 MiB; lm_head (Linear) 12.0 MiB" in text


def test_a_stack_is_said_once_in_the_memory_section_and_the_finding():
    # A 12-layer transformer: its blocks and each block's MLP are one row each, the bytes summed, not 3 of 12.
    site = Site("/u/model.py", 103, "Block.forward")
    blocks = [ModuleActivations(f"transformer.h.{i}", "Block", 0, (16 + (i == 7)) * MIB, 40, site) for i in range(12)]
    mlps = [ModuleActivations(f"transformer.h.{i}.mlp", "MLP", 0, 9 * MIB, 4) for i in range(12)]
    head = ModuleActivations("lm_head", "Linear", 0, 20 * MIB, 1)
    memory = dataclasses.replace(_memory(activations=250 * MIB), modules=(
        ModuleActivations("", "GPT", 0, 250 * MIB, 600), *blocks, head, *mlps))
    section = memory_section(_context(memory=memory))
    assert [(m.name, m.blocks, m.bytes) for m in section.top_modules[:3]] == [
        ("transformer.h.0-11", 12, 193 * MIB), ("transformer.h.0-11.mlp", 12, 108 * MIB), ("lm_head", 1, 20 * MIB)]
    assert "saved for backward: transformer.h.0-11 (12 x Block, /u/model.py:103) 193.0 MiB; transformer.h.0-11.mlp " \
           "(12 x MLP) 108.0 MiB; lm_head (Linear) 20.0 MiB" in "\n".join(memory_lines(section)).replace("\n", " ")
    [f] = evaluate(_context(memory=memory), only=["activation-memory"])
    assert "The blocks that save the most: transformer.h.0-11 (12 x Block, /u/model.py:103) 193.0 MiB." in f.message
    # Gaps in a stack, a stack inside a stack's block, and two classes in one list.
    names = [s.name for s in stacked([ModuleActivations(n, c, 0, b, 1) for n, c, b in [
        ("x.0", "A", 4), ("x.1", "A", 4), ("x.3", "A", 4), ("x.2", "B", 1), ("enc.0.blocks.1", "C", 2),
        ("enc.1.blocks.1", "C", 2), ("enc.1.blocks.0", "C", 3)]])]
    assert names == ["x.0-1,3", "enc.0-1.blocks.1", "enc.1.blocks.0", "x.2"], names


def test_a_stack_the_row_cut_reaches_is_kept_whole_for_checkpointing():
    # Forty equal blocks past a cut of 8 rows: checkpointing recomputes the whole stack, not the rows that made it.
    from turbotrain.doctor.record.memory_watch import measure_step

    torch = pytest.importorskip("torch")
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(40))

    class Deep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = blocks

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    model = Deep()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    memory = measure_step(model, [opt], [torch.randn(4, 8)], lambda m, x: m(x).square().mean(), top=8)
    assert {f"blocks.{i}" for i in range(40)} <= {m.name for m in memory.modules}
    assert blocks_to_checkpoint(memory.modules, memory.activation_bytes) == [f"blocks.{i}" for i in range(40)]


@pytest.mark.parametrize("device_mib, rules, planned", [
    (16 * 1024, None, False),  # 16 GiB for a ~70-MiB step: recomputing would cost time for memory nobody needs
    (16 * 1024, ("activation-memory",), True),  # asked for by name
    (200, None, True),  # a step that fills most of the device: medium, planned
])
def test_a_memory_fix_goes_in_the_patch_where_the_memory_is_needed(device_mib, rules, planned):
    # minGPT's 6 blocks on a 24-GiB CPU: checkpointing went into --fix's patch, and the fixes verified together ran
    # x0.62, which dropped the two time fixes with it.
    from turbotrain.doctor.fixes.choose import plan_fixes

    memory = _memory(activations=64 * MIB, total=device_mib * MIB)
    root, block = memory.modules
    called = dataclasses.replace(block, call=Site("/u/train.py", 20, "Net.forward"))
    ctx = _context(memory=dataclasses.replace(memory, modules=(root, called)))
    [f] = evaluate(ctx, only=["activation-memory"])
    [result] = plan_fixes(ctx, [f], "/u", rules)
    assert result.purpose == "memory" and (result.dropped is None) == planned, (f.evidence.tight, result.dropped)
    if not planned:
        assert "room to spare" in result.dropped and "--fix-only activation-memory" in result.dropped
