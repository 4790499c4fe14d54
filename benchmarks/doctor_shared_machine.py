"""The doctor on a shared machine: a small transformer with 4 DataLoader workers, quiet and contended.

For each state (quiet; one other process spinning on one core, pinned there) this prints the
script's own step time, the doctor's verdict (bottleneck, noise warning, first finding and what it
predicts), and the measured gain of that first fix: the script run as it is and with the fix
(``--threads``/``--workers``), interleaved in rounds, each run timing its own steps (``STEP_MS``).

    python benchmarks/doctor_shared_machine.py [--rounds 3] [--steps 30] [--json PATH]

Every run is a fresh process, so torch sizes its thread pool itself, as it does for a user.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from turbotrain.hardware import detect

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "doctor" / "scripts" / "char_transformer_workers.py"
SPIN = ("import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\n"
        "end = time.monotonic() + float(sys.argv[2])\nwhile time.monotonic() < end:\n    pass\n")


@contextlib.contextmanager
def contention(on: bool):
    """Another busy process on our first core, for at most 20 minutes, killed on the way out."""
    if not on:
        yield
        return
    child = subprocess.Popen([sys.executable, "-c", SPIN, str(min(os.sched_getaffinity(0))), "1200"])
    try:
        yield
    finally:
        child.kill()
        child.wait()


def step_ms(steps: int, *extra: str) -> float:
    out = subprocess.run([sys.executable, str(SCRIPT), "--steps", str(steps), *extra], capture_output=True,
                         text=True, check=True, timeout=600).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("STEP_MS")))


def doctor(steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "turbotrain", "doctor", "--quiet", "--steps", str(steps),
                        "--json", str(path), str(SCRIPT)], capture_output=True, text=True, timeout=900)
        return json.loads(path.read_text())


def fix_args(finding: dict | None) -> list[str]:
    plan = (finding or {}).get("fixes", {}).get("plan") or {}
    args = []
    if "intra_op_threads" in plan:
        args += ["--threads", str(plan["intra_op_threads"])]
    if "num_workers" in plan:
        args += ["--workers", str(plan["num_workers"])]
    return args


def measure_state(contended: bool, rounds: int, steps: int) -> dict:
    with contention(contended):
        report = doctor(20)
        first = report["findings"][0] if report["findings"] else None
        extra = fix_args(first)
        as_is, fixed = [], []
        for _ in range(rounds):   # interleaved: load that comes and goes hits both
            as_is.append(step_ms(steps))
            fixed.append(step_ms(steps, *extra) if extra else float("nan"))
    return {
        "state": "contended" if contended else "quiet",
        "step_ms": statistics.median(as_is), "fixed_step_ms": statistics.median(fixed) if extra else None,
        "bottleneck": report["bottleneck"], "noise": report.get("noise"),
        "doctor_step_ms": report["step_time_ms"]["median"],
        "first_rule": first["rule"] if first else None, "first_severity": first["severity"] if first else None,
        "predicted": first["est_speedup"] if first else None, "fix": " ".join(extra) or None,
        "real_gain": statistics.median(a / b for a, b in zip(as_is, fixed)) if extra else None,
        "rounds_ms": {"as_is": as_is, "fixed": fixed},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", help="write the rows as JSON")
    args = parser.parse_args()
    print(f"{detect('cpu').device_name}, {len(os.sched_getaffinity(0))} usable cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads by default")
    rows = [measure_state(contended, args.rounds, args.steps) for contended in (False, True)]
    print("| state | script step (ms) | doctor: bottleneck | noise warning | first finding | predicted | "
          "fix | fixed step (ms) | real gain |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        noise = "; ".join(r["noise"]["reasons"]) if r["noise"] else "none"
        predicted = f"x{r['predicted']:.2f}" if r["predicted"] else "-"
        fixed = f"{r['fixed_step_ms']:.1f}" if r["fixed_step_ms"] else "-"
        gain = f"x{r['real_gain']:.2f}" if r["real_gain"] else "-"
        print(f"| {r['state']} | {r['step_ms']:.1f} | {r['bottleneck']} | {noise} | {r['first_rule']} "
              f"({r['first_severity']}) | {predicted} | {r['fix'] or '-'} | {fixed} | {gain} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
