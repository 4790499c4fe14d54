from tiny import make_loader, make_mlp

import turbotrain as tt


def test_workers_survive_between_epochs():
    rt = tt.prepare(make_mlp(), None, tt.Plan(device="cpu", num_workers=1, persistent_workers=True))
    loader = rt.rebuild_loader(make_loader(n=16))
    assert loader.persistent_workers
    list(loader)
    first = loader._iterator  # the worker pool of epoch 1
    list(loader)
    assert loader._iterator is first


def test_dropped_when_the_loader_ends_up_without_workers():
    rt = tt.prepare(make_mlp(), None, tt.Plan(device="cpu", persistent_workers=True))
    loader = rt.rebuild_loader(make_loader(n=16, num_workers=0))
    assert loader.persistent_workers is False  # illegal without workers: not a crash
