"""Which plans the bench measures on which hardware, and the reasons for the others."""

import dataclasses
import sys

from turbotrain.bench.ablation import LOADER, RESIDENT, candidates, tuned_candidate
from turbotrain.bench.workloads import get_workload
from turbotrain.hardware import detect
from turbotrain.plan import Plan
from turbotrain.speedups.registry import all_speedups


def _rows(name, hw, **kw):
    wl = get_workload(name)
    model, _ = wl.build()
    return wl, model, {c.label: c for c in candidates(wl, model, hw, device="cpu", **kw)}


def _cuda_like(hw):
    # What the registry's hardware checks see on an Ampere GPU; only the candidate list is built.
    return dataclasses.replace(hw, device_type="cuda", device_name="NVIDIA A100-SXM4-80GB", capability=(8, 0),
                               bf16=True, fp16=True, tf32=True, cudnn=True)


def test_cpu_skips_gpu_only_switches_with_the_hardware_reason():
    hw = detect("cpu")
    _, _, rows = _rows("cnn", hw)
    for name in ("cudnn_benchmark", "tf32", "pin_memory", "non_blocking", "device_prefetch"):
        plan = rows[name].plan
        reasons = {f"{e.name}: {e.requires(hw, plan)}" for e in all_speedups()
                   if e.active(plan) and e.requires(hw, plan)}
        assert not rows[name].measured and rows[name].skip in reasons
    assert rows["channels_last"].measured and rows["channels_last"].path == RESIDENT
    assert "naive (data path)" not in rows   # nothing runs on the data path, so no baseline for it


def test_data_path_switches_get_their_own_baseline_on_a_gpu():
    _, _, rows = _rows("cnn", _cuda_like(detect("cpu")))
    for name in ("pin_memory", "non_blocking", "device_prefetch"):
        assert rows[name].measured and rows[name].path == LOADER
    assert rows["naive (data path)"].path == LOADER and rows["naive (data path)"].plan == Plan(device="cpu")
    assert rows["fast (data path)"].plan == rows["fast"].plan
    assert rows["tf32"].measured and rows["cudnn_benchmark"].measured


def test_compile_rows_can_be_left_out():
    _, _, rows = _rows("cnn", detect("cpu"), compile_ok=False)
    assert "compile" in rows and not rows["compile"].measured
    fast = rows["fast (no compile)"]
    assert fast.plan.compile is False and "compile left out" in fast.note


def test_a_tip_the_naive_plan_already_has_is_priced_by_turning_it_off():
    _, _, rows = _rows("mlp", detect("cpu"))
    row = rows["set_to_none off"]
    assert row.inverse and row.plan.set_to_none is False


def test_a_bench_change_that_changes_nothing_is_skipped():
    wl, model, _ = _rows("cnn", detect("cpu"))
    for batch in (128, 256):  # the batch_size entry asks for 128: the same batch, or a smaller one
        wl = dataclasses.replace(wl, batch_size=batch)
        rows = {c.label: c for c in candidates(wl, model, detect("cpu"), device="cpu")}
        assert f"no larger batch: the cnn workload already uses batch_size {batch}" in rows["batch_size"].skip
    wl = dataclasses.replace(wl, batch_size=64)
    assert {c.label: c for c in candidates(wl, model, detect("cpu"), device="cpu")}["batch_size"].measured


def test_tuned_row_uses_the_tuner_or_says_why_not(monkeypatch):
    wl, model, _ = _rows("mlp", detect("cpu"))
    seen = {}

    def fake_tune(m, loss_fn, loader, optimizer_fn, time_budget_s):    # the stable surface only
        seen["budget"] = time_budget_s
        return Plan(fused_optimizer=True)

    tuned = tuned_candidate(wl, model, "cpu", 7, tune_fn=fake_tune)
    assert tuned.measured and tuned.plan == Plan(device="cpu", fused_optimizer=True) and seen["budget"] == 7

    def tune_with_options(m, loss_fn, loader, optimizer_fn, time_budget_s=120.0, **options):
        seen["options"] = options
        return Plan()

    tuned_candidate(wl, model, "cpu", 7, tune_fn=tune_with_options, compile_ok=False)
    assert seen["options"] == {"verbose": False, "exclude": ("compile",)}

    monkeypatch.setitem(sys.modules, "turbotrain.tuning", None)   # as if the tuner were not installed
    missing = tuned_candidate(wl, model, "cpu", 7)
    assert not missing.measured and "turbotrain.tuning is not available" in missing.skip

    def broken_tune(*args, **kwargs):
        raise RuntimeError("out of ideas")

    failed = tuned_candidate(wl, model, "cpu", 7, tune_fn=broken_tune)
    assert not failed.measured and "out of ideas" in failed.skip


def test_tuned_row_from_the_real_tuner():
    """The bench's tuned row runs the real tt.tune (not a stand-in) and gets a plan it can train."""
    wl, model, _ = _rows("mlp", detect("cpu"))
    tuned = tuned_candidate(wl, model, "cpu", 8, compile_ok=False)
    assert tuned.measured, tuned.skip
    assert tuned.plan.device == "cpu" and tuned.plan.compile is False
    assert "tuned within 8 s" in tuned.note


def test_without_the_ablation_only_naive_and_fast_are_measured_on_each_path():
    """`--no-ablation` (the GPU check's short run): every entry alone is listed with the reason, unmeasured;
    naive and fast keep their rows on both paths."""
    _, _, full = _rows("cnn", _cuda_like(detect("cpu")))
    _, _, rows = _rows("cnn", _cuda_like(detect("cpu")), ablation=False)
    assert rows.keys() == full.keys()
    measured = {label for label, c in rows.items() if c.measured}
    assert measured == {"naive", "fast", "naive (data path)", "fast (data path)"}
    assert all("--no-ablation" in c.skip for label, c in rows.items() if full[label].measured and label not in measured)
