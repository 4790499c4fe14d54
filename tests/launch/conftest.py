"""Fixtures for the launch tests (helpers live in launch_helpers.py)."""

from __future__ import annotations

import pytest
import several_runs
from launch_helpers import WORKER, launch


@pytest.fixture(scope="session")
def single_process_reference():
    """The 'plain' configuration trained in one process with the global batch of two processes."""
    import launch_tiny as tiny
    import turbotrain as tt

    model = tiny.make_model("plain")
    optimizer, scheduler = tiny.make_optimizer(model)
    trainer = tt.Trainer(model, optimizer, tiny.loss_fn, plan=tt.Plan(grad_accum_steps=tiny.ACCUM),
                         schedulers=scheduler, **tiny.trainer_kwargs())
    result = trainer.fit(tiny.reference_loader(world=2), tiny.val_loader())
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()}, "history": result.history,
            "steps": result.steps}


@pytest.fixture(scope="session")
def two_rank_runs(tmp_path_factory):
    """One launch of two ranks for two runs, one after the other in the same processes (torch starts once per
    process), each writing into its own folder: ``ddp``, both configurations under DDP, the 'dropout' one also
    checkpointing (the restart test's reference); then ``fsdp``, 'plain' under FSDP2 with sharded checkpoints."""
    ddp, fsdp = tmp_path_factory.mktemp("ddp"), tmp_path_factory.mktemp("fsdp")
    launch("--nproc-per-node", "2", str(WORKER), *several_runs.joined(
        ["--out", str(ddp), "--config", "plain", "--config", "dropout", "--checkpoint-dir", str(ddp / "ckpt")],
        ["--out", str(fsdp), "--config", "plain", "--strategy", "fsdp", "--checkpoint-dir", str(fsdp / "ckpt")]))
    return {"ddp": ddp, "fsdp": fsdp}


@pytest.fixture(scope="session")
def ddp_run(two_rank_runs):
    return two_rank_runs["ddp"]
