"""The biggest win in the user's own code: periodic work at a period far beyond the window, validation run after
every step, a batch built one sample at a time. Each corpus script marks the line its finding must name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from doctor_helpers import cached_report, marked_lines, script
from turbotrain.doctor.analysis.batch_building import per_sample_build
from turbotrain.doctor.analysis.context import build_context
from turbotrain.doctor.analysis.periodic import watch_message
from turbotrain.doctor.record.cadence import running_cadences
from turbotrain.doctor.record.recorder import Recorder
from turbotrain.doctor.record.recording import from_json, to_json
from turbotrain.doctor.record.recurring import find_watched
from turbotrain.doctor.record.steps import Stop
from turbotrain.doctor.sites import Site
from fakes import FakeClock, FakeOptimizer

pytestmark = pytest.mark.one_core  # one process, one thread: run beside one other such test (tests/conftest.py)

SEVERITY = {"low": 0, "medium": 1, "high": 2}


def _findings(report, rule):
    return [f for f in report.to_dict()["findings"] if f["rule"] == rule]


def _points_at_marked_lines(name, report):
    for rule, line in marked_lines(name):
        wheres = [f["where"] for f in _findings(report, rule)]
        assert f"{name}.py:{line}" in wheres, f"{rule} should point at {name}.py:{line}; got {wheres}"


# -- periodic work beyond the window -------------------------------------------------------------------

@pytest.fixture(scope="module")
def eval_every_300():
    return cached_report("eval_every_300", what_if=False)


def test_evaluation_every_300_steps_is_found_beyond_a_short_window(eval_every_300):
    report = eval_every_300
    assert report.status == "ok", report.messages
    assert len(report.breakdown.steps) < 20  # the measured window never holds an evaluation
    _points_at_marked_lines("eval_every_300", report)
    [finding] = _findings(report, "periodic-work")
    assert finding["evidence"]["every"] == 300
    assert "every 300 steps" in finding["message"] and "watching the step clock" in finding["note"]
    assert SEVERITY[finding["severity"]] >= SEVERITY["medium"] and finding["est_speedup"] > 1.05
    [row] = [r for r in report.periodic if r.found_by == "watch"]
    assert row.kind == "validation" and row.suggested_every > 300 and 0.05 < row.share < 1
    # The bar holds it too, spread over its period, and the report says what the watch did.
    assert report.breakdown.shares["outside_step"] >= 0.9 * row.share, (report.breakdown.shares, row)
    assert any("the step clock was watched" in m and "occurrence(s) found" in m for m in report.messages)


def test_evaluation_every_other_step_is_periodic_work_not_every_step_work():
    """Work in half the steps has a period of 2: one finding says so, with a cadence that is a multiple of it, and
    no eval-every-step says the same evaluation runs after every step."""
    report = cached_report("eval_every_other_step", what_if=False)
    assert report.status == "ok", report.messages
    _points_at_marked_lines("eval_every_other_step", report)
    [row] = report.periodic
    assert row.every == 2 and row.kind == "validation" and row.suggested_every % 2 == 0, row
    [finding] = _findings(report, "periodic-work")
    assert "every 2 steps" in finding["message"] and not _findings(report, "eval-every-step"), report.findings
    # Each measured step either ran the evaluation or not: the occurrences are every other one.
    assert {b - a for a, b in zip(row.steps, row.steps[1:])} == {2}, row


def _fake_recorder(measure, watch_s):
    """A recorder on a fake clock (its steps are ticked by hand), and a fake optimizer to step."""
    recorder = Recorder(capture=False, measure=measure, warmup=1, profile=0, watch_s=watch_s)
    now = FakeClock()
    recorder.clock.now = now
    recorder.tracker.restart()
    return recorder, now, FakeOptimizer()


def _fake_run(period, steps, measure=5, eval_s=0.5, watch_s=60.0):
    """A loop whose `if step % period == 0:` runs a 0.5 s validation, on a fake clock: its steps take 10 ms."""
    recorder, now, opt = _fake_recorder(measure, watch_s)
    try:
        for step in range(steps):
            if step % period == 0:
                recorder.clock.push("eval")
                now.tick(eval_s)
                recorder.clock.pop()
            now.tick(0.01)
            recorder.tracker.before_optimizer_step(opt)
            now.tick(0.001)
            recorder.tracker.after_optimizer_step(opt)
    except Stop:
        return recorder, "stopped"
    return recorder, "finished"


def test_the_step_clock_is_watched_until_two_periods_of_the_loops_cadence():
    recorder, status = _fake_run(period=40, steps=10_000)
    recording = recorder.recording()
    watched = recording.watched
    assert status == "stopped" and watched is not None and watched.ended == "periods"
    assert len(recording.steps) == 1 + 5  # the window's steps only: the watched ones are not its numbers
    assert [c.every for c in watched.cadences] == [40] and watched.last == 2 * 40 + 1
    assert [s.index for s in watched.spikes] == [40, 80]
    [periodic] = find_watched(watched, list(recording.steps))
    assert periodic.every == 40 and periodic.category == "outside_step" and periodic.watched
    assert periodic.cost_s == pytest.approx(0.5, rel=0.05)
    assert from_json(to_json(recording)) == recording
    message = watch_message(build_context(recording))
    assert "steps 6-81" in message and "every 40 steps" in message and "2 occurrence(s) found" in message


def _fake_epochs(per_epoch, every_epochs, measure=5):
    """Epochs of ``per_epoch`` 10-ms steps; after every ``every_epochs``-th a 0.5 s validation, on a fake clock."""
    recorder, now, opt = _fake_recorder(measure, 60.0)
    try:
        for epoch in range(10_000):
            for _ in range(per_epoch):
                now.tick(0.01)
                recorder.tracker.before_optimizer_step(opt)
                now.tick(0.001)
                recorder.tracker.after_optimizer_step(opt)
            if (epoch + 1) % every_epochs == 0:
                recorder.clock.push("eval")
                now.tick(0.5)
                recorder.clock.pop()
    except Stop:
        pass
    return recorder.recording()


def test_a_cadence_on_an_outer_loops_counter_is_watched_in_steps():
    """`if (epoch + 1) % 10 == 0:` around 4 steps an epoch recurs every 40 steps, not every 10."""
    recording = _fake_epochs(per_epoch=4, every_epochs=10)
    watched = recording.watched
    assert watched is not None and watched.ended == "occurrences", watched
    [cadence] = watched.cadences
    # The epoch counter moved once in the window's 5 steps: about 5 steps an epoch, an estimate.
    assert cadence.outer and cadence.per_count == 5.0 and cadence.every == 50
    assert [s.index for s in watched.spikes] == [40, 80, 120]  # three periods of the estimate's 50 steps
    [periodic] = find_watched(watched, list(recording.steps))
    assert periodic.every == 40 and periodic.cost_s == pytest.approx(0.5, rel=0.05)
    assert from_json(to_json(recording)) == recording
    message = watch_message(build_context(recording))
    assert "every 10 iterations of the loop around the step (about 50 steps)" in message, message


def test_work_more_frequent_than_the_cadence_does_not_end_the_watch():
    """A 0.5 s validation every 4 steps (in the window already) while the loop's `% 50` asks for more: the
    watch goes on for a whole period of the cadence, not just three occurrences of the frequent work."""
    recorder, now, opt = _fake_recorder(20, 60.0)
    try:
        for step in range(10_000):
            if step % 4 == 3:
                recorder.clock.push("eval")
                now.tick(0.5)
                recorder.clock.pop()
            if step % 50 == 49:
                pass  # the cadence the watch is for; its work costs nothing here
            now.tick(0.01)
            recorder.tracker.before_optimizer_step(opt)
            now.tick(0.001)
            recorder.tracker.after_optimizer_step(opt)
    except Stop:
        pass
    recording = recorder.recording()
    watched = recording.watched
    assert watched is not None and watched.first == 21 and watched.last >= 50, watched
    assert len(watched.spikes) > 3  # three of them came within 12 steps of the window's end
    message = watch_message(build_context(recording))
    assert "none of them recurring work beyond what the window found" in message or "occurrence(s) found" in message


def test_an_outer_counter_that_did_not_move_in_the_window_is_not_watched():
    # 100 steps an epoch: the window's 5 steps never see the counter move, so its period in steps is unknown.
    recording = _fake_epochs(per_epoch=100, every_epochs=10)
    assert recording.watched is None and len(recording.steps) == 6


def test_one_occurrence_takes_its_period_from_the_code():
    # The budget runs out after the first occurrence (the watch is given none): the loop's `% 40` is the period.
    recorder, _ = _fake_run(period=40, steps=10_000, watch_s=1e-9)
    watched = recorder.recording().watched
    assert watched is not None and watched.ended == "budget" and not watched.spikes
    recorder, _ = _fake_run(period=7, steps=10_000, measure=3)
    watched = recorder.recording().watched
    assert watched is not None and [s.index for s in watched.spikes] == [7, 14]
    lone = watched.__class__(watched.first, watched.last, watched.seconds, watched.ordinary_s, watched.spikes[:1],
                             watched.cadences, "budget")
    [periodic] = find_watched(lone, list(recorder.steps))
    assert periodic.every == 7 and periodic.period_from == "code"


def test_no_cadence_beyond_the_window_ends_the_script_with_the_window():
    recorder, status = _fake_run(period=2, steps=10_000, measure=5)
    assert status == "stopped" and recorder.recording().watched is None and recorder.tracker.closed == 6


def test_cadences_are_read_from_names_without_running_anything():
    class Config:
        eval_interval = 300

        @property
        def log_every(self):  # a property is never called to find a cadence
            raise AssertionError("ran the script's code")

    args, cfg, found = SimpleNamespace(save_every=1000), Config(), []
    for step in range(1):
        if step % args.save_every == 0 and step % cfg.eval_interval == 0:
            found = running_cadences(__import__("sys")._getframe())
        if step < 0 and step % cfg.log_every == 0:  # never true: only its source is read
            pass
    assert sorted(c.every for c in found) == [300, 1000]


# -- validation after every step, and no unexplained share ---------------------------------------------

@pytest.fixture(scope="module")
def double_eval():
    return cached_report("double_eval_per_step", what_if=False)


def test_two_validation_forwards_after_every_step_are_named(double_eval):
    report = double_eval
    assert report.status == "ok", report.messages
    _points_at_marked_lines("double_eval_per_step", report)
    [finding] = _findings(report, "eval-every-step")
    assert finding["evidence"]["forwards_per_step"] == 2 and finding["evidence"]["same_inputs"]
    assert "`model(val_x)` runs 2 times per step" in finding["message"] and "once" in finding["fix"]
    assert SEVERITY[finding["severity"]] >= SEVERITY["medium"]


def test_every_phase_over_a_tenth_of_the_step_ends_in_a_finding_with_a_line(double_eval):
    data = double_eval.to_dict()
    for category, share in data["breakdown"].items():
        if category in ("compute", "python_overhead", "optimizer") or share < 0.10:
            continue
        wheres = [f["where"] for f in data["findings"] if f["category"] == category and f["where"]]
        assert wheres, f"{category} ({share:.0%}) has no finding with a line: {data['findings']}"
    # The untimed batch building is said plainly, with why no finer line was found.
    unexplained = [f for f in data["findings"] if f["rule"] == "unattributed-time"]
    assert all(f["category"] != "outside_step" for f in unexplained)  # eval-every-step explains that one


# -- per-sample Python in the batch path ----------------------------------------------------------------

@pytest.fixture(scope="module")
def list_comprehension():
    return cached_report("list_comprehension_batches", what_if_budget_s=3.0)


def test_a_batch_built_one_sample_at_a_time_is_named_and_timed_on_the_scripts_data(list_comprehension):
    report = list_comprehension
    assert report.status == "ok", report.messages
    _points_at_marked_lines("list_comprehension_batches", report)
    timed = [f for f in _findings(report, "per-sample-batch") if f.get("what_if")]
    assert timed, _findings(report, "per-sample-batch")
    for finding in timed:
        what_if = finding["what_if"]
        assert what_if["kind"] == "batch_build" and what_if["same_batch"] and what_if["data"] == "data"
        assert what_if["rows"] == 256 and what_if["sample_shape"] == [8]
        assert finding["measured"] and "data[ix[:, None] + torch.arange" in finding["fix"]


def test_per_sample_builds_are_read_from_the_line(tmp_path):
    source = tmp_path / "train.py"
    source.write_text(
        "import torch\n"
        "def get_batch(data, block):\n"
        "    ix = torch.randint(len(data) - block, (4,))\n"
        "    x = torch.stack([data[i:i + block] for i in ix])\n"
        "    y = torch.stack([data[i + 1:i + block + 1] for i in ix])\n"
        "    z = torch.stack([torch.tensor(rows[i]) for i in starts])\n"
        "    w = data[ix]\n")
    x, y, z = (per_sample_build(Site(str(source), line, "get_batch")) for line in (4, 5, 6))
    assert x.kind == "slices" and x.one_op() == "data[ix[:, None] + torch.arange(block)]"
    assert y.one_op() == "data[ix[:, None] + torch.arange(1, block + 1)]"
    assert z.kind == "rows" and z.data is None and "starts" in z.one_op()
    assert per_sample_build(Site(str(source), 7, "get_batch")) is None
    data = torch.arange(100)
    ix = torch.tensor([3, 50])
    assert torch.equal(torch.stack([data[i:i + 8] for i in ix]), data[ix[:, None] + torch.arange(8)])


def test_watch_zero_ends_the_script_with_the_window(capsys):
    from turbotrain.cli import main

    report = cached_report("eval_every_300", what_if=False, watch_s=0.0)
    assert report.status == "ok" and not [r for r in report.periodic if r.found_by == "watch"]
    assert not any("the step clock was watched" in m for m in report.messages)
    assert main(["doctor", "--watch", "-1", str(script("eval_every_300"))]) == 2
    assert "DoctorOptions.watch_s (--watch): -1 is not allowed" in capsys.readouterr().err


def test_work_that_generates_samples_is_called_sampling_not_validation():
    """Eval-mode forwards under no_grad inside a ``generate`` are sampling: no val loader, no inference_mode fix."""
    report = cached_report("sample_every_10", what_if=False)
    assert report.status == "ok", report.messages
    [row] = [r for r in report.periodic if r.every == 10]
    assert row.kind == "sampling", report.periodic
    _points_at_marked_lines("sample_every_10", report)
    [finding] = _findings(report, "periodic-work")
    assert finding["message"].startswith("Sampling every 10 steps") and "inference_mode" not in finding["fix"]
