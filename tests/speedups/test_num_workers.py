import torch
from tiny import make_loader, make_mlp

import turbotrain as tt


def test_worker_loader_yields_the_same_batches_in_the_same_order():
    base = make_loader(n=40, batch_size=8, seed=5)
    rt = tt.prepare(make_mlp(), None, tt.Plan(device="cpu", num_workers=2))
    workers = rt.rebuild_loader(make_loader(n=40, batch_size=8, seed=5))
    assert workers.num_workers == 2
    for (a, _), (b, _) in zip(base, workers, strict=True):
        assert torch.equal(a, b)


def test_none_keeps_the_loader():
    rt = tt.prepare(make_mlp(), None, tt.Plan(device="cpu"))
    loader = make_loader(num_workers=0)
    assert rt.rebuild_loader(loader) is loader
