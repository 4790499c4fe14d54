import pytest
import torch
from tiny import make_loader, make_mlp

import turbotrain as tt
from turbotrain.data.prefetch import DeviceLoader


def test_cpu_runtime_hands_the_loader_through_untouched():
    rt = tt.prepare(make_mlp(), None, tt.Plan(device="cpu", device_prefetch=True))
    assert [n for n, _ in rt.skipped] == ["device_prefetch"]
    loader = make_loader()
    assert rt.device_batches(loader) is loader  # no wrapper, no per-batch cost on CPU


def test_device_loader_without_prefetch_moves_each_batch():
    moved = []
    loader = DeviceLoader([1, 2, 3], lambda b: moved.append(b) or b * 10, torch.device("cpu"), prefetch=True)
    assert not loader.prefetch  # prefetch is a CUDA-stream feature
    assert list(loader) == [10, 20, 30] and moved == [1, 2, 3]


@pytest.mark.gpu
def test_prefetch_yields_the_same_batches_on_cuda():
    rt = tt.prepare(make_mlp(), None, tt.Plan(device="cuda", device_prefetch=True, pin_memory=True))
    loader = make_loader(shuffle=False)
    got = [x.cpu() for x, _ in rt.device_batches(rt.rebuild_loader(loader))]
    want = [x for x, _ in loader]
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and len(got) == len(want)
