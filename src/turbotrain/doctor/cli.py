"""``turbotrain doctor [--steps N] [--json PATH] [--html PATH] [--trace PATH] [--fix PATH [--verify]] script.py
[args...]``; on several processes ``turbotrain doctor --nproc-per-node N script.py [args...]`` (the doctor starts
them with ``turbotrain launch``) or ``turbotrain doctor [options] -- torchrun ... script.py [args...]`` (the
user's own launcher, every rank recorded)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--steps",
        type=int,
        default=20,
        help="steps to measure: optimizer steps, or backward passes when no optimizer steps (default 20)",
    )
    parser.add_argument("--warmup", type=int, default=3, help="steps before measuring (default 3, at least 1)")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--html", metavar="PATH", help="write a self-contained HTML report with plots")
    parser.add_argument(
        "--trace", metavar="PATH", help="write a Chrome/Perfetto trace of the profiled steps (open in ui.perfetto.dev)"
    )
    parser.add_argument("--no-what-if", action="store_true", help="do not measure the fixes (faster, estimates only)")
    parser.add_argument(
        "--what-if-budget",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="time allowed for measuring fixes (default 20)",
    )
    parser.add_argument("--compile", action="store_true", help="also measure torch.compile (compiling takes a while)")
    parser.add_argument(
        "--watch",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="after the window, watch the step clock this long at most for work the loop runs "
        "every N steps beyond it (evaluation, checkpoints); 0: end with the window (default 20)",
    )
    parser.add_argument("--quiet", action="store_true", help="no terminal report")
    parser.add_argument(
        "--fix", metavar="PATH", help="write each finding's fix as one unified diff of your script (git apply PATH)"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="run the original and the patched script interleaved: verified speed-up and losses",
    )
    parser.add_argument(
        "--verify-budget",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="time for verifying fixes one at a time (default 120); together always runs",
    )
    parser.add_argument(
        "--fix-only",
        metavar="RULES",
        help="comma-separated rule ids: patch only their findings (default: every fixable one)",
    )
    parser.add_argument(
        "--verify-rounds",
        type=int,
        default=2,
        metavar="N",
        help="interleaved original/patched rounds per comparison (default 2)",
    )
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        metavar="N",
        help="run the script on N processes (torchrun, via turbotrain launch) and report every rank",
    )
    parser.add_argument(
        "--rank-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="on several processes: end the job when no rank makes progress for this long (default 120)",
    )
    parser.add_argument(
        "--job-what-if-budget",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="on several processes: time for timing fixes on every rank, as runs of the whole job (default 180)",
    )
    parser.add_argument(
        "--job-what-if-rounds",
        type=int,
        default=3,
        metavar="N",
        help="on several processes: at most N rounds of the job per fix timed (default 3; 2 at least, which "
        "the judgement needs)",
    )
    parser.add_argument(
        "--job-what-if-rules",
        metavar="RULES",
        help="on several processes: time only these rules' fixes on every rank (comma-separated rule ids, e.g. "
        "straggler); the others keep their estimates",
    )
    parser.add_argument(
        "script",
        help="the training script, run unmodified as __main__; or, after --, a launcher "
        "command (torchrun ... script.py)",
    )
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")


# The patch options may also follow the script's own arguments (`doctor train.py --lr 3e-4 --fix p.patch`);
# anything after a literal `--` is the script's, for a script that has a `--verify` of its own.
_TRAILING = {
    "--fix": "fix",
    "--verify": "verify",
    "--verify-budget": "verify_budget",
    "--verify-rounds": "verify_rounds",
    "--fix-only": "fix_only",
}
_CONVERT = {"verify_budget": float, "verify_rounds": int}


def _job_what_if_rules(value: str | None) -> tuple[str, ...] | None:
    """``--job-what-if-rules straggler,cpu-oversubscribed`` as rule ids; an unknown one is an error naming it."""
    if not value:
        return None
    from ..config import ConfigError
    from .rules.registry import RULE_IDS

    rules = tuple(r.strip() for r in value.split(",") if r.strip())
    unknown = [r for r in rules if r not in RULE_IDS]
    if unknown:
        raise ConfigError(
            f"doctor --job-what-if-rules: {', '.join(unknown)} is not a rule id; "
            f"rule ids: {', '.join(sorted(RULE_IDS))}"
        )
    return rules


def take_trailing_options(args: argparse.Namespace) -> None:
    """Move the patch options found among ``args.script_args`` onto ``args``."""
    from ..config import ConfigError

    rest, kept = list(args.script_args), []
    while rest:
        token = rest.pop(0)
        if token == "--":
            kept += rest
            break
        name, _, value = token.partition("=")
        dest = _TRAILING.get(name)
        if dest is None:
            kept.append(token)
        elif dest == "verify":
            args.verify = True
        else:
            if not value:
                if not rest:
                    raise ConfigError(f"doctor {name}: expected a value after it")
                value = rest.pop(0)
            try:
                setattr(args, dest, _CONVERT.get(dest, str)(value))
            except ValueError:
                raise ConfigError(f"doctor {name} {value!r}: expected a number") from None
    args.script_args = kept


def _job_command(args: argparse.Namespace) -> list[str] | None:
    """The launcher command of a multi-process run, or None for a script run in this process."""
    import shutil

    from ..config import ConfigError

    if args.nproc_per_node is not None:
        if args.nproc_per_node < 1:
            raise ConfigError(f"doctor --nproc-per-node {args.nproc_per_node}: expected an integer >= 1.")
        if not Path(args.script).is_file():
            raise ConfigError(f"doctor: no such script: {args.script}")
        return [
            sys.executable,
            "-m",
            "turbotrain",
            "launch",
            "--nproc-per-node",
            str(args.nproc_per_node),
            args.script,
            *args.script_args,
        ]
    import os

    path = Path(args.script)
    if args.script.endswith(".py") or (path.is_file() and not os.access(path, os.X_OK)):
        return None  # a script, run in this process
    if shutil.which(args.script) is None:
        raise ConfigError(
            f"doctor: {args.script!r} is neither a script nor a command on PATH; give a training "
            "script (doctor train.py) or a launcher after -- (doctor -- torchrun ... train.py)."
        )
    return [args.script, *args.script_args]


def run(args: argparse.Namespace) -> int:
    from ..config import ConfigError
    from .diagnose import DoctorOptions, diagnose_script

    take_trailing_options(args)
    if args.steps < 1:
        raise ConfigError(f"doctor --steps: {args.steps} is not allowed; expected an integer >= 1.")
    if args.watch < 0:
        raise ConfigError(f"doctor --watch: {args.watch:g} is not allowed; expected seconds >= 0 (0: no watch).")
    if args.warmup < 1:
        raise ConfigError(
            f"doctor --warmup: {args.warmup} is not allowed; the first step holds the script's set-up "
            "time, so at least 1 warm-up step is needed."
        )
    command = _job_command(args)
    if command is None and not Path(args.script).is_file():
        raise ConfigError(f"doctor: no such script: {args.script}")
    from .diagnose import script_in
    from .report.files import check_outputs

    # Before anything runs: no output may overwrite the script, a Python file or another output.
    outputs = {"--fix": args.fix, "--json": args.json, "--html": args.html, "--trace": args.trace}
    check_outputs(args.script if command is None else script_in(command), outputs)
    if args.verify_rounds < 1 or args.verify_budget < 0:
        raise ConfigError(
            f"doctor --verify-rounds {args.verify_rounds} / --verify-budget {args.verify_budget:g}: "
            "expected at least 1 round and a budget >= 0 seconds."
        )
    if args.job_what_if_rounds < 2:
        raise ConfigError(
            f"doctor --job-what-if-rounds {args.job_what_if_rounds}: expected 2 or more (a fix's gain is judged "
            "by two rounds that agree)."
        )
    if args.fix or args.verify:
        from .fixes import require_libcst

        require_libcst()
        if args.fix_only:
            from .fixes.choose import check_rules

            check_rules(args.fix_only.split(","))
        if args.fix and Path(args.fix).is_dir():
            raise ConfigError(
                f"doctor --fix {args.fix}: that is a folder; give the patch file's path, e.g. --fix fixes.patch"
            )
    options = DoctorOptions(
        steps=args.steps,
        warmup=args.warmup,
        what_if=not args.no_what_if,
        what_if_budget_s=args.what_if_budget,
        compile=args.compile,
        trace_path=args.trace,
        fix=args.fix,
        verify=args.verify,
        verify_budget_s=args.verify_budget,
        verify_rounds=args.verify_rounds,
        watch_s=args.watch,
        fix_rules=tuple(args.fix_only.split(",")) if args.fix_only else None,
    )
    if command is not None:
        from dataclasses import replace

        from .diagnose import diagnose_job

        if (args.fix or args.verify) and script_in(command) is None:
            raise ConfigError(
                f"doctor --fix/--verify: no script (.py file) in the launcher command {' '.join(command)!r} to edit; "
                "name the training script in it (torchrun ... train.py)."
            )

        job_options = replace(
            options,
            hang_timeout_s=args.rank_timeout,
            job_what_if_budget_s=args.job_what_if_budget,
            job_what_if_rules=_job_what_if_rules(args.job_what_if_rules),
            job_what_if_rounds=args.job_what_if_rounds,
        )
        report = diagnose_job(command, job_options)
    else:
        report = diagnose_script(args.script, list(args.script_args), options)
    from .report.outputs import write_reports

    written = write_reports(report, json=args.json, html=args.html)
    if not args.quiet:
        from .report.terminal import print_report

        print_report(report)
        for label, path in (("JSON", args.json), ("HTML", args.html)):
            if path and label in written:
                print(f"{label} report: {path}")
        if report.fixes is not None and report.fixes.path:
            print(f"Patch: {report.fixes.path} (review it, then: git apply {report.fixes.path})")
    if command is not None and report.status == "error" and report.run is not None and report.run.error:
        print(f"turbotrain doctor: {report.run.error}", file=sys.stderr)
    if report.run is not None and report.run.traceback and report.status == "error":
        print(report.run.traceback, file=sys.stderr, end="")
    if args.fix and report.fixes is not None and report.fixes.path is None:
        # Refused (the combined patch would not compile, each fix alone did), or it could not be written.
        print(f"doctor --fix: no patch written to {args.fix}: {' '.join(report.fixes.messages)}", file=sys.stderr)
        return 1
    for failure in report.failures:
        if failure["part"] in ("json", "html"):
            print(f"turbotrain doctor: {failure['message']}", file=sys.stderr)
    return report.exit_code
