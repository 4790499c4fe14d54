"""The doctor on a shared machine: another busy process, a CPU quota, more threads than cores.

The contention is built here: a child process spinning on one core (pinned there), started and
killed by the test, bounded in time. What is asserted is what the doctor says, never a speed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
import torch

from doctor_helpers import script
from turbotrain import hardware
from turbotrain.doctor import DoctorOptions, diagnose_script

SPIN = ("import os, sys, time\n"
        "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
        "end = time.monotonic() + float(sys.argv[2])\n"
        "while time.monotonic() < end:\n"
        "    pass\n")
# /proc/stat counts each CPU's busy time, and /proc/self/stat this process's, in clock ticks (10 ms): each
# of the two readings can be a tick off per CPU and for our own time, which over a window of 0.2-0.4 s is a
# tenth of a core or more.
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _busy_core():
    """Another process keeping one of our cores busy (at most 120 s; killed when the block ends)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores: one to keep busy, one left")
    child = subprocess.Popen([sys.executable, "-c", SPIN, str(cores[0]), "120"])
    time.sleep(0.3)
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def _run_seconds(pid: int) -> float:
    """CPU seconds a process has run (/proc/<pid>/schedstat: nanoseconds on a CPU, first field)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


@dataclass
class BusyRun:
    report: object
    neighbour: float   # the busy neighbour's cores over the doctor's measured window
    tolerance: float   # what the clock ticks' error can take from that figure


@pytest.fixture(scope="module")
def busy_run(tmp_path_factory):
    """ONE doctor run, shared by the tests of a busy machine (it is the slow part), as torch would run the script
    here by itself (one intra-op thread per core) while another process keeps one of our cores busy.

    The busy neighbour's cores over the doctor's measured window: its run time read at the same two moments
    the recorder samples the machine's load (the neighbour's share of a core is the scheduler's to give).
    40 measured steps: a window of 1.4-2.2 s here (16 gave 0.26-0.75 s), so the clock ticks' error stays
    under a tenth of a core."""
    from turbotrain.doctor.record import recorder

    saved = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp, _busy_core() as busy:
        # what the autouse fixtures give each test (they are function-scoped: this runs before them)
        mp.setenv("TURBOTRAIN_CACHE", str(tmp_path_factory.mktemp("turbotrain-cache")))
        seen = []

        def sample_and_read_neighbour(*args, **kwargs):
            sample = hardware.sample_load(*args, **kwargs)
            seen.append((sample.at, _run_seconds(busy.pid)))
            return sample

        mp.setattr(recorder, "sample_load", sample_and_read_neighbour)
        try:
            report = _doctor("char_transformer_workers", threads=len(os.sched_getaffinity(0)), steps=40)
        finally:
            torch.set_num_threads(saved)
    assert len(seen) == 2, seen  # the window's start and its end
    (t0, run0), (t1, run1) = seen
    ticks_off = 2 * (len(os.sched_getaffinity(0)) + 1)
    return BusyRun(report, (run1 - run0) / (t1 - t0), ticks_off * TICK_S / (t1 - t0))


def _doctor(name: str, threads: int, **options):
    torch.set_num_threads(threads)  # what torch picks by itself on this machine (the conftest set 1)
    defaults = dict(steps=8, warmup=3, profile_steps=1, what_if_budget_s=25.0)
    return diagnose_script(script(name), [], DoctorOptions(**{**defaults, **options}))


def _measured(findings) -> list[tuple]:
    """What ranked each finding: its rule, severity, measured gain and the what-if's rounds."""
    return [(f.rule, f.severity, f.measured, f.est_speedup, f.what_if and f.what_if.verdict,
             f.what_if and getattr(f.what_if, "rounds", None)) for f in findings]


def test_a_busy_neighbour_is_named_with_the_thread_fix_behind_only_fixes_measured_to_buy_more(busy_run):
    report = busy_run.report
    data = report.to_dict()
    # The spinner shares its core with our threads and workers: the scheduler gives it a quarter to a half
    # of it. The doctor must see what it really took in the measured window, not a fixed figure.
    neighbour, tolerance = busy_run.neighbour, busy_run.tolerance
    assert neighbour > 0.1, neighbour
    assert data["machine"]["other_load"] >= neighbour - tolerance > 0, (neighbour, tolerance, data["machine"])
    assert data["noise"] is not None and data["noise"]["reasons"]
    rules = [f.rule for f in report.findings]
    assert "cpu-oversubscribed" in rules, _measured(report.findings)
    at = rules.index("cpu-oversubscribed")
    threads = report.findings[at]
    assert threads.measured and threads.what_if.verdict == "faster", _measured(report.findings)
    assert "torch.set_num_threads(1)" in threads.fix.pytorch
    assert threads.fix.plan["intra_op_threads"] == 1
    # Fewer DataLoader workers relieve the same cores and can measure more on some CPUs: only a fix timed
    # faster, by more, may come first.
    for ahead in report.findings[:at]:
        assert ahead.measured and ahead.what_if.verdict == "faster", _measured(report.findings)
        assert ahead.est_speedup >= threads.est_speedup, _measured(report.findings)


def test_no_serious_finding_rests_on_noise(busy_run):
    report = busy_run.report
    for f in report.findings:
        if f.severity in ("high", "medium") and f.measured and f.what_if and f.what_if.verdict is not None:
            assert f.what_if.verdict == "faster", f.to_dict()
            assert f.what_if.ratio > 1 + f.what_if.noise, f.to_dict()


def test_a_cpu_quota_below_the_threads_is_oversubscription(monkeypatch, tmp_path):
    """A container allowed one core while torch starts two threads (the host's count)."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cpu.max").write_text("100000 100000\n")
    self_cgroup = tmp_path / "self"
    self_cgroup.write_text("0::/\n")
    monkeypatch.setattr(hardware, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(hardware, "PROC_SELF_CGROUP", str(self_cgroup))
    hardware._detect.cache_clear()
    try:
        report = _doctor("clean", threads=2, what_if=False)
    finally:
        hardware._detect.cache_clear()
    data = report.to_dict()
    assert data["machine"]["cpu_quota"] == 1.0 and data["machine"]["usable_cores"] == 1
    found = [f for f in report.findings if f.rule == "cpu-oversubscribed"]
    assert found and found[0].evidence.usable_cores == 1 and found[0].evidence.threads == 2


def test_threads_that_fit_the_cores_raise_nothing():
    report = _doctor("clean", threads=1, what_if=False)
    assert "cpu-oversubscribed" not in report.rules()
    assert report.to_dict()["machine"]["intra_op_threads"] == 1


def test_one_thread_and_no_workers_on_a_busy_machine_has_nothing_to_reduce():
    """Other processes keep 1.4 of 2 cores busy while the script runs one thread and no workers: no fewer
    threads exist, so there is no oversubscription finding (the busy machine is the noise warning's job)."""
    from types import SimpleNamespace

    from turbotrain.doctor.analysis.machine import MachineFacts
    from turbotrain.doctor.rules.machine.cpu_oversubscribed import recommended

    ctx = SimpleNamespace(on_gpu=False, main_loader=None,
                          machine=MachineFacts(usable_cores=2, intra_op_threads=1, other_load=1.4))
    assert recommended(ctx) is None
    ctx.machine = dataclasses.replace(ctx.machine, intra_op_threads=2)
    assert recommended(ctx)[2] == 1  # two threads on the same machine: fit to one


def test_workers_idle_behind_a_full_queue_take_no_core_from_the_threads():
    """Four workers on two cores beside two torch threads: where the window saw them busy, the count is the fix;
    where they sat idle (a long compute-bound step the queue stays ahead of), there is nothing to take back."""
    from types import SimpleNamespace

    from turbotrain.doctor.analysis.machine import MachineFacts
    from turbotrain.doctor.rules.machine.cpu_oversubscribed import recommended

    loader = SimpleNamespace(settings={"num_workers": 4})
    busy = MachineFacts(usable_cores=2, intra_op_threads=2, other_load=0.0, worker_load=1.1)
    ctx = SimpleNamespace(on_gpu=False, main_loader=loader, machine=busy)
    assert recommended(ctx) is not None
    for idle in (0.0, 0.1):
        ctx.machine = dataclasses.replace(busy, worker_load=idle)
        assert recommended(ctx) is None, idle
    ctx.machine = dataclasses.replace(busy, worker_load=None)  # not measured: the count decides
    assert recommended(ctx) is not None


def test_the_thread_fix_applies_to_the_evaluation_forwards_between_steps_too():
    """A GCN-like loop spends 90% of each step in evaluation forwards (no_grad) outside the captured step: a thread
    count speeds those as much as the training step, so the measured ratio applies to nearly the whole step."""
    from turbotrain.doctor.analysis.breakdown import compute_breakdown
    from turbotrain.doctor.analysis.context import Context
    from turbotrain.doctor.record.measurements import StepRecord
    from turbotrain.doctor.record.recording import Recording, Window
    from turbotrain.doctor.whatif.settings import threads_apply_to

    def context(outside: str) -> Context:
        steps, t = [], 0.0
        for i in range(8):
            phases = {"forward": 0.001, "backward": 0.001, "optimizer": 0.0002, outside: 0.0198}
            duration = sum(phases.values())
            steps.append(StepRecord(i, t, t + duration, phases, forwards=1, backwards=1, optimizers=1))
            t += duration
        recording = Recording(window=Window(2, 6, 0, 0), steps=tuple(steps), step_delimiter="optimizer.step()",
                              events=(), loaders=(), optimizer_sites=(), module_sites=(), matmul_shapes=(),
                              gap_samples=())
        breakdown = compute_breakdown(steps, 2)
        return Context(script=None, base=None, hw=hardware.detect("cpu"), device="cpu", breakdown=breakdown,
                       measured_steps=breakdown.steps, recording=recording)

    evaluating, saving = context("eval"), context("save")
    assert evaluating.share("outside_step") > 0.85 and saving.share("outside_step") > 0.85
    assert threads_apply_to(evaluating) == pytest.approx(1.0, abs=0.01)
    # A checkpoint written between steps is not the thread count's: only the training step is.
    assert threads_apply_to(saving) == pytest.approx(1 - saving.share("outside_step"), abs=0.01)
