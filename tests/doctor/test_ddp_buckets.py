"""``ddp-bucket-settings``: ranks that wait on the gradient all-reduce with DDP's default buckets get
``gradient_as_bucket_view=True`` and a bucket size that spreads the gradients over several buckets, timed on every
rank; DDP built that way already, or a wait that only the ranks arriving early have (some rank's lateness),
gets nothing."""

from __future__ import annotations

import dataclasses

import pytest

from doctor_helpers import rank_recording
from turbotrain.doctor.analysis.context import build_context
from turbotrain.doctor.requests import JobRequest
from turbotrain.doctor.rules import evaluate
from turbotrain.doctor.rules.job.ddp_bucket_settings import BUCKETS, _bucket_change

MIB = 1 << 20


@pytest.mark.parametrize("reducer, expected", [
    # 5 MiB of 12 tensors in DDP's 2 default buckets: views, and a quarter of the gradients a bucket
    ({"gradient_as_bucket_view": 0.0, "total_parameter_size_bytes": 5.0 * MIB, "buckets": 2.0,
      "num_parameter_tensors": 12.0}, {"gradient_as_bucket_view": True, "bucket_cap_mb": 1}),
    # ... of 6 tensors: a bucket holds whole tensors, the bucket count would not change
    ({"gradient_as_bucket_view": 0.0, "total_parameter_size_bytes": 5.0 * MIB, "buckets": 2.0,
      "num_parameter_tensors": 6.0}, {"gradient_as_bucket_view": True}),
    ({"gradient_as_bucket_view": 0.0, "total_parameter_size_bytes": 400.0 * MIB, "buckets": 16.0},
     {"gradient_as_bucket_view": True}),  # already spread over more than BUCKETS buckets
    ({"gradient_as_bucket_view": 0.0, "total_parameter_size_bytes": 1.5 * MIB, "buckets": 2.0},
     {"gradient_as_bucket_view": True}),  # too small to spread
    ({"gradient_as_bucket_view": 1.0, "total_parameter_size_bytes": 100.0 * MIB, "buckets": 1.0,
      "num_parameter_tensors": 40.0}, {"bucket_cap_mb": 100 // BUCKETS}),
    ({"gradient_as_bucket_view": 1.0, "total_parameter_size_bytes": 1.5 * MIB, "buckets": 2.0}, {}),
])
def test_the_keywords_timed_are_the_defaults_the_job_still_has(reducer, expected):
    assert _bucket_change(reducer) == expected


def _job(waits_ms: list[list[float]], reducer: dict[str, float]):
    recordings = [dataclasses.replace(rank_recording(r, data_ms=[1.0] * len(w), exposed_ms=w), reducer=reducer)
                  for r, w in enumerate(waits_ms)]
    return build_context(dataclasses.replace(recordings[0], job=tuple(recordings)))


DEFAULTS = {"gradient_as_bucket_view": 0.0, "total_parameter_size_bytes": 5.0 * MIB, "buckets": 2.0,
            "num_parameter_tensors": 12.0}


def test_every_rank_waiting_on_the_all_reduce_times_the_bucket_settings_on_every_rank():
    steps = 12
    (finding,) = evaluate(_job([[10.0] * steps, [10.0] * steps], DEFAULTS), only=["ddp-bucket-settings"])
    assert isinstance(finding.request, JobRequest)
    assert finding.request.change.ddp == {"gradient_as_bucket_view": True, "bucket_cap_mb": 1}
    assert finding.severity == "low" and not finding.measured  # until the job what-if times it
    assert "25%" in finding.message and "5.0 MiB of gradients in 2 bucket(s)" in finding.message


def test_a_late_rank_or_ddp_already_set_gets_no_bucket_settings():
    steps = 12
    late = _job([[10.0] * steps, [0.2] * steps], DEFAULTS)  # rank 0 waits for rank 1 every step: a straggler
    assert evaluate(late, only=["ddp-bucket-settings"]) == []
    settled = {"gradient_as_bucket_view": 1.0, "total_parameter_size_bytes": 1.5 * MIB, "buckets": 2.0}
    assert evaluate(_job([[10.0] * steps, [10.0] * steps], settled), only=["ddp-bucket-settings"]) == []
    quiet = _job([[1.0] * steps, [1.0] * steps], DEFAULTS)  # 1 ms of a 40 ms step: under 10%
    assert evaluate(quiet, only=["ddp-bucket-settings"]) == []
