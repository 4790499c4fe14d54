"""Fixtures for the launch tests (helpers live in launch_helpers.py)."""

from __future__ import annotations

import pytest
from launch_helpers import run_worker


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
def ddp_run(tmp_path_factory):
    """One launch, two ranks, both configurations; the 'dropout' one also checkpoints (the restart test's reference)."""
    out = tmp_path_factory.mktemp("ddp")
    return run_worker(out, "--config", "plain", "--config", "dropout", "--checkpoint-dir", str(out / "ckpt"))
