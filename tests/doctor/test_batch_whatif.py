"""The larger-batch what-if credits the loading part of a step only with what loading really saves at the
larger batch: samples whose loading costs per sample gain nothing from being batched."""

from __future__ import annotations

import statistics

import pytest

from doctor_helpers import run_doctor

from turbotrain.doctor.results import BatchResult

pytestmark = pytest.mark.one_core  # one process, one thread: run beside one other such test (tests/conftest.py)


def test_a_larger_batch_is_not_credited_with_loading_that_costs_per_sample():
    report = run_doctor("batch_one_costly_samples", what_if_budget_s=20.0)
    finding = next(f for f in report.findings if f.rule == "small-batch")
    what_if = finding.what_if
    assert finding.measured and isinstance(what_if, BatchResult), (what_if, finding.note)
    assert what_if.loader == "timed at batch_size 1 and 8"
    # Each sample's loading is a fixed amount of Python work: eight of them take about eight times as long.
    assert what_if.loader_samples_ratio < 2.0, what_if
    assert report.breakdown.shares["data_loading"] > 0.2, report.breakdown.shares
    # The model alone gains several-fold per sample; the whole step far less, its loading being unchanged.
    assert finding.est_speedup < 0.7 * statistics.median(what_if.model_rounds), (finding.est_speedup, what_if)
    # The batch timed is the one the finding says fits, with the memory it needs against the machine's.
    memory = finding.evidence.memory
    assert memory.fits and memory.batch_size == what_if.candidate_batch_size == 8, memory
    assert memory.measured_peak_bytes < memory.needs_bytes < memory.capacity_bytes, memory
    assert "A batch of 8 needs about" in finding.message and "it fits" in finding.message


def test_a_batch_that_cannot_grow_along_dimension_0_leaves_the_finding_low():
    report = run_doctor("batch_not_dim0", what_if_budget_s=20.0)
    finding = next(f for f in report.findings if f.rule == "small-batch")
    assert not finding.measured and finding.severity == "low", (finding.severity, finding.note)
    assert "could not be made" in finding.note and "RuntimeError" in finding.note


def test_one_unbatched_state_a_step_is_a_batch_of_one_and_batching_states_is_timed():
    """A `[4]` state per step is one sample: the larger batch timed is 8 states stacked, per sample against one."""
    report = run_doctor("unbatched_policy", what_if_budget_s=20.0)
    finding = next(f for f in report.findings if f.rule == "small-batch")
    assert finding.message.startswith("Batches of 1 sample(s)"), finding.message
    # one state a forward: the batch is several stacked (several environments at once), not a loader's setting
    assert finding.fix.pytorch.startswith("Feed 8 samples per forward") and "environments" in finding.fix.pytorch
    what_if = finding.what_if
    assert finding.measured and isinstance(what_if, BatchResult), (what_if, finding.note)
    assert (what_if.batch_size, what_if.candidate_batch_size) == (1, 8), what_if
