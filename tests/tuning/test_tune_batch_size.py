"""The batch-size finder on a fake memory limit (and once for real, against a host memory budget)."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from turbotrain.plan import Plan
from turbotrain.data.transfer import resize_batch
from turbotrain.tuning.batch_size import find_batch_size, split_effective_batch

from tune_helpers import adamw, fake_trial, loss_fn, tiny_loader

MiB = 2**20


class FakeMemory:
    """Peak = 100 MiB + 1 MiB per sample; beyond ``oom_at`` samples the step runs out of memory."""

    def __init__(self, oom_at: int | None = None, fail_at: int | None = None):
        self.oom_at, self.fail_at = oom_at, fail_at
        self.sizes: list[int] = []

    def __call__(self, size: int):
        self.sizes.append(size)
        if self.fail_at is not None and size >= self.fail_at:
            return fake_trial(Plan(), 0.01, [], error="RuntimeError: shape mismatch")
        if self.oom_at is not None and size > self.oom_at:
            return fake_trial(Plan(), 0.01, [], error="OutOfMemoryError: CUDA out of memory. Tried to allocate")
        return fake_trial(Plan(), 0.01, [1.0, 1.0], peak=(100 + size) * MiB)


def _find(measure, batch_size=32, **kw):
    batch = (torch.zeros(batch_size, 4), torch.zeros(batch_size, dtype=torch.long))
    return find_batch_size(None, None, None, batch, Plan(device="cpu"), measure=measure, **kw)


def test_largest_multiple_of_8_under_the_limit_less_the_margin():
    # 500 MiB less 10% = 450 MiB usable: 350 samples fit at most, so 344 (a multiple of 8).
    measure = FakeMemory()
    result = _find(measure, memory_limit_bytes=500 * MiB, margin=0.1)
    assert result.batch_size == 344 and result.batch_size % 8 == 0
    assert result.peak_memory_bytes == (100 + 344) * MiB <= 450 * MiB
    assert measure.sizes[:4] == [32, 64, 128, 256]               # doubling from the loader's batch
    assert (512, (100 + 512) * MiB, "over 450 MiB") in result.tried  # then bisection below the first miss
    assert result.stopped_by == "352 does not fit"


def test_out_of_memory_errors_count_as_not_fitting():
    result = _find(FakeMemory(oom_at=200), memory_limit_bytes=10_000 * MiB)
    assert result.batch_size == 200
    assert any(outcome == "out of memory" for _, _, outcome in result.tried)


def test_a_batch_too_big_to_start_with_is_halved():
    measure = FakeMemory()
    result = _find(measure, batch_size=1024, memory_limit_bytes=300 * MiB, margin=0.0)
    assert measure.sizes[:3] == [1024, 512, 256]
    assert result.batch_size == 200


def test_nothing_fits_and_other_failures_are_actionable_errors():
    with pytest.raises(RuntimeError, match="even a batch of 8 does not fit"):
        _find(FakeMemory(), memory_limit_bytes=50 * MiB)
    with pytest.raises(RuntimeError, match="other than memory: RuntimeError: shape mismatch"):
        _find(FakeMemory(fail_at=0), memory_limit_bytes=500 * MiB)


def test_keeping_the_effective_batch_through_accumulation():
    result = _find(FakeMemory(), memory_limit_bytes=200 * MiB, margin=0.0, effective_batch_size=256)
    assert (result.batch_size, result.grad_accum_steps) == (64, 4) and result.effective_batch_size == 256
    assert split_effective_batch(256, 1000) == (256, 1)          # fits at once: unchanged
    assert split_effective_batch(100, 48) == (25, 4)             # exact divisor when no multiple of 8 divides
    assert split_effective_batch(96, 40) == (32, 3)


def test_max_batch_size_and_time_budget_stop_the_search():
    assert _find(FakeMemory(), memory_limit_bytes=10**6 * MiB, max_batch_size=128).stopped_by == "max_batch_size=128"

    class Clock:
        now = 0.0

        def __call__(self):
            return self.now
    clock = Clock()
    slow = FakeMemory()

    def timed(size):
        clock.now += size / 10                                   # 0.1 s per sample, all of it in the steps
        trial = slow(size)
        trial.step_times_s = [size / 10 / len(trial.step_times_s)] * len(trial.step_times_s)
        return trial
    result = _find(timed, memory_limit_bytes=10**6 * MiB, time_budget_s=20, clock=clock)
    assert result.stopped_by == "time budget" and result.batch_size == 64


def test_resize_batch_tiles_batch_tensors_only():
    x, y, mask = torch.arange(6.0).view(3, 2), torch.tensor([0, 1, 2]), torch.ones(5)
    out = resize_batch({"x": x, "y": [y], "mask": mask}, 8)
    assert out["x"].shape == (8, 2) and torch.equal(out["x"][3], x[0])
    assert out["y"][0].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert out["mask"] is mask                                   # not batch-shaped: left alone
    assert resize_batch((x, y), 2)[1].tolist() == [0, 1]


def test_real_cpu_run_against_a_host_memory_budget():
    """A real model whose activations grow with the batch, held to resident memory + 250 MiB."""
    from turbotrain.tuning.memory import release_host_memory, resident_bytes

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 8192), nn.ReLU(), nn.Linear(8192, 10))  # ~0.1 MiB a sample
    release_host_memory()
    limit = resident_bytes() + 250 * MiB
    batch = next(iter(tiny_loader()))
    result = find_batch_size(model, adamw, loss_fn, batch, Plan(device="cpu"), memory_limit_bytes=limit,
                             max_batch_size=4096, time_budget_s=60)
    assert result.batch_size % 8 == 0 and result.batch_size >= 8
    assert result.peak_memory_bytes <= limit * (1 - result.margin)
    # The search really hit the budget: a larger size was tried and did not fit.
    assert any(size > result.batch_size and outcome != "fits" for size, _, outcome in result.tried)


@pytest.mark.gpu
def test_gpu_out_of_memory_is_caught_and_memory_comes_back():
    model = nn.Sequential(nn.Linear(1024, 16384), nn.ReLU(), nn.Linear(16384, 10))
    batch = (torch.randn(64, 1024), torch.randint(0, 10, (64,)))
    # Earlier tests' cyclic garbage may still hold device memory; the finder collects it, so collect it first.
    gc.collect()
    before = torch.cuda.memory_allocated()
    # A few GiB of the card, whatever its size: on a 140 GiB H200 the doublings up to the whole card took
    # over 40 s; the allocator refuses past this cap with the same OutOfMemoryError a full card raises.
    fraction = min(1.0, 6 * 2**30 / torch.cuda.get_device_properties(0).total_memory)
    torch.cuda.set_per_process_memory_fraction(fraction)
    try:
        result = find_batch_size(model, adamw, loss_fn, batch, Plan(device="cuda"), max_batch_size=2**20,
                                 time_budget_s=300)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert any(outcome == "out of memory" for _, _, outcome in result.tried)
    assert result.batch_size % 8 == 0
    assert result.allocated_after == result.allocated_before == before
