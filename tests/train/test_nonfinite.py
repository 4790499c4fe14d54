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
