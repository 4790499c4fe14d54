"""The loss the doctor's replays train the captured model with: the model's own where its forward returns one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from turbotrain.doctor.analysis.replay import surrogate_step

pytestmark = pytest.mark.reads_no_time  # values and gradients only


class LossInForward(nn.Module):
    """nanoGPT's shape: forward(idx, targets) returns (logits, loss)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 50)

    def forward(self, idx, targets=None):
        logits = self.head(self.emb(idx))
        if targets is None:
            return logits
        return logits, nn.functional.cross_entropy(logits.view(-1, 50), targets.view(-1))


def test_a_forward_that_returns_its_loss_is_trained_on_that_loss_alone():
    torch.manual_seed(0)
    model = LossInForward()
    idx = torch.randint(0, 50, (2, 8))
    loss = surrogate_step(model, ((idx, idx), {}))
    loss.backward()
    replayed = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    _, own = model(idx, idx)
    own.backward()
    assert torch.equal(loss.detach(), own.detach())
    assert all(torch.equal(a, p.grad) for a, p in zip(replayed, model.parameters()))


def test_a_forward_without_a_loss_is_trained_on_the_mean_square_of_its_outputs():
    torch.manual_seed(0)
    model = LossInForward()
    idx = torch.randint(0, 50, (2, 8))
    loss = surrogate_step(model, ((idx,), {}))
    assert torch.allclose(loss, model(idx).float().pow(2).mean())
