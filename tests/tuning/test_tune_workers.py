"""The num_workers finder on a fake slow loader, a fast in-memory one, and faked timings."""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, Dataset

from turbotrain.tuning.workers import find_num_workers, worker_memory_estimate

from tune_helpers import tiny_loader


class SlowDataset(Dataset):
    """Each sample takes 10 ms to 'read' (a sleep: like storage, it needs no CPU)."""

    def __len__(self):
        return 512

    def __getitem__(self, i):
        time.sleep(0.010)
        return torch.full((8,), float(i)), i % 10


def test_a_slow_loader_gets_workers_with_persistence_and_no_pinning_on_cpu():
    loader = DataLoader(SlowDataset(), batch_size=4)
    result = find_num_workers(loader, device_type="cpu", max_workers=2, batches=10)
    assert [n for n, _ in result.tried][:2] == [0, 1]
    assert result.num_workers == 2, result.tried                 # two sleeping workers overlap their reads
    assert result.persistent_workers is True and result.pin_memory is False


def test_an_in_memory_loader_keeps_zero_workers():
    result = find_num_workers(tiny_loader(samples=2048, batch_size=32), device_type="cpu", max_workers=2)
    assert result.num_workers == 0, result.tried                 # process hand-off costs more than indexing
    assert result.persistent_workers is None


def _fake(rates):
    calls = []

    def time_loader(loader, batches, num_workers, **overrides):
        calls.append(num_workers)
        return rates[num_workers]
    return time_loader, calls


def test_stops_once_more_workers_no_longer_improve():
    fake, calls = _fake([100, 102, 180, 185, 186, 300, 400])
    result = find_num_workers(tiny_loader(), device_type="cpu", max_workers=6, time_loader_fn=fake)
    assert result.num_workers == 2 and calls == [0, 1, 2, 3, 4]   # 1 forgiven; 3 and 4 bring < 10%
    assert result.bound_by == "max_workers=6" and result.stopped_by.startswith("2 more worker count(s)")


def test_stops_when_the_loader_outpaces_training_and_respects_bounds():
    fake, calls = _fake([1000, 2000, 3000])
    result = find_num_workers(tiny_loader(), device_type="cpu", max_workers=2, needed_batches_per_s=100,
                              time_loader_fn=fake)
    assert result.num_workers == 0 and calls == [0] and "training consumes" in result.stopped_by

    fake, calls = _fake([100, 200, 300, 400])
    per_worker = worker_memory_estimate(next(iter(tiny_loader())))
    result = find_num_workers(tiny_loader(), device_type="cpu", memory_budget_bytes=int(1.5 * per_worker),
                              time_loader_fn=fake)
    assert result.bound == 1 and result.bound_by.startswith("memory") and calls == [0, 1]
    assert result.num_workers == 1


def test_a_loader_too_short_to_time_keeps_its_own_settings():
    def too_short(loader, **overrides):
        raise StopIteration
    result = find_num_workers(tiny_loader(), device_type="cpu", time_loader_fn=too_short)
    assert result.tried == [] and "too few batches" in result.stopped_by
    assert result.plan_changes() == {}


def test_the_time_budget_stops_it_before_a_count_that_would_end_past_it():
    """Each count here takes 4 s to time (ResNet-50's 150 MB host batches: the finder ran the tuner 30-47 s past
    its budget on an H200): with 10 s left it times two counts, not a third that would end at 12 s."""
    now = [0.0]
    rates = [100, 200, 300, 400, 500]

    def slow_timing(loader, batches, num_workers, **overrides):
        now[0] += 4.0
        return rates[num_workers]

    result = find_num_workers(tiny_loader(), device_type="cpu", max_workers=4, time_loader_fn=slow_timing,
                              time_budget_s=10.0, clock=lambda: now[0])
    assert [n for n, _ in result.tried] == [0, 1] and result.num_workers == 1
    assert result.stopped_by == "the time budget (10 s)" and now[0] <= 10.0
