"""SIGTERM (preemption) to a real training process: a checkpoint at the next step boundary, exit 143.

Beyond tests/train/test_preemption.py (the signal raised in-process): the signal comes from
outside, at a chosen step or at a random moment, to the process alone or to its whole
process group (as Slurm's scancel does, DataLoader workers included), and the resumed run
ends bitwise equal to an uninterrupted one with the same sample order. The CLI exits with
143 too.
"""

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from faultharness import (Child, Kill, SampleLog, assert_epochs_are_permutations, assert_same_final_state, leftovers,
                          newest_step, run_child)
from fault_trainee import Job

import turbotrain as tt

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _preempt_when_paused(job: Job, to_group: bool = False):
    """Run ``job`` (which pauses after step ``job.pause_after``), send SIGTERM there, let it go on."""
    child = Child(job)
    for msg in child.messages():
        if msg[0] == "paused":
            if to_group:
                os.killpg(child.proc.pid, signal.SIGTERM)  # the child leads its group; its workers are in it
            else:
                child.signal(signal.SIGTERM)
            child.conn.send("go")
    return child.finish()


CASES = {  # loader, the step the signal arrives in, whether the whole process group gets it
    "mid-epoch": (dict(), 5, False),
    "epoch boundary, persistent workers": (dict(num_workers=2, persistent_workers=True), 12, False),
    "process group, workers": (dict(num_workers=2), 7, True),
}


@pytest.mark.parametrize("case", CASES)
def test_sigterm_checkpoints_at_the_next_boundary_exits_143_and_resumes_exactly(tmp_path, case):
    loader, at, to_group = CASES[case]
    job = Job(str(tmp_path / "preempted"), max_steps=36, checkpoint_every=5, own_process_group=to_group, **loader)
    reference = replace(job, directory=str(tmp_path / "uninterrupted"))
    ref_log, log = SampleLog(), SampleLog()
    ref_log.add(run_child(reference))

    run = _preempt_when_paused(replace(job, pause_after=at), to_group)
    # The signal arrived during step `at`: that step finished, was checkpointed, and nothing after it ran.
    assert run.exitcode == tt.PREEMPTED_EXIT_CODE == 143, (run.exitcode, run.outcome)
    assert run.outcome == ("preempted", at, str(Path(job.directory) / f"step-{at:09d}.pt"))
    assert run.stepped == at and max(step for step, _ in run.batches) == at - 1
    assert newest_step(job.directory) == at and not leftovers(job.directory)
    log.add(run)

    resumed = run_child(job)
    assert resumed.outcome == ("done", 36, 0) and resumed.resumed_at == at
    log.add(resumed)
    assert assert_same_final_state(reference.directory, job.directory) == 36
    assert log.order(36) == ref_log.order(36)
    assert_epochs_are_permutations(log.order(36), 48)


def test_sigterm_at_random_moments_never_trains_past_the_checkpoint(tmp_path):
    """Ten signals from outside at seeded moments: each run stops at the first boundary after it."""
    rng = random.Random(143)
    job = Job(str(tmp_path), max_steps=10_000, checkpoint_every=10**6)  # only preemption saves
    for _ in range(10):
        before = newest_step(job.directory)
        run = run_child(job, Kill(rng.randint(1, 6), rng.uniform(0.0, 0.003), signum=signal.SIGTERM))
        assert run.exitcode == 143 and run.outcome[0] == "preempted", (run.exitcode, run.outcome)
        step = run.outcome[1]
        # Saved at the boundary after the signal, then exited: no step was trained past the checkpoint.
        assert step == before + run.stepped == newest_step(job.directory)
        assert run.stepped >= run.signalled_after and run.resumed_at == before


def test_the_cli_exits_143_on_sigterm_and_the_recipe_resumes(tmp_path):
    ckpt = tmp_path / "ckpt"
    recipe = tmp_path / "mlp.yaml"
    recipe.write_text(f"workload: mlp\nresume: true\ntrainer:\n  max_steps: 1000000\n  checkpoint_dir: {ckpt}\n"
                      f"  checkpoint_every_n_steps: 50\n  progress: false\n")
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "turbotrain", "train", str(recipe)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not list(ckpt.glob("step-*.json")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143 and "Traceback" not in err, err
    stopped = newest_step(ckpt)
    assert stopped >= 50 and not leftovers(ckpt)
    recipe.write_text(recipe.read_text().replace("max_steps: 1000000", f"max_steps: {stopped + 20}"))
    out = subprocess.run([sys.executable, "-m", "turbotrain", "train", str(recipe)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"stopped by max_steps after {stopped + 20} steps" in out.stdout
