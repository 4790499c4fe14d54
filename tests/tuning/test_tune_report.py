"""The tuner's table as a user sees it: in a real pseudo-terminal (tmux) 80 and 120 columns wide."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from pseudo_terminal import check_layout, in_terminal
from turbotrain.plan import Plan
from turbotrain.tuning.api import TuneResult
from turbotrain.tuning.report import render
from turbotrain.tuning.search import Attempt, SearchResult

HERE = Path(__file__).parent
SWITCHES = ("precision=bf16-mixed", "fused_optimizer=True", "channels_last=True", "compile=max-autotune",
            "persistent_workers=True", "num_workers=1", "pin_memory=False")
REASONS = ("not faster when re-measured (0.97x, 1.01x)", "numerics: loss off fp32 by 3.2e-01 (limit 1e-02)",
           "time budget (~45s needed, 12s left)")


def sample_result() -> TuneResult:
    plan, mib = Plan(), 2**20
    rows = [
        Attempt("naive", plan, "baseline", "baseline", "", 10234.5, 0.0031, 1.0, 700 * mib),
        Attempt("precision=bf16-mixed", plan, "switch", "rejected", REASONS[0], 9876.0, 0.0032, 0.97, 651 * mib),
        Attempt("fused_optimizer=True", plan, "switch", "accepted", "1.17x the plan before", 11987.0, 0.0027, 1.17,
                660 * mib),
        Attempt("channels_last=True", plan, "switch", "rejected", REASONS[1]),
        Attempt("compile=max-autotune", plan, "compile", "skipped", REASONS[2]),
        Attempt("persistent_workers=True (under compile)", plan, "under-compile", "rejected",
                "slower than fused_optimizer=True", 11000.0, 0.003, 1.07, 1234 * mib, 12.3),
        Attempt("chosen: fused_optimizer=True, num_workers=1, persistent_workers=True, precision=bf16-mixed", plan,
                "final", "chosen", "", 12001.0, 0.0027, 1.17, 1234 * mib, 3.4),
    ]
    search = SearchResult(plan=plan, baseline=plan, attempts=rows, speedup=1.17,
                          message="1.17x the naive plan: fused_optimizer=True, num_workers=1", steps=40, elapsed_s=25.0,
                          compile_s=3.4, samples_per_s=12001.0, baseline_samples_per_s=10234.5,
                          left_out=[("cudnn_benchmark", "cuDNN is a CUDA library and this run is on the CPU")])
    return TuneResult(plan=plan, search=search, hardware="AMD EPYC (cpu, 2 cores, 24 GiB; fast: bf16)", budget_s=30.0,
                      elapsed_s=25.0, by_rule={"pin_memory": False})


@pytest.mark.parametrize("columns", [80, 120])
def test_the_table_keeps_each_switch_whole_in_a_terminal(columns):
    lines = in_terminal("from test_tune_report import sample_result; from turbotrain.tuning.report import render; "
                        "render(sample_result())", columns, path=str(HERE))
    check_layout(lines, columns, SWITCHES)
    text = "\n".join(lines)
    header = next(line for line in lines if "candidate" in line)
    for column in ("#", "samples/s", "vs naive", "peak mem", "compile s", "verdict"):
        assert column in header, column
    for status in ("baseline", "rejected", "accepted", "skipped", "chosen"):
        assert status in text
    joined = " ".join(" ".join(lines).split())
    for reason in REASONS:
        assert reason in joined, reason
    # The chosen plan, one switch a line.
    chosen = next(i for i, line in enumerate(lines) if line.rstrip().endswith("chosen"))
    assert "fused_optimizer=True" in lines[chosen] and "precision=bf16-mixed" in " ".join(lines[chosen:chosen + 4])


def test_the_table_renders_to_any_console():
    out = io.StringIO()
    render(sample_result(), Console(file=out, width=80))
    assert "precision=bf16-mixed" in out.getvalue() and "not tried: cudnn_benchmark" in out.getvalue()
