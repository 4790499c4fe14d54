import pytest
import torch
from tiny import make_loader, make_mlp

import turbotrain as tt
from turbotrain.data.loader import rebuild_loader


def test_rebuilt_loader_pins_and_keeps_everything_else():
    loader = make_loader(batch_size=4, drop_last=True)
    pinned = rebuild_loader(loader, pin_memory=True)
    assert pinned.pin_memory and pinned.batch_size == 4 and pinned.drop_last and pinned.generator is loader.generator
    assert pinned.dataset is loader.dataset and pinned.sampler is loader.sampler


def test_skipped_on_cpu_and_loader_left_alone():
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    rt = tt.prepare(make_mlp(), None, tt.Plan(device="cpu", pin_memory=True))
    assert [n for n, _ in rt.skipped] == ["pin_memory"]
    loader = make_loader()
    assert rt.rebuild_loader(loader) is loader


@pytest.mark.gpu
def test_pinned_batches_on_cuda():
    rt = tt.prepare(make_mlp(), None, tt.Plan(device="cuda", pin_memory=True))
    x, _ = next(iter(rt.rebuild_loader(make_loader())))
    assert x.is_pinned()
