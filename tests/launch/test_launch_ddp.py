"""Two CPU processes (gloo) under `turbotrain launch`: DDP trains like one process with the global batch."""

from __future__ import annotations

import csv

import pytest

import launch_tiny as tiny
import several_runs
from launch_helpers import WORKER, assert_same_weights, launch, read_rank


def test_ddp_equals_one_process_with_the_same_global_batch(ddp_run, single_process_reference):
    """Also proves the injected DistributedSampler: two ranks reading the same data would not match."""
    rank0, rank1 = read_rank(ddp_run, "plain", 0), read_rank(ddp_run, "plain", 1)
    assert rank0["world"] == 2 and "strategy" in rank0["applied"]
    assert_same_weights(rank0["weights"], rank1["weights"], exact=True)  # replicas never drift apart
    assert_same_weights(rank0["weights"], single_process_reference["weights"])
    # the LR scheduler built on the user's optimizer kept stepping
    assert rank0["lr"] == pytest.approx(0.05 * 0.5 ** (tiny.MAX_STEPS // 3))


def test_accumulation_all_reduces_once_per_optimizer_step(ddp_run):
    rank0 = read_rank(ddp_run, "plain", 0)
    # ACCUM micro-batches per step, but gradients are only synchronized at the last one (DDP no_sync);
    # the worker's comm hook counts synchronizations (all-reduces of DDP's bucket 0).
    assert rank0["steps"] == tiny.MAX_STEPS
    assert rank0["allreduces"] == rank0["steps"]


def test_logged_metrics_are_reduced_across_ranks(ddp_run, single_process_reference):
    """train_loss is the mean over ranks (= the global batch's loss), val_loss covers every rank's shard."""
    history = read_rank(ddp_run, "plain", 0)["history"]
    reference = single_process_reference["history"]
    assert [row["step"] for row in history] == [row["step"] for row in reference]
    for key in ("train_loss", "val_loss"):
        ours = [row[key] for row in history if key in row]
        theirs = [row[key] for row in reference if key in row]
        assert ours and ours == pytest.approx(theirs, rel=1e-5)
    # rank 1 computes the same reduced values: every rank takes part in the reduction at log time
    assert [r.get("train_loss") for r in read_rank(ddp_run, "plain", 1)["history"]] == \
        [r.get("train_loss") for r in history]


def test_only_rank_zero_writes_logs(ddp_run):
    with open(ddp_run / "logs-plain" / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    # one row per logged step plus the validation row; a second writer would duplicate or interleave rows
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 4, 5, 6, 7]


@pytest.fixture(scope="module")
def nan_runs(tmp_path_factory):
    """nan_one_rank.py under DDP, then under FSDP: one launch, the two runs one after the other in the same
    processes (torch starts once per process), each writing into its own folder."""
    out = {strategy: tmp_path_factory.mktemp(f"nan-{strategy}") for strategy in ("ddp", "fsdp")}
    launch("--nproc-per-node", "2", str(WORKER.parent / "nan_one_rank.py"),
           *several_runs.joined(*(["--out", str(out[s]), "--strategy", s] for s in ("ddp", "fsdp"))), timeout=180)
    return out


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_nan_on_one_rank_stops_every_rank_at_that_step(nan_runs, strategy):
    """Without one verdict for all ranks, rank 1 would stop alone and rank 0 wait in the next collective."""
    out = nan_runs[strategy]
    assert [(out / f"rank{r}.txt").read_text() for r in (0, 1)] == ["3", "3"]
