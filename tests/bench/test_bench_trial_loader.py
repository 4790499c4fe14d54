"""run_trial(loader=...): the data path is part of what is timed, under the plan's loader switches."""

import torch
from torch.utils.data import DataLoader, TensorDataset

from turbotrain.measure import run_trial
from turbotrain.plan import Plan


class CountingDataset(TensorDataset):
    """Counts item reads, so a test can see that the loader really fed the steps."""

    def __init__(self, *tensors):
        super().__init__(*tensors)
        self.reads = 0

    def __getitem__(self, index):
        self.reads += 1
        return super().__getitem__(index)


def _setup(samples=40):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 8, generator=g)
    data = CountingDataset(x, x[:, :3].argmax(1))
    model = torch.nn.Linear(8, 3)
    return model, data, lambda p: torch.optim.SGD(p, lr=0.1), torch.nn.functional.cross_entropy


def test_loader_batches_feed_every_step_and_restart_when_exhausted():
    model, data, opt_fn, loss_fn = _setup(samples=40)
    loader = DataLoader(data, batch_size=10, shuffle=False)
    trial = run_trial(model, opt_fn, loss_fn, [], Plan(device="cpu"), steps=6, warmup=1, loader=loader)
    assert trial.ok, trial.error
    # 7 steps of 10 samples from a 40-sample loader: it ran out once and started over.
    assert data.reads == 70
    assert trial.samples_per_step == 10
    assert len(trial.losses) == 7


def test_plan_batch_size_and_accumulation_apply_to_the_loader():
    model, data, opt_fn, loss_fn = _setup(samples=64)
    loader = DataLoader(data, batch_size=10, shuffle=False)
    plan = Plan(device="cpu", batch_size=8, grad_accum_steps=2)
    trial = run_trial(model, opt_fn, loss_fn, [], plan, steps=2, warmup=1, loader=loader)
    assert trial.ok, trial.error
    assert trial.samples_per_step == 16          # the rebuilt loader's 8, twice per optimizer step
    assert data.reads == 3 * 16


def test_an_empty_loader_is_an_error_not_a_hang():
    model, data, opt_fn, loss_fn = _setup(samples=5)
    loader = DataLoader(data, batch_size=10, drop_last=True)
    trial = run_trial(model, opt_fn, loss_fn, [], Plan(device="cpu"), steps=2, warmup=1, loader=loader)
    assert not trial.ok and "no batches" in trial.error
