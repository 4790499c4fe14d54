"""The ranks' lanes: each rank's measured steps on a common clock (lined up on the all-reduce, not on host clocks),
in the analysis, the JSON and the HTML picture. Recordings built by hand; no job runs here.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import re

import pytest

from doctor_helpers import rank_recording
from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.ranks import analyse_ranks
from turbotrain.doctor.record.recording import Recording
from turbotrain.doctor.report.html import render_html
from turbotrain.doctor.report.model import Report
from turbotrain.doctor.report.ranks import LANE_STEPS, WAIT_STYLE, lane_ranks, ranks_html, ranks_json

STEPS = 9  # 1 warm-up + 8 measured (rank_recording's window)


def shifted(rec: Recording, seconds: float) -> Recording:
    """The same recording on a host clock ``seconds`` ahead."""
    steps = tuple(dataclasses.replace(s, start=s.start + seconds, end=s.end + seconds) for s in rec.steps)
    comm = tuple(dataclasses.replace(c, done_at=c.done_at + seconds) for c in rec.communication)
    return dataclasses.replace(rec, steps=steps, communication=comm)


def straggler_job(slow: int, world: int = 2, ahead_s: float = 5.0):
    """Rank ``slow`` loads its data 25 ms per step, the others wait 25 ms for it; rank 1's clock is 5 s ahead."""
    recs = [rank_recording(r, [25.0 if r == slow else 1.0] * STEPS, [1.0 if r == slow else 25.0] * STEPS)
            for r in range(world)]
    recs = [shifted(r, ahead_s) if r.rank == 1 else r for r in recs]
    job = analyse_ranks(recs)
    assert job is not None
    return recs, job


def test_lanes_line_up_on_the_all_reduce_not_on_the_host_clock():
    _, job = straggler_job(slow=0)
    assert job.offsets_s[1] == pytest.approx(5.0, abs=1e-6)
    lanes = job.lanes
    assert [s.step for s in lanes[0]] == [s.step for s in lanes[1]] == job.steps
    for a, b in zip(lanes[0], lanes[1]):
        assert abs(a.end_s - b.end_s) < 1e-6 and abs(a.start_s - b.start_s) < 1e-6
    for lane in lanes.values():
        assert lane[0].start_s == pytest.approx(0.0, abs=1e-9)  # time zero: the earliest step's start
        for step, following in zip(lane, lane[1:]):
            assert following.start_s == pytest.approx(step.end_s)  # a step starts where the previous ended
        for step in lane:
            assert sum(step.parts_s.values()) == pytest.approx(step.end_s - step.start_s, rel=1e-6)


def test_a_rank_whose_all_reduces_were_not_timed_is_lined_up_on_its_step_ends():
    recs = [rank_recording(r, [1.0] * STEPS, [2.0] * STEPS) for r in (0, 1)]
    recs[1] = dataclasses.replace(shifted(recs[1], 5.0), communication=())
    job = analyse_ranks(recs)
    assert job is not None and 1 not in job.offsets_s
    for a, b in zip(job.lanes[0], job.lanes[1]):
        assert abs(a.end_s - b.end_s) < 1e-6


@pytest.mark.parametrize("slow", [0, 1])
def test_the_waiting_rank_shows_its_wait_and_the_straggler_does_not(slow):
    _, job = straggler_job(slow)
    assert job.straggler is not None and job.straggler.rank == slow
    waiting = 1 - slow
    for late, waits in zip(job.lanes[slow], job.lanes[waiting]):
        assert waits.parts_s["communication"] == pytest.approx(0.025, abs=1e-6)
        assert late.parts_s["communication"] == pytest.approx(0.001, abs=1e-6)
        assert late.parts_s["data_loading"] == pytest.approx(0.025, abs=1e-6)
    data = ranks_json(job)
    lane = {r["rank"]: r["lane_ms"] for r in data["ranks"]}
    assert [s["parts"]["communication"] for s in lane[waiting]] == [25.0] * len(job.steps)
    assert [s["parts"]["communication"] for s in lane[slow]] == [1.0] * len(job.steps)
    assert [s["end"] for s in lane[0]] == [s["end"] for s in lane[1]]


def _picture(page: str):
    import matplotlib.image

    m = re.search(r'<img id="rank-lanes" alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert m, "no embedded picture of the ranks' lanes"
    return matplotlib.image.imread(io.BytesIO(base64.b64decode(m.group(1))), format="png")


def _has_colour(image, hex_colour: str) -> bool:
    rgb = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    return bool((abs(image[..., :3] - rgb).max(axis=-1) < 0.02).any())


def test_the_html_report_draws_the_lanes_with_the_waits():
    recs, job = straggler_job(slow=0)
    report = Report(status="ok", breakdown=compute_breakdown(list(recs[0].steps), warmup=1), findings=[], ranks=job)
    page = render_html(report)
    image = _picture(page)
    assert _has_colour(image, WAIT_STYLE["facecolor"])  # the wait is drawn in its own colour
    assert f"the first {min(LANE_STEPS, len(job.steps))} measured steps" in page
    assert "waited for the gradient all-reduce" in page  # a DDP job: what its ranks wait on


def test_without_waits_the_picture_has_no_wait_colour():
    recs = [rank_recording(r, [1.0] * STEPS, [0.0] * STEPS) for r in (0, 1)]
    job = analyse_ranks(recs)
    assert job is not None
    assert not _has_colour(_picture(ranks_html(ranks_json(job))), WAIT_STYLE["facecolor"])


@pytest.mark.parametrize("world", [4, 16])
def test_the_picture_draws_every_rank_up_to_8_then_the_median_and_worst(world):
    _, job = straggler_job(slow=3, world=world)
    data = ranks_json(job)
    if world <= 8:
        assert lane_ranks(data) == list(range(world))
    else:
        assert lane_ranks(data) == sorted({job.median_rank, job.worst_rank, 3}) and job.worst_rank == 3
    assert "<img" in ranks_html(data)
