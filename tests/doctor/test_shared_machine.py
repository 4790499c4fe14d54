"""The doctor on a shared machine: another busy process, a CPU quota, more threads than cores.

The contention is built here: a child process spinning on one core (pinned there), started and
killed by the test, bounded in time. What is asserted is what the doctor says, never a speed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

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


@pytest.fixture
def busy_core():
    """Another process keeping one of our cores busy (at most 120 s; killed when the test ends)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores: one to keep busy, one left")
    child = subprocess.Popen([sys.executable, "-c", SPIN, str(cores[0]), "120"])
    time.sleep(0.3)
    try:
        yield cores[0]
    finally:
        child.kill()
        child.wait()


def _doctor(name: str, threads: int, **options):
    torch.set_num_threads(threads)  # what torch picks by itself on this machine (the conftest set 1)
    defaults = dict(steps=8, warmup=3, profile_steps=1, what_if_budget_s=25.0)
    return diagnose_script(script(name), [], DoctorOptions(**{**defaults, **options}))


def test_a_busy_neighbour_is_named_first_with_the_thread_fix(busy_core):
    report = _doctor("char_transformer_workers", threads=len(os.sched_getaffinity(0)))
    data = report.to_dict()
    # The spinner shares its core with our own threads, so it gets about half of it (0.45 was seen).
    assert data["machine"]["other_load"] >= 0.25, data["machine"]
    assert data["noise"] is not None and data["noise"]["reasons"]
    first = report.findings[0]
    assert first.rule == "cpu-oversubscribed", [f.to_dict() for f in report.findings]
    assert first.measured and first.what_if["verdict"] == "faster", first.what_if
    assert "torch.set_num_threads(1)" in first.fix.pytorch
    assert first.fix.plan["intra_op_threads"] == 1


def test_no_serious_finding_rests_on_noise(busy_core):
    report = _doctor("char_transformer_workers", threads=len(os.sched_getaffinity(0)))
    for f in report.findings:
        if f.severity in ("high", "medium") and f.measured and f.what_if and "verdict" in f.what_if:
            assert f.what_if["verdict"] == "faster", f.to_dict()
            assert f.what_if["ratio"] > 1 + f.what_if["noise"], f.to_dict()


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
    assert found and found[0].evidence["usable_cores"] == 1 and found[0].evidence["threads"] == 2


def test_threads_that_fit_the_cores_raise_nothing():
    report = _doctor("clean", threads=1, what_if=False)
    assert "cpu-oversubscribed" not in report.rules()
    assert report.to_dict()["machine"]["intra_op_threads"] == 1


def test_one_thread_and_no_workers_on_a_busy_machine_has_nothing_to_reduce():
    """Other processes keep 1.4 of 2 cores busy while the script runs one thread and no workers: no fewer
    threads exist, so there is no oversubscription finding (the busy machine is the noise warning's job)."""
    from types import SimpleNamespace

    from turbotrain.doctor.rules.threads import recommended

    ctx = SimpleNamespace(on_gpu=False, main_loader=None,
                          machine={"usable_cores": 2, "intra_op_threads": 1, "other_load": 1.4})
    assert recommended(ctx) is None
    ctx.machine["intra_op_threads"] = 2
    assert recommended(ctx)[2] == 1  # two threads on the same machine: fit to one
