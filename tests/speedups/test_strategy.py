import pytest
from tiny import make_mlp

import turbotrain as tt
from turbotrain.config import ConfigError


@pytest.fixture
def alone(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_distributed_strategy_without_launcher_says_how_to_launch(alone, strategy):
    with pytest.raises(ConfigError, match=f"strategy='{strategy}'.*turbotrain launch --nproc-per-node"):
        tt.prepare(make_mlp(), None, tt.Plan(device="cpu", strategy=strategy))


def test_auto_in_a_single_process_does_nothing(alone):
    model = make_mlp()
    rt = tt.prepare(model, None, tt.Plan(device="cpu"))
    assert rt.model is model and rt.ddp is None and "strategy" not in rt.applied
