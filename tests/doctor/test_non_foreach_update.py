"""``non-foreach-update``: a loop over parameters that updates each tensor in place in the steps is named at its line
(and loops that do anything else, or run once, are not); its foreach rewrite computes the same tensors bitwise; the
per-tensor loop and the foreach calls are timed on the model's own parameters; then once end to end, patched and
verified. A loop under ``if step % N == 0:`` runs once in N steps: its gain is counted so."""

from __future__ import annotations

import copy
import textwrap
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from doctor_helpers import Budget, SCRIPTS, git_apply, marked_lines
from turbotrain.doctor import DoctorOptions, diagnose_script
from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.analysis.source import load_sources
from turbotrain.doctor.requests import OwnTrial
from turbotrain.doctor.rules import by_id, evaluate
from turbotrain.doctor.rules.loop.non_foreach_update import ForeachResult, measure
from turbotrain.hardware import detect

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

RULE = "non-foreach-update"

# Each loop below sits in the training loop (it calls backward) unless said otherwise; the ones marked fire.
SOURCE = textwrap.dedent("""\
    import copy
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    ema = copy.deepcopy(model)
    decay, lr = 0.9, 0.1


    def update_ema():
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, 1 - decay)


    for p in model.parameters():
        p.data.mul_(0.5)
    for step in range(2):
        loss = model(torch.ones(3, 4)).sum()
        loss.backward()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(decay).add_(p, alpha=1 - decay)
            for p in list(model.parameters()):
                p -= lr * p.grad
            for p in model.parameters():
                p.grad = None
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, e.mean())
        update_ema()
""")
FIRES = [22, 24]  # the EMA chain and the SGD step by hand (not: the one-off scaling, `.grad = None`, a weight
# that reads the tensor); update_ema()'s loop fires where its function was seen running


def _context(tmp_path, source: str = SOURCE, ran: dict | None = None, **fields) -> Context:
    script = tmp_path / "train.py"
    script.write_text(source)
    return Context(script=str(script), base=str(tmp_path), hw=detect("cpu"), device="cpu",
                   breakdown=compute_breakdown([], 1), measured_steps=[], sources=load_sources([str(script)]),
                   ran_lines=ran, **fields)


def test_the_per_step_loops_that_only_update_in_place_are_named(tmp_path):
    found = evaluate(_context(tmp_path), only=[RULE])
    assert sorted(f.site.line for f in found) == FIRES
    assert all(isinstance(f.request, OwnTrial) and f.severity == "low" for f in found)
    ema = next(f for f in found if f.site.line == 22)
    assert ema.evidence.methods == ("mul_", "add_") and "zip(ema.parameters()" in ema.message
    assert next(f for f in found if f.site.line == 24).evidence.methods == ("sub_",)


def test_a_loop_in_a_function_counts_once_the_function_was_seen_running(tmp_path):
    ctx = _context(tmp_path, ran={str(tmp_path / "train.py"): tuple(range(10, 14))})
    assert sorted(f.site.line for f in evaluate(ctx, only=[RULE])) == sorted([*FIRES, 12])


def test_a_loop_caught_running_before_the_forward_explains_that_data_loading_time(tmp_path):
    from turbotrain.doctor.findings import Finding, Fix
    from turbotrain.doctor.rules.loop.unattributed_time import explained
    from turbotrain.doctor.sites import Site

    samples = {Site(str(tmp_path / "train.py"), line, "<module>"): 7 for line in (23, 25)}
    found = evaluate(_context(tmp_path, gap_samples=samples), only=[RULE])
    assert sorted(f.site.line for f in found) == FIRES
    assert all(f.source == "runtime" and f.category == "data_loading" for f in found)
    ema = next(f for f in found if f.site.line == 22)
    assert "shows as data loading" in ema.message
    gap = Finding("unattributed-time", category="data_loading", message="21% of each step...", fix=Fix("none"))
    assert explained([ema, gap]) == [ema]


GUARDED = textwrap.dedent("""\
    import copy
    import torch
    from torch import nn

    model = nn.Linear(4, 2)
    ema = copy.deepcopy(model)
    EMA_EVERY = 5


    def update_ema():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.lerp_(p, 0.1)


    for step in range(20):
        model(torch.ones(3, 4)).sum().backward()
        if step % 4 == 0:
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, 0.1)
        if not step % EMA_EVERY:
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, 0.1)
        if step % args.ema_every == 0:
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, 0.1)
        if step % 2 != 0:
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, 0.1)
        else:
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, 0.1)
        if step % 3 == 0 and step > 6:
            update_ema()
""")
# line of each loop -> steps between its runs (None: a period the run did not show)
GUARDED_EVERY = {11: 3, 18: 4, 21: 5, 24: None, 27: 1, 30: 1}


def test_a_loop_under_a_cadence_runs_once_in_its_period(tmp_path):
    ctx = _context(tmp_path, GUARDED, ran={str(tmp_path / "train.py"): (10, 11, 12)})
    found = {f.site.line: f for f in evaluate(ctx, only=[RULE])}
    assert {line: f.evidence.every for line, f in found.items()} == GUARDED_EVERY
    assert "every 4 steps" in found[18].message and "not timed" in found[24].message


def test_a_function_called_every_step_somewhere_runs_every_step(tmp_path):
    def every(source: str) -> int | None:
        ctx = _context(tmp_path, source, ran={str(tmp_path / "train.py"): (10, 11, 12)})
        return next(f for f in evaluate(ctx, only=[RULE]) if f.site.line == 11).evidence.every

    unknown = GUARDED + "    if step % args.every == 0:\n        update_ema()\n"
    assert every(unknown) is None  # called every 3 steps and at a period nothing shows
    assert every(unknown + "    update_ema()\n") == 1  # and also every step


def test_a_period_named_by_a_variable_is_the_one_the_runs_watch_read_at_that_if(tmp_path):
    from turbotrain.doctor.record.cadence import Cadence
    from turbotrain.doctor.record.recording import Recording, Window
    from turbotrain.doctor.record.watch import WatchedRun
    from turbotrain.doctor.sites import Site

    cadence = Cadence(Site(str(tmp_path / "train.py"), 23, "<module>"), every=7)
    recording = Recording(window=Window(1, 3, 3, 0), steps=(), step_delimiter="optimizer.step()", events=(),
                          loaders=(), optimizer_sites=(), module_sites=(), matmul_shapes=(), gap_samples=(),
                          watched=WatchedRun(4, 30, 1.0, 0.01, (), (cadence,), "periods"))
    ctx = _context(tmp_path, GUARDED, recording=recording)
    assert next(f for f in evaluate(ctx, only=[RULE]) if f.site.line == 24).evidence.every == 7


def test_a_loop_that_runs_every_n_steps_is_credited_an_nth_of_its_time(tmp_path):
    import dataclasses

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])
    capture = SimpleNamespace(module=model, args=(torch.randn(4, 8),), kwargs={})
    ctx = _context(tmp_path, GUARDED, capture=capture)
    ctx = ctx.replace(breakdown=dataclasses.replace(ctx.breakdown, seconds={"forward": 0.5}))
    found = {f.site.line: f for f in evaluate(ctx, only=[RULE])}
    measured = measure(ctx, found[18], Budget())
    # the loop's seconds once in 4 steps of 0.5 s (loop_ms is rounded to 0.1 us)
    assert measured.applies_to * 4 * 0.5 == pytest.approx(measured.what_if.loop_ms / 1e3, abs=5e-8)
    assert "once every 4 steps" in measured.note
    assert measure(ctx, found[24], Budget()) is None  # how often it runs is unknown


def _rewritten(tmp_path, source: str, line: int) -> str:
    from turbotrain.doctor.fixes.choose import plan_fixes

    ctx = _context(tmp_path, source)
    finding = next(f for f in evaluate(ctx, only=[RULE]) if f.site.line == line)
    [fix] = plan_fixes(ctx, [finding], str(tmp_path))
    assert fix.request is not None and fix.request.kind == "rule" and fix.request.numerics == "exact", fix
    from turbotrain.doctor.fixes.table import apply_edit

    return apply_edit(source, fix.request, "train.py")


LOOPS = {
    "ema": ("for e, p in zip(ema.parameters(), model.parameters()):\n    e.mul_(decay).add_(p, alpha=1 - decay)",
            "torch._foreach_add_([e for e, p in pairs], [p for e, p in pairs], alpha=1 - decay)"),
    "sgd": ("for p in model.parameters():\n    p.data.add_(p.grad, alpha=-lr)",
            "torch._foreach_add_([p.data for p in params], [p.grad for p in params], alpha=-lr)"),
    "augmented": ("for p in list(model.parameters()):\n    p -= lr * p.grad",
                  "torch._foreach_sub_([p for p in params], torch._foreach_mul([p.grad for p in params], lr))"),
    "lerp": ("for e, p in zip(ema.parameters(), model.parameters()):\n    e.lerp_(p, 1 - decay)",
             "torch._foreach_lerp_([e for e, p in pairs], [p for e, p in pairs], 1 - decay)"),
    # a target network's soft update, as reinforcement-learning scripts write it
    "soft-update": ("for t, p in zip(ema.parameters(), model.parameters()):\n"
                    "    t.data.copy_(decay * t.data + (1.0 - decay) * p.data)",
                    "torch._foreach_copy_([t.data for t, p in pairs], torch._foreach_add(torch._foreach_mul("
                    "[t.data for t, p in pairs], decay), torch._foreach_mul([p.data for t, p in pairs], 1.0 - decay)"
                    "))"),
    "data-assigned": ("for t, p in zip(ema.parameters(), model.parameters()):\n"
                      "    t.data = (1 - decay) * p.data + decay * t.data",
                      "torch._foreach_copy_([t.data for t, p in pairs], torch._foreach_add("),
    # an EMA as one subtraction, and one as a lerp of a detached copy
    "sub-difference": ("for e, p in zip(ema.parameters(), model.parameters()):\n    e.sub_((1 - decay) * (e - p))",
                       "torch._foreach_sub_([e for e, p in pairs], torch._foreach_mul(torch._foreach_sub("),
    "lerp-copied": ("for e, p in zip(ema.parameters(), model.parameters()):\n    e.copy_(p.detach().lerp(e, decay))",
                    "torch._foreach_copy_([e for e, p in pairs], torch._foreach_lerp([p.detach() for e, p in pairs], "
                    "[e for e, p in pairs], decay))"),
    "value-minus": ("for e, p in zip(ema.parameters(), model.parameters()):\n    e.copy_(decay - p * lr)",
                    "torch._foreach_add(torch._foreach_neg(torch._foreach_mul([p for e, p in pairs], lr)), decay)"),
}


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_the_rewrite_computes_the_same_tensors_bitwise(tmp_path, name):
    loop, expected = LOOPS[name]
    source = ("import torch\n\n\ndef train(model, ema, decay, lr, steps):\n    for _ in range(steps):\n"
              "        model(torch.ones(3, 4)).sum().backward()\n        # the update\n"
              "        with torch.no_grad():\n" + textwrap.indent(loop, " " * 12) + "\n")
    new = _rewritten(tmp_path, source, line=9)
    assert expected in new and "        # the update\n" in new and " in zip(" not in new.replace("list(zip(", "")

    def run(text: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        ema = copy.deepcopy(model)
        namespace: dict = {}
        exec(compile(text, "train.py", "exec"), namespace)  # noqa: S102 - the test's own source and its rewrite
        for _ in range(3):
            model.zero_grad()
            namespace["train"](model, ema, 0.9, 0.1, 1)
        return [t.clone() for t in (*model.parameters(), *ema.parameters())]

    assert all(torch.equal(a, b) for a, b in zip(run(source), run(new)))


def test_an_edit_is_by_hand_where_the_file_does_not_import_torch(tmp_path):
    from turbotrain.doctor.fixes.choose import plan_fixes
    from turbotrain.doctor.fixes.model import ByHand
    from turbotrain.doctor.fixes.table import apply_edit

    source = SOURCE.replace("import torch\n", "import torch as th\n").replace("torch.", "th.")
    ctx = _context(tmp_path, source)
    finding = next(f for f in evaluate(ctx, only=[RULE]) if f.site.line == 22)
    [fix] = plan_fixes(ctx, [finding], str(tmp_path))
    assert "th._foreach_mul_(" in apply_edit(source, fix.request, "train.py")  # the file's own name for torch
    with pytest.raises(ByHand, match="does not `import torch`"):
        apply_edit(source.replace("import torch as th\n", ""), fix.request, "train.py")


def test_the_loop_and_the_foreach_calls_are_timed_on_the_models_parameters(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])
    before = [p.clone() for p in model.parameters()]
    capture = SimpleNamespace(module=model, args=(torch.randn(4, 8),), kwargs={})
    ctx = _context(tmp_path, capture=capture)
    finding = next(f for f in evaluate(ctx, only=[RULE]) if f.site.line == 22)
    measured = measure(ctx, finding, Budget())
    assert isinstance(measured.what_if, ForeachResult) and measured.what_if.tensors == 12
    assert len(measured.what_if.rounds) == 3 and measured.what_if.loop_ms > 0 and measured.what_if.foreach_ms > 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # timed on copies
    assert "12 parameter tensors" in measured.note


def test_the_corpus_script_is_found_timed_patched_and_verified(tmp_path):
    pytest.importorskip("libcst", reason="doctor --fix needs libcst: pip install -e '.[fix]'")
    script = tmp_path / "ema_per_tensor.py"
    script.write_text((SCRIPTS / "ema_per_tensor.py").read_text())
    patch = tmp_path / "fixes.patch"
    options = DoctorOptions(steps=6, warmup=2, profile_steps=1, what_if_budget_s=8.0, fix=str(patch), verify=True,
                            verify_rounds=1, verify_budget_s=0, fix_rules=(RULE,))
    report = diagnose_script(script, [], options)
    [(rule, line)] = marked_lines("ema_per_tensor")
    [finding] = [f for f in report.findings if f.rule == rule]
    assert finding.site.line == line and finding.measured and finding.what_if.tensors == 50, finding.to_dict()
    if finding.source == "runtime":  # caught running before the forward: that data-loading time is explained
        assert not [f for f in report.findings if f.rule == "unattributed-time" and f.category == "data_loading"]
    [fix] = [f for f in report.fixes.fixes if f.rule == RULE]
    assert fix.diff and not fix.by_hand and fix.verification is not None, fix
    assert fix.verification.loss_match["expected"] == "bitwise" and fix.verification.loss_match["compared"] > 0
    assert fix.verification.loss_match["match"] is True, fix.verification.loss_match
    if not fix.in_patch:  # verified slower on this machine: left out of the patch, its own diff still applies
        assert "slower" in fix.dropped
        patch.write_text(fix.diff)
    git_apply(tmp_path, patch)
    patched = tmp_path / "ema_per_tensor.py"
    assert "torch._foreach_mul_(" in patched.read_text()
    assert not evaluate(_context(tmp_path, patched.read_text()), only=[RULE])  # the rule no longer fires
    assert by_id(RULE).card.edit is not None


# A target network's soft update over state dicts, as the PyTorch DQN tutorial writes it (and two other spellings).
STATE_DICT_LOOPS = {
    "keys": ("for key in p_sd:\n    t_sd[key] = p_sd[key] * decay + t_sd[key] * (1 - decay)",
             "torch._foreach_copy_([t_sd[key] for key in keys], torch._foreach_add(torch._foreach_mul("
             "[p_sd[key] for key in keys], decay), torch._foreach_mul([t_sd[key] for key in keys], 1 - decay)))"),
    "dot-keys": ("for key in p_sd.keys():\n    t_sd[key] = t_sd[key].mul(decay).add(p_sd[key], alpha=1 - decay)",
                 "torch._foreach_copy_([t_sd[key] for key in keys], torch._foreach_add(torch._foreach_mul("),
    "items": ("for key, value in p_sd.items():\n    t_sd[key] = decay * t_sd[key] + (1 - decay) * value",
              "[value for key, value in items]"),
}
STATE_DICT_TRAIN = """\
import torch


def train(model, target, decay, steps):
    for _ in range(steps):
        model(torch.ones(3, 4)).sum().backward()
        t_sd = target.state_dict()
        p_sd = model.state_dict()
{loop}
        target.load_state_dict(t_sd)
"""


@pytest.mark.parametrize("name", sorted(STATE_DICT_LOOPS))
def test_a_soft_update_over_state_dicts_is_named_and_rewritten_bitwise(tmp_path, name):
    loop, expected = STATE_DICT_LOOPS[name]
    source = STATE_DICT_TRAIN.format(loop=textwrap.indent(loop, " " * 8))
    [found] = evaluate(_context(tmp_path, source), only=[RULE])
    assert found.site.line == 9 and "makes each state-dict tensor anew" in found.message, found.message
    new = _rewritten(tmp_path, source, line=9)
    assert expected in new and "target.load_state_dict(t_sd)" in new and " in p_sd" not in new

    def run(text: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
        target = copy.deepcopy(model)
        namespace: dict = {}
        exec(compile(text, "train.py", "exec"), namespace)  # noqa: S102 - the test's own source and its rewrite
        for _ in range(3):
            model.zero_grad()
            namespace["train"](model, target, 0.9, 1)
        return [t.clone() for t in (*model.state_dict().values(), *target.state_dict().values())]

    assert all(torch.equal(a, b) for a, b in zip(run(source), run(new)))


@pytest.mark.parametrize("loop", [
    "for key in p_sd:\n    t_sd[key] = p_sd[key] * decay\n    print(key)",  # does something else too
    "for key in other:\n    t_sd[key] = p_sd[key] * decay",  # walks a dict that is no state dict
    "for key in p_sd.values():\n    t_sd[key] = p_sd[key] * decay",  # walks its tensors, not its keys
    "for key in p_sd:\n    t_sd[key] = torch.zeros(3)",  # a value from nothing of the loop's
])
def test_a_state_dict_loop_that_does_anything_else_is_not_named(tmp_path, loop):
    source = STATE_DICT_TRAIN.format(loop=textwrap.indent(loop, " " * 8)).replace(
        "import torch\n", "import torch\nother = {}\n")
    assert evaluate(_context(tmp_path, source), only=[RULE]) == []


def test_a_state_dict_loop_is_timed_on_the_models_state_dict(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 8))
    before = [t.clone() for t in model.state_dict().values()]
    capture = SimpleNamespace(module=model, args=(torch.randn(4, 8),), kwargs={})
    source = STATE_DICT_TRAIN.format(loop=textwrap.indent(STATE_DICT_LOOPS["keys"][0], " " * 8))
    ctx = _context(tmp_path, source, capture=capture)
    [finding] = evaluate(ctx, only=[RULE])
    measured = measure(ctx, finding, Budget())
    # 6 parameters and BatchNorm's running mean, running variance and its int64 count of batches
    assert measured.what_if.tensors == 9 and "9 state-dict tensors" in measured.note
    assert measured.what_if.loop_ms > 0 and measured.what_if.foreach_ms > 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.state_dict().values()))  # timed on copies
