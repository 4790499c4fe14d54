"""The terminal report as a user sees it: in a real pseudo-terminal (tmux) 80 and 120 columns wide.

A report built by hand (long messages, a long path, a fix in four frameworks, a noisy machine,
periodic validation) keeps these tests fast and deterministic; one real doctor run checks the same
on what the doctor really prints.
"""

from __future__ import annotations

import dataclasses
import html
import re
from pathlib import Path

import pytest

from doctor_helpers import script
from pseudo_terminal import check_layout, in_terminal
from turbotrain.doctor.analysis.breakdown import Breakdown
from turbotrain.doctor.analysis.machine import MachineFacts, NoiseWarning
from turbotrain.doctor.analysis.periodic import PeriodicRow
from turbotrain.doctor.findings import Finding, Fix
from turbotrain.doctor.report.html import render_html
from turbotrain.doctor.record.measurements import CATEGORIES
from turbotrain.doctor.report.model import Report
from turbotrain.doctor.report.terminal import FINDING_LINES, print_report

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

HERE = Path(__file__).parent
LONG_WHERE = ("/home/someone/projects/a-rather-long-project-name/experiments/2026-11-24/"
              "train_with_a_long_name.py:142")
LIGHTNING_FIX = "L.Trainer(precision='bf16-mixed', accelerator='auto')"
ACCELERATE_FIX = "Accelerator(mixed_precision='bf16') and accelerator.autocast() around the loss"
NOISE_HEAD = "gains under x1.4 cannot be told from noise on this machine now"
# Tokens a user copies or clicks: none may be split across lines.
TOKENS = ("precision=bf16-mixed", "train_with_a_long_name.py:142", "train.py:57", "loader.py:31",
          "torch.set_num_threads(1)", "OMP_NUM_THREADS=1")


def sample_report(script_path: str = "train.py") -> Report:
    shares = {"data_loading": 0.12, "host_to_device": 0.0, "compute": 0.55, "optimizer": 0.08, "host_sync": 0.0,
              "python_overhead": 0.15, "outside_step": 0.10}
    step_s = 0.0312
    breakdown = Breakdown(steps=list(range(3, 23)), step_seconds=[step_s * (1 + 0.02 * (i % 5)) for i in range(20)],
                          seconds={k: v * step_s for k, v in shares.items()}, shares=shares, bottleneck="compute",
                          timeline=[{"step": i, "ms": 31.2, **{k: v * 31.2 for k, v in shares.items()},
                                     "interference": 0.0} for i in range(3, 23)])
    findings = [
        Finding("cpu-oversubscribed",
                "torch runs 2 intra-op threads and the DataLoader 4 workers on 2 usable cores, one "
                "of which another process keeps busy: every parallel op waits at a barrier for a descheduled thread, "
                "and the step takes 15-22x longer than on a quiet machine. Measured interleaved against the "
                "baseline (A/B/A/B) on this model.",
                Fix(pytorch="torch.set_num_threads(1) at the top of the script (or OMP_NUM_THREADS=1 in its "
                            "environment), and DataLoader(..., num_workers=1)",
                    plan={"intra_op_threads": 1, "num_workers": 1},
                    lightning="torch.set_num_threads(1) before L.Trainer(...).fit(...), DataLoader(num_workers=1)",
                    accelerate="torch.set_num_threads(1) before accelerator.prepare(...)"),
                severity="high", where=LONG_WHERE, est_speedup=5.84, measured=True,
                note="The gain was timed with another process busy on one core; on a quiet machine it is smaller."),
        Finding("no-mixed-precision", "The forward and backward passes run in float32 on a CPU that computes bf16 "
                "natively (AMX): matrix multiplications take most of the step.",
                Fix(pytorch="with torch.autocast('cpu', dtype=torch.bfloat16): around the forward pass and the loss "
                            "(turbotrain: precision=bf16-mixed)",
                    plan={"precision": "bf16-mixed"}, lightning=LIGHTNING_FIX, accelerate=ACCELERATE_FIX),
                severity="medium", where="train.py:88", est_speedup=1.2, measured=False),
        Finding("pin-memory", "pin_memory=True pins every batch on a machine without a GPU, where nothing reads "
                "pinned memory faster.", Fix(pytorch="DataLoader(..., pin_memory=False)", plan={"pin_memory": False}),
                severity="low", where="loader.py:31"),
    ]
    return Report(
        status="ok", breakdown=breakdown, findings=findings, device="cpu",
        hardware="Intel Xeon with AMX (cpu, 2 cores, 8 GiB; fast: bf16)", script=script_path,
        argv=["--epochs", "3", "--data", "/mnt/datasets/shakespeare-char/input.txt"], steps_requested=20,
        warmup_steps=3, steps_completed=23, step_delimiter="optimizer.step()",
        machine=MachineFacts(usable_cores=2, cpu_quota=2.0, affinity_cores=2, host_cores=4, intra_op_threads=2,
                             interop_threads=2, dataloader_workers=4, other_load=1.02, loadavg_1m=2.31,
                             dispersion=6.1),
        noise=NoiseWarning("high", ("other processes kept 1.0 cores busy during the window",
                                    "step time p90/p10 is 6.1 (a quiet machine stays under 1.3)"), min_speedup=1.4),
        periodic=[PeriodicRow(kind="validation", category="outside_step", every=20, steps=[20, 40], cost_ms=812.0,
                              share=0.41, where="train.py:57", site=None, suggested_every=160)],
    )


def _render(report: Report, width: int) -> str:
    import io

    buf = io.StringIO()
    print_report(report, file=buf, width=width)
    return buf.getvalue()


# -- in a real pseudo-terminal ------------------------------------------------------------------------

def _check_layout(lines: list[str], columns: int, tokens: tuple[str, ...] = ()) -> None:
    check_layout(lines, columns, tokens)
    starts = [i for i, line in enumerate(lines) if re.match(r"(HIGH|MEDIUM|LOW)\s+\S", line)]
    for i in starts:
        block = []
        for line in lines[i:]:
            if not line.strip():
                break
            block.append(line)
        assert len(block) <= FINDING_LINES, "\n".join(block)


@pytest.mark.parametrize("columns", [80, 120])
def test_hand_built_report_reads_well_in_a_terminal(columns):
    lines = in_terminal("from test_terminal_width import sample_report; "
                        "from turbotrain.doctor.report.terminal import print_report; "
                        "print_report(sample_report())", columns,
                        path=str(HERE))
    text = "\n".join(lines)
    _check_layout(lines, columns, TOKENS)
    assert sum(bool(re.match(r"(HIGH|MEDIUM|LOW)\s", line)) for line in lines) == 3
    assert "x5.84 measured" in text and "x1.20 estimated" in text
    # The noise warning comes right after the header, before the machine line and the breakdown.
    noise = next(i for i, line in enumerate(lines) if NOISE_HEAD in " ".join(" ".join(lines[i:i + 2]).split()))
    machine = next(i for i, line in enumerate(lines) if "2 usable of 4" in line)
    bar = next(i for i, line in enumerate(lines) if "█" in line)
    assert noise < machine < bar and noise <= 3
    assert "delimited by optimizer.step())" in " ".join(lines)
    joined = " ".join(" ".join(lines).split())
    for figure in ("other processes kept 1.0 cores busy", "quota 2", "2 intra-op, 2 inter-op",
                   "DataLoader workers: 4", "1.0 busy cores", "load avg 2.31", "p90/p10: 6.1",
                   "validation every 20 steps costs 41% of training time (812 ms each) at train.py:57; "
                   "every 160 steps keeps it under 5%"):
        assert figure in joined, figure
    # One fix, the PyTorch one: the other frameworks' texts are for the HTML and JSON.
    assert LIGHTNING_FIX not in text and ACCELERATE_FIX not in text and "tt.Plan(" not in text
    assert "torch.set_num_threads(1) at the top" in text


def test_real_doctor_report_reads_well_at_80_columns():
    path = script("data_bound_loader")
    lines = in_terminal(f"import sys; from turbotrain.cli import main; sys.exit(main(['doctor', '--steps', '6', "
                        f"'--warmup', '2', '--what-if-budget', '8', {str(path)!r}]))", 80, timeout_s=240)
    _check_layout(lines, 80)
    text = "\n".join(lines)
    # What the doctor finds is the corpus tests' business (and wobbles on a shared machine); the layout is this one's.
    assert "turbotrain doctor " in text and "Bottleneck: " in text, text
    assert "delimited by optimizer.step())" in " ".join(lines)
    assert "Lightning: " not in text and "Accelerate: " not in text


# -- in process -------------------------------------------------------------------------------------

def test_html_keeps_every_framework_and_shows_the_same_figures():
    page = render_html(sample_report())
    assert html.escape(LIGHTNING_FIX) in page and html.escape(ACCELERATE_FIX) in page
    assert 'id="noise"' in page and NOISE_HEAD in page and page.index('id="noise"') < page.index('id="breakdown"')
    for figure in ("2 usable of 4 (quota 2, affinity 2)", "torch threads: 2 intra-op, 2 inter-op", "load avg 2.31",
                   "delimited by optimizer.step())", "every 160 steps keeps it under 5%",
                   "x5.84 measured"):
        assert figure in page, figure


def test_a_lightning_script_gets_the_lightning_fix():
    report = sample_report()
    for f in report.findings:  # as the rules stamp them when the recording saw a Lightning Trainer step
        f.fix = dataclasses.replace(f.fix, framework="lightning")
    text = _render(report, 100)
    assert "fix (Lightning): " + LIGHTNING_FIX in text and "autocast('cpu'" not in text
    # A finding without a Lightning text falls back to the PyTorch one.
    assert "fix: DataLoader(..., pin_memory=False)" in text


def test_a_bare_report_renders_without_the_new_fields():
    report = sample_report()
    report.machine, report.noise, report.periodic, report.findings = None, None, [], []
    text = _render(report, 80)
    assert "Noisy" not in text and "usable" not in text and "every 160" not in text
    assert "No findings" in text and "Bottleneck: compute" in text
    bare = Report(status="no-steps", breakdown=None, findings=[], script="train.py")
    assert "turbotrain doctor train.py" in _render(bare, 80)
    assert set(sample_report().breakdown.shares) == set(CATEGORIES)


def test_the_headline_is_the_bars_total_and_names_other_processes_time():
    """One statistic: the headline is the sum of the legend's phases plus what other processes took."""
    report = sample_report()
    assert report.breakdown is not None
    report.breakdown.interference_s = 0.004
    text = " ".join(_render(report, 200).split())
    headline = float(re.search(r"warm-up: ([\d.]+) ms per step", text).group(1))
    phases = sum(float(ms) for ms in re.findall(r"% \(([\d.]+) ms\)", text))
    other = float(re.search(r"other processes ([\d.]+) ms \(not in the bar\)", text).group(1))
    assert headline == pytest.approx(phases + other, abs=0.3) and other == 4.0
