"""``ddp-static-graph``: DDP that looks for unused parameters after every forward (``find_unused_parameters=True``)
and finds the same ones every time, on every rank, gets ``static_graph=True`` timed on every rank; a graph whose
unused parameters change, or DDP with nothing unused (``ddp-find-unused-parameters`` answers that) gets nothing.
First the reducer's own check, read off real DDP models in this process, then the rule on recordings built by
hand."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch import nn

from doctor_helpers import rank_recording
from turbotrain.doctor.analysis.context import build_context
from turbotrain.doctor.fixes.choose import fixable_rules
from turbotrain.doctor.record.collectives import GradientSync
from turbotrain.doctor.record.patcher import Patcher
from turbotrain.doctor.requests import JobRequest
from turbotrain.doctor.rules import evaluate


class TwoBranches(nn.Module):
    """A head used every step and a branch used when ``use_branch(step)`` says so."""

    def __init__(self, use_branch):
        super().__init__()
        self.body, self.branch, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1)
        self.use_branch, self.step = use_branch, 0

    def forward(self, x):
        self.step += 1
        return self.head(self.branch(x) if self.use_branch(self.step) else self.body(x))


def _reducer_after(folder, use_branch, steps=12, **ddp) -> dict[str, float]:
    """What the doctor reads of DDP's reducer after ``steps`` training steps on a group of one."""
    if dist.is_initialized():
        pytest.skip("a process group is already active in this test process")
    folder.mkdir()
    dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=0, world_size=1)
    patcher, step = Patcher(), [0]
    sync = GradientSync(lambda: (step[0], 0), lambda: True)
    try:
        sync.install(patcher)
        model = nn.parallel.DistributedDataParallel(TwoBranches(use_branch), **ddp)
        for _ in range(steps):  # DDP's logger samples its statistics at iteration 10
            model(torch.randn(4, 8)).sum().backward()
            step[0] += 1
        return sync.reducer_stats()
    finally:
        patcher.restore()
        dist.destroy_process_group()


def test_the_reducer_says_whether_the_unused_parameters_ever_changed(tmp_path):
    never = _reducer_after(tmp_path / "a", lambda step: False, find_unused_parameters=True)
    assert never["graph_static"] == 1.0 and never["static_graph"] == 0.0
    assert never["unused_parameter_size"] > 0  # the branch's weight and bias
    every_third = _reducer_after(tmp_path / "b", lambda step: step % 3 == 0, find_unused_parameters=True)
    assert every_third["graph_static"] == 0.0
    declared = _reducer_after(tmp_path / "c", lambda step: False, static_graph=True)
    assert declared["static_graph"] == 1.0


MIB = 1 << 20
UNUSED = {"find_unused_parameters": 1.0, "unused_parameter_size": 0.25 * MIB, "graph_static": 1.0,
          "static_graph": 0.0}


def _job(*reducers: dict[str, float]):
    steps = 12
    recordings = [dataclasses.replace(rank_recording(r, data_ms=[1.0] * steps, exposed_ms=[5.0] * steps),
                                      reducer=reducer) for r, reducer in enumerate(reducers)]
    return build_context(dataclasses.replace(recordings[0], job=tuple(recordings)))


def test_the_same_unused_parameters_on_every_rank_time_static_graph_on_every_rank():
    (finding,) = evaluate(_job(UNUSED, UNUSED), only=["ddp-static-graph"])
    assert isinstance(finding.request, JobRequest)
    assert finding.request.change.ddp == {"static_graph": True, "find_unused_parameters": False}
    assert finding.severity == "low" and not finding.measured  # until the job what-if times it
    assert "0.25 MiB" in finding.message and "static_graph=True" in finding.fix.pytorch
    assert "ddp-static-graph" in fixable_rules()  # --fix writes the keyword into the DDP call


@pytest.mark.parametrize("other", [
    {**UNUSED, "graph_static": 0.0},  # this rank's unused parameters changed from one step to another
    {**UNUSED, "static_graph": 1.0},  # already declared
    {**UNUSED, "unused_parameter_size": 0.0},  # nothing unused: drop find_unused_parameters instead
    {**UNUSED, "find_unused_parameters": 0.0},
], ids=["graph-changed", "already-static", "nothing-unused", "not-looking"])
def test_a_rank_whose_graph_is_not_known_static_keeps_the_job_out(other):
    assert evaluate(_job(UNUSED, other), only=["ddp-static-graph"]) == []


def test_nothing_unused_is_the_find_unused_rule_not_this_one():
    nothing = {**UNUSED, "unused_parameter_size": 0.0}
    rules = [f.rule for f in evaluate(_job(nothing, nothing), only=["ddp-static-graph",
                                                                    "ddp-find-unused-parameters"])]
    assert rules == ["ddp-find-unused-parameters"]
