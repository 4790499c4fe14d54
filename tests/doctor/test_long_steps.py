"""Long steps cut the window: where --steps of the warm-up's steps would take more than --record-budget, the steps
that fit are measured (at least five) and one is profiled, and the report says so; short steps and a budget of 0
keep every step asked for."""

from __future__ import annotations

import pytest

from turbotrain.doctor import DoctorOptions, diagnose_script
from turbotrain.doctor.record.measurements import StepRecord
from turbotrain.doctor.record.schedule import StepSchedule

pytestmark = pytest.mark.reads_no_time  # a step sleeps at least its time: a busy machine only makes it longer


def _steps(seconds: list[float]) -> list[StepRecord]:
    out, t = [], 0.0
    for i, s in enumerate(seconds):
        out.append(StepRecord(i, t, t + s, {"forward": s}))
        t += s
    return out


@pytest.mark.parametrize("warmup_s, record_s, measure, profile, stop_after", [
    ([40.0, 30.0, 30.0], 180.0, 6, 1, 3 + 6 + 1),     # 180 s hold six 30-s steps; the set-up step is not read
    ([40.0, 300.0, 300.0], 180.0, 5, 1, 3 + 5 + 1),   # never fewer than five
    ([2.0, 0.05, 0.05], 180.0, 20, 2, 3 + 20 + 2),    # short steps: all twenty
    ([40.0, 30.0, 31.0], None, 20, 2, 3 + 20 + 2),    # no budget: all twenty
    ([40.0, 60.0, 0.5], 180.0, 20, 2, 3 + 20 + 2),    # one slow warm-up step (a compile) is no long step
    ([40.0, 30.0, 30.0], float("inf"), 20, 2, 3 + 20 + 2),
    ([40.0], 180.0, 20, 2, 3 + 20 + 2),                # --warmup 1: only the set-up step, nothing to judge by
])
def test_the_window_is_cut_to_the_steps_that_fit_as_it_opens(warmup_s, record_s, measure, profile, stop_after):
    schedule = StepSchedule(20, 3, 2, True, record_s=record_s)
    schedule.fit_window(_steps(warmup_s))
    assert (schedule.measure, schedule.profile_steps, schedule.stop_after) == (measure, profile, stop_after)
    assert schedule.profile_at == 3 + measure and schedule.asked == 20
    assert (schedule.cut_for_step_s is not None) == (measure < 20)


SLEEPY = """\
import time
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    time.sleep(0.2)
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
"""


def test_a_script_of_long_steps_is_measured_and_verified_on_fewer_and_the_report_says_why(tmp_path):
    script = tmp_path / "sleepy.py"
    script.write_text(SLEEPY)
    options = DoctorOptions(steps=20, warmup=2, what_if=False, watch_s=0.0, record_budget_s=1.0,
                            fix=str(tmp_path / "fix.patch"), verify=True, verify_rounds=1, verify_budget_s=0.0)
    report = diagnose_script(script, [], options)
    assert report.status == "ok", report.messages
    assert len(report.breakdown.steps) == 5
    said = [m for m in report.messages if m.startswith("Steps of ")]
    assert said and "5 of the 20 asked were measured (and 1 profiled)" in said[0], report.messages
    # --verify runs each side on as many steps as the recording measured, not the 20 asked for.
    [fix] = [f for f in report.fixes.fixes if f.rule == "zero-grad-not-none"]
    assert fix.verification is not None and fix.verification.steps == 5, fix.verification
