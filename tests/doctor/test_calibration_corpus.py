"""The doctor's calibration corpus (benchmarks/calibration): its pairs are well-formed and run.

No doctor runs and no timing here (benchmarks/doctor_calibration.py does both): each pair exists,
both scripts compile, the twins differ only by the fix, every timed rule has a pair, and every
script runs two steps as a plain script and prints its STEP_MS line (and its PEAK_BYTES line: the memory pairs
of benchmarks/memory_calibration.py read it).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from turbotrain.hardware import detect

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("doctor_calibration", ROOT / "benchmarks" / "doctor_calibration.py")
calibration = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = calibration  # dataclasses look their module up there
_spec.loader.exec_module(calibration)

PAIRS = calibration.load_pairs()
MEMORY_PAIRS = calibration.load_pairs(memory=True)
# The fixes the activation-memory finding measures, each with a memory pair.
MEMORY_FIXES = {"checkpointing", "bf16-autocast", "micro-batches"}
# Every rule whose fix the doctor times (a what-if), plus the thread-oversubscription and cadence rules.
TIMED_RULES = {"no-mixed-precision", "channels-last", "non-foreach-optimizer", "zero-grad-not-none",
               "conv-bias-before-bn", "jit-script", "small-batch", "num-workers", "grad-in-validation",
               "manual-attention", "save-in-loop", "host-sync-in-loop", "cpu-oversubscribed", "periodic-work",
               "per-sample-batch", "hand-written-layer"}


def _changed_lines(pair) -> list[str]:
    """The lines the fix changes; indentation is not a change (a fix may wrap a block in ``with``)."""
    slow, fixed = ([line.strip() for line in p.read_text().splitlines()] for p in (pair.slow, pair.fixed))
    return [line for line in difflib.unified_diff(slow, fixed, lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_the_corpus_has_twelve_pairs_covering_every_timed_rule():
    assert len(PAIRS) >= 12
    assert TIMED_RULES <= {p.rule for p in PAIRS}
    assert len({p.name for p in PAIRS}) == len(PAIRS)


def test_every_measured_memory_fix_has_a_pair_the_time_calibration_leaves_out():
    assert {p.memory_fix for p in MEMORY_PAIRS} == MEMORY_FIXES
    assert {p.rule for p in MEMORY_PAIRS} == {"activation-memory", "out-of-memory"}
    # A compiled pair's run is compared with its twin only where both make the fix alike.
    assert all(p.memory_detail for p in MEMORY_PAIRS if p.rule == "out-of-memory")
    assert not [p for p in PAIRS if p.memory_fix], "doctor_calibration.py would time a memory pair as a speed-up"


# Pairs whose fix is longer than four lines: torch.cond makes each side of the branch a function of its own.
LONG_FIXES = {"compile_cond": 10}


@pytest.mark.parametrize("pair", PAIRS + MEMORY_PAIRS, ids=lambda p: p.name)
def test_pair_compiles_and_differs_only_by_the_fix(pair):
    for path in (pair.slow, pair.fixed):
        compile(path.read_text(), str(path), "exec")
    changed = _changed_lines(pair)
    assert 1 <= len(changed) <= LONG_FIXES.get(pair.name, 4), "\n".join(changed)
    assert "timed_steps(" in pair.slow.read_text()
    assert pair.expect, f"{pair.slow.name} says nothing about the gain it expects (# expect: ...)"


def test_every_script_runs_two_steps_as_a_plain_script(worker_tmp):
    """All scripts in one interpreter (torch imported once), each run as `python script.py --steps 2` would (a memory
    pair's with --steps 1)."""
    scripts = [p for pair in PAIRS + MEMORY_PAIRS for p in (pair.slow, pair.fixed)]
    if not detect("cpu").bf16:
        # Without bf16 instructions its wide blocks' bf16 matmuls run emulated, a quarter of this test's time; the same
        # script without autocast, memory_bf16_slow.py, runs here, and both run on a CPU with bf16.
        scripts = [p for p in scripts if p.name != "memory_bf16_fixed.py"]
    # The memory pairs' steps take half a second: one timed step after one of warm-up is enough to print both lines.
    # Inductor's code generation (seconds a graph on a CPU, tens cold) is the calibration's to time, not this check's:
    # a script that names no backend is traced by AOT autograd and run eagerly here.
    driver = textwrap.dedent("""
        import functools, runpy, sys, torch
        torch.compile = functools.partial(torch.compile, backend="aot_eager")
        sys.path.insert(0, sys.argv[1])
        threads = torch.get_num_threads()
        for path in sys.argv[2:]:
            sys.argv = [path, "--steps", "1" if "/memory_" in path else "2"]
            print("RUN", path, flush=True)
            runpy.run_path(path, run_name="__main__")
            torch.set_num_threads(threads)  # a script may change it; the next one starts as a fresh process would
    """)
    # A temporary root of its own: the persistent DataLoader workers of loader_workers_*.py, terminated at the driver's
    # exit as in any plain run, leave their multiprocessing folders (pymp-*) there.
    proc = subprocess.run([sys.executable, "-c", driver, str(calibration.CORPUS), *map(str, scripts)],
                          capture_output=True, text=True, cwd=calibration.CORPUS, timeout=300,
                          env={**os.environ, "TMPDIR": str(worker_tmp)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = proc.stdout.split("RUN ")[1:]
    assert len(runs) == len(scripts)
    for run in runs:
        assert calibration.STEP_LINE.search(run), run
        peak = calibration.PEAK_LINE.search(run)
        assert peak and int(peak[1]) >= int(peak[2]) > 0, run


def _memory_calibration():
    spec = importlib.util.spec_from_file_location("memory_calibration", ROOT / "benchmarks" / "memory_calibration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports doctor_calibration, registered above
    return module


def test_a_memory_pair_is_scored_by_the_saving_and_the_time_against_the_twins():
    memory = _memory_calibration()
    mib, run = 2**20, calibration.ScriptRun
    predicted = [{"detail": "blocks.1, blocks.0", "saved_bytes": 140 * mib, "time_ratio": 0.72, "doctor_s": 40.0},
                 {"doctor_s": 3.0, "error": "no checkpointing row in the activation-memory finding"}]
    slow = [run(430.0, 430.0, 2048, 700 * mib), run(440.0, 440.0, 2048, 702 * mib)]
    fixed = [run(600.0, 600.0, 2048, 560 * mib), run(590.0, 590.0, 2048, 560 * mib), run(1.0, 1.0, 1, None)]
    row = memory.score(predicted, slow, fixed)
    assert row["predicted_saved_bytes"] == 140 * mib and row["real_saved_bytes"] == 141 * mib
    assert row["memory_target"] == "ok" and row["time_target"] == "ok", row
    assert row["real_time"] == round(430 / 590, 3) and row["errors"] == [predicted[1]["error"]]
    # A prediction 20% under the real saving misses; no twin run with a peak leaves the memory unjudged.
    assert memory.score([{**predicted[0], "saved_bytes": 112 * mib}], slow, fixed)["memory_target"] == "MISS"
    assert "memory_target" not in memory.score(predicted, [run(1.0, 1.0, 1, None)], fixed[:1])


def test_a_compiled_pair_is_scored_by_the_compiled_runs_added_memory_and_step_against_the_fixed_twin():
    memory = _memory_calibration()
    mib, run = 2**20, calibration.ScriptRun
    pair = calibration.Pair("memory_compiled", "out-of-memory", memory_fix="micro-batches", memory_detail="2 x 4096")
    compiled = {"runs": [{"fix": "micro-batches", "detail": "2 x 4096", "ran": True, "peak_bytes": 300 * mib,
                          "held_bytes": 40 * mib, "step_seconds": 0.42}]}
    predicted = [{"doctor_s": 30.0, **memory.compiled_prediction(compiled, pair)}]
    fixed = [run(400.0, 410.0, 8192, 900 * mib, 640 * mib), run(410.0, 420.0, 8192, 905 * mib, 640 * mib)]
    row = memory.score_compiled(predicted, fixed)
    assert row["predicted_added_bytes"] == 260 * mib and row["real_added_bytes"] == round(262.5 * mib)
    assert row["predicted_step_ms"] == 420.0 and row["real_step_ms"] == 405.0
    assert row["memory_target"] == "ok" and row["time_target"] == "ok", row
    # The doctor ran another split than the twin makes: said, and nothing compared.
    other = {"runs": [{**compiled["runs"][0], "detail": "4 x 2048"}]}
    said = memory.compiled_prediction(other, pair)["error"]
    assert said == "the doctor ran micro-batches (4 x 2048) compiled; the twin makes micro-batches (2 x 4096)"
    assert "memory_target" not in memory.score_compiled([{"doctor_s": 1.0, "error": said}], fixed)
