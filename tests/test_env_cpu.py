"""`turbotrain env` prints the cores this process may use (quota, affinity) and torch's threads."""

from __future__ import annotations

import argparse
import json
import os

import torch

from turbotrain import hardware
from turbotrain.commands import env


def _run(capsys, **args) -> str:
    env.run(argparse.Namespace(json=False, **args))
    return capsys.readouterr().out


def test_env_reports_a_fake_cgroup_quota_and_thread_settings(tmp_path, monkeypatch, capsys):
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    (tmp_path / "self_cgroup").write_text("0::/\n")
    monkeypatch.setattr(hardware, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(hardware, "PROC_SELF_CGROUP", str(tmp_path / "self_cgroup"))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    hardware._detect.cache_clear()
    try:
        info = env.collect()
        assert info["cpu_quota"] == 0.5 and info["usable_cores"] == 1
        assert info["affinity_cores"] == len(os.sched_getaffinity(0))
        assert info["intra_op_threads"] == torch.get_num_threads()
        assert info["interop_threads"] == torch.get_num_interop_threads()
        assert info["thread_env"] == {"OMP_NUM_THREADS": "3"}
        json.dumps(info)  # --json prints it
        table = _run(capsys)
        for row in ("usable_cores", "cpu_quota", "affinity_cores", "intra_op_threads", "interop_threads",
                    "OMP_NUM_THREADS=3"):
            assert row in table, row
        assert "0.5" in next(line for line in table.splitlines() if "cpu_quota" in line)
    finally:
        hardware._detect.cache_clear()


def test_no_quota_reads_none(tmp_path, monkeypatch, capsys):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    monkeypatch.setattr(hardware, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(hardware, "PROC_SELF_CGROUP", str(tmp_path / "missing"))
    hardware._detect.cache_clear()
    try:
        assert env.collect()["cpu_quota"] is None
        assert "none" in next(line for line in _run(capsys).splitlines() if "cpu_quota" in line)
    finally:
        hardware._detect.cache_clear()
