import dataclasses

import pytest
import torch
from tiny import make_loader, make_mlp

import turbotrain as tt
from turbotrain.hardware import detect
from turbotrain.measure import run_trial
from turbotrain.speedups import registry
from turbotrain.speedups.cpu_threads import fit_plan, fit_to_cores, set_intra_op_threads, thread_values
from turbotrain.speedups.model_info import inspect_model

CPU = detect("cpu")


def _other_than(threads: int) -> int:
    return 1 if threads != 1 else 2


def test_pure_function_sets_torch_threads_and_returns_the_old_count():
    before = torch.get_num_threads()
    target = _other_than(before)
    assert set_intra_op_threads(target) == before
    assert torch.get_num_threads() == target
    set_intra_op_threads(before)
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match=">= 1"):
        set_intra_op_threads(0)


def test_prepare_applies_the_plan_and_detect_sees_it():
    before = torch.get_num_threads()
    target = _other_than(before)
    try:
        rt = tt.prepare(make_mlp(), None, tt.Plan(device="cpu", intra_op_threads=target))
        assert "cpu_threads" in rt.applied and torch.get_num_threads() == target
        assert detect("cpu").intra_op_threads == target
    finally:
        torch.set_num_threads(before)


def test_a_trial_never_leaks_its_thread_count():
    before = torch.get_num_threads()
    target = _other_than(before)
    seen = []

    def step_fn(model, batch):
        seen.append(torch.get_num_threads())
        return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

    trial = run_trial(make_mlp(), lambda p: torch.optim.SGD(p, lr=0.1), None, list(make_loader(n=16, batch_size=8)),
                      tt.Plan(device="cpu", intra_op_threads=target), steps=2, warmup=1, step_fn=step_fn)
    assert trial.ok and set(seen) == {target}
    assert torch.get_num_threads() == before


def test_skipped_on_a_gpu():
    gpu = dataclasses.replace(CPU, device_type="cuda")
    entry = registry.get("cpu_threads")
    assert entry.requires(gpu, tt.Plan(intra_op_threads=2)) is not None
    assert entry.recommend(gpu, inspect_model(make_mlp())) is None
    assert entry.requires(CPU, tt.Plan(intra_op_threads=2)) is None


@pytest.mark.parametrize("usable, workers, expected", [
    (1, None, (1, None)), (1, 4, (1, 0)),
    (2, None, (2, None)), (2, 0, (2, 0)), (2, 4, (1, 1)),
    (8, None, (8, None)), (8, 2, (6, 2)), (8, 4, (4, 4)), (8, 16, (4, 4)),
])
def test_threads_and_workers_fit_the_usable_cores(usable, workers, expected):
    threads, fitted = fit_to_cores(usable, workers)
    assert (threads, fitted) == expected
    assert threads >= 1 and threads + (fitted or 0) <= usable
    assert fit_to_cores(usable, workers, threads=1)[0] == 1  # never more than asked


@pytest.mark.parametrize("usable", [1, 2, 8])
def test_fast_plan_fits_fake_hardware(monkeypatch, usable):
    # The host has 64 cores; the quota allows `usable` of them; torch sized its pool to the host.
    fake = dataclasses.replace(CPU, cpu_cores=usable, affinity_cores=64, host_cores=64, cpu_quota=float(usable),
                               intra_op_threads=64)
    monkeypatch.setattr("turbotrain.hardware.detect", lambda device="auto": fake)
    plan = tt.Plan.fast(make_mlp(), device="cpu")
    assert plan.intra_op_threads == usable
    # A count that already fits (OMP_NUM_THREADS=1, or torch's default on a quiet machine) is left alone.
    monkeypatch.setattr("turbotrain.hardware.detect",
                        lambda device="auto": dataclasses.replace(fake, intra_op_threads=1))
    assert tt.Plan.fast(make_mlp(), device="cpu").intra_op_threads is None
    # With the loader's 4 workers the tuner (and the doctor) fit both into the same cores.
    fitted = fit_plan(plan.replace(num_workers=4), usable, fake.intra_op_threads)
    assert fitted.intra_op_threads + fitted.num_workers <= usable
    assert fitted.num_workers == usable // 2 and fitted.intra_op_threads >= 1


def test_fit_plan_drops_persistence_with_the_last_worker_and_keeps_what_fits():
    plan = tt.Plan(num_workers=2, persistent_workers=True)
    one = fit_plan(plan, 1, 4)
    assert (one.intra_op_threads, one.num_workers, one.persistent_workers) == (1, 0, None)
    roomy = tt.Plan(intra_op_threads=4, num_workers=2)
    assert fit_plan(roomy, 16, 16) is roomy
    # The loader's own workers count when the plan keeps them.
    assert fit_plan(tt.Plan(), 2, 2, loader_workers=4) == tt.Plan(intra_op_threads=1, num_workers=1)


def test_tuner_values_leave_out_the_current_count():
    assert thread_values(2, 2) == (1,)
    assert thread_values(8, 8) == (4, 1)
    assert thread_values(1, 64) == (1,)
    assert thread_values(1, 1) == ()


def test_setup_applies_it_and_exports_name_the_line():
    from turbotrain.tuning.export import code_changes

    before = torch.get_num_threads()
    target = _other_than(before)
    try:
        tt.setup(make_mlp(), torch.optim.SGD(make_mlp().parameters(), lr=0.1), None,
                 tt.Plan(device="cpu", intra_op_threads=target))
        assert torch.get_num_threads() == target
    finally:
        torch.set_num_threads(before)
    assert f"torch.set_num_threads({target})" in "\n".join(code_changes(tt.Plan(intra_op_threads=target), "lightning"))
