"""Shared helpers: run the doctor in-process on the corpus in tests/doctor/scripts (cached per session)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from turbotrain.doctor import DoctorOptions, diagnose_script

SCRIPTS = Path(__file__).parent / "scripts"
_MARK = re.compile(r"#\s*doctor:\s*([a-z0-9-]+)")


def script(name: str) -> Path:
    return SCRIPTS / f"{name}.py"


def marked_lines(name: str) -> list[tuple[str, int]]:
    """``(rule, line)`` for every ``# doctor: rule`` comment: where the doctor must point."""
    out = []
    for number, text in enumerate(script(name).read_text().splitlines(), start=1):
        m = _MARK.search(text)
        if m:
            out.append((m.group(1), number))
    return out


FAST = dict(steps=6, warmup=2, profile_steps=1, what_if_budget_s=8.0)


def run_doctor(name: str, *argv: str, **options):
    torch.set_num_threads(1)
    return diagnose_script(script(name), list(argv), DoctorOptions(**{**FAST, **options}))


_CACHE: dict = {}


def cached_report(name: str, **options):
    """One doctor run per script and options for the whole session (the runs are the slow part)."""
    key = (name, tuple(sorted(options.items())))
    if key not in _CACHE:
        _CACHE[key] = run_doctor(name, **options)
    return _CACHE[key]


def git_apply(folder: Path, patch: Path) -> None:
    """``git apply --check`` then ``git apply`` of ``patch`` in ``folder``, made a git repository first."""
    import subprocess

    def git(*args: str) -> None:
        proc = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True)
        assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"

    if not (folder / ".git").exists():
        git("init", "-q")
    git("apply", "--check", str(patch))
    git("apply", str(patch))
