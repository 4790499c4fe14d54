"""The doctor's what-ifs against reality: predicted against real speed-up on the calibration corpus.

Each pair in ``benchmarks/calibration`` is a slow script ``<name>_slow.py`` and its twin
``<name>_fixed.py`` that differ only by the fix of one doctor rule, which the slow script names in a
header comment (``# calibrates: RULE``; optional ``# doctor-args: ...`` for the doctor, e.g.
``--compile``, and ``# fixed-every: N`` for a cadence fix). For each pair this

1. runs ``turbotrain doctor --json`` on the slow script and reads the finding of that rule: its
   ``est_speedup`` is the prediction ("not found" when the doctor reports none). A periodic-work rule
   the doctor reports only under ``periodic`` (validation every N steps) is predicted from that
   entry's share of the run, with the cadence changed to the fixed script's;
2. times both scripts for real, each as its own ``python script.py`` process, interleaved in rounds
   (slow, fixed, slow, fixed, ...). The doctor runs again at the start of each of the first
   ``--predict-rounds`` rounds (doctor, slow, fixed; doctor, slow, fixed; ...) and the prediction is
   the median of its runs: on a shared machine a script's speed drifts by tens of percent within
   minutes, and a prediction made in one minute judged against gains timed in another measures the
   drift as much as the doctor. Each script times itself: ``calibration/calib_clock.py`` wraps its
   loop, times every iteration after a warm-up with ``time.perf_counter`` and prints, on a
   ``STEP_MS ... SAMPLES n`` line, the median over 10-step blocks of each block's mean step time.
   Timing inside the script, rather than from outside or under the doctor with what-ifs off, leaves
   out what is not steady-state training (interpreter start, imports, worker start-up, compiling) and
   adds no instrumentation of ours to either twin; a block holds whole periods of the validation or
   checkpoint work a fix removes, and the median over blocks is not moved by a neighbour's burst of
   load (this benchmark runs on shared machines). The pair's real gain is the fastest slow run's time
   per sample over the fastest fixed run's (samples differ only for a batch-size fix): other
   processes only ever add time, so each twin's least-disturbed run is its best estimate, and the
   interleaving gives both twins the same chances at a quiet moment. The median of the rounds'
   own slow/fixed ratios is kept as well (``real_median``; the JSON has every run): on a quiet
   machine the two agree, and where they do not, the machine was too busy to trust the row;
3. with ``--verify``, the doctor also writes its own fix of that rule as a patch and verifies it
   (``turbotrain doctor --fix --fix-only RULE --verify``): the patched slow script against the slow
   one, interleaved, under the doctor's recorder. Its ``verified`` speed-up, read from the JSON's
   ``fixes``, is the ground truth where there is one (the doctor's own edit, not the hand-written
   twin; the twin's ``real`` stays beside it);
4. prints a table: pair, rule, predicted, real, predicted/real, and the target verdict: a pair whose
   true gain (verified where it could be, else real) is >= 1.2x must be predicted within 0.8x-1.25x
   of it; a pair whose true gain is < 1.05x must not be predicted above 1.2x; between the two there is
   no target.

    python benchmarks/doctor_calibration.py [--pairs a,b] [--rounds 3] [--predict-rounds 3] [--verify]
                                            [--json PATH] [--markdown PATH] [--from-json PATH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from turbotrain.doctor.fixes.choose import fixable_rules

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "benchmarks" / "calibration"
STEP_LINE = re.compile(r"^STEP_MS ([\d.]+) MEAN_MS ([\d.]+) SAMPLES (\d+)$", re.M)
PEAK_LINE = re.compile(r"^PEAK_BYTES (\d+) START_BYTES (\d+)$", re.M)
HEADER = re.compile(r"^# (?P<key>[a-z-]+): (?P<value>.+)$", re.M)

# The targets of issue 13.
BIG_GAIN, SMALL_GAIN, PREDICT_CAP = 1.2, 1.05, 1.2
LOW, HIGH = 0.8, 1.25


@dataclass
class Pair:
    name: str
    rule: str
    expect: str = ""
    doctor_args: list[str] = field(default_factory=list)
    fixed_every: int | None = None
    memory_fix: str | None = None  # a memory pair (benchmarks/memory_calibration.py): the fix's row to read
    memory_detail: str | None = None  # the fix as its twin makes it ("2 x 4096"): a compiled pair's run must match

    @property
    def slow(self) -> Path:
        return CORPUS / f"{self.name}_slow.py"

    @property
    def fixed(self) -> Path:
        return CORPUS / f"{self.name}_fixed.py"


def load_pairs(only: list[str] | None = None, memory: bool = False) -> list[Pair]:
    """Every ``<name>_slow.py`` of the corpus with its header (``only``: these names, in this order). The pairs
    whose header names a ``memory-fix`` are benchmarks/memory_calibration.py's: only those with ``memory``,
    else only the others."""
    names = only or sorted(p.name[:-len("_slow.py")] for p in CORPUS.glob("*_slow.py")
                           if ("# memory-fix: " in p.read_text()) == memory)
    pairs = []
    for name in names:
        path = CORPUS / f"{name}_slow.py"
        if not path.is_file():
            raise SystemExit(f"doctor_calibration: no pair {name!r} ({path} is missing)")
        header = {m["key"]: m["value"].strip() for m in HEADER.finditer(path.read_text())}
        if "calibrates" not in header:
            raise SystemExit(f"doctor_calibration: {path} declares no '# calibrates: RULE'")
        pairs.append(Pair(name, header["calibrates"], header.get("expect", ""),
                          shlex.split(header.get("doctor-args", "")),
                          int(header["fixed-every"]) if "fixed-every" in header else None,
                          header.get("memory-fix"), header.get("memory-detail")))
    return pairs


def _turbotrain() -> list[str]:
    return [sys.executable, "-m", "turbotrain"]


def predict(pair: Pair, doctor_steps: int, budget_s: float, script_args: list[str], verify: bool = False,
            verify_rounds: int = 3) -> dict:
    """Run the doctor on the slow script: ``{"predicted": x or None, "severity", "measured", "bottleneck", ...}``;
    with ``verify``, also its patch of that rule, verified (``verified``, ``fix_predicted``, ``loss_match``)."""
    with tempfile.TemporaryDirectory(prefix="calib-doctor-") as tmp:
        out = Path(tmp) / "report.json"
        # Only a rule --fix can edit gets a patch (the others would make the doctor refuse the command).
        editable = verify and pair.rule in fixable_rules()
        fix = ["--fix", str(Path(tmp) / "fixes.patch"), "--fix-only", pair.rule, "--verify",
               "--verify-rounds", str(verify_rounds)] if editable else []
        cmd = [*_turbotrain(), "doctor", "--quiet", "--json", str(out), "--steps", str(doctor_steps),
               "--what-if-budget", str(budget_s), *pair.doctor_args, *fix, str(pair.slow), *script_args]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=CORPUS)
        took = time.perf_counter() - started
        if not out.is_file():
            return {"predicted": None, "doctor_s": round(took, 1),
                    "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no report"]}
        report = json.loads(out.read_text())
    found = [f for f in report.get("findings", []) if f.get("rule") == pair.rule]
    result = {"predicted": None, "doctor_s": round(took, 1), "bottleneck": report.get("bottleneck"),
              "doctor_step_ms": (report.get("step_time_ms") or {}).get("median")}
    if pair.fixed_every:
        # The doctor's finding is for the cadence it suggests; the twin has its own: predict that one from
        # the recurring work's measured share and period.
        result.update(_from_periodic(report.get("periodic") or [], pair), severity=found[0].get("severity")
                      if found else None, measured=True)
    elif found:
        best = max(found, key=lambda f: f.get("est_speedup") or 0.0)
        result.update(predicted=best.get("est_speedup"), severity=best.get("severity"),
                      measured=best.get("measured"), where=best.get("where"))
    if editable:
        result.update(verified_fix(report, pair.rule))
    elif verify:
        result.update(verified=None, verify_note="no edit for this rule (--fix lists it by hand or not at all)")
    return result


def verified_fix(report: dict, rule: str) -> dict:
    """What ``doctor --fix --verify`` measured for ``rule``'s fix: its own figure when it was verified alone,
    else the fixes verified together (a rule found at two lines); why not, when it could not be."""
    fixes = [f for f in report.get("fixes") or [] if f.get("rule") == rule]
    together = report.get("patch") or {}
    if not fixes:
        return {"verified": None, "verify_note": "no fix of this rule"}
    edits = [f for f in fixes if f.get("diff")]
    if not edits:
        return {"verified": None, "verify_note": "by hand: " + (fixes[0].get("by_hand") or "")}
    alone = edits[0] if len(edits) == 1 and edits[0].get("verified") else None
    verified = alone["verified"] if alone else together.get("verified")
    return {"verified": verified, "fix_predicted": alone["predicted"] if alone else together.get("predicted"),
            "loss_match": (alone or {}).get("loss_match") or together.get("loss_match"),
            "verify_note": edits[0].get("dropped") or (edits[0].get("verification") or {}).get("error")}


def _from_periodic(entries: list[dict], pair: Pair) -> dict:
    """A cadence fix predicted from the report's periodic entry: its share shrinks by every / fixed_every."""
    entry = next((e for e in entries if e.get("share") is not None), None)
    if entry is None or not entry.get("every"):
        return {}
    left = entry["share"] * min(1.0, entry["every"] / pair.fixed_every)
    return {"predicted": round(1.0 / max(1e-6, 1.0 - entry["share"] + left), 3), "where": entry.get("where"),
            "from": "periodic"}


@dataclass(frozen=True)
class ScriptRun:
    """What one plain run of a calibration script printed: its STEP_MS line and, where given, its PEAK_BYTES."""

    step_ms: float
    mean_ms: float
    samples: int
    peak_bytes: int | None = None
    start_bytes: int | None = None  # at the first timed step: PEAK_BYTES less it is what a step adds


def run_script(path: Path, script_args: list[str]) -> ScriptRun | None:
    """One plain run of ``path`` (its own clock's lines), None when it failed."""
    proc = subprocess.run([sys.executable, str(path), *script_args], capture_output=True, text=True, cwd=CORPUS)
    lines = STEP_LINE.findall(proc.stdout)
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        print(f"    {path.name} failed (exit {proc.returncode}): {' '.join(tail)}", file=sys.stderr)
        return None
    blocks, mean, samples = lines[-1]
    peaks = PEAK_LINE.findall(proc.stdout)
    peak, start = (int(peaks[-1][0]), int(peaks[-1][1])) if peaks else (None, None)
    return ScriptRun(float(blocks), float(mean), int(samples), peak, start)


def time_script(path: Path, script_args: list[str], whole_periods: bool = False) -> float | None:
    """Milliseconds per sample of one plain run of ``path`` (its own STEP_MS line), None when it failed.

    ``whole_periods``: the plain mean (MEAN_MS) instead, for a cadence pair run over whole periods of its
    fixed twin (a block median would leave the twin's remaining validations out, and the prediction
    counts them)."""
    run = run_script(path, script_args)
    if run is None:
        return None
    return (run.mean_ms if whole_periods else run.step_ms) / run.samples


def time_round(pair: Pair, script_args: list[str]) -> tuple[float | None, float | None]:
    """One interleaved round: the slow script, then its fixed twin (ms per sample each, None when it failed)."""
    whole = bool(pair.fixed_every)
    if whole and "--steps" not in script_args:
        script_args = [*script_args, "--steps", str(2 * pair.fixed_every)]
    return time_script(pair.slow, script_args, whole), time_script(pair.fixed, script_args, whole)


def calibrate(pair: Pair, args: argparse.Namespace, script_args: list[str]) -> dict:
    """The pair's rounds: each is the doctor on the slow script (the first ``--predict-rounds`` rounds), then
    the slow script, then the fixed one, so a prediction and the gain it is judged against are measured
    under the same load; the prediction is the median over its rounds, like the gain."""
    predictions, slow, fixed = [], [], []
    for number in range(args.rounds):
        if not args.no_doctor and number < args.predict_rounds:
            predictions.append(predict(pair, args.doctor_steps, args.what_if_budget, script_args, args.verify,
                                       args.verify_rounds))
        s, f = time_round(pair, script_args)
        if s is not None and f is not None:
            slow.append(s)
            fixed.append(f)
    return {**combine_predictions(predictions), **gains(slow, fixed)}


def combine_predictions(runs: list[dict]) -> dict:
    """Several doctor runs of one pair as one row: the medians of what they predicted and verified, every
    run's figures kept beside them (a figure a run did not give is left out of its median)."""
    if not runs:
        return {"predicted": None}
    row = dict(runs[0])
    for key in ("predicted", "verified", "fix_predicted"):
        values = [r[key] for r in runs if r.get(key)]
        row[key] = round(statistics.median(values), 3) if values else None
        row[f"{key}_runs"] = [r.get(key) for r in runs]
    row["doctor_s"] = round(sum(r.get("doctor_s") or 0.0 for r in runs), 1)
    row["severity"] = next((r["severity"] for r in runs if r.get("severity")), None)
    return row


def gains(slow: list[float], fixed: list[float]) -> dict:
    """The real gain from paired per-sample times: min over min, with the rounds' median ratio beside it."""
    if not slow:
        return {"real": None}
    ratios = [s / f for s, f in zip(slow, fixed)]
    return {"real": round(min(slow) / min(fixed), 3), "real_median": round(statistics.median(ratios), 3),
            "ratios": [round(r, 3) for r in ratios], "slow_ms_per_sample": [round(v, 4) for v in slow],
            "fixed_ms_per_sample": [round(v, 4) for v in fixed]}


def verdict(predicted: float | None, real: float | None) -> str:
    """``ok`` / ``MISS`` against the issue's targets, ``-`` where no target applies."""
    if real is None:
        return "no timing"
    if real >= BIG_GAIN:
        return "ok" if predicted and LOW <= predicted / real <= HIGH else "MISS"
    if real < SMALL_GAIN:
        return "MISS" if predicted and predicted > PREDICT_CAP else "ok"
    return "-"


def machine() -> dict:
    import torch

    model = platform.processor() or platform.machine()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": model, "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__,
            "python": platform.python_version(), "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]}


COLUMNS = ("pair", "rule", "predicted", "real", "pred/real", "target", "rounds' median", "verified", "pred/verified")


def _x(value: float | None, missing: str = "-") -> str:
    return f"x{value:.2f}" if value else missing


def _row(r: dict) -> list[str]:
    pred, real = r.get("predicted"), r.get("real")
    ratio = f"{pred / real:.2f}" if pred and real else "-"
    missing = "unmeasured" if r.get("severity") else "not found"  # the finding is there without a figure
    verified, fix_pred = r.get("verified"), r.get("fix_predicted")
    versus = f"{fix_pred / verified:.2f}" if fix_pred and verified else "-"
    return [r["pair"], r["rule"], _x(pred, missing), _x(real), ratio, r["target"], _x(r.get("real_median")),
            _x(verified), versus]


def table(rows: list[dict]) -> str:
    cells = [list(COLUMNS)] + [_row(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in cells)


def markdown(rows: list[dict], info: dict) -> str:
    head = (f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']} "
            f"(load average at start {info['load_avg_at_start']}).\n\n")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(_row(r)) + " |" for r in rows]
    return head + "\n".join(lines) + "\n\n" + summary(rows) + "\n"


def summary(rows: list[dict]) -> str:
    judged = [r for r in rows if r["target"] in ("ok", "MISS")]
    misses = [r["pair"] for r in judged if r["target"] == "MISS"]
    return (f"{len(judged) - len(misses)}/{len(judged)} pairs with a target meet it"
            + (f"; missed: {', '.join(misses)}" if misses else "") + ".")


def target(row: dict) -> str:
    """The verdict against the ground truth: the doctor's verified fix against what the doctor predicted for
    that very fix (its cadence, not the twin's) where it was verified; else the prediction against the twins."""
    if row.get("verified"):
        return verdict(row.get("fix_predicted") or row.get("predicted"), row["verified"])
    return verdict(row.get("predicted"), row.get("real"))


def report(rows: list[dict], info: dict, args: argparse.Namespace) -> int:
    for row in rows:
        row["target"] = target(row)
    print()
    print(table(rows))
    print(summary(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "pairs": rows}, indent=2))
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows, info))
    return 0



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", help="comma-separated pair names (default: every pair in the corpus)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved slow/fixed rounds per pair (default 3)")
    parser.add_argument("--predict-rounds", type=int, default=3,
                        help="rounds that run the doctor before timing the twins (default 3, at most --rounds)")
    parser.add_argument("--doctor-steps", type=int, default=20, help="the doctor's --steps (default 20)")
    parser.add_argument("--what-if-budget", type=float, default=20.0, help="the doctor's --what-if-budget (default 20)")
    parser.add_argument("--steps", type=int, help="the scripts' own --steps (default: each script's default)")
    parser.add_argument("--no-doctor", action="store_true", help="time the pairs only")
    parser.add_argument("--verify", action="store_true",
                        help="also verify the doctor's own patch of each rule (doctor --fix --verify): the ground truth")
    parser.add_argument("--verify-rounds", type=int, default=3,
                        help="the doctor's --verify-rounds with --verify (default 3: two rounds on a noisy machine can "
                             "miss a x1.3 gain)")
    parser.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="write the table as Markdown")
    parser.add_argument("--from-json", metavar="PATH", nargs="+",
                        help="rescore earlier runs' JSON (several: their pairs in one table); run nothing")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not 1 <= args.predict_rounds <= args.rounds:
        parser.error(f"--predict-rounds must be between 1 and --rounds ({args.rounds}), not {args.predict_rounds}")
    if args.from_json:
        saved = [json.loads(Path(path).read_text()) for path in args.from_json]
        rows = [dict(r, **gains(r.get("slow_ms_per_sample", []), r.get("fixed_ms_per_sample", [])))
                for run in saved for r in run["pairs"]]
        return report(rows, saved[0]["machine"], args)
    pairs = load_pairs(args.pairs.split(",") if args.pairs else None)
    script_args = ["--steps", str(args.steps)] if args.steps else []
    info = machine()
    print(f"machine: {info['cpu']}; {info['cores']} cores; torch {info['torch']}; python {info['python']}; "
          f"load average {info['load_avg_at_start']}")
    print(f"{len(pairs)} pairs, {args.rounds} interleaved rounds each; doctor --steps {args.doctor_steps} "
          f"--what-if-budget {args.what_if_budget:g}")
    rows = []
    for pair in pairs:
        row = {"pair": pair.name, "rule": pair.rule, "expect": pair.expect, **calibrate(pair, args, script_args)}
        row["target"] = target(row)
        rows.append(row)
        print(f"  {'  '.join(_row(row))}   (rounds {row.get('ratios')}, predicted {row.get('predicted_runs')}, "
              f"verified {row.get('verified_runs', '-')}, doctor {row.get('doctor_s', '-')} s)", flush=True)
    return report(rows, info, args)


if __name__ == "__main__":
    sys.exit(main())
