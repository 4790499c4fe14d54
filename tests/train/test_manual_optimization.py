"""GAN-style manual optimization: two optimizers, accumulation, the other model frozen."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import turbotrain as tt


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gen = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6))
        self.disc = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))


def _loader():
    g = torch.Generator().manual_seed(1)
    real = torch.randn(32, 6, generator=g)
    noise = torch.randn(32, 4, generator=g)
    return DataLoader(TensorDataset(real, noise), batch_size=4)


def _d_loss(gan, real, noise):
    fake = gan.gen(noise)  # not detached: only the toggle keeps the generator out of this backward
    ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
    return (F.binary_cross_entropy_with_logits(gan.disc(real), ones)
            + F.binary_cross_entropy_with_logits(gan.disc(fake), zeros))


def _g_loss(gan, noise):
    return F.binary_cross_entropy_with_logits(gan.disc(gan.gen(noise)), torch.ones(len(noise), 1))


def _turbotrain(accum, probe=None):
    gan = GAN()
    opt_d = torch.optim.SGD(gan.disc.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(gan.gen.parameters(), lr=0.1)

    def step(ctx, batch):
        real, noise = batch
        with ctx.toggle(opt_d):
            before = [None if p.grad is None else p.grad.clone() for p in gan.gen.parameters()]
            d_loss = _d_loss(gan, real, noise)
            ctx.backward(d_loss)
            if probe is not None:  # the discriminator's backward left the generator's gradients alone
                after = [p.grad for p in gan.gen.parameters()]
                probe.append(all((a is None and b is None) or torch.equal(a, b) for a, b in zip(before, after)))
        ctx.step(opt_d)
        with ctx.toggle(opt_g):
            g_loss = _g_loss(gan, noise)
            ctx.backward(g_loss)
        ctx.step(opt_g)
        return {"loss": d_loss + g_loss}

    tt.Trainer(gan, [opt_d, opt_g], step_fn=step, plan=tt.Plan(device="cpu", grad_accum_steps=accum),
               manual_optimization=True, max_epochs=1, progress=False).fit(_loader())
    return gan


def _by_hand(accum):
    gan = GAN()
    opt_d = torch.optim.SGD(gan.disc.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(gan.gen.parameters(), lr=0.1)
    for i, (real, noise) in enumerate(_loader()):
        last = (i + 1) % accum == 0
        for p in gan.gen.parameters():
            p.requires_grad_(False)
        (_d_loss(gan, real, noise) / accum).backward()
        for p in gan.gen.parameters():
            p.requires_grad_(True)
        if last:
            opt_d.step()
            opt_d.zero_grad()
        for p in gan.disc.parameters():
            p.requires_grad_(False)
        (_g_loss(gan, noise) / accum).backward()
        for p in gan.disc.parameters():
            p.requires_grad_(True)
        if last:
            opt_g.step()
            opt_g.zero_grad()
    return gan


def test_two_optimizers_with_accumulation_match_a_hand_written_loop():
    ours, theirs = _turbotrain(accum=2), _by_hand(accum=2)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b)


def test_the_other_models_gradients_are_not_computed():
    probe = []
    _turbotrain(accum=2, probe=probe)
    assert probe and all(probe)


def test_steps_only_at_the_last_micro_batch():
    gan = GAN()
    opt_d = torch.optim.SGD(gan.disc.parameters(), lr=0.1)
    calls = []
    opt_d.register_step_post_hook(lambda *a: calls.append(1))

    def step(ctx, batch):
        real, noise = batch
        ctx.backward(_d_loss(gan, real, noise))
        ctx.step(opt_d)
        return _d_loss(gan, real, noise)

    result = tt.Trainer(gan, [opt_d], step_fn=step, plan=tt.Plan(device="cpu", grad_accum_steps=4),
                        manual_optimization=True, max_epochs=1, progress=False).fit(_loader())
    assert len(calls) == result.steps == 2
