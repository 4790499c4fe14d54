"""``doctor --verify``: the original and the patched script, run for real, interleaved in rounds.

The script's folder is copied to a temporary place outside it (once for the original, once per variant;
sockets, named pipes and what cannot be read are left out, saying so), the
patched files are written into their copy, and both run under the doctor's recorder in their own
processes (:mod:`.child`, each forked from one interpreter that imported torch once: :mod:`.warm_start`), on the
same steps, alternating: original, patched; then patched, original;
... so load that comes and goes falls on both. Each run's time is the median of its own steps (a
burst of another process's load spoils a step, not the run; with DataLoader workers, of runs of as
many steps as one round of theirs feeds), or, when a fix changes a cadence, the
mean over whole periods of it (the median would leave the validation out); what other processes
took from a step is not counted (what the script's own DataLoader workers took is). The speed-up per round
is original / patched, and
``turbotrain.measure.judge`` (the one definition of "faster") turns the rounds into a verdict.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...measure import judge, run_means
from .. import lifeline
from .losses import loss_match
from .warm_start import WarmStart
from ..report.fix_results import FITS, Verification

__all__ = ["TimedRun", "Verifier", "VerifyError", "VerifyOptions"]

_SKIP = shutil.ignore_patterns(
    ".git",
    "__pycache__",
    ".venv",
    "venv",
    "node_modules",
    ".tox",
    ".mypy_cache",
    ".pytest_cache",
    "*.pyc",
    "turbotrain-doctor-run-*",  # a doctor's temporary folders, where TMPDIR is the script's folder
)
LINK_ABOVE_BYTES = 16 * 2**20  # bigger files (data, checkpoints) are linked into the copy, not copied
MAX_COPY_BYTES = 512 * 2**20
MAX_COPY_FILES = 20_000
_STARTUP_S = 4.0  # a fresh interpreter importing torch, before the script's first line
_CHILD = "turbotrain.doctor.fixes.child"


class VerifyError(RuntimeError):
    """Verification cannot start: the message says why and what to do."""


@dataclass
class VerifyOptions:
    steps: int = 20
    warmup: int = 3
    rounds: int = 2
    budget_s: float = 120.0
    threads: int = 0  # torch threads for both sides (0: each script's default)
    noise_floor: float = 0.0  # this machine's noise, from the doctor's own run
    run_timeout_s: float = 600.0
    memory_limit_bytes: int | None = None  # both sides run under the doctor's --memory-limit
    # Steps of two kinds (compiled code that hit the recompile limit runs some inputs eagerly): each run counts as
    # its mean step, which a median (one kind's) would leave out.
    mean_step: bool = False


@dataclass
class TimedRun:
    """One run of the original or a patched script: its step times, losses, or why it failed."""

    step_ms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    error: str | None = None
    wall_s: float = 0.0
    loader_round: int = 0  # steps one round of the DataLoader's workers feeds (0: no workers)
    graphs: dict[str, Any] | None = None  # autograd graphs alive at a few step boundaries (child.py's "graphs")
    memory: dict[str, Any] | None = None  # the memory peak over the measured steps (child.py's "memory")
    out_of_memory: bool = False  # the run died of an out-of-memory error (child.py's "out_of_memory")

    def ms(self, mean: bool) -> float:
        if mean:  # every step counts: work every N steps, or steps of two kinds
            return statistics.fmean(self.step_ms)
        # Fed by workers, a median of single steps picks one that waited for nothing: runs of a round each.
        return statistics.median(run_means(self.step_ms, min(self.loader_round, len(self.step_ms) // 3)))


def _copy(src: Path, dst: Path) -> list[str]:
    """Copy the folder ``src`` to ``dst``: files, folders and symlinks (as links). Sockets, named pipes and devices
    are left out, and so are ``dst`` itself (where it lies inside ``src``) and what cannot be read; what was left
    out, in words."""
    special: list[str] = []
    inside = os.path.realpath(dst)

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = set(_SKIP(folder, names))
        for name in names:
            path = os.path.join(folder, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue  # gone meanwhile: the copy says so
            if stat.S_ISDIR(mode) and os.path.realpath(path) == inside:
                skipped.add(name)
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)) and name not in skipped:
                special.append(os.path.relpath(path, src))
                skipped.add(name)
        return skipped

    def copy(s: str, d: str) -> None:
        if os.path.getsize(s) > LINK_ABOVE_BYTES:
            os.symlink(os.path.realpath(s), d)  # read-only data stays where it is
        else:
            shutil.copy2(s, d)

    notes = []
    try:
        shutil.copytree(src, dst, ignore=ignore, symlinks=True, copy_function=copy)
    except shutil.Error as exc:  # every file that could be copied was: the rest is named
        failed = [f"{os.path.relpath(s, src)} ({why})" for s, _, why in exc.args[0]]
        notes.append(f"--verify's copy of {src} is missing what could not be copied: {'; '.join(failed)}.")
    if special:
        notes.append(
            f"--verify's copy of {src} leaves out {', '.join(sorted(special))}: sockets, named pipes and devices "
            "are not copied (a script that needs one fails in the copy)."
        )
    return notes


def _check_size(base: Path) -> None:
    files = size = 0
    for root, dirs, names in os.walk(base):
        dirs[:] = [d for d in dirs if not _SKIP(root, [d])]
        for name in names:
            files += 1
            try:
                small = os.path.getsize(os.path.join(root, name))
            except OSError:
                continue
            size += small if small <= LINK_ABOVE_BYTES else 0
        if files > MAX_COPY_FILES or size > MAX_COPY_BYTES:
            raise VerifyError(
                f"doctor --verify copies the script's folder {base}, which holds over "
                f"{min(files, MAX_COPY_FILES)} files / {size / 2**20:.0f} MiB; put the script in a "
                "folder of its own (with what it imports) and run the doctor there"
            )


class Verifier:
    """Copies of the script's folder and interleaved runs of original against patched."""

    def __init__(self, script: str, argv: list[str], base: str, options: VerifyOptions) -> None:
        self.script, self.argv, self.base, self.options = Path(script), list(argv), Path(base), options
        self.started = time.perf_counter()
        self.run_s = 0.0  # the longest run so far: what a comparison will cost
        self._tmp: str | None = None
        self._variants = 0
        self._warm: WarmStart | None = None  # started by the first run, ended with the copies
        self.warm_runs = 0  # runs forked from it (the others started a new interpreter)
        self.notes: list[str] = []  # what the copies left out, for the report

    def __enter__(self) -> "Verifier":
        _check_size(self.base)
        # Outside the folder copied, or the copy would copy itself (TMPDIR in the script's folder).
        self._tmp = lifeline.temp_folder("verify-", outside=str(self.base))
        try:
            self.original = Path(self._tmp) / "original"
            self.notes += _copy(self.base, self.original)
        except BaseException:
            lifeline.remove(self._tmp)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._warm is not None:
            self._warm.close()
        if self._tmp is not None:
            lifeline.remove(self._tmp)

    # -- budget -----------------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def comparison_s(self, estimate_run_s: float) -> float:
        run = max(self.run_s, estimate_run_s + _STARTUP_S)
        return 2 * self.options.rounds * run

    def affords(self, comparisons: int, estimate_run_s: float) -> bool:
        return self.elapsed() + comparisons * self.comparison_s(estimate_run_s) <= self.options.budget_s

    # -- runs -------------------------------------------------------------------------------------

    def variant(self, texts: dict[str, str]) -> Path:
        """A copy of the folder with ``texts`` (absolute original path -> new text) written in."""
        self._variants += 1
        assert self._tmp is not None  # made on entering the with-block
        folder = Path(self._tmp) / f"patched-{self._variants}"
        _copy(self.base, folder)  # leaves out what the original's copy did, said once
        for path, text in texts.items():
            (folder / os.path.relpath(path, self.base)).write_text(text, encoding="utf-8")
        return folder

    def _cwd(self, folder: Path) -> Path:
        """The user's working directory inside the copy when it was inside the script's folder."""
        here = Path.cwd().resolve()
        try:
            return folder / here.relative_to(self.base.resolve())
        except ValueError:
            return here

    def run(self, folder: Path, steps: int) -> TimedRun:
        out = folder / ".turbotrain-verify.json"
        out.unlink(missing_ok=True)
        script = folder / os.path.relpath(self.script, self.base)
        args = ["--steps", str(steps), "--warmup", str(self.options.warmup), "--threads", str(self.options.threads)]
        if self.options.memory_limit_bytes is not None:
            args += ["--memory-limit", str(self.options.memory_limit_bytes)]
        args += ["--out", str(out), str(script), *self.argv]
        env = self._env()
        if self._warm is None:
            assert self._tmp is not None  # made on entering the with-block
            self._warm = WarmStart(env, self._tmp)  # its imports, once, before the first run's clock starts
        started = time.perf_counter()
        ended = self._run_child(args, env, str(self._cwd(folder)))
        if ended is None:
            return TimedRun(error=f"did not finish within {self.options.run_timeout_s:.0f} s")
        returncode, stdout, stderr = ended
        wall = time.perf_counter() - started
        self.run_s = max(self.run_s, wall)
        if not out.is_file():
            tail = (stderr or stdout).strip().splitlines()[-1:] or [f"exit code {returncode}"]
            return TimedRun(error=tail[0], wall_s=wall)
        data = json.loads(out.read_text())
        losses = [float.fromhex(v) for v in data["losses"]]
        if data["status"] in ("error", "exit"):
            error = data["error"] or "the script failed"
            return TimedRun(losses=losses, error=error, wall_s=wall, out_of_memory=data.get("out_of_memory", False))
        if not data["step_s"]:
            return TimedRun(
                losses=losses, error="no step was measured (the script ended before the warm-up was over)", wall_s=wall
            )
        return TimedRun(
            [v * 1e3 for v in data["step_s"]],
            losses,
            wall_s=wall,
            loader_round=data.get("loader_round", 0),
            graphs=data.get("graphs"),
            memory=data.get("memory"),
        )

    def _env(self) -> dict[str, str]:
        package_root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")]))
        env.update(lifeline.mark())  # ended with the doctor, whatever ends it
        return env

    def _run_child(self, args: list[str], env: dict[str, str], cwd: str) -> tuple[int, str, str] | None:
        """:mod:`.child` with ``args``, forked from the warm server where it can be, else in a new interpreter:
        (exit code, stdout, stderr), or None at the time limit."""
        limit = self.options.run_timeout_s
        assert self._warm is not None  # started by run()
        warm = self._warm.run(_CHILD, ["--parent", str(self._warm.pid), *args], env, cwd, limit)
        if warm is not None:
            if warm.returncode is None:
                return None
            self.warm_runs += 1
            return warm.returncode, warm.stdout, warm.stderr
        cmd = [sys.executable, "-m", _CHILD, "--parent", str(os.getpid()), *args]
        try:
            proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return None
        return proc.returncode, proc.stdout, proc.stderr

    def compare(self, folder: Path, steps: int, numerics: str, periodic: bool = False) -> Verification:
        """Original against ``folder``'s patched copy, ``rounds`` interleaved rounds of ``steps`` steps;
        ``periodic``: a fix changes a cadence, so each run counts as its mean over whole periods."""
        result = Verification(steps=steps)
        originals: list[TimedRun] = []
        patched: list[TimedRun] = []
        for round_ in range(self.options.rounds):
            order = [(self.original, originals), (folder, patched)]
            for where, runs in order if round_ % 2 == 0 else reversed(order):
                if runs is originals and result.original_out_of_memory:
                    continue  # it runs out of memory whenever it runs: the patched side is what is measured
                runs.append(self.run(where, steps))
                if runs is originals and runs[-1].out_of_memory:
                    result.original_out_of_memory = runs.pop().error
            for side, run in (("original", originals[-1:]), ("patched", patched[-1:])):
                if run and run[0].error:
                    result.error = f"the {side} script failed: {run[0].error}"
                    return result
        if result.original_out_of_memory:
            return _patched_only(result, patched, periodic)
        mean = periodic or self.options.mean_step
        result.original_ms = [r.ms(mean) for r in originals]
        result.patched_ms = [r.ms(mean) for r in patched]
        result.ratios = [o / p for o, p in zip(result.original_ms, result.patched_ms)]
        verdict = judge(result.ratios, noise_floor=self.options.noise_floor)
        result.speedup, result.verdict = verdict.speedup, verdict.verdict
        again = originals[1].losses if len(originals) > 1 else None
        result.loss_match = loss_match(numerics, originals[0].losses, patched[0].losses, again)
        result.graphs_kept = graphs_kept(originals[0].graphs, patched[0].graphs)
        result.peak_memory = peak_memory([r.memory for r in originals], [r.memory for r in patched])
        return result


def _patched_only(result: Verification, patched: list[TimedRun], periodic: bool) -> Verification:
    """The original ran out of memory: the patched runs' steps and peak, no ratio (nothing ran to compare with)."""
    result.patched_ms = [r.ms(periodic) for r in patched]
    result.verdict = FITS
    peaks = [r.memory for r in patched if r.memory is not None]
    if peaks:
        result.peak_memory = {
            "kind": peaks[0]["kind"],
            "patched_bytes": round(statistics.median(m["peak_bytes"] for m in peaks)),
            "patched_start_bytes": round(statistics.median(m["start_bytes"] for m in peaks)),
        }
    return result


def peak_memory(original: list[dict[str, Any] | None], patched: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Each side's memory peak over its measured steps, the median over its runs (None where a run gave none):
    what a fix frees, or costs, in memory, checked beside the time."""
    first = original[0] if original else None
    if first is None or not patched or any(m is None for m in (*original, *patched)):
        return None

    def median(runs: list[dict[str, Any] | None], key: str) -> int:
        return round(statistics.median(m[key] for m in runs if m is not None))

    return {
        "kind": first["kind"],
        "original_bytes": median(original, "peak_bytes"),
        "patched_bytes": median(patched, "peak_bytes"),
        "original_start_bytes": median(original, "start_bytes"),
        "patched_start_bytes": median(patched, "start_bytes"),
    }


def graphs_kept(original: dict[str, Any] | None, patched: dict[str, Any] | None) -> dict[str, Any] | None:
    """Each side's autograd graphs kept from step to step, where either side kept some (None: neither did, or a
    side was not counted): the memory a fix such as ``.detach()`` frees, checked beside the time."""
    if original is None or patched is None or not (original["growing"] or patched["growing"]):
        return None
    return {
        side: {
            "growing": g["growing"],
            "bytes_per_step": round(g["bytes_per_step"]),
            "nodes_per_step": round(g["nodes_per_step"], 1),
            "tensors": g["tensors"],
        }
        for side, g in (("original", original), ("patched", patched))
    }
