"""GPU-only rules: low on the CPU, but they fire once the same run is seen as a CUDA run.

There is no GPU here, so the context of a real CPU run is given a CUDA ``Hardware`` (and, for the
copy rules, the host-to-device copies a GPU run would have recorded).
"""

from __future__ import annotations

import dataclasses

import pytest

from turbotrain.doctor import DoctorOptions
from turbotrain.doctor.analysis.context import build_context
from turbotrain.doctor.record.recorder import Recorder
from turbotrain.doctor.record.tallies import Tally
from turbotrain.doctor.rules import evaluate
from turbotrain.doctor.record.runner import run_script
from turbotrain.doctor.sites import Site
from turbotrain.hardware import detect

from doctor_helpers import script

pytestmark = pytest.mark.one_core  # one process, one thread: run beside one other such test (tests/conftest.py)


DEFAULTS = DoctorOptions()


def fake_cuda(gpus: int = 1):
    return dataclasses.replace(detect("cpu"), device_type="cuda", device_name="NVIDIA H100 (faked)",
                               device_count=gpus, capability=(9, 0), bf16=True, fp16=True, tf32=True, fp8=True,
                               cudnn=True)


_CTX: dict = {}


def cpu_context(name: str):
    if name not in _CTX:
        # The doctor's own window: four steps right after the first read the settling steps, and one slow batch
        # there weighs a quarter of the mean.
        recorder = Recorder(measure=DEFAULTS.steps, warmup=DEFAULTS.warmup, profile=1)
        run_script(script(name), [], recorder)
        _CTX[name] = build_context(recorder.recording(), recorder.live_objects(), str(script(name)))
    return _CTX[name]


def severities(findings, rule):
    return [f.severity for f in findings if f.rule == rule]


def test_gpu_habits_fire_on_a_gpu():
    ctx = cpu_context("gpu_habits")
    cpu = evaluate(ctx)
    gpu = evaluate(ctx.replace(hw=fake_cuda(), device="cuda"))
    for rule in ("empty-cache-in-loop", "cudnn-benchmark-off"):
        assert severities(cpu, rule) == ["low"], rule
        assert "medium" in severities(gpu, rule), (rule, severities(gpu, rule))


def test_copy_rules_fire_with_a_gpu_run_s_copies():
    ctx = cpu_context("gpu_habits")
    # What a CUDA run records at the `images.to(device)` line: pageable, blocking copies every step.
    lines = enumerate(script("gpu_habits").read_text().splitlines(), 1)
    line = next(n for n, t in lines if "doctor: non-blocking" in t)
    tally = Tally()
    for step in ctx.measured_steps:
        tally.add(step, 0.004, 32 * 3 * 16 * 16 * 4)
    tally.detail.update(non_blocking=False, pinned=False)
    shares = dict(ctx.breakdown.shares, host_to_device=0.3, compute=0.5)
    site = Site(ctx.script, line)
    gpu = ctx.replace(hw=fake_cuda(), device="cuda", tallies={**ctx.tallies, ("h2d", site): tally.freeze("h2d", site)},
                      breakdown=dataclasses.replace(ctx.breakdown, shares=shares))
    found = evaluate(gpu)
    assert "high" in severities(found, "pin-memory")
    blocking = [f for f in found if f.rule == "non-blocking" and f.source == "runtime"]
    assert blocking and blocking[0].site.line == line and blocking[0].severity == "high"
    assert "non-blocking" not in {f.rule for f in evaluate(ctx) if f.source == "runtime"}


def test_odd_vocabulary_matters_with_tensor_cores():
    ctx = cpu_context("odd_vocab")
    assert set(severities(evaluate(ctx), "dims-not-multiple-of-8")) == {"low"}
    gpu = evaluate(ctx.replace(hw=fake_cuda(), device="cuda"))
    assert "medium" in severities(gpu, "dims-not-multiple-of-8")


def test_data_parallel_is_high_on_several_gpus():
    ctx = cpu_context("data_parallel")
    assert severities(evaluate(ctx), "data-parallel") == ["low"]
    assert severities(evaluate(ctx.replace(hw=fake_cuda(gpus=4), device="cuda")), "data-parallel") == ["high"]
    assert severities(evaluate(ctx.replace(hw=fake_cuda(gpus=1), device="cuda")), "data-parallel") == ["medium"]


def test_accumulation_syncs_matter_with_several_processes():
    ctx = cpu_context("accumulation_ddp")
    assert severities(evaluate(ctx), "accumulation-syncs") == ["low"]
    assert severities(evaluate(ctx.replace(world_size=4)), "accumulation-syncs") == ["medium"]


def test_the_clean_script_stays_clean_on_a_gpu_too():
    ctx = cpu_context("clean")

    def serious(findings) -> dict[str, str]:
        return {f.rule: f.message for f in findings if f.severity in ("high", "medium")}

    on_cpu, on_gpu = serious(evaluate(ctx)), serious(evaluate(ctx.replace(hw=fake_cuda(), device="cuda")))
    # On a GPU the one thing a CPU script lacks is mixed precision (estimated until a GPU measures it). What the CPU
    # run measured itself (its data wait, its threads) is rated as on the CPU: test_corpus.py holds the clean
    # script to no serious finding there, over the doctor's own runs.
    waits = [round(s.categories()["data_loading"] * 1e3, 3) for s in ctx.step_records]
    assert set(on_gpu) - set(on_cpu) <= {"no-mixed-precision"}, (on_gpu, on_cpu, waits)
