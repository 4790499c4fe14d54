import torch
import torch.nn.functional as F
from tiny import make_loader, make_mlp

import turbotrain as tt


def _grads_after_one_step(set_to_none):
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tt.Trainer(model, opt, F.cross_entropy, tt.Plan(device="cpu", set_to_none=set_to_none), max_steps=1,
               progress=False).fit(make_loader())
    return [p.grad for p in model.parameters()]


def test_set_to_none_drops_gradients():
    assert all(g is None for g in _grads_after_one_step(True))


def test_without_it_gradients_are_zero_tensors():
    grads = _grads_after_one_step(False)
    assert all(g is not None and not g.any() for g in grads)
    assert tt.prepare(make_mlp(), None, tt.Plan(set_to_none=False)).applied == ["set_to_none"]


class _CountingZeroGrad(torch.optim.SGD):
    calls = 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        type(self).calls += 1
        super().zero_grad(set_to_none)


def test_the_direct_drop_skips_torch_zero_grad_and_leaves_what_it_leaves(monkeypatch):
    from turbotrain.speedups.set_to_none import zero_grad

    model = make_mlp()
    opt = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.5}], lr=0.1)
    model(torch.ones(2, 8)).sum().backward()

    def no_profiler_range(*args, **kwargs):
        raise AssertionError("torch's zero_grad (and its profiler range) ran")

    monkeypatch.setattr(torch.autograd.profiler, "record_function", no_profiler_range)
    zero_grad(opt)
    assert all(p.grad is None for p in model.parameters())


class _Forwarding:
    """A wrapper that forwards to an optimizer through __getattr__ (no zero_grad of its own class)."""

    def __init__(self, opt):
        self.opt = opt

    def __getattr__(self, name):
        return getattr(self.opt, name)


def test_wrappers_and_instance_patches_go_through_their_own_zero_grad():
    from turbotrain.speedups.set_to_none import zero_grad

    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 8)).sum().backward()
    zero_grad(_Forwarding(opt))
    assert all(p.grad is None for p in model.parameters())
    calls = []
    opt.zero_grad = lambda set_to_none=True: calls.append(set_to_none)
    zero_grad(opt)
    assert calls == [True]


def test_an_optimizer_with_its_own_zero_grad_and_a_running_profiler_go_through_torch():
    from turbotrain.speedups.set_to_none import zero_grad

    model = make_mlp()
    opt = _CountingZeroGrad(model.parameters(), lr=0.1)
    model(torch.ones(2, 8)).sum().backward()
    zero_grad(opt)
    assert _CountingZeroGrad.calls == 1 and all(p.grad is None for p in model.parameters())
    # Under the profiler torch's zero_grad runs, so the trace keeps its label.
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 8)).sum().backward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        zero_grad(plain)
    assert any("zero_grad" in e.name for e in prof.events())
    assert all(p.grad is None for p in model.parameters())
