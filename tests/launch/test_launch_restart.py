"""Elastic restart: one rank is SIGKILLed mid-run; torchrun restarts the group; training resumes exactly."""

from __future__ import annotations

from launch_helpers import assert_same_weights, read_rank, run_worker


def test_killed_rank_restarts_and_finishes_with_the_uninterrupted_weights(ddp_run, tmp_path):
    """ddp_run (conftest) is the same configuration, uninterrupted."""
    out = tmp_path
    # 'dropout' draws per-rank random numbers (each rank seeds its own stream), so the resumed run only matches
    # when every rank gets its own random state back, not rank 0's.
    run_worker(out, "--config", "dropout", "--checkpoint-dir", str(out / "ckpt"),
               "--kill-rank", "1", "--kill-at-step", "5", launch_args=("--nproc-per-node", "2", "--max-restarts", "1"))
    for rank in (0, 1):
        resumed, uninterrupted = read_rank(out, "dropout", rank), read_rank(ddp_run, "dropout", rank)
        assert resumed["restart"] == 1  # the files come from the second attempt
        # it resumed from the checkpoint at step 3, mid-epoch (4 steps per epoch), not from scratch
        assert resumed["history"][0]["step"] == 4
        assert_same_weights(resumed["weights"], uninterrupted["weights"], exact=True)
