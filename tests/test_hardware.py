"""The cores this process may really use: affinity, cgroup v1/v2 quota; torch's threads; other load."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from turbotrain import hardware
from turbotrain.hardware import busy_cores, cpu_quota, detect, other_load, read_cpu_times, usable_cores


def _v2(tmp_path, cpu_max: str, rel: str = "/", leaf: str | None = None):
    """A cgroup v2 mount at tmp_path/root with ``cpu.max`` at the process's cgroup ``rel``."""
    root = tmp_path / "root"
    where = root / rel.strip("/")
    where.mkdir(parents=True, exist_ok=True)
    (where / "cpu.max").write_text(cpu_max + "\n")
    if leaf is not None:
        (root / leaf.strip("/")).mkdir(parents=True, exist_ok=True)
    self_cgroup = tmp_path / "cgroup"
    self_cgroup.write_text(f"0::{leaf or rel}\n")
    return root, self_cgroup


@pytest.mark.parametrize("cpu_max, expected", [("50000 100000", 0.5), ("150000 100000", 1.5),
                                               ("400000 100000", 4.0), ("max 100000", None)])
def test_cgroup_v2_cpu_max(tmp_path, cpu_max, expected):
    root, self_cgroup = _v2(tmp_path, cpu_max)
    assert cpu_quota(root, self_cgroup) == expected


def test_cgroup_v2_quota_on_an_ancestor_binds_the_leaf(tmp_path):
    root, self_cgroup = _v2(tmp_path, "100000 100000", rel="/kubepods/pod1", leaf="/kubepods/pod1/ctr")
    assert cpu_quota(root, self_cgroup) == 1.0


def test_cgroup_v1_cfs_quota(tmp_path):
    root = tmp_path / "root"
    cpu = root / "cpu,cpuacct" / "docker" / "abc"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("200000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    self_cgroup = tmp_path / "cgroup"
    self_cgroup.write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cpu_quota(root, self_cgroup) == 2.0
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(root, self_cgroup) is None


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert cpu_quota(tmp_path, tmp_path / "missing") is None


@pytest.mark.parametrize("affinity, quota, expected", [(8, None, 8), (8, 0.5, 1), (8, 1.5, 2), (2, 4.0, 2),
                                                       (0, None, 1)])
def test_usable_cores_is_affinity_capped_by_the_quota_rounded_up(affinity, quota, expected):
    assert usable_cores(affinity, quota) == expected


def test_detect_reads_the_quota_from_the_injectable_root(tmp_path, monkeypatch):
    root, self_cgroup = _v2(tmp_path, "50000 100000")
    monkeypatch.setattr(hardware, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(hardware, "PROC_SELF_CGROUP", str(self_cgroup))
    hardware._detect.cache_clear()
    try:
        hw = detect("cpu")
        assert hw.cpu_quota == 0.5 and hw.usable_cores == hw.cpu_cores == 1
        assert hw.affinity_cores == len(os.sched_getaffinity(0))
        assert "quota 0.5" in hw.summary() and "1 usable cores" in hw.cpu_summary()
    finally:
        hardware._detect.cache_clear()


def test_thread_counts_are_read_at_each_detect():
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    try:
        torch.set_num_threads(other)
        hw = detect("cpu")
        assert hw.intra_op_threads == other and hw.interop_threads == torch.get_num_interop_threads()
    finally:
        torch.set_num_threads(before)
    assert detect("cpu").intra_op_threads == before


STAT = """cpu  300 0 100 600 0 0 0 0 0 0
cpu0 100 0 50 350 0 0 0 0 0 0
cpu1 200 0 50 250 0 0 0 0 0 0
intr 1 2 3
"""
STAT_LATER = """cpu  500 0 100 800 0 0 0 0 0 0
cpu0 110 0 50 440 0 0 0 0 0 0
cpu1 290 0 50 260 0 0 0 0 0 0
"""


def test_busy_cores_from_two_proc_stat_samples():
    assert read_cpu_times(STAT) == (400, 1000)
    assert read_cpu_times(STAT, cpus={1}) == (250, 500)
    # cpu0 busy 10 of 100 ticks, cpu1 90 of 100: one core busy in all.
    assert busy_cores(read_cpu_times(STAT), read_cpu_times(STAT_LATER), 2) == pytest.approx(1.0)
    assert busy_cores(read_cpu_times(STAT, {1}), read_cpu_times(STAT_LATER, {1}), 1) == pytest.approx(0.9)


def _spin(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def test_other_load_sees_a_busy_process_and_not_this_one():
    """Another program spinning is other load, even when this process started it; a forked worker of this
    program (a DataLoader worker) is this job's own."""
    import multiprocessing

    cpu = sorted(os.sched_getaffinity(0))[0]
    spin = "import os,time\nos.sched_setaffinity(0,{%d})\nend=time.time()+20\nwhile time.time()<end: pass\n" % cpu
    child = subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
    try:
        time.sleep(0.2)
        busy = other_load(0.5)   # children_are_own, but this child runs another program
    finally:
        child.kill()
        child.wait()
    assert busy >= 0.5, busy          # one core spinning (others may add to it, never subtract)
    worker = multiprocessing.get_context("fork").Process(target=_spin, args=(3.0,))
    worker.start()
    try:
        time.sleep(0.2)
        before = hardware.sample_load()
        time.sleep(0.5)
        after = hardware.sample_load()
    finally:
        worker.terminate()
        worker.join()
    assert after.children_s - before.children_s > 0.1   # the forked worker's CPU time is counted as this process's own

    def ticks(seconds: float) -> int:
        # CPU times are whole clock ticks: compared as floats, 129.96 - 129.45 reads less than 3.17 - 2.66.
        return round(seconds * os.sysconf("SC_CLK_TCK"))

    assert ticks(after.own_s - before.own_s) >= ticks(after.children_s - before.children_s)
    assert hardware.children_busy_cores(before, after) > 0.2


def test_a_gpu_that_only_emulates_bf16_has_no_fast_bf16(monkeypatch):
    """torch calls a V100's or T4's bf16 supported (emulated: it runs, slowly); the doctor's and the tuner's
    `Hardware.bf16` means fast, so there it is False while float16's tensor cores count."""
    from types import SimpleNamespace

    def props(index):
        return SimpleNamespace(major=7, minor=0, name="Tesla V100 (faked)", total_memory=16 * 2**30)

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    hw = hardware._detect.__wrapped__("cuda", 0)
    assert (hw.device_type, hw.bf16, hw.fp16, hw.tf32) == ("cuda", False, True, False)
