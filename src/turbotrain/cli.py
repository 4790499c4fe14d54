"""The ``turbotrain`` command line.

Each area owns its sub-command in ``turbotrain/<area>/cli.py`` with ``add_arguments(parser)``
and ``run(args) -> int``; this module only dispatches, so commands are added without
editing it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys

from .config import ConfigError

# name -> (module with add_arguments/run, one-line help)
COMMANDS = {
    "demo": ("turbotrain.commands.demo", "train GPT and CNN with the naive and the fast plan, side by side"),
    "doctor": ("turbotrain.doctor.cli", "diagnose why a training script is slow, and measure the fixes"),
    "tune": ("turbotrain.tuning.cli", "find the fastest safe plan for a model on this machine"),
    "train": ("turbotrain.commands.train", "train a reference workload from a recipe YAML"),
    "bench": ("turbotrain.bench.cli", "what each speed-up buys, alone and combined"),
    "launch": ("turbotrain.launch.cli", "run a script on torchrun (DDP/FSDP, multi-node, restarts)"),
    "env": ("turbotrain.commands.env", "what this machine can do: devices, precisions, interconnect"),
}


def _available():
    for name, (module, help_text) in COMMANDS.items():
        try:
            yield name, importlib.import_module(module), help_text
        except ModuleNotFoundError as exc:
            if not (module == exc.name or module.startswith(f"{exc.name}.")):
                raise  # the command exists but a dependency of it is missing: say so


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turbotrain", description="Make PyTorch training fast, and prove it.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what turbotrain does")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module, help_text in _available():
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    with _own_messages_to_stderr(args.verbose):
        try:
            return int(args._run(args) or 0)
        except ConfigError as exc:
            print(f"turbotrain: {exc}", file=sys.stderr)
            return 2


@contextlib.contextmanager
def _own_messages_to_stderr(verbose: bool):
    """Print turbotrain's log records, and only those: the root logger stays as a plain run has it.

    The doctor runs the user's script in this process; a handler on the root logger changes how
    libraries log (Lightning then prints each of its lines twice).
    """
    logger = logging.getLogger("turbotrain")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
