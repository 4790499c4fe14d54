"""The one torch.compile what-if of the suite: a tiny model, compiled and timed against eager."""

from __future__ import annotations

import shutil

import pytest

from doctor_helpers import run_doctor


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="torch.compile on CPU needs a C++ compiler")
def test_compile_is_measured_when_asked():
    report = run_doctor("batch_size_one", compile=True, what_if_budget_s=120)
    finding = next(f for f in report.findings if f.rule == "jit-script")
    assert finding.measured and finding.what_if["changes"] == {"compile": True}, finding.note
    assert finding.what_if["compile_s"] > 0 and finding.what_if["candidate_ms"] > 0
    assert finding.est_speedup is not None and finding.speedup == "compile"
