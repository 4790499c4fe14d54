"""``turbotrain bench``: what each speed-up buys, alone and together, on this machine."""

from __future__ import annotations

import sys

# The reference workloads' names, for the flag's choices without importing their models and torch with them (the
# keys of bench/workloads.py's WORKLOADS: tests/bench/test_bench_registry_coverage.py).
WORKLOAD_NAMES = ("gpt", "cnn", "mlp", "data")


def add_arguments(parser) -> None:
    parser.add_argument(
        "--workload",
        default="all",
        choices=[*WORKLOAD_NAMES, "all"],
        help="which reference workload to measure (default: all)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a few minutes on a small CPU: no compile rows, no tuning, short trials"
    )
    parser.add_argument("--json", metavar="PATH", help="write every row (with the machine) as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="write the tables as markdown")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG bar chart of the speed-ups")
    parser.add_argument("--steps", type=int, help="measured steps per trial, at least (default 20; --quick 6)")
    parser.add_argument("--warmup", type=int, help="warm-up steps per trial, not timed (default 3; --quick 1)")
    parser.add_argument("--repeats", type=int, help="interleaved repeats per plan (default 3)")
    parser.add_argument(
        "--min-time",
        type=float,
        metavar="S",
        help="more steps until a naive trial measures at least S seconds (default 1; --quick 0.2)",
    )
    parser.add_argument(
        "--scale",
        default="auto",
        choices=["auto", "cpu", "gpu"],
        help="workload size: cpu (seconds), gpu (GPT-2 small, ResNet-50 at 224x224); auto picks gpu on CUDA",
    )
    parser.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda' or 'cuda:N'")
    parser.add_argument("--no-compile", action="store_true", help="skip the plans that use torch.compile")
    parser.add_argument("--no-tune", action="store_true", help="skip the tuned plan")
    parser.add_argument(
        "--no-ablation",
        action="store_true",
        help="skip the rows of each speed-up alone: naive, fast and tuned only (on both paths)",
    )
    parser.add_argument(
        "--tune-budget",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds the tuner may use per workload (default 60; 30 s left a 0.3 s-step CNN on one thread untuned)",
    )
    parser.add_argument(
        "--gpt-tokens",
        default="bytes",
        choices=["bytes", "random"],
        help="GPT data: byte-level stdlib text (the loss falls) or uniformly random tokens",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        metavar="T",
        help="the device's dense bf16 peak in TFLOP/s for MFU, when it is not in the built-in table",
    )
    parser.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch intra-op threads (default: torch's); 1 gives steadier CPU timings on a shared machine",
    )
    parser.add_argument(
        "--data-files",
        type=int,
        metavar="N",
        help="data workload: how many small files nginx serves (default 256; --quick 96)",
    )
    parser.add_argument(
        "--data-latency-ms",
        type=float,
        metavar="MS",
        help="data workload: nginx's wait before each response's first byte (default 20; --quick 5)",
    )
    parser.add_argument("--seed", type=int, default=0)


def settings_from_args(args):
    from .settings import BenchSettings

    chosen = {
        k: v
        for k, v in (
            ("steps", args.steps),
            ("warmup", args.warmup),
            ("repeats", args.repeats),
            ("min_trial_s", args.min_time),
        )
        if v is not None
    }
    common = dict(
        workloads=WORKLOAD_NAMES if args.workload == "all" else (args.workload,),
        scale=args.scale,
        device=args.device,
        tune_budget_s=args.tune_budget,
        gpt_tokens=args.gpt_tokens,
        peak_tflops=args.peak_tflops,
        threads=args.threads,
        seed=args.seed,
        data_files=args.data_files,
        data_latency_ms=args.data_latency_ms,
        **chosen,
    )
    settings = BenchSettings.quick_run(**common) if args.quick else BenchSettings(**common)
    if args.no_compile:
        settings.compile = False
    if args.no_tune:
        settings.tune = False
    if args.no_ablation:
        settings.ablation = False
    return settings


def run(args) -> int:
    from rich.console import Console

    from .report import print_tables, summary_lines, write_json, write_markdown, write_plot
    from .runner import run_bench

    # Piped or captured output would otherwise wrap the wide table at 80 columns.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        console.print(f"turbotrain bench: {exc}")
        return 2
    if console.is_terminal:
        with console.status("benchmarking...") as status:
            result = run_bench(settings, progress=lambda msg: status.update(f"benchmarking {msg}"))
    else:  # a log file: one line per step of the run, so a long GPU run can be followed
        result = run_bench(settings, progress=lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True))
    print_tables(result, console)
    for path, write in ((args.json, write_json), (args.markdown, write_markdown), (args.plot, write_plot)):
        if path:
            console.print(f"wrote {write(result, path)}")
    for line in summary_lines(result):
        console.print(line)
    if result.errors:
        console.print("[red]some plans failed:[/]\n  " + "\n  ".join(result.errors))
        return 1
    return 0
