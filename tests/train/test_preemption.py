import os
import signal

import pytest
import torch
import torch.nn.functional as F
from tiny import make_loader, make_mlp

import turbotrain as tt


def _run(tmp_path, sigterm_at=None, resume=False):
    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    calls = []

    def step(ctx, batch):
        calls.append(1)
        if len(calls) == sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler does before it kills the job
        x, y = batch
        return F.cross_entropy(ctx.model(x), y)

    trainer = tt.Trainer(model, opt, step_fn=step, max_epochs=2, checkpoint_dir=str(tmp_path),
                         checkpoint_every_n_epochs=1, progress=False)
    return trainer, model, lambda: trainer.fit(make_loader(n=64, batch_size=8), resume=resume)


def test_sigterm_checkpoints_at_the_next_step_and_exits_143(tmp_path):
    _, _, fit = _run(tmp_path / "a", sigterm_at=5)
    with pytest.raises(tt.Preempted) as exc:
        fit()
    assert exc.value.code == tt.PREEMPTED_EXIT_CODE == 143 and exc.value.step == 5
    assert exc.value.checkpoint.endswith("step-000000005.pt")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is removed again


def test_resume_after_preemption_equals_an_uninterrupted_run(tmp_path):
    _, full, fit = _run(tmp_path / "full")
    fit()
    _, _, fit = _run(tmp_path / "b", sigterm_at=11)
    with pytest.raises(tt.Preempted):
        fit()
    _, resumed, fit = _run(tmp_path / "b", resume=True)
    assert fit().steps == 16
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
