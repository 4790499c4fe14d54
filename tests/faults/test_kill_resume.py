"""kill -9 at random moments of a real training run, then resume: nothing lost beyond k steps, exact.

Each training process is a real child (forked from a preloaded forkserver) killed with
SIGKILL by the test, or killing itself at the named fault point between writing a
checkpoint's data and committing it. The longer campaign (200 kills) is marked slow; its
figures are in docs/reliability.md:

    TT_FAULT_FIGURES_DIR=. python -m pytest tests/faults/test_kill_resume.py -m slow -s
"""

import os
import signal
from dataclasses import replace

import pytest
from faultharness import (SAVE_WINDOW, Kill, SampleLog, assert_epochs_are_permutations, assert_same_final_state,
                          kill_campaign, leftovers, newest_step, run_child, unloadable)
from fault_trainee import Job


def _report(figures) -> None:
    """Print the figures; with TT_FAULT_FIGURES_DIR set, also write them there as kills-<n>.json."""
    print(figures.to_json())
    out = os.environ.get("TT_FAULT_FIGURES_DIR")
    if out:
        with open(os.path.join(out, f"kills-{figures.kills}.json"), "w") as fh:
            fh.write(figures.to_json())


def test_fifty_kills_resume_every_time_and_end_bitwise_equal(tmp_path):
    figures = kill_campaign(tmp_path, kills=50, seed=8, job=Job("", max_steps=240, checkpoint_every=4))
    _report(figures)
    assert figures.kills == figures.restarts == 50
    assert figures.restarts_resumed + figures.restarts_from_scratch + figures.restarts_killed_while_starting == 50
    assert figures.unloadable_checkpoints == 0 and figures.files_not_cleaned == 0
    assert max(figures.steps_lost) <= 4
    # The seeded plan reaches every window it is meant to: start-up, the save window, mid-epoch
    # and epoch-boundary resumes, and kills that left files for the next start to clean.
    assert len(figures.kinds) == 3 and figures.resumed_mid_epoch and figures.resumed_at_epoch_boundary
    assert figures.kills_leaving_files >= figures.kinds["save window (fault point)"]
    assert figures.bitwise_equal_to_uninterrupted and figures.same_sample_order and figures.final_step == 240


@pytest.mark.slow
def test_two_hundred_kills(tmp_path):
    figures = kill_campaign(tmp_path, kills=200, seed=2026, job=Job("", max_steps=800, checkpoint_every=4))
    _report(figures)
    assert figures.kills == figures.restarts == 200
    assert figures.unloadable_checkpoints == 0 and figures.files_not_cleaned == 0
    assert max(figures.steps_lost) <= 4 and figures.bitwise_equal_to_uninterrupted


LOADERS = {
    "workers-0": dict(num_workers=0),
    "workers-2": dict(num_workers=2),
    "workers-2-persistent": dict(num_workers=2, persistent_workers=True),
}

# The kills of one run, in order: (what, changes to the job, an outside kill, where it resumes).
# 12 steps an epoch, a checkpoint every 3 steps, 36 steps in all.
KILLS = [
    ("mid-epoch, right after an optimizer step", dict(die_after_step=5), None, 3),
    ("at an epoch boundary, the next epoch's loader started", dict(die_before_step=12), None, 12),
    ("in the save window (data written, not committed)", dict(fault=SAVE_WINDOW), None, 12),
    ("mid-epoch, in the second epoch", dict(die_after_step=20), None, 18),
    ("at the second epoch boundary", dict(die_before_step=24), None, 24),
    ("from outside, at a random moment", {}, Kill(after_steps=4, delay_s=0.0013), None),  # 12 steps to spare
    ("from outside, while resuming", {}, Kill(after_steps=None, delay_s=0.02), None),
]


@pytest.mark.parametrize("loader", LOADERS)
def test_resume_after_kills_is_bitwise_exact_with_the_same_sample_order(tmp_path, loader):
    job = Job(str(tmp_path / "killed"), max_steps=36, checkpoint_every=3, **LOADERS[loader])
    reference = replace(job, directory=str(tmp_path / "uninterrupted"))
    ref_run = run_child(reference)
    assert ref_run.outcome == ("done", 36, 0), ref_run.outcome
    ref_log, log = SampleLog(), SampleLog()
    ref_log.add(ref_run)
    for what, changes, kill, resumes_at in KILLS:
        run = run_child(replace(job, **changes), kill)
        assert run.exitcode == -signal.SIGKILL, (what, run.exitcode, run.outcome)
        assert not unloadable(job.directory), what
        assert resumes_at is None or newest_step(job.directory) == resumes_at, (what, newest_step(job.directory))
        log.add(run)
    resumed_at = newest_step(job.directory)
    final = run_child(job)
    assert final.outcome == ("done", 36, 0) and final.resumed_at == resumed_at and not leftovers(job.directory)
    log.add(final)
    assert assert_same_final_state(reference.directory, job.directory) == 36
    order = log.order(36)
    assert order == ref_log.order(36) and len(order) == 36 * 4
    assert_epochs_are_permutations(order, 48)
