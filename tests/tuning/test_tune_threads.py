"""The tuner times intra-op thread counts on the CPU and fits threads + workers into the usable cores."""

from __future__ import annotations

import dataclasses

from turbotrain.hardware import detect
from turbotrain.plan import Plan
from turbotrain.speedups.model_info import inspect_model
from turbotrain.tuning import api, tune_report
from turbotrain.tuning.candidates import build_candidates

from tune_helpers import adamw, fake_trial, loss_fn, tiny_loader, tiny_mlp

# Two usable cores (a quota on a 64-core host) and torch's pool sized to the host.
CONTAINER = dataclasses.replace(detect("cpu"), cpu_cores=2, affinity_cores=64, host_cores=64, cpu_quota=2.0,
                                intra_op_threads=64)


def test_thread_counts_are_timed_on_the_cpu_only():
    timed = {s.field: s.values for s in build_candidates(CONTAINER, inspect_model(tiny_mlp()), Plan()).timed}
    assert timed["intra_op_threads"] == (2, 1)
    gpu = dataclasses.replace(CONTAINER, device_type="cuda")
    left_out = dict(build_candidates(gpu, inspect_model(tiny_mlp()), Plan()).left_out)
    assert "CPU training" in left_out["cpu_threads"]


class _FourWorkers(list):
    """A loader's batches and its worker count, without starting four processes."""
    num_workers = 4


def _tune(monkeypatch, loader, faster_threads: int | None):
    monkeypatch.setattr(api, "detect", lambda device="auto": CONTAINER)

    def measure(plan, steps, warmup):
        fast = faster_threads is not None and plan.intra_op_threads == faster_threads
        return fake_trial(plan, 0.01 if fast else 0.05, [2.0, 1.5, 1.2], steps=steps)

    return tune_report(tiny_mlp(), loss_fn, loader, adamw, time_budget_s=30, include=("cpu_threads",),
                       find_num_workers=False, cache=False, verbose=False, measure=measure)


def test_a_faster_thread_count_is_kept_and_the_loaders_workers_are_fitted(monkeypatch):
    loader = _FourWorkers(tiny_loader())
    result = _tune(monkeypatch, loader, faster_threads=1)
    assert result.plan.intra_op_threads == 1
    assert result.plan.num_workers == 1                 # 4 workers on 2 cores: half of them
    assert result.plan.intra_op_threads + result.plan.num_workers <= CONTAINER.usable_cores


def test_without_a_timed_win_threads_still_fit_the_quota(monkeypatch):
    result = _tune(monkeypatch, tiny_loader(), faster_threads=None)
    assert result.search.plan.intra_op_threads is None  # nothing won the search
    assert result.plan.intra_op_threads == 2             # but 64 threads on a 2-core quota never fit
    assert result.plan.num_workers is None               # the loader's 0 workers already fit
