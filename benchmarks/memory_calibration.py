"""The memory doctor's measured fixes against reality: the peak memory each fix saves and its step time,
predicted against the twins' own runs.

A memory pair in ``benchmarks/calibration`` is a slow script whose header names the fix it calibrates
(``# memory-fix: checkpointing``, ``bf16-autocast`` or ``micro-batches``: a row of the ``activation-memory``
finding) and its twin ``<name>_fixed.py`` with that fix written by hand. For each pair, in rounds:

1. ``turbotrain doctor --json`` on the slow script (the first ``--predict-rounds`` rounds). Its activation-memory
   finding measures the fix on copies of the captured model and batch: the step's peak bytes and time as it is
   and with the fix. Predicted: the bytes the fix saves (as it is less fixed) and its time ratio (as it is over
   fixed), the medians over the doctor's runs;
2. each twin as its own ``python script.py``, interleaved: each prints its step time and its memory peak over
   the timed steps (``calibration/calib_clock.py``: the process's resident peak on the CPU, as ``doctor
   --verify`` measures it; the caching allocator's on a GPU). Real: the slow twin's peak less the fixed twin's
   (the median over the rounds), and the time gain (fastest run over fastest run, as doctor_calibration.py);
3. a table: the saving predicted against the real one (target: within 10%), the time ratio predicted against
   the real one (target: within 0.8x-1.25x).

A compiled pair (its slow script compiles its model and runs out of memory under the header's ``--memory-limit``)
calibrates the ``out-of-memory`` finding's compiled run instead: the doctor runs the fix that fits on a compiled copy
at the script's batch (its ``memory-detail``, as the twin makes it) and says the memory that step added to what it
held and its step time; the real ones are the fixed twin's (compiled too): its peak over its first timed step's
resident memory, and its step time (target: the memory within 10%, the time within 0.8x-1.25x).

Why the saving and not the peak itself: a process's resident peak holds its interpreter and libraries (hundreds
of MiB that are no tensor of the step) alike in both twins; the difference between the twins is the fix's own.
The pairs' tensors are 36-72 MiB each, above glibc's largest mmap threshold (32 MiB), so each is returned to the
system when freed and the resident peak follows the live tensors.

    python benchmarks/memory_calibration.py [--pairs a,b] [--rounds 2] [--predict-rounds 1] [--json PATH]
                                            [--markdown PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from doctor_calibration import CORPUS, Pair, ScriptRun, load_pairs, machine, run_script

MIB = 2**20
MEMORY_WITHIN = 0.10  # the predicted saving within 10% of the real one
LOW, HIGH = 0.8, 1.25  # the predicted time ratio over the real one


def predict(pair: Pair, doctor_steps: int, budget_s: float) -> dict:
    """The doctor on the slow script: the activation-memory finding's row for the pair's fix."""
    with tempfile.TemporaryDirectory(prefix="memory-calib-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "turbotrain", "doctor", "--quiet", "--json", str(out), "--steps",
               str(doctor_steps), "--what-if-budget", str(budget_s), *pair.doctor_args, str(pair.slow)]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=CORPUS)
        took = round(time.perf_counter() - started, 1)
        if not out.is_file():
            return {"doctor_s": took, "error": ((proc.stderr or proc.stdout).strip().splitlines() or ["no report"])[-1]}
        report = json.loads(out.read_text())
    finding = next((f for f in report.get("findings", []) if f.get("rule") == pair.rule), None)
    compiled = ((finding or {}).get("evidence") or {}).get("compiled")
    if compiled is not None:
        return {"doctor_s": took, **compiled_prediction(compiled, pair)}
    rows = ((finding or {}).get("what_if") or {}).get("fixes") or []
    row = next((r for r in rows if r.get("fix") == pair.memory_fix), None)
    if row is None:
        return {"doctor_s": took, "error": f"no {pair.memory_fix} row in the {pair.rule} finding"}
    return {"doctor_s": took, "detail": row["detail"], "saved_bytes": row["baseline_bytes"] - row["fixed_bytes"],
            "time_ratio": row["baseline_ms"] / row["fixed_ms"], "baseline_bytes": row["baseline_bytes"]}


def compiled_prediction(compiled: dict, pair: Pair) -> dict:
    """The out-of-memory finding's compiled run of the pair's fix: what its step added to what it held, its time."""
    run = next((r for r in compiled.get("runs", []) if r.get("ran")), None)
    if run is None:
        return {"error": f"no compiled run ran ({compiled.get('skipped') or len(compiled.get('runs', []))} runs)"}
    if run["fix"] != pair.memory_fix or (pair.memory_detail and run["detail"] != pair.memory_detail):
        return {"error": f"the doctor ran {run['fix']} ({run['detail']}) compiled; the twin makes "
                         f"{pair.memory_fix} ({pair.memory_detail})"}
    return {"compiled": True, "detail": run["detail"], "added_bytes": run["peak_bytes"] - run["held_bytes"],
            "step_ms": run["step_seconds"] * 1e3}


def score_compiled(predictions: list[dict], fixed: list[ScriptRun]) -> dict:
    """A compiled pair's row: the compiled run's added memory and step time against the fixed twin's (medians)."""
    made = [p for p in predictions if p.get("compiled")]
    row: dict = {"compiled": True, "errors": [p["error"] for p in predictions if "error" in p],
                 "doctor_s": round(sum(p.get("doctor_s", 0.0) for p in predictions), 1)}
    if made:
        row.update(detail=made[0]["detail"],
                   predicted_added_bytes=round(statistics.median(p["added_bytes"] for p in made)),
                   predicted_step_ms=round(statistics.median(p["step_ms"] for p in made), 1))
    runs = [f for f in fixed if f.peak_bytes is not None and f.start_bytes is not None]
    if runs:
        row.update(real_added_bytes=round(statistics.median(f.peak_bytes - f.start_bytes for f in runs)),
                   real_step_ms=round(statistics.median(f.step_ms for f in runs), 1))
    if row.get("predicted_added_bytes") is not None and row.get("real_added_bytes"):
        row["memory_ratio"] = round(row["predicted_added_bytes"] / row["real_added_bytes"], 3)
        row["memory_target"] = "ok" if abs(row["memory_ratio"] - 1) <= MEMORY_WITHIN else "MISS"
    if row.get("predicted_step_ms") and row.get("real_step_ms"):
        row["time_ratio"] = round(row["predicted_step_ms"] / row["real_step_ms"], 3)
        row["time_target"] = "ok" if LOW <= row["time_ratio"] <= HIGH else "MISS"
    return row


def score(predictions: list[dict], slow: list[ScriptRun], fixed: list[ScriptRun]) -> dict:
    """One pair's row from its doctor runs and its twins' rounds (a round that failed is left out)."""
    made = [p for p in predictions if "saved_bytes" in p]
    row: dict = {"errors": [p["error"] for p in predictions if "error" in p],
                 "doctor_s": round(sum(p.get("doctor_s", 0.0) for p in predictions), 1)}
    if made:
        row.update(detail=made[0]["detail"],
                   predicted_saved_bytes=round(statistics.median(p["saved_bytes"] for p in made)),
                   predicted_time=round(statistics.median(p["time_ratio"] for p in made), 3))
    pairs = [(s, f) for s, f in zip(slow, fixed) if s.peak_bytes is not None and f.peak_bytes is not None]
    if pairs:
        row.update(real_saved_bytes=round(statistics.median(s.peak_bytes - f.peak_bytes for s, f in pairs)),
                   slow_peak_bytes=[s.peak_bytes for s, _ in pairs], fixed_peak_bytes=[f.peak_bytes for _, f in pairs],
                   real_time=round(min(s.step_ms / s.samples for s, _ in pairs)
                                   / min(f.step_ms / f.samples for _, f in pairs), 3))
    predicted, real = row.get("predicted_saved_bytes"), row.get("real_saved_bytes")
    if predicted is not None and real:
        row["memory_ratio"] = round(predicted / real, 3)
        row["memory_target"] = "ok" if abs(predicted / real - 1) <= MEMORY_WITHIN else "MISS"
    if row.get("predicted_time") and row.get("real_time"):
        row["time_ratio"] = round(row["predicted_time"] / row["real_time"], 3)
        row["time_target"] = "ok" if LOW <= row["time_ratio"] <= HIGH else "MISS"
    return row


def calibrate(pair: Pair, args: argparse.Namespace) -> dict:
    predictions, slow, fixed = [], [], []
    for number in range(args.rounds):
        if number < args.predict_rounds:
            predictions.append(predict(pair, args.doctor_steps, args.what_if_budget))
        s, f = run_script(pair.slow, []), run_script(pair.fixed, [])
        if s is not None and f is not None:
            slow.append(s)
            fixed.append(f)
    if any(p.get("compiled") for p in predictions):
        return {"pair": pair.name, "fix": pair.memory_fix, **score_compiled(predictions, fixed)}
    return {"pair": pair.name, "fix": pair.memory_fix, **score(predictions, slow, fixed)}


COLUMNS = ("pair", "fix", "saved: predicted", "real", "pred/real", "target", "time: predicted", "real", "pred/real",
           "target")


def _mib(nbytes: int | None) -> str:
    return f"{nbytes / MIB:.1f} MiB" if nbytes is not None else "-"


def _x(value: float | None) -> str:
    return f"x{value:.2f}" if value else "-"


def _ms(value: float | None) -> str:
    return f"{value:.0f} ms" if value else "-"


def cells(row: dict) -> list[str]:
    """A compiled pair's memory cells are what its step added to what it held, its time cells the step's ms."""
    compiled = row.get("compiled", False)
    memory = ("predicted_added_bytes", "real_added_bytes") if compiled else ("predicted_saved_bytes",
                                                                             "real_saved_bytes")
    time_of, shown = (("predicted_step_ms", "real_step_ms"), _ms) if compiled else (("predicted_time", "real_time"), _x)
    fix = f"{row['fix']}{' compiled' if compiled else ''} ({row.get('detail', '-')})"
    return [row["pair"], fix, _mib(row.get(memory[0])), _mib(row.get(memory[1])),
            f"{row['memory_ratio']:.2f}" if "memory_ratio" in row else "-", row.get("memory_target", "-"),
            shown(row.get(time_of[0])), shown(row.get(time_of[1])),
            f"{row['time_ratio']:.2f}" if "time_ratio" in row else "-", row.get("time_target", "-")]


def table(rows: list[dict]) -> str:
    lines = [list(COLUMNS)] + [cells(r) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines)


def markdown(rows: list[dict], info: dict) -> str:
    head = f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}.\n\n"
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    return head + "\n".join(lines + ["| " + " | ".join(cells(r)) + " |" for r in rows]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", help="comma-separated memory pair names (default: every memory pair)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved slow/fixed rounds per pair (default 2)")
    parser.add_argument("--predict-rounds", type=int, default=1,
                        help="rounds that run the doctor before timing the twins (default 1, at most --rounds)")
    parser.add_argument("--doctor-steps", type=int, default=10, help="the doctor's --steps (default 10)")
    parser.add_argument("--what-if-budget", type=float, default=120.0,
                        help="the doctor's --what-if-budget (default 120: each fix is measured over 20 steps)")
    parser.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="write the table as Markdown")
    args = parser.parse_args()
    if not 1 <= args.predict_rounds <= args.rounds:
        parser.error(f"--predict-rounds must be between 1 and --rounds ({args.rounds}), not {args.predict_rounds}")
    pairs = load_pairs(args.pairs.split(",") if args.pairs else None, memory=True)
    info = machine()
    print(f"machine: {info['cpu']}; {info['cores']} cores; torch {info['torch']}; {len(pairs)} memory pairs, "
          f"{args.rounds} rounds each", flush=True)
    rows = []
    for pair in pairs:
        if pair.memory_fix is None:
            parser.error(f"{pair.name} is not a memory pair (its header names no '# memory-fix: FIX')")
        rows.append(calibrate(pair, args))
        print("  " + "  ".join(cells(rows[-1])), flush=True)
    print()
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "pairs": rows}, indent=2))
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows, info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
