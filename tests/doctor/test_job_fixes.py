"""``doctor --fix`` / ``--verify`` on a multi-process job: the fixes timed on every rank become edits of the
script's own lines (DDP's keywords, the thread count), and ``--verify`` runs the patched script as the job."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from doctor_helpers import doctor_job, git_apply, job_env, job_processes, marked_lines
from warm_command import warm_ranks_env

SCRIPT = Path(__file__).parent / "scripts" / "ddp_fixable.py"


def _copy(tmp: Path) -> Path:
    folder = tmp / "job"
    folder.mkdir()
    shutil.copy(SCRIPT, folder / SCRIPT.name)
    return folder


def test_the_patch_edits_the_lines_of_the_fixes_timed_on_every_rank(tmp_path):
    folder = _copy(tmp_path)
    patch = tmp_path / "fixes.patch"
    proc, report = doctor_job(folder, "--fix", str(patch), "--nproc-per-node", "2", SCRIPT.name)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    edits = {f["rule"]: f["where"] for f in report["fixes"] if f["in_patch"]}
    marked = {rule: f"{SCRIPT.name}:{line}" for rule, line in marked_lines("ddp_fixable")}
    # Where the ranks waited a tenth of the step on the all-reduce, DDP's bucket keywords join the same call.
    buckets = edits.pop("ddp-bucket-settings", None)
    assert edits == marked and buckets in (None, marked["ddp-find-unused-parameters"]), report["fixes"]
    git_apply(folder, patch)
    text = (folder / SCRIPT.name).read_text()
    assert "torch.set_num_threads(1)" in text and "find_unused_parameters=False" in text
    assert ("gradient_as_bucket_view=True" in text) == (buckets is not None)
    # The patched job still trains: both ranks step to the end under plain torchrun (ranks from the warm server);
    # torchrun's log folder in the test's tmp_path, not /tmp (torchrun leaves it where it makes it).
    env = {**job_env(), "TMPDIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          SCRIPT.name], cwd=folder, env={**env, **warm_ranks_env(env)}, capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert job_processes(SCRIPT.name) == []


def test_verify_runs_the_original_and_the_patched_job_in_rounds(tmp_path):
    folder = _copy(tmp_path)
    proc, report = doctor_job(folder, "--fix", str(tmp_path / "fixes.patch"), "--verify", "--verify-rounds", "2",
                              "--fix-only", "ddp-find-unused-parameters", "--nproc-per-node", "2", SCRIPT.name)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (fix,) = report["fixes"]
    check = fix["verification"]
    assert check.get("error") is None, check
    assert len(check["ratios"]) == 2
    assert all(ms > 0 for ms in check["original_ms_per_step"] + check["patched_ms_per_step"])
    assert check["steps"] == 10
    # find_unused_parameters changes no gradient: both ranks' losses, bitwise, over every step they took.
    losses = fix["loss_match"]
    assert losses["compared"] >= 2 * check["steps"] and losses["match"] is True, losses
    assert job_processes(SCRIPT.name) == []
