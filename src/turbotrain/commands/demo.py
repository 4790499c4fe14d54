"""``turbotrain demo``."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--workloads", default="gpt,cnn", help="comma-separated: gpt, cnn, mlp (default: gpt,cnn)")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run (default: 60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-doctor", action="store_true", help="skip diagnosing each workload's plain loop first")
    parser.add_argument(
        "--tune",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds tt.tune may spend per workload finding the measured plan, trained as a "
        "third run (default: 120, enough to try a compile on a small CPU; 0 skips tuning)",
    )


def run(args) -> int:
    from ..demo import run_demo

    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    rows = run_demo(workloads, steps=args.steps, seed=args.seed, tune_budget_s=args.tune, diagnose=not args.no_doctor)
    return 0 if rows else 1
