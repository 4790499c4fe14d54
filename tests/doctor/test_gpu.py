"""On a CUDA machine (pytest -m gpu): the GPU paths the CPU suite can only fake."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from doctor_helpers import marked_lines, run_doctor, script
from turbotrain.doctor.findings import MEDIUM_SHARE, severity_for
from turbotrain.doctor.report.memory import MemoryMeasured

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SEVERITY = {"low": 0, "medium": 1, "high": 2}


def best(report, rule):
    return max((SEVERITY[f.severity] for f in report.findings if f.rule == rule), default=-1)


def assert_found_where_marked(report, name):
    where = {(f.rule, Path(f.to_dict()["where"]).name) for f in report.findings}
    for rule, line in marked_lines(name):
        assert (rule, f"{name}.py:{line}") in where, (rule, line, sorted(where))


def assert_rated_by_what_it_buys(report):
    """A habit is serious on this GPU only when fixing it buys what the rating says (how much a pinned copy or
    cuDNN's autotuner buys depends on the GPU and the model: no test may assume it)."""
    for f in report.findings:
        if f.gain_share is not None:
            assert SEVERITY[f.severity] <= SEVERITY[severity_for(f.gain_share)], f.to_dict()


def test_gpu_habits_are_found_on_their_lines_and_rated_by_their_gain():
    report = run_doctor("gpu_habits", steps=10)
    assert report.device == "cuda"
    assert_found_where_marked(report, "gpu_habits")
    assert_rated_by_what_it_buys(report)
    # empty_cache() costs a synchronizing cudaMalloc per step on any GPU: the rule rates it without a trial.
    assert best(report, "empty-cache-in-loop") >= SEVERITY["medium"]
    assert report.copies and all(not row.pinned for row in report.copies)
    data = report.to_dict()
    assert sum(data["breakdown"].values()) == pytest.approx(1.0)


def test_cuda_syncs_are_tied_to_the_users_lines():
    report = run_doctor("gpu_sync_bound", steps=10)
    assert report.device == "cuda"
    rows = {row.where for row in report.syncs}
    for _, line in marked_lines("gpu_sync_bound"):
        assert f"gpu_sync_bound.py:{line}" in rows, sorted(rows)
    assert_found_where_marked(report, "gpu_sync_bound")


def test_device_time_drives_compute_on_cuda():
    report = run_doctor("manual_attention", steps=10)
    assert report.device == "cuda" and report.bottleneck in ("compute", "python_overhead")
    assert_found_where_marked(report, "manual_attention")
    assert_rated_by_what_it_buys(report)
    attention = next(f for f in report.findings if f.rule == "manual-attention")
    assert attention.measured and attention.gain_share is not None
    assert (best(report, "manual-attention") >= SEVERITY["medium"]) == (attention.gain_share >= MEDIUM_SHARE)


def test_a_compiled_model_on_cuda_is_seen_through():
    """Inductor on the GPU: each block's .item() is a graph break at the user's line, the compile seconds are
    measured, and the script compiles the same under the doctor as it does alone (no compile of the doctor's)."""
    report = run_doctor("gpu_compiled", steps=10)
    assert report.device == "cuda" and report.status == "ok", report.messages
    assert_found_where_marked(report, "gpu_compiled")
    compiled = report.compiled
    assert compiled is not None and compiled.graphs >= 2 and compiled.breaks >= 1 and compiled.compile_s > 0
    [(_, line)] = marked_lines("gpu_compiled")
    sites = {(Path(b.site.file).name, b.site.line) for c in compiled.codes for b in c.breaks if b.site is not None}
    assert ("gpu_compiled.py", line) in sites, sorted(sites)
    assert_rated_by_what_it_buys(report)


def test_a_cuda_out_of_memory_is_explained_with_a_fix_that_fits():
    """The CUDA allocator's OutOfMemoryError (not the host's MemoryError): step, phase and line, the memory split
    at a batch that fits on this GPU, and a fix measured to fit."""
    report = run_doctor("gpu_out_of_memory")
    [f] = [f for f in report.findings if f.rule == "out-of-memory"]
    [(_, line)] = marked_lines("gpu_out_of_memory")
    assert f.to_dict(report.base)["where"] == f"gpu_out_of_memory.py:{line}"
    assert "in the forward" in f.message and f.evidence.fit.rows < f.evidence.fit.full_rows
    assert any(fix.fits for fix in f.evidence.fit.fixes), f.evidence.fit.fixes
    section = report.memory
    assert isinstance(section, MemoryMeasured) and section.device.startswith("cuda"), section
    assert section.parts.activations > 0 and section.device_total_bytes > 0


def test_a_cuda_memory_limit_caps_the_allocator_and_the_fix_that_fits_is_verified_under_it(tmp_path):
    """``--memory-limit`` on CUDA caps the caching allocator (its per-process fraction): 4096 rows of 1024 centres
    (about 3 GiB at the step's peak) run out under 1536 MiB, the fixes are measured at a halving under the same cap,
    and the micro-batches that fit are written and verified: the original runs out again, the patched script runs."""
    pytest.importorskip("libcst", reason="doctor --fix needs libcst: pip install -e '.[fix]'")
    (tmp_path / "train.py").write_text(script("gpu_out_of_memory").read_text())
    command = [sys.executable, "-m", "turbotrain", "doctor", "--memory-limit", "1536MiB", "--steps", "2", "--warmup",
               "1", "--verify-rounds", "1", "--json", "report.json", "train.py", "4096", "1024", "--fix", "fix.patch",
               "--verify"]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    report = json.loads((tmp_path / "report.json").read_text())
    [finding] = [f for f in report["findings"] if f["rule"] == "out-of-memory"]
    assert "at step 1 in the forward" in finding["message"], proc.stdout + proc.stderr
    memory = report["memory"]
    assert memory["device"].startswith("cuda") and memory["memory_limit_bytes"] == 1536 * 2**20, memory
    assert memory["rows"] < memory["full_rows"] and memory["peak_bytes"] <= 1536 * 2**20
    [fix] = report["fixes"]
    assert fix["in_patch"] and "micro-batches" in fix["label"], fix
    assert fix["verification"]["verdict"] == "fits", fix["verification"]
