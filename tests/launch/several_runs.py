"""Several runs in one launch, so each process starts torch once: the runs' options travel on one command line,
separated by ``--next-run``; the test joins them and the worker splits them."""

from __future__ import annotations

import argparse

NEXT_RUN = "--next-run"


def joined(*runs: list[str]) -> list[str]:
    """One command line for ``runs`` (each a list of the worker's options)."""
    argv: list[str] = []
    for options in runs:
        argv += ([NEXT_RUN] if argv else []) + options
    return argv


def split(parser: argparse.ArgumentParser, argv: list[str]) -> list[argparse.Namespace]:
    """The worker's side: each run's options, parsed."""
    runs: list[list[str]] = [[]]
    for arg in argv:
        if arg == NEXT_RUN:
            runs.append([])
        else:
            runs[-1].append(arg)
    return [parser.parse_args(run) for run in runs]
