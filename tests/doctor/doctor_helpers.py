"""Shared helpers: run the doctor in-process on the corpus in tests/doctor/scripts (cached per session)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from turbotrain.doctor import DoctorOptions, diagnose_script
from turbotrain.doctor.record.collectives import CommStep
from turbotrain.doctor.record.measurements import StepRecord
from turbotrain.doctor.job.rank_main import ENV_FOLDER
from turbotrain.doctor.record.recording import Recording, Window
from warm_command import RANK_ENV, TEST_RUN, TEST_RUN_ID, turbotrain_command, warm_ranks_env, warm_ranks_pid

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).resolve().parents[2]
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


def rank_recording(rank: int, data_ms: list[float], exposed_ms: list[float], step_ms: float = 40.0,
               cpu_ms: float | None = None, cpu_wait_ms: float | None = None,
               eval_ms: list[float] | None = None) -> Recording:
    """One rank's recording of a 2-rank job, built by hand: per step its data and exposed all-reduce ms (and the
    ms it evaluated between steps)."""
    steps, comm, t = [], [], 100.0
    evals = eval_ms or [0.0] * len(data_ms)
    for i, (data, exposed, evaluated) in enumerate(zip(data_ms, exposed_ms, evals)):
        steps.append(StepRecord(index=i, start=t, end=t + step_ms / 1e3,
                                phases={"data": data / 1e3, "eval": evaluated / 1e3},
                                gap_before_forward=0.0, forwards=1, backwards=1, optimizers=1))
        comm.append(CommStep(step=i, buckets=1, exposed_s=exposed / 1e3, busy_s=(exposed + 1) / 1e3,
                             overlap_s=0.0005, done_at=t + step_ms / 1e3 - 0.001,
                             cpu_s=None if cpu_ms is None else cpu_ms / 1e3,
                             cpu_wait_s=None if cpu_wait_ms is None else cpu_wait_ms / 1e3))
        t += step_ms / 1e3
    return Recording(window=Window(warmup=1, measure=len(steps) - 1, asked=len(steps) - 1, profile_steps=0),
                     steps=tuple(steps), step_delimiter="optimizer.step()", events=(), loaders=(),
                     optimizer_sites=(), module_sites=(), matmul_shapes=(), gap_samples=(), rank=rank,
                     world_size=2, host=f"node{rank}", communication=tuple(comm))


# -- the doctor on a multi-process job, as a user runs it -----------------------------------------------

JOB_FAST = ["--steps", "10", "--warmup", "2"]


# job_env() marks every process a test of this pytest run starts (RANK_ENV): job_processes() counts only this run's,
# not those of another test run on the same machine (another clone's suite, a developer's doctor on the same script).


def job_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(RANK_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", ENV_FOLDER):
        env.pop(key, None)
    return env


def job_processes(script: str) -> list[int]:
    """Processes of a doctor job on ``script`` that this test run started (job_env()) still running (ranks,
    launchers, their children), and warm-rank servers and the ranks they forked, which the kernel shows with the
    server's environment and command line (doctor/job/warm_ranks.py), past the session's server."""
    found = []
    ours = f"{TEST_RUN}={TEST_RUN_ID}".encode()
    session = str(warm_ranks_pid())
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != session:
            try:
                environ = (entry / "environ").read_bytes()
                command = (entry / "cmdline").read_bytes()
                job = ENV_FOLDER.encode() in environ and script.encode() in command
                if ours in environ and (job or b"turbotrain.doctor.job.warm_ranks" in command):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def doctor_job(tmp: Path, *args: str, timeout: float = 240,
               what_if: bool = False) -> tuple[subprocess.CompletedProcess, dict]:
    """``turbotrain doctor`` in a subprocess with ``args`` (a launcher or --nproc-per-node): its exit and JSON
    report. Without ``what_if`` the fixes are not timed (each timing re-runs the whole job)."""
    out = tmp / "report.json"
    fast = JOB_FAST if what_if else [*JOB_FAST, "--no-what-if"]
    # A temporary directory of the job's own (outside the script's folder): what the launchers leave there is seen.
    temp = Path(tempfile.mkdtemp(prefix="doctor-job-tmp-"))
    try:
        env = job_env()
        proc = turbotrain_command(["doctor", *fast, "--json", str(out), *args], cwd=tmp,
                                  env={**env, **warm_ranks_env(env), "TMPDIR": str(temp)}, timeout=timeout)
        left = sorted(p.name for p in temp.glob("torchelastic_*"))
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert left == [], f"the job left torchrun's log folders in its TMPDIR: {left}"
    report = json.loads(out.read_text()) if out.exists() else {}
    return proc, report


# A tiny loop with one fixable habit (zero_grad(set_to_none=False)), for the CLI's output and --verify tests.
ZERO_GRAD_LOOP = """import torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(64, 8)
for step in range(1000):
    loss = model(data[step % 8 * 8:step % 8 * 8 + 8]).pow(2).mean()
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
"""


class Budget:
    """A what-if budget (rules.rule.TimeLeft) of 60 s for a rule's measurer called by hand."""

    left = 60.0

    def allows(self, cost_s: float) -> bool:
        return cost_s <= self.left
