"""``turbotrain doctor [--steps N] [--json PATH] [--html PATH] [--trace PATH] [--fix PATH [--verify]] script.py
[args...]``; on several processes ``turbotrain doctor --nproc-per-node N script.py [args...]`` (the doctor starts
them with ``turbotrain launch``) or ``turbotrain doctor [options] -- torchrun ... script.py [args...]`` (the
user's own launcher, every rank recorded). ``turbotrain doctor --rules`` lists the rules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .options import add_option_arguments

    # What a run does: one flag per DoctorOptions field (doctor/options.py), defaults and help from there.
    add_option_arguments(parser)
    # What the command does with the report, and how it starts the script.
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--html", metavar="PATH", help="write a self-contained HTML report with plots")
    parser.add_argument("--quiet", action="store_true", help="no terminal report")
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        metavar="N",
        help="run the script on N processes (torchrun, via turbotrain launch) and report every rank",
    )
    parser.add_argument(
        "--rules", action="store_true", help="list every rule: what it reads, when it fires, what --fix writes"
    )
    parser.add_argument(
        "script",
        nargs="?",
        help="the training script, run unmodified as __main__; or, after --, a launcher "
        "command (torchrun ... script.py)",
    )
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")


# The patch options may also follow the script's own arguments (`doctor train.py --lr 3e-4 --fix p.patch`);
# anything after a literal `--` is the script's, for a script that has a `--verify` of its own.
_TRAILING = {
    "--fix": "fix",
    "--verify": "verify",
    "--verify-budget": "verify_budget_s",
    "--verify-rounds": "verify_rounds",
    "--fix-only": "fix_rules",
}
_CONVERT: dict[str, Callable[[str], Any]] = {
    "verify_budget_s": float,
    "verify_rounds": int,
    "fix_rules": lambda v: tuple(v.split(",")),
}


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
    # torch is imported only once the command line checks out: a mistyped flag or path answers in a fraction of
    # the seconds importing it takes.
    from ..config import ConfigError
    from .options import options_from_args

    if args.rules:
        from .report.rule_list import print_rules

        print_rules()
        return 0
    if args.script is None:
        raise ConfigError(
            "doctor: no script given; run `turbotrain doctor train.py [args...]` (--rules lists the rules)"
        )
    take_trailing_options(args)
    options = options_from_args(args)  # every value checked, the errors naming the flag
    command = _job_command(args)
    if command is None and not Path(args.script).is_file():
        raise ConfigError(f"doctor: no such script: {args.script}")
    from .report.files import check_outputs

    # Before anything runs: no output may overwrite the script, a Python file or another output.
    outputs = {"--fix": options.fix, "--json": args.json, "--html": args.html, "--trace": options.trace_path}
    if command is None:
        check_outputs(args.script, outputs)
    else:
        from .diagnose import script_in

        check_outputs(script_in(command), outputs)
    if args.fix or args.verify:
        from .fixes import require_libcst

        require_libcst()
        if options.fix_rules:
            from .fixes.choose import check_rules

            check_rules(list(options.fix_rules))
        if args.fix and Path(args.fix).is_dir():
            raise ConfigError(
                f"doctor --fix {args.fix}: that is a folder; give the patch file's path, e.g. --fix fixes.patch"
            )
    from .diagnose import diagnose_job, diagnose_script, script_in

    if command is not None:
        if (args.fix or args.verify) and script_in(command) is None:
            raise ConfigError(
                f"doctor --fix/--verify: no script (.py file) in the launcher command {' '.join(command)!r} to edit; "
                "name the training script in it (torchrun ... train.py)."
            )

        report = diagnose_job(command, options)
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
        if failure.part in ("json", "html"):
            print(f"turbotrain doctor: {failure.message}", file=sys.stderr)
    return report.exit_code
