"""The doctor on torchrun against reality: predicted against real speed-up on slow/fixed twins of a DDP (or
FSDP) job.

Each pair is ``benchmarks/distributed/ddp_twins.py`` run two ways under ``torchrun --nproc-per-node 2``
(gloo): with one slow habit (the slow twin) and without it (the fixed twin). For each pair this

1. runs ``turbotrain doctor --nproc-per-node 2 --json`` on the slow twin and reads the finding of the pair's
   rule: its ``est_speedup`` is the prediction, and whether it was timed on every rank (a ``job`` what-if) or
   estimated (the straggler's cost, read from the other ranks' wait);
2. times both twins for real under plain torchrun, interleaved in rounds (slow, fixed, slow, fixed, ...);
   rank 0 times its own loop and prints its median step (``STEP_MS``). The real gain is the fastest slow run
   over the fastest fixed run (other processes only ever add time);
3. prints pair, rule, how it was predicted, predicted, real, predicted/real and the target verdict of the
   calibration benchmark (a real gain of 1.2x or more predicted within 0.8x-1.25x; under 1.05x not predicted
   above 1.2x).

With ``--overhead`` it also times the doctor's own cost per rank: the fixed twin's median step under the
doctor's recorder on every rank (what-ifs off) over the same job under plain torchrun, interleaved.

    python benchmarks/doctor_distributed.py [--pairs threads,accumulation] [--rounds 3] [--overhead]
                                            [--overhead-twin=--fsdp] [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doctor_calibration import machine, verdict

ROOT = Path(__file__).resolve().parents[1]
TWINS = ROOT / "benchmarks" / "distributed" / "ddp_twins.py"
STEP_LINE = re.compile(r"^STEP_MS ([\d.]+)$", re.M)


@dataclass(frozen=True)
class Pair:
    name: str
    rule: str
    slow: tuple[str, ...]
    fixed: tuple[str, ...] = ()


PAIRS = (
    Pair("threads", "cpu-oversubscribed", ("--threads-all",)),
    Pair("accumulation", "accumulation-syncs", ("--accumulate", "4"), ("--accumulate", "4", "--no-sync")),
    Pair("find_unused", "ddp-find-unused-parameters", ("--find-unused",)),
    Pair("default_buckets", "ddp-bucket-settings", (), ("--bucket-settings",)),
    Pair("rank0_checkpoint", "straggler", ("--rank0-save",)),
    Pair("slow_data_rank1", "straggler", ("--slow-data-rank", "1")),
    Pair("slow_loader_rank1", "straggler", ("--loader", "--slow-data-rank", "1"), ("--loader",)),
    # Rank 0 evaluates every other step: the twins' mean steps, which hold the evaluation spread over its period.
    Pair("rank0_eval", "straggler", ("--rank0-eval", "2", "--mean"), ("--mean",)),
    # FSDP: every layer's parameters gathered for its forward and again for its backward, or once.
    Pair("fsdp_reshard", "exposed-gradient-sync", ("--fsdp",), ("--fsdp", "--no-reshard")),
    # FSDP reduce-scatters every micro-batch's gradients, or only the last one's.
    Pair("fsdp_accumulation", "accumulation-syncs", ("--fsdp", "--accumulate", "4"),
         ("--fsdp", "--accumulate", "4", "--no-sync")),
    # DDP looks for the unused head's parameters after every forward, or learns them once.
    Pair("static_graph", "ddp-static-graph", ("--find-unused", "--unused-head"),
         ("--find-unused", "--unused-head", "--static-graph")),
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def predict(pair: Pair, budget_s: float) -> dict:
    """The doctor's finding for the pair's rule on the slow twin: est_speedup and how it was had."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "turbotrain", "doctor", "--quiet", "--json", str(out),
                   "--job-what-if-budget", str(budget_s), "--nproc-per-node", "2", str(TWINS), "--steps", "1000",
                   *pair.slow]
        proc = subprocess.run(command, cwd=tmp, env=_env(), capture_output=True, text=True, timeout=900)
        if not out.exists():
            return {"predicted": None, "how": f"doctor failed: {proc.stderr[-300:]}"}
        report = json.loads(out.read_text())
    found = [f for f in report.get("findings", []) if f["rule"] == pair.rule]
    if not found:
        return {"predicted": None, "how": "not found", "rules": [f["rule"] for f in report.get("findings", [])]}
    f = found[0]
    what_if = f.get("what_if") or {}
    how = "timed on every rank" if what_if.get("kind") == "job" else "estimated"
    return {"predicted": f.get("est_speedup"), "how": how, "severity": f["severity"], "what_if": what_if}


def time_twin(args: tuple[str, ...], steps: int) -> float | None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(TWINS),
               "--steps", str(steps), *args]
    proc = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=600)
    found = STEP_LINE.search(proc.stdout)
    return float(found.group(1)) if found else None


def calibrate(pair: Pair, rounds: int, steps: int, budget_s: float) -> dict:
    row: dict = {"pair": pair.name, "rule": pair.rule, **predict(pair, budget_s)}
    slow, fixed = [], []
    for _ in range(rounds):
        for twin, into in ((pair.slow, slow), (pair.fixed, fixed)):
            ms = time_twin(twin, steps)
            if ms is not None:
                into.append(ms)
    row.update(slow_ms=slow, fixed_ms=fixed)
    row["real"] = round(min(slow) / min(fixed), 3) if slow and fixed else None
    row["verdict"] = verdict(row["predicted"], row["real"])
    return row


def doctor_step_ms(args: tuple[str, ...]) -> float | None:
    """The job's median step under the doctor's recorder on every rank (what-ifs off): its slowest rank's."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "turbotrain", "doctor", "--quiet", "--no-what-if", "--watch", "0",
                   "--json", str(out), "--nproc-per-node", "2", str(TWINS), "--steps", "1000", *args]
        subprocess.run(command, cwd=tmp, env=_env(), capture_output=True, text=True, timeout=900)
        if not out.exists():
            return None
        ranks = json.loads(out.read_text()).get("ranks") or []
    return max((r["step_time_ms"]["median"] for r in ranks), default=None)


def overhead(rounds: int, steps: int, twin: tuple[str, ...] = ()) -> dict:
    """The doctor's own cost per rank: the fixed twin's step (``twin``: its flags) under the doctor over the same
    job under plain torchrun, interleaved; the lowest of each (other processes only ever add time)."""
    plain, doctored = [], []
    for _ in range(rounds):
        for timed, into in ((lambda: time_twin(twin, steps)), plain), ((lambda: doctor_step_ms(twin)), doctored):
            ms = timed()
            if ms is not None:
                into.append(ms)
    ratio = round(min(doctored) / min(plain), 3) if plain and doctored else None
    # The medians too: on a noisy machine one quiet plain run can make the lowest-of-each ratio say more than
    # the doctor costs.
    medians = round(statistics.median(doctored) / statistics.median(plain), 3) if plain and doctored else None
    return {"plain_ms": plain, "doctor_ms": doctored, "ratio": ratio, "median_ratio": medians}


def table(rows: list[dict]) -> str:
    lines = ["| pair | rule | prediction | predicted | real | pred/real | target |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        pred, real = r.get("predicted"), r.get("real")
        ratio = f"{pred / real:.2f}" if pred and real else "-"
        lines.append(f"| {r['pair']} | `{r['rule']}` | {r['how']} | {f'x{pred:.2f}' if pred else '-'} | "
                     f"{f'x{real:.2f}' if real else '-'} | {ratio} | {r['verdict']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", help="comma-separated pair names (default: all; none: no pair)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per twin run (after 5 warm-up)")
    parser.add_argument("--budget", type=float, default=120.0, help="the doctor's --job-what-if-budget")
    parser.add_argument("--overhead", action="store_true", help="also time the doctor's own cost per rank")
    parser.add_argument("--overhead-twin", default="", help="the twin's flags for --overhead, after an = sign: --overhead-twin='--fsdp --no-reshard'")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    chosen = set() if args.pairs == "none" else set(args.pairs.split(",")) if args.pairs else None
    unknown = (chosen or set()) - {p.name for p in PAIRS}
    if unknown:
        parser.error(f"unknown pair(s) {sorted(unknown)}; the pairs are {[p.name for p in PAIRS]}")
    rows = []
    for pair in PAIRS:
        if chosen is None or pair.name in chosen:
            rows.append(calibrate(pair, args.rounds, args.steps, args.budget))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    facts = machine()
    text = f"Machine: {facts}\n\n{table(rows)}\n"
    twin = tuple(args.overhead_twin.split())
    cost = overhead(args.rounds, args.steps, twin) if args.overhead else None
    if cost is not None:
        text += (f"\nThe doctor's own cost per rank (fixed twin {' '.join(twin)}, 2 ranks): plain torchrun "
                 f"{cost['plain_ms']} ms, "
                 f"under the doctor {cost['doctor_ms']} ms a step: x{cost['ratio']} lowest of each, "
                 f"x{cost['median_ratio']} median of each (target <= 1.05)\n")
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": facts, "rows": rows, "overhead": cost}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
