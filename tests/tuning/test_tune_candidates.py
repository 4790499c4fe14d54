"""Candidates come from the registry, filtered by the hardware's and the model's needs."""

from __future__ import annotations

import dataclasses

import pytest

from turbotrain.bench.models import ResNetCNN
from turbotrain.hardware import detect
from turbotrain.plan import Plan
from turbotrain.speedups.model_info import inspect_model
from turbotrain.speedups.registry import all_speedups
from turbotrain.tuning.candidates import FINDER_FIELDS, build_candidates

from tune_helpers import tiny_mlp

CPU = detect("cpu")
# An Ampere-class GPU as the registry's `requires` checks see it (no device needed).
AMPERE = dataclasses.replace(CPU, device_type="cuda", device_name="fake A100", capability=(8, 0), bf16=True,
                             fp16=True, tf32=True, cudnn=True)


def _timed(cands) -> dict[str, tuple]:
    return {s.field: s.values for s in cands.timed}


def test_every_registry_entry_is_timed_found_ruled_or_left_out_with_a_reason():
    cands = build_candidates(CPU, inspect_model(ResNetCNN()), Plan())
    seen = {s.name for s in cands.timed} | {name for name, _ in cands.left_out}
    seen |= {e.name for e in all_speedups() if e.field in cands.by_rule or e.field in FINDER_FIELDS}
    assert seen == {e.name for e in all_speedups()}
    assert all(why for _, why in cands.left_out)


def test_cpu_mlp_gets_no_conv_switches_and_no_gpu_only_ones():
    cands = build_candidates(CPU, inspect_model(tiny_mlp()), Plan())
    timed = _timed(cands)
    assert "channels_last" not in timed and "cudnn_benchmark" not in timed and "drop_conv_bias" not in timed
    assert timed["precision"] == ("bf16-mixed",)          # fp16-mixed needs CUDA (the registry says why)
    assert timed["fused_optimizer"] == (True,)
    reasons = dict(cands.left_out)
    assert "Ampere" in reasons["tf32"]
    assert "convolution" in reasons["channels_last"]
    assert cands.by_rule == {}                              # no host-to-device copy on the CPU


def test_conv_net_gets_layout_and_bias_switches():
    timed = _timed(build_candidates(CPU, inspect_model(ResNetCNN()), Plan()))
    assert timed["channels_last"] == (True,)
    assert timed["drop_conv_bias"] == (True,)


def test_gpu_hardware_opens_fp16_tf32_compile_modes_and_copy_rules():
    cands = build_candidates(AMPERE, inspect_model(ResNetCNN()), Plan())
    timed = _timed(cands)
    assert timed["precision"] == ("bf16-mixed", "fp16-mixed")
    assert timed["tf32"] == (True,) and timed["cudnn_benchmark"] == (True,)
    assert timed["compile"][0] is True and "reduce-overhead" in timed["compile"]
    assert cands.by_rule == {"non_blocking": True, "device_prefetch": True}
    compile_switch = next(s for s in cands.timed if s.field == "compile")
    assert compile_switch.expensive   # tried after the cheap switches, within the budget


def test_include_exclude_and_unknown_names():
    cands = build_candidates(CPU, inspect_model(tiny_mlp()), Plan(), exclude=("compile",))
    assert "compile" not in _timed(cands)
    assert ("compile", "excluded by the caller") in cands.left_out
    only = build_candidates(CPU, inspect_model(tiny_mlp()), Plan(), include=("precision",))
    assert list(_timed(only)) == ["precision"]
    with pytest.raises(ValueError, match="unknown speed-up name.*'complie'"):
        build_candidates(CPU, inspect_model(tiny_mlp()), Plan(), exclude=("complie",))
