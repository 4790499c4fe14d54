"""Each what-if kind's result is typed; its JSON in the report is the stable surface it has always been: the
same keys, in the same order, with the same values."""

from __future__ import annotations

import dataclasses
import json

import pytest

from turbotrain.doctor.findings import Finding, Fix
from turbotrain.doctor.results import (AttentionResult, BatchResult, EvalGradResult, Judgement, LoaderResult,
                                       PlanResult, ThreadSetting, ThreadsResult)
from turbotrain.measure import Comparison

JUDGED = Judgement(ratio=1.234, noise=0.05, verdict="faster")


def _same(result, expected: dict) -> None:
    got = result.to_dict()
    assert list(got.items()) == list(expected.items())
    assert json.dumps(got) == json.dumps(expected)


def test_a_plan_result_in_process():
    result = PlanResult(changes={"precision": "bf16-mixed"}, steps=10, losses_finite=True, rounds=(1.2, 1.25),
                        candidate_ms=3.5, judgement=JUDGED)
    _same(result, {"kind": "plan", "changes": {"precision": "bf16-mixed"}, "steps": 10, "losses_finite": True,
                   "rounds": [1.2, 1.25], "candidate_ms": 3.5, "ratio": 1.234, "noise": 0.05, "verdict": "faster"})


def test_a_plan_result_re_timed_in_fresh_processes_and_compiled():
    fresh = PlanResult(changes={"fused_optimizer": True}, steps=8, losses_finite=True, rounds=(1.1, 1.2, 1.3),
                       page_faults_per_step=900, timed_in="fresh processes", in_process_rounds=(1.9, 1.8),
                       candidate_ms=2.0, judgement=JUDGED)
    _same(fresh, {"kind": "plan", "changes": {"fused_optimizer": True}, "steps": 8, "losses_finite": True,
                  "page_faults_per_step": 900, "timed_in": "fresh processes", "in_process_rounds": [1.9, 1.8],
                  "rounds": [1.1, 1.2, 1.3], "candidate_ms": 2.0, "ratio": 1.234, "noise": 0.05, "verdict": "faster"})
    failed = dataclasses.replace(fresh, timed_in="this process", in_process_rounds=None)
    assert "in_process_rounds" not in failed.to_dict() and failed.to_dict()["timed_in"] == "this process"
    compiled = PlanResult(changes={"compile": True}, steps=3, losses_finite=False, rounds=(0.9,), compile_s=12.34,
                          judgement=JUDGED)
    _same(compiled, {"kind": "plan", "changes": {"compile": True}, "steps": 3, "losses_finite": False,
                     "rounds": [0.9], "compile_s": 12.34, "ratio": 1.234, "noise": 0.05, "verdict": "faster"})


def test_a_batch_result():
    result = BatchResult(batch_size=1, candidate_batch_size=8, rounds=(2.0, 2.1), model_rounds=(5.0, 5.2),
                         loader_samples_ratio=1.1, loader="timed at batch_size 1 and 8", baseline_samples_per_s=100.0,
                         candidate_samples_per_s=210.5, judgement=JUDGED)
    _same(result, {"kind": "batch", "batch_size": 1, "candidate_batch_size": 8, "rounds": [2.0, 2.1],
                   "model_rounds": [5.0, 5.2], "loader_samples_ratio": 1.1, "loader": "timed at batch_size 1 and 8",
                   "baseline_samples_per_s": 100.0, "candidate_samples_per_s": 210.5, "ratio": 1.234, "noise": 0.05,
                   "verdict": "faster"})


def test_a_loader_result_projected_then_verified():
    projected = LoaderResult(batches_per_s={0: 10.5, 2: 30.25}, best_num_workers=2, projected_step_ms=33.0,
                             current_projected_step_ms=95.0, step_ms=100.0, pair_ratio=2.879, pair_rounds=1)
    expected = {"kind": "num_workers", "batches_per_s": {"0": 10.5, "2": 30.25}, "best_num_workers": 2,
                "projected_step_ms": 33.0, "current_projected_step_ms": 95.0, "step_ms": 100.0, "pair_ratio": 2.879,
                "pair_rounds": 1}
    _same(projected, expected)
    assert projected.verdict is None and projected.ratio is None
    verified = dataclasses.replace(projected, rounds=(1.5, 1.6), baseline_ms=90.0, candidate_ms=60.0,
                                   judgement=JUDGED)
    _same(verified, {**expected, "rounds": [1.5, 1.6], "baseline_ms": 90.0, "candidate_ms": 60.0, "ratio": 1.234,
                     "noise": 0.05, "verdict": "faster"})


def test_a_threads_result():
    result = ThreadsResult(now=ThreadSetting(4, 2), tried=((1, 2), (1, 0)), candidate=ThreadSetting(1, 0),
                           rounds=(3.0, 3.1), baseline_ms=50.0, candidate_ms=16.0, judgement=JUDGED)
    _same(result, {"kind": "threads", "now": {"threads": 4, "workers": 2}, "tried": [(1, 2), (1, 0)],
                   "candidate": {"threads": 1, "workers": 0}, "rounds": [3.0, 3.1], "baseline_ms": 50.0,
                   "candidate_ms": 16.0, "ratio": 1.234, "noise": 0.05, "verdict": "faster"})


def test_the_single_comparisons():
    _same(EvalGradResult(forward_ms_with_grad=2.0, forward_ms_inference_mode=1.5, pair_ratio=1.333, pair_rounds=2),
          {"kind": "eval_grad", "forward_ms_with_grad": 2.0, "forward_ms_inference_mode": 1.5, "pair_ratio": 1.333,
           "pair_rounds": 2})
    _same(AttentionResult(q_shape=(4, 2, 64, 16), keys=64, causal=True, manual_ms=3.0, sdpa_ms=1.0,
                          calls_per_step=2.0, pair_ratio=3.0, pair_rounds=2),
          {"kind": "attention", "q_shape": [4, 2, 64, 16], "keys": 64, "causal": True, "manual_ms": 3.0,
           "sdpa_ms": 1.0, "calls_per_step": 2.0, "pair_ratio": 3.0, "pair_rounds": 2})


def test_a_judgement_is_rounded_as_the_report_shows_it():
    result = EvalGradResult(forward_ms_with_grad=2.0, forward_ms_inference_mode=1.5, pair_ratio=1.333, pair_rounds=2)
    judged = result.judged(Comparison(speedup=1.23456, noise=0.04321, verdict="within noise"))
    assert (judged.ratio, judged.noise, judged.verdict) == (1.235, 0.043, "within noise")
    assert result.judgement is None  # results are frozen: judging makes a new one
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.pair_ratio = 2.0


def test_a_finding_carries_its_result_as_json():
    f = Finding(rule="grad-in-validation", message="m", fix=Fix(pytorch="inference_mode"))
    assert "what_if" not in f.to_dict()
    f.what_if = EvalGradResult(forward_ms_with_grad=2.0, forward_ms_inference_mode=1.5, pair_ratio=1.333,
                               pair_rounds=2)
    assert f.to_dict()["what_if"] == f.what_if.to_dict()
    json.dumps(f.to_dict())
