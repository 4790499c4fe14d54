"""In-process pieces of the distributed path: strategy choice, SyncBatchNorm rules, optimizer rebinding,
loader sharding and per-rank resume positions."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler
from torch.utils.data.distributed import DistributedSampler

import launch_tiny as tiny
import turbotrain as tt
from turbotrain.config import ConfigError
from turbotrain.data.loader import rebuild_loader
from turbotrain.hardware import detect
from turbotrain.launch.fsdp import rebind_optimizer
from turbotrain.launch.trainer_hooks import position_for_rank, shard_loader
from turbotrain.speedups import sync_batchnorm


@pytest.fixture
def one_process(monkeypatch):
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def rank_one_of_two(monkeypatch):
    """What torchrun's environment says to rank 1 of 2 (no process group is started)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")


def _model_and_optimizer():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_auto_strategy_is_a_single_process_without_a_launcher(one_process):
    rt = tt.prepare(*_model_and_optimizer(), tt.Plan())
    assert "strategy" not in rt.applied and rt.ddp is None


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ddp_or_fsdp_without_a_launcher_says_how_to_launch(one_process, strategy):
    with pytest.raises(ConfigError, match=f"strategy='{strategy}'.*turbotrain launch --nproc-per-node N"):
        tt.prepare(*_model_and_optimizer(), tt.Plan(strategy=strategy))


def test_sync_batchnorm_with_compile_is_refused_unless_forced(one_process):
    with pytest.raises(ConfigError, match="sync_batchnorm='force'"):
        tt.prepare(*_model_and_optimizer(), tt.Plan(sync_batchnorm=True, compile=True))
    # forced: no refusal (here it is then skipped: one process has nothing to synchronize)
    rt = tt.prepare(*_model_and_optimizer(), tt.Plan(sync_batchnorm="force", compile=True))
    assert ("sync_batchnorm" in dict(rt.skipped)) and "several processes" in dict(rt.skipped)["sync_batchnorm"]


def test_sync_batchnorm_needs_a_gpu_and_converts_in_place(rank_one_of_two):
    why = sync_batchnorm._requires(detect("cpu"), tt.Plan(sync_batchnorm=True))
    assert why is not None and "cuda" in why  # PyTorch's SyncBatchNorm raises on CPU tensors
    model, optimizer = _model_and_optimizer()
    converted = sync_batchnorm.convert_sync_batchnorm(model)
    assert isinstance(converted[1], nn.SyncBatchNorm)
    assert converted[1].weight is optimizer.param_groups[0]["params"][2]  # the optimizer's parameters survive


def test_rebind_optimizer_moves_groups_onto_new_parameters_in_place():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    optimizer = torch.optim.AdamW([{"params": model[0].parameters(), "lr": 0.1},
                                   {"params": model[1].parameters(), "lr": 0.01, "weight_decay": 0.0}])
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    group_lists = [g["params"] for g in optimizer.param_groups]
    replaced = {p: nn.Parameter(p.detach().clone()) for p in model.parameters()}
    rebind_optimizer(optimizer, replaced)
    new = list(replaced.values())
    assert [p for g in optimizer.param_groups for p in g["params"]] == new
    assert all(g["params"] is lst for g, lst in zip(optimizer.param_groups, group_lists))  # same list objects
    assert [g["lr"] for g in optimizer.param_groups] == [0.1, 0.01]
    assert optimizer.param_groups[1]["weight_decay"] == 0.0
    for p in new:
        p.grad = torch.ones_like(p)
    optimizer.step()
    scheduler.step()
    assert all(len(optimizer.state[p]) for p in new)  # it now optimizes the new parameters
    assert [g["lr"] for g in optimizer.param_groups] == [0.05, 0.005]  # the user's scheduler still drives it


def test_rebind_refuses_an_optimizer_that_already_stepped():
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    with pytest.raises(ConfigError, match="already stepped"):
        rebind_optimizer(optimizer, {p: nn.Parameter(p.detach().clone()) for p in model.parameters()})


def test_loader_is_sharded_with_the_users_shuffle_and_seed(rank_one_of_two):
    loader = tiny.train_loader()
    sharded = shard_loader(loader)
    sampler = sharded.sampler
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle, sampler.seed) == (2, 1, True, tiny.SEED)
    assert sharded.batch_size == loader.batch_size and len(sharded) == len(loader) // 2
    sampler.set_epoch(0)
    ours = list(iter(sampler))
    sampler.rank = 0
    theirs = list(iter(sampler))
    assert sorted(ours + theirs) == list(range(tiny.SAMPLES))  # two disjoint halves of the data
    sequential = shard_loader(tiny.val_loader())
    assert sequential.sampler.shuffle is False
    assert shard_loader(sharded) is sharded  # already distributed: left alone


def test_a_custom_sampler_is_left_alone_with_a_warning(rank_one_of_two, caplog):
    data = TensorDataset(torch.arange(8.0))
    loader = DataLoader(data, batch_size=2, sampler=WeightedRandomSampler(torch.ones(8), 8))
    with caplog.at_level(logging.WARNING, logger="turbotrain"):
        assert shard_loader(loader) is loader
    assert "WeightedRandomSampler" in caplog.text and "shard it yourself" in caplog.text


def test_plan_batch_size_applies_on_top_of_the_injected_sampler(rank_one_of_two):
    loader = rebuild_loader(shard_loader(tiny.train_loader()), batch_size=8)  # what Plan(batch_size=8) does
    assert isinstance(loader.sampler, DistributedSampler) and loader.batch_size == 8
    assert len(loader) == tiny.SAMPLES // 2 // 8


def _state(positions):
    return {"position": positions[0], "positions": positions}


def test_each_rank_resumes_its_own_position():
    positions = [{"epoch": 1, "batches_done": 6, "rng": f"rng-of-rank-{r}"} for r in range(2)]
    assert position_for_rank(_state(positions), 1, 2)["rng"] == "rng-of-rank-1"
    assert position_for_rank(_state(positions), 0, 2)["rng"] == "rng-of-rank-0"
    # a checkpoint from before per-rank positions existed
    assert position_for_rank({"position": positions[0]}, 0, 1)["batches_done"] == 6


def test_position_is_rescaled_when_the_number_of_processes_changes(caplog):
    positions = [{"epoch": 0, "batches_done": 3, "rng": r} for r in range(2)]
    with caplog.at_level(logging.WARNING, logger="turbotrain"):
        assert position_for_rank(_state(positions), 0, 1)["batches_done"] == 6   # same samples, one process
        assert position_for_rank(_state(positions), 3, 4)["batches_done"] == 1   # 6 global batches / 4: 2 again
    assert "the global batch changes" in caplog.text and "trained again" in caplog.text
