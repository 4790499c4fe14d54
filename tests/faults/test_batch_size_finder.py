"""The batch-size finder under a simulated memory limit: it leaves no trace, and its pick fits.

The simulated device: a step at batch B needs the weights, their gradients and the
optimizer's state (which exists only after the first optimizer step, as with Adam) plus
activations proportional to B; above the limit the forward raises torch.OutOfMemoryError,
and the meter's peak is what the finder reads as the peak memory. Peers' finders fail here
by measuring a step without the optimizer's state, or by picking the first size that did
not fit; a run at the picked size must then stay under the limit.
"""

import copy
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from faultharness import assert_same
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import turbotrain as tt
from turbotrain.train import rng

batch_size = pytest.importorskip("turbotrain.tuning.batch_size", reason="needs turbotrain.tuning (issue 4)")

MiB = 2**20


class SimulatedMemory:
    """A device with ``limit`` bytes: static state plus ``per_sample`` bytes of activations per sample."""

    def __init__(self, limit: int, per_sample: int):
        self.limit, self.per_sample = limit, per_sample
        self.optimizers: list[torch.optim.Optimizer] = []
        self.peak = 0

    def __deepcopy__(self, memo):
        return self  # shared by the finder's deep copies of the model: one device

    def reset(self) -> None:
        self.peak = 0

    def step_bytes(self, module: nn.Module, batch: int) -> int:
        params = list(module.parameters())
        weights = sum(p.numel() * p.element_size() for p in params)
        state = sum(t.numel() * t.element_size() for opt in self.optimizers for p in params
                    for t in opt.state.get(p, {}).values() if torch.is_tensor(t))
        return 2 * weights + state + self.per_sample * batch  # weights + gradients + optimizer + activations

    def allocate(self, module: nn.Module, batch: int) -> None:
        need = self.step_bytes(module, batch)
        if need > self.limit:
            raise torch.OutOfMemoryError(f"simulated: tried to allocate {need / MiB:.1f} MiB of {self.limit / MiB:.1f}")
        self.peak = max(self.peak, need)


class Metered(nn.Module):
    def __init__(self, memory: SimulatedMemory):
        super().__init__()
        self.memory = memory
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 10))

    def forward(self, x):
        self.memory.allocate(self, x.shape[0])
        return self.net(x)


@pytest.fixture
def device(monkeypatch):
    """A 48 MiB device; the finder's peak-memory reading is the simulated one."""
    import turbotrain.measure as measure

    memory = SimulatedMemory(limit=48 * MiB, per_sample=96 * 1024)
    monkeypatch.setattr(measure, "peak_host_memory", lambda: memory.peak)
    monkeypatch.setattr(measure, "_reset_host_peak", memory.reset)
    return memory


def _setup(memory):
    torch.manual_seed(0)
    model = Metered(memory)

    def optimizer_fn(params):
        opt = torch.optim.AdamW(params, lr=1e-3)
        memory.optimizers.append(opt)
        return opt

    optimizer = optimizer_fn(model.parameters())
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(1))
    data = TensorDataset(x, torch.randint(0, 10, (512,), generator=torch.Generator().manual_seed(2)))
    F.cross_entropy(model(x[:16]), data.tensors[1][:16]).backward()
    optimizer.step()  # the user's optimizer has state: the finder must leave it alone
    optimizer.zero_grad()
    return model, optimizer, optimizer_fn, data


@pytest.mark.parametrize("margin", [0.1, 0.25])
def test_finder_restores_everything_and_its_pick_fits_under_the_limit(device, margin):
    model, optimizer, optimizer_fn, data = _setup(device)
    random.seed(5)
    np.random.seed(5)
    before = {"model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict()),
              "rng": rng.capture()}
    training, flags = model.training, [p.requires_grad for p in model.parameters()]

    found = batch_size.find_batch_size(model, optimizer_fn, F.cross_entropy, (data.tensors[0][:16],
                                       data.tensors[1][:16]), tt.Plan(device="cpu"), max_batch_size=512,
                                       memory_limit_bytes=device.limit, margin=margin)

    # Nothing the finder touched is left changed: weights, optimizer state, every RNG, modes.
    assert_same(model.state_dict(), before["model"], "model")
    assert_same(optimizer.state_dict(), before["optimizer"], "optimizer")
    assert_same(rng.capture(), before["rng"], "rng")
    assert model.training == training and [p.requires_grad for p in model.parameters()] == flags
    assert all(p.grad is None for p in model.parameters())

    # Its pick: a multiple of 8, within the margin, and the next multiple of 8 would not be.
    usable = device.limit * (1 - margin)
    b = found.batch_size
    assert b % 8 == 0 and device.step_bytes(model, b) <= usable < device.step_bytes(model, b + 8)
    print(f"picked {b} (margin {margin}): tried {[(s, o) for s, _, o in found.tried]}")

    # A real run at that size, optimizer state included, stays under the limit.
    device.reset()
    loader = DataLoader(data, batch_size=b, shuffle=True, drop_last=True)
    tt.Trainer(model, optimizer, F.cross_entropy, plan=tt.Plan(device="cpu"), max_steps=6, progress=False).fit(loader)
    assert 0 < device.peak <= device.limit


def test_the_simulated_device_does_run_out_of_memory(device):
    """The limit is real for the run: one size step above the pick fails the way a GPU would."""
    model, optimizer, optimizer_fn, data = _setup(device)
    found = batch_size.find_batch_size(model, optimizer_fn, F.cross_entropy, (data.tensors[0][:16],
                                       data.tensors[1][:16]), tt.Plan(device="cpu"), max_batch_size=512,
                                       memory_limit_bytes=device.limit, margin=0.0)
    too_big = found.batch_size + 8
    assert device.step_bytes(model, too_big) > device.limit
    loader = DataLoader(data, batch_size=too_big, drop_last=True)
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        tt.Trainer(model, optimizer, F.cross_entropy, plan=tt.Plan(device="cpu"), max_steps=2,
                   progress=False).fit(loader)
