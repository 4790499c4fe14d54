import pytest
import torch
from tiny import make_mlp

import turbotrain as tt
from turbotrain.data.transfer import move_batch


def test_move_batch_passes_non_blocking_to_every_tensor(monkeypatch):
    seen = []
    real_to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("non_blocking"))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    batch = {"x": torch.ones(2), "pair": (torch.zeros(1), [torch.ones(3)]), "name": "keep"}
    moved = move_batch(batch, torch.device("cpu"), non_blocking=True)
    assert seen == [True, True, True] and moved["name"] == "keep"


def test_skipped_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    rt = tt.prepare(make_mlp(), None, tt.Plan(device="cpu", non_blocking=True))
    assert [n for n, _ in rt.skipped] == ["non_blocking"] and not rt.non_blocking


@pytest.mark.gpu
def test_non_blocking_copy_on_cuda():
    rt = tt.prepare(make_mlp(), None, tt.Plan(device="cuda", non_blocking=True))
    x = rt.to_device(torch.ones(4).pin_memory())
    torch.cuda.synchronize()
    assert x.is_cuda and x.sum().item() == 4
