"""The doctor on its test corpus with the command's defaults: what it names, what it measures, how long it takes.

Each script in tests/doctor/scripts is built to have one known problem. For each, this prints the
bottleneck, the top findings with their measured (or estimated) whole-step speed-up, and the
doctor's own wall time (run + rules + what-ifs) against the one-minute target for steps under a
second.

    python benchmarks/doctor_corpus.py [--threads 1] [script ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from turbotrain.doctor import DoctorOptions, diagnose_script  # noqa: E402
from turbotrain.hardware import detect  # noqa: E402

CORPUS = ["data_bound_loader", "gan_two_optimizers", "batch_size_one", "item_per_step", "numpy_copy",
          "checkpoint_every_step", "non_foreach_optimizer", "manual_attention", "conv_bias_bn", "odd_vocab",
          "grad_in_validation", "data_parallel", "clean"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scripts", nargs="*", default=CORPUS)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {detect('cpu').summary()}; torch {torch.__version__}; threads {args.threads}")
    print(f"{'script':22} {'step ms':>8} {'bottleneck':16} {'doctor s':>8}  findings (severity, x whole-step, m=measured)")
    for name in args.scripts:
        started = time.perf_counter()
        report = diagnose_script(ROOT / "tests/doctor/scripts" / f"{name}.py", [], DoctorOptions())
        took = time.perf_counter() - started
        shown = [f"{f.rule} ({f.severity}" + (f", x{f.est_speedup:.2f}{' m' if f.measured else ''}" if f.est_speedup
                                             else "") + ")" for f in report.findings if f.severity != "low"][:3]
        lows = sum(f.severity == "low" for f in report.findings)
        step = report.breakdown.median_s * 1e3 if report.breakdown else float("nan")
        print(f"{name:22} {step:8.2f} {str(report.bottleneck):16} {took:8.1f}  {'; '.join(shown) or '-'}"
              f"{f' (+{lows} low)' if lows else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
