import pytest
import torch
import torch.nn.functional as F
from tiny import make_loader, make_mlp

import turbotrain as tt


def _poisoned_loss(at_call, kind="loss"):
    calls = []

    def loss_fn(out, y):
        calls.append(1)
        loss = F.cross_entropy(out, y)
        if len(calls) == at_call:
            if kind == "loss":
                return loss * float("nan")
            # a finite loss whose gradient is infinite in one place
            return loss + (out[0, 0] * 0 + 1).sqrt() * 0 + (out[0, 0] - out[0, 0].detach()).abs().pow(0.5).sum()
        return loss

    return loss_fn


def _fit(loss_fn, **limits):
    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    trainer = tt.Trainer(model, opt, loss_fn, plan=tt.Plan(device="cpu"), schedulers=sched, progress=False,
                         max_steps=6, **limits)
    return trainer, model, opt, sched


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_default_stops_before_the_optimizer_touches_the_weights(kind):
    trainer, model, opt, _ = _fit(_poisoned_loss(4, kind))
    snapshot = {}

    def keep(optimizer, args, kwargs):
        snapshot.update({k: v.clone() for k, v in model.state_dict().items()})

    opt.register_step_post_hook(keep)
    with pytest.raises(tt.NonFiniteError, match="at step 4") as err:
        trainer.fit(make_loader(shuffle=False))
    assert err.value.step == 4
    for k, v in model.state_dict().items():
        assert torch.isfinite(v).all() and torch.equal(v, snapshot[k])  # unchanged since step 3


def test_skip_mode_skips_counts_and_holds_the_scheduler():
    trainer, model, opt, sched = _fit(_poisoned_loss(2), on_nonfinite="skip")
    result = trainer.fit(make_loader(shuffle=False))
    assert result.steps == 6 and result.skipped_steps == 1
    assert sched.last_epoch == 5  # 6 steps, one skipped: the schedule advanced 5 times
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_device_side_skip_protocol_with_a_fused_optimizer():
    """The GPU path, exercised on the CPU: the verdict goes to the fused kernel, no host read per step."""
    from turbotrain.speedups.fused_optimizer import make_fused
    from turbotrain.train.nonfinite import FiniteGuard

    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    assert make_fused(opt) == "fused"
    guard = FiniteGuard([opt], torch.device("cpu"), "stop")
    guard.on_host, guard.on_device_skip = False, True  # what a CUDA device with fused optimizers gets
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.ones(2, 8)).sum() * float("inf")
    loss.backward()
    assert guard.check(loss.detach(), step=7)  # no host decision: the kernel decides
    guard.arm([opt])
    opt.step()
    guard.disarm([opt])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the update was skipped
    assert not hasattr(opt, "found_inf")
    with pytest.raises(tt.NonFiniteError, match="at step 7"):
        guard.report()  # surfaced at the logging cadence


def test_ignore_mode_lets_the_nan_through_like_plain_pytorch():
    trainer, model, _, _ = _fit(_poisoned_loss(2), on_nonfinite="ignore")
    result = trainer.fit(make_loader(shuffle=False))
    assert result.skipped_steps == 0 and not all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("steps, bad", [(5, (3,)), (600, (2, 300, 599))])
def test_the_device_window_names_the_first_bad_step_and_counts_each_one(steps, bad):
    """The GPU path on the CPU: each step's kernel writes its own flag (no zeroing, no count per step);
    a read names the first bad step and counts every bad one, also past the first window's length."""
    from turbotrain.speedups.fused_optimizer import make_fused
    from turbotrain.train.nonfinite import WINDOW, FiniteGuard

    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    assert make_fused(opt) == "fused"
    guard = FiniteGuard([opt], torch.device("cpu"), "skip")
    guard.on_host, guard.on_device_skip = False, True
    first = 10
    for step in range(first, first + steps):
        opt.zero_grad()
        loss = model(torch.ones(2, 8)).sum() * (float("nan") if step - first in bad else 1.0)
        loss.backward()
        assert guard.check(loss.detach(), step)
        assert guard.found.item() == (1.0 if step - first in bad else 0.0)  # this step's own flag
    assert (steps > WINDOW) == (len(guard._slots) > WINDOW)  # grew rather than shared a flag
    assert guard.report() == len(bad)
    assert guard.report() == len(bad)  # read once: the window started over
    guard.mode = "stop"
    for step in (1000, 1001):
        opt.zero_grad()
        (model(torch.ones(2, 8)).sum() * float("inf")).backward()
        guard.check(None, step)
    with pytest.raises(tt.NonFiniteError, match="at step 1000"):
        guard.report()
