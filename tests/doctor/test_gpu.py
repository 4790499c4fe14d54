"""On a CUDA machine (pytest -m gpu): the GPU paths the CPU suite can only fake."""

from __future__ import annotations

import pytest
import torch

from doctor_helpers import marked_lines, run_doctor

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SEVERITY = {"low": 0, "medium": 1, "high": 2}


def best(report, rule):
    return max((SEVERITY[f.severity] for f in report.findings if f.rule == rule), default=-1)


def test_gpu_habits_are_measured_on_the_gpu():
    report = run_doctor("gpu_habits", steps=10)
    assert report.device == "cuda"
    found = {f.rule: f for f in report.findings}
    for rule in ("pin-memory", "non-blocking", "empty-cache-in-loop", "cudnn-benchmark-off"):
        assert rule in found and best(report, rule) >= SEVERITY["medium"], (rule, report.to_dict()["findings"])
    assert report.copies and all(not row["pinned"] for row in report.copies)
    data = report.to_dict()
    assert sum(data["breakdown"].values()) == pytest.approx(1.0)


def test_cuda_syncs_are_tied_to_the_users_lines():
    report = run_doctor("item_per_step", steps=10)
    rows = {row["where"] for row in report.syncs}
    for _, line in marked_lines("item_per_step"):
        assert f"item_per_step.py:{line}" in rows


def test_device_time_drives_compute_on_cuda():
    report = run_doctor("manual_attention", steps=10)
    assert report.device == "cuda" and report.bottleneck in ("compute", "python_overhead")
    assert best(report, "manual-attention") >= SEVERITY["medium"]
