"""One vocabulary: every catalogue rule exists, and the registry's doctor_rules are rules the doctor has."""

from __future__ import annotations

from turbotrain.doctor.rules import RULE_IDS, RULES, _load
from turbotrain.speedups.registry import all_speedups

CATALOGUE = {
    "num-workers", "persistent-workers", "pin-memory", "non-blocking", "host-sync-in-loop", "tensor-from-numpy-copy",
    "tensor-created-off-device", "dims-not-multiple-of-8", "batch-size-not-multiple-of-8", "small-batch",
    "no-mixed-precision", "zero-grad-not-none", "grad-in-validation", "cudnn-benchmark-off", "channels-last",
    "conv-bias-before-bn", "data-parallel", "syncbn-with-compile", "empty-cache-in-loop", "jit-script",
    "manual-attention", "non-foreach-optimizer", "save-in-loop", "accumulation-syncs", "nccl-env", "slow-storage",
    "periodic-work", "cpu-oversubscribed", "straggler", "exposed-gradient-sync", "ddp-find-unused-parameters",
    "ddp-static-graph", "ddp-bucket-settings", "per-sample-batch", "eval-every-step", "unattributed-time",
    "uneven-work",
}


def test_every_catalogue_rule_has_an_implementation():
    _load()
    assert set(RULE_IDS) == CATALOGUE
    assert {rule_id for rule_id, _, _ in RULES} == CATALOGUE


def test_registry_rules_are_doctor_rules():
    for entry in all_speedups():
        assert set(entry.doctor_rules) <= CATALOGUE, entry.name


def test_slow_storage_waits_for_the_data_layer():
    """Without the data layer's read statistics (no reads through turbotrain.data) the rule stays silent."""
    from turbotrain.doctor.analysis.breakdown import compute_breakdown
    from turbotrain.doctor.analysis.context import Context
    from turbotrain.doctor.rules import evaluate
    from turbotrain.hardware import detect

    ctx = Context(script=None, base=None, hw=detect("cpu"), device="cpu", breakdown=compute_breakdown([], 1),
                  measured_steps=[])
    assert evaluate(ctx, only=["slow-storage"]) == []
