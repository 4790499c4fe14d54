"""strategy='pipeline' without launching: the Plan's checks, the layout, split points, refusals, one process."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch
from torch import nn

import pipeline_tiny as tiny
import turbotrain as tt
from launch_helpers import ROOT, cli_env
from turbotrain.config import ConfigError
from turbotrain.launch.pipeline import Layout, bubble_fraction, default_split_points, layout_for


@pytest.fixture
def alone(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)


def pipeline_plan(**settings) -> tt.Plan:
    return tt.Plan(strategy="pipeline", **settings)


@pytest.mark.parametrize("settings, words", [
    ({"strategy": "ddp", "microbatches": 4}, "a pipeline setting, and strategy is 'ddp'"),
    ({"strategy": "pipeline", "pipeline_stages": 4, "microbatches": 2}, "2 micro-batches for 4 stages"),
    ({"strategy": "pipeline", "pipeline_stages": 1}, "pipeline_stages: 1 is not allowed"),
    ({"strategy": "pipeline", "stages_per_process": 2}, "need schedule='interleaved-1f1b'"),
    ({"strategy": "pipeline", "grad_accum_steps": 2}, "set microbatches instead"),
    ({"strategy": "pipeline", "schedule": "zero-bubble"}, "Plan.schedule"),
])
def test_the_plan_refuses_pipeline_settings_that_cannot_work(settings, words):
    with pytest.raises(ConfigError, match=words):
        tt.Plan(**settings)


def test_a_pipeline_plan_round_trips_through_yaml(tmp_path):
    plan = pipeline_plan(pipeline_stages=4, microbatches=8, schedule="interleaved-1f1b")
    assert tt.Plan.from_yaml(plan.to_yaml(tmp_path / "plan.yaml")) == plan


@pytest.mark.parametrize("settings, world, layout", [
    ({}, 2, Layout(2, 1, 2, 1, 2, "1f1b")),                                      # one stage per process
    ({"pipeline_stages": 2, "microbatches": 4}, 4, Layout(2, 1, 2, 2, 4, "1f1b")),  # 2 stages x 2 FSDP replicas
    ({"pipeline_stages": 4, "schedule": "interleaved-1f1b"}, 2, Layout(4, 2, 2, 1, 4, "interleaved-1f1b")),
    ({"schedule": "gpipe", "microbatches": 8}, 4, Layout(4, 1, 4, 1, 8, "gpipe")),
])
def test_layout_of_stages_processes_and_replicas(settings, world, layout):
    assert layout_for(pipeline_plan(**settings), world) == layout


@pytest.mark.parametrize("settings, world, words", [
    ({"pipeline_stages": 4}, 2, "needs 4 processes per pipeline .* this run has 2"),
    ({"pipeline_stages": 2}, 3, "or a multiple of 2 for pipeline x FSDP"),
    ({"pipeline_stages": 6, "schedule": "interleaved-1f1b"}, 2, "needs 3 processes per pipeline"),
    ({"schedule": "interleaved-1f1b", "microbatches": 5}, 2, "not a multiple of 2"),
    ({"microbatches": 3}, 4, "3 micro-batches for 4 stages"),  # stages from the number of processes
])
def test_more_stages_than_the_processes_allow_is_refused(settings, world, words):
    with pytest.raises(ConfigError, match=words):
        layout_for(pipeline_plan(**settings), world)


def test_stages_of_a_process_and_the_bubble():
    interleaved = layout_for(pipeline_plan(pipeline_stages=4, schedule="interleaved-1f1b"), 2)
    assert interleaved.stage_ids(0) == [0, 2] and interleaved.stage_ids(1) == [1, 3]
    assert bubble_fraction(layout_for(pipeline_plan(microbatches=4), 2)) == pytest.approx(1 / 5)
    assert bubble_fraction(interleaved) == pytest.approx(1 / 9)  # two stages per process: half the bubble


def test_default_split_points_cut_the_largest_module_list_evenly():
    assert default_split_points(tiny.Net(), 2) == ["blocks.2"]
    assert default_split_points(tiny.Net(), 4) == ["blocks.1", "blocks.2", "blocks.3"]
    with pytest.raises(ConfigError, match="no nn.ModuleList of at least 2 blocks"):
        default_split_points(nn.Sequential(nn.Linear(2, 2)), 2)


@pytest.mark.parametrize("points, words", [
    (["blocks.9"], "split point 'blocks.9' names no module of Net; modules nearby: blocks, blocks.0"),
    (["trunk"], "names no module of Net; its top-level modules: "),
    (["blocks.1", "blocks.2"], "2 given for 2 stages; give 1"),
])
def test_a_split_point_that_names_no_module_is_refused_at_construction(alone, points, words):
    model = tiny.make_model()
    with pytest.raises(ConfigError, match=words):
        tt.Trainer(model, tiny.make_optimizer(model), tiny.loss_fn, plan=pipeline_plan(pipeline_stages=2),
                   split_points=points)


def test_one_process_without_a_launcher_trains_the_same_numbers(alone, caplog):
    """The same script runs without `turbotrain launch`: the stages as one model, the schedule's arithmetic."""
    weights, losses = tiny.reference(4, steps=6)
    with tiny.like_a_worker():
        model = tiny.make_model()
        with caplog.at_level(logging.WARNING, logger="turbotrain"):
            trainer = tt.Trainer(model, tiny.make_optimizer(model), tiny.loss_fn,
                                 plan=pipeline_plan(pipeline_stages=2, microbatches=4), max_steps=6,
                                 log_every_n_steps=1, progress=False, warmup_steps=0, val_check_interval=6)
            result = trainer.fit(tiny.loader(), tiny.loader(n=32))
    assert "run it with `turbotrain launch --nproc-per-node 2" in caplog.text
    assert [row["train_loss"] for row in result.history if "train_loss" in row] == losses
    assert result.metrics["val_loss"] == pytest.approx(tiny.validation_loss(weights, microbatches=4), rel=1e-6)
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), name


@pytest.mark.parametrize("changes, kwargs, words", [
    ({"compile": True}, {}, "compile with strategy='pipeline' is not supported"),
    ({"precision": "fp16-mixed"}, {}, "use 'bf16-mixed'"),
    ({}, {"step_fn": lambda ctx, batch: None}, "needs loss_fn"),
])
def test_what_a_pipeline_cannot_do_is_refused(alone, changes, kwargs, words):
    model = tiny.make_model()
    with pytest.raises(ConfigError, match=words):
        tt.Trainer(model, tiny.make_optimizer(model), tiny.loss_fn, plan=pipeline_plan(**changes), **kwargs)


def test_split_points_without_a_pipeline_are_refused(alone):
    model = tiny.make_model()
    with pytest.raises(ConfigError, match="set Plan\\(strategy='pipeline'\\)"):
        tt.Trainer(model, tiny.make_optimizer(model), tiny.loss_fn, split_points=["blocks.2"])


DDP_UNDER_PIPELINE = """
import sys, tempfile
import torch, torch.distributed as dist
from torch import nn
import turbotrain as tt
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
try:
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))
    tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.functional.mse_loss,
               plan=tt.Plan(strategy="pipeline"))
except tt.ConfigError as exc:
    print(exc)
finally:
    dist.destroy_process_group()
"""


def test_ddp_under_a_pipeline_is_refused_with_the_fsdp_way():
    """DDP wrapping a stage crashes with GPipe (reducer.cpp) and, with static_graph=True, trains silently wrong."""
    proc = subprocess.run([sys.executable, "-c", DDP_UNDER_PIPELINE], cwd=ROOT, env=cli_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "DDP cannot wrap a pipeline stage" in proc.stdout
    assert "shards each stage with FSDP" in proc.stdout


def test_the_tuner_never_chooses_the_strategy_on_one_device():
    from turbotrain.hardware import detect
    from turbotrain.speedups.model_info import inspect_model
    from turbotrain.tuning.candidates import build_candidates

    cands = build_candidates(detect("cpu"), inspect_model(tiny.make_model()), tt.Plan())
    reasons = dict(cands.left_out)
    assert "pipeline need several processes" in reasons["strategy"]
    assert all(switch.field != "strategy" for switch in cands.timed)
    assert tt.Plan.fast(tiny.make_model(), device="cpu").strategy == "auto"
