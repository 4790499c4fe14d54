"""FSDP2 (fully_shard) on two CPU processes with gloo: training, sharded checkpoints, resharded resume."""

from __future__ import annotations

import pytest

import launch_tiny as tiny
from launch_helpers import assert_same_weights, read_rank, run_worker


@pytest.fixture(scope="module")
def fsdp_run(two_rank_runs):
    """'plain' under FSDP2 on two ranks, sharded checkpoints in ckpt/ (conftest: the same launch as ddp_run's)."""
    return two_rank_runs["fsdp"]


def test_fsdp_trains_like_one_process(fsdp_run, single_process_reference):
    rank0 = read_rank(fsdp_run, "plain", 0)
    assert rank0["world"] == 2
    # fully_shard replaced the parameters; the user's optimizer was moved onto the shards, not left behind
    assert rank0["optimizer_on_model_params"]
    assert rank0["lr"] == pytest.approx(0.05 * 0.5 ** (tiny.MAX_STEPS // 3))  # its scheduler still works
    assert_same_weights(rank0["weights"], single_process_reference["weights"])
    assert_same_weights(rank0["weights"], read_rank(fsdp_run, "plain", 1)["weights"], exact=True)


def test_fsdp_accumulation_reduces_gradients_once_per_optimizer_step(fsdp_run):
    rank0 = read_rank(fsdp_run, "plain", 0)
    units_with_parameters = 2  # the two Linear layers; the root holds none of its own
    # ACCUM micro-batches per step, one reduce-scatter per unit per step (set_requires_gradient_sync(False)
    # on the others); without it this would be ACCUM times as many
    assert rank0["reduce_scatters"] == rank0["steps"] * units_with_parameters


def test_fsdp_checkpoints_are_sharded_and_committed(fsdp_run):
    ckpt = fsdp_run / "ckpt" / "plain"
    steps = sorted(p.name for p in ckpt.glob("step-*.pt"))
    assert steps == [f"step-{s:09d}.pt" for s in (3, 6, 7)]
    for step in (3, 6, 7):
        shards = ckpt / f"step-{step:09d}.dcp"
        assert (shards / ".metadata").is_file()
        assert len(list(shards.glob("*.distcp"))) == 2  # one file per rank: nobody gathered the full model


def test_fsdp_checkpoint_resumes_on_a_different_number_of_processes(fsdp_run, tmp_path):
    out = tmp_path
    # one process picks up the two-process checkpoint of step 7 (max_steps is 7: nothing left to train)
    run_worker(out, "--config", "plain", "--strategy", "fsdp", "--checkpoint-dir", str(fsdp_run / "ckpt"),
               launch_args=("--nproc-per-node", "1"))
    resumed = read_rank(out, "plain", 0)
    assert resumed["world"] == 1 and resumed["steps"] == tiny.MAX_STEPS
    assert_same_weights(resumed["weights"], read_rank(fsdp_run, "plain", 0)["weights"], exact=True)


def test_fsdp_checkpoint_loads_without_any_process_group(fsdp_run):
    """A sharded checkpoint resumes in a plain single process too (torch.distributed.checkpoint, no group)."""
    import turbotrain as tt

    model = tiny.make_model("plain")
    optimizer, scheduler = tiny.make_optimizer(model)
    trainer = tt.Trainer(model, optimizer, tiny.loss_fn, plan=tt.Plan(grad_accum_steps=tiny.ACCUM),
                         schedulers=scheduler, **tiny.trainer_kwargs(checkpoint_dir=str(fsdp_run / "ckpt" / "plain")))
    result = trainer.fit(tiny.reference_loader(world=2), resume=True)
    assert result.steps == tiny.MAX_STEPS
    assert optimizer.state  # the momentum buffers came back too
    assert_same_weights({k: v.detach() for k, v in model.state_dict().items()},
                        read_rank(fsdp_run, "plain", 0)["weights"], exact=True)
