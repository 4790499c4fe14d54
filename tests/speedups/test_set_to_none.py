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
