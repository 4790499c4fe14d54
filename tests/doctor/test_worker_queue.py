"""DataLoader workers queue batches ahead: the doctor measures past them, and does not call its own workers noise.

A window that opens on a full queue takes its first batches without waiting, and a data-bound loop reads
as faster and less data-bound than it is. The corpus script's workers need 30 ms a batch (sleeping, so the
figure does not depend on how busy the cores are) and two of them feed a step every ~15 ms.
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from doctor_helpers import run_doctor
from turbotrain.doctor.record.function_trace import FunctionTracer
from turbotrain.doctor.record.recorder import Recorder
from turbotrain.doctor.record.schedule import StepSchedule
from turbotrain.hardware import LoadSample
from turbotrain.doctor.analysis.machine import others_share
from turbotrain.measure import Trial, run_means
from turbotrain.plan import Plan

STEADY_WAIT_S = 0.015  # two workers, 30 ms a batch each


def test_warm_up_is_extended_by_the_batches_the_workers_queue_and_the_wait_is_measured_steady():
    report = run_doctor("workers_queue_ahead", steps=8, warmup=2, what_if=False)
    # num_workers x prefetch_factor more, and as many again as the workers still held ready after those
    extended = report.warmup_steps - 2
    assert 2 * 4 <= extended <= 3 * 2 * 4
    assert any(f"Warm-up was extended by {extended} steps" in m for m in report.messages)
    wait = report.breakdown.seconds["data_loading"]
    assert wait >= 0.6 * STEADY_WAIT_S, report.breakdown.seconds
    assert report.breakdown.bottleneck == "data_loading"


COMPUTE_BOUND = """\
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    data = TensorDataset(torch.randn(4096, 32), torch.randint(0, 4, (4096,)))
    loader = DataLoader(data, batch_size=16, num_workers=2, prefetch_factor=4)
    model = nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        time.sleep(0.05)  # the step's compute, far longer than a worker's batch
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_workers_that_keep_up_with_the_step_are_drained_once_not_again(tmp_path):
    """A queue the workers fill again while the steps take its batches stays full whatever the warm-up waits:
    one extension of num_workers x prefetch_factor, no more (each drain would cost as many steps)."""
    from turbotrain.doctor import DoctorOptions, diagnose_script

    path = tmp_path / "compute_bound.py"
    path.write_text(COMPUTE_BOUND)
    report = diagnose_script(path, [], DoctorOptions(steps=4, warmup=2, what_if=False, watch_s=0.0))
    assert report.warmup_steps - 2 == 2 * 4, report.messages


def test_each_loader_s_queue_is_judged_against_its_own_capacity():
    """Two loaders: a small one (1 worker x 2) full again and a large one (4 x 2) still holding 5 of 8: the large one
    is drained 5 steps more. Compared as the most ready against the largest capacity, 5 < 8 as well, but a full small
    queue beside an empty large one (2 < 8) would have drained again for nothing."""
    from turbotrain.doctor.record.recorder import still_draining

    assert still_draining([(2, 2), (5, 8)]) == 5
    assert still_draining([(2, 2), (0, 8)]) == 0  # the small one keeps up, the large one is drained
    assert still_draining([(8, 8)]) == 0  # full again: the workers keep up with the step
    assert still_draining([(3, 8), (1, 2)]) == 3
    assert still_draining([]) == 0


def test_without_the_extension_the_window_opens_on_the_queued_batches(monkeypatch):
    """The cause, shown: the same run measured from the old warm-up reads a fraction of the steady wait."""
    monkeypatch.setattr(Recorder, "_prefetched_batches", lambda self, done: 0)
    report = run_doctor("workers_queue_ahead", steps=8, warmup=2, what_if=False)
    assert report.warmup_steps == 2
    assert report.breakdown.seconds["data_loading"] < 0.4 * STEADY_WAIT_S, report.breakdown.seconds


def test_the_schedule_moves_everything_after_warm_up_back_once():
    schedule = StepSchedule(measure=10, warmup=3, profile=2, stop=True)
    schedule.extend_warmup(8)
    assert (schedule.warmup, schedule.measured_end, schedule.profile_at, schedule.stop_after) == (11, 21, 21, 23)
    schedule.extend_warmup(8)  # once only
    assert schedule.warmup == 11


def _sample(at: float, busy: int, own_s: float, children_s: float) -> LoadSample:
    return LoadSample(at, (busy, int(at * 200)), own_s, 2, children_s)


def test_run_queue_wait_is_the_script_s_own_when_its_workers_held_the_cores():
    # 1 s window, 2 CPUs: busy 1.5 cores; this process 0.5 core, of which its workers 0 / 0.9 / 0.3.
    assert others_share((_sample(0.0, 0, 0.0, 0.0), _sample(1.0, 150, 1.5, 0.0))) == 1.0  # no workers
    assert others_share((_sample(0.0, 0, 0.0, 0.0), _sample(1.0, 150, 1.4, 0.9))) == pytest.approx(0.1 / 1.0)
    assert others_share((_sample(0.0, 0, 0.0, 0.0), _sample(1.0, 150, 0.5, 0.3))) == pytest.approx(1.0 / 1.3)
    assert others_share((None, None)) == 1.0


def test_a_round_of_the_workers_is_timed_whole():
    # Two workers finish together: one step waits 20 ms, the next takes its batch at once (1 ms).
    steps = [0.020, 0.001] * 6
    assert run_means(steps, 2) == pytest.approx([0.0105] * 6)
    assert run_means(steps, 0) == steps and run_means(steps[:1], 2) == steps[:1]
    trial = Trial(plan=Plan(), samples_per_step=1, step_times_s=steps + [0.001])
    assert trial.step_s == pytest.approx(0.001)        # the median single step waited for nothing
    trial.loader_round = 2
    assert trial.step_s == pytest.approx(0.0105)


def test_a_verify_run_drains_the_queue_and_is_timed_in_rounds_of_the_workers(tmp_path):
    """``doctor --verify``'s child: warm-up drains the queue, and the run counts as its median round."""
    import json
    import subprocess
    import sys

    from doctor_helpers import script
    from turbotrain.doctor.fixes.verify import TimedRun

    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, "-m", "turbotrain.doctor.fixes.child", "--steps", "8", "--warmup", "2",
                           "--out", str(out), str(script("workers_queue_ahead"))], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["warmup"] >= 10 and (data["loader_round"], len(data["step_s"])) == (2, 8)
    assert sum(data["step_s"]) / 8 >= 0.6 * STEADY_WAIT_S, data["step_s"]
    run = TimedRun(step_ms=[20.0, 1.0] * 6, loader_round=2)
    assert run.ms(mean=False) == pytest.approx(10.5)
    assert TimedRun(step_ms=[20.0, 1.0] * 6 + [1.0]).ms(mean=False) == pytest.approx(1.0)


class _TraceSeen(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(sys.gettrace() is not None)


@pytest.mark.skipif(sys.gettrace() is not None, reason="another tracer (coverage, a debugger) is installed")
def test_a_worker_forked_while_functions_are_traced_builds_its_batches_untraced():
    # The recorder traces calls during the warm-up, when a loader's first iterator forks its workers.
    tracer = FunctionTracer()
    tracer.trace(True)
    try:
        traced_here = sys.gettrace() is not None
        loader = DataLoader(_TraceSeen(), batch_size=2, num_workers=1, multiprocessing_context="fork")
        traced_in_worker = [bool(batch.any()) for batch in loader]
    finally:
        tracer.trace(False)
    assert traced_here
    assert traced_in_worker == [False, False]
