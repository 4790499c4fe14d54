import pytest
import torch
from torch import nn

import turbotrain as tt
from turbotrain.config import ConfigError
from turbotrain.runtime import Runtime
from turbotrain.hardware import detect
from turbotrain.speedups.sync_batchnorm import ENTRY, convert_sync_batchnorm


def test_single_process_skips_with_reason(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    rt = tt.prepare(nn.Sequential(nn.BatchNorm1d(3)), None, tt.Plan(device="cpu", sync_batchnorm=True))
    assert rt.skipped and rt.skipped[0][0] == "sync_batchnorm" and "one" in rt.skipped[0][1]


def test_conversion_replaces_batchnorm_and_keeps_parameters():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    weight = model[1].weight
    converted = convert_sync_batchnorm(model)
    assert isinstance(converted[1], nn.SyncBatchNorm) and converted[1].weight is weight


def _runtime(plan, model):
    return Runtime(plan=plan, hardware=detect("cpu"), device=torch.device("cpu"), module=model, model=model,
                   optimizers=[])


def test_refused_together_with_compile_unless_forced(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    model = nn.Sequential(nn.BatchNorm1d(3))
    with pytest.raises(ConfigError, match="SyncBatchNorm.*compile.*'force'"):
        tt.prepare(model, None, tt.Plan(device="cpu", sync_batchnorm=True, compile=True))
    tt.prepare(nn.Sequential(nn.BatchNorm1d(3)), None,
               tt.Plan(device="cpu", sync_batchnorm="force"))  # forced: no error (skipped: one process)


def test_apply_converts_the_module_the_runtime_trains():
    rt = _runtime(tt.Plan(sync_batchnorm=True), nn.Sequential(nn.BatchNorm1d(3)))
    ENTRY.apply(rt)
    assert isinstance(rt.module[0], nn.SyncBatchNorm) and rt.model is rt.module
