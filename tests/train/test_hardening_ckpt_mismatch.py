"""Resuming from a checkpoint that loads but does not fit the run: one error naming the file and what
differs, raised before anything changes, and no fallback to an older checkpoint (it is not damage). A
changed batch size resumes at the same sample when it can."""

import hashlib
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import turbotrain as tt
from turbotrain.config import ConfigError
from turbotrain.train.checkpoint import CheckpointError, CheckpointMismatchError

NEWEST = "step-000000006.pt"


class Indexed(Dataset):
    def __init__(self, n=48):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x[:, :3].argmax(1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def _trainer(directory, hidden=16, max_steps=None, seen=None, schedulers=None, **limits):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)

    def step(ctx, batch):
        x, y, idx = batch
        if seen is not None:
            seen.extend(idx.tolist())
        return F.cross_entropy(ctx.model(x), y)

    return tt.Trainer(model, opt, step_fn=step, plan=tt.Plan(device="cpu"), max_steps=max_steps, max_epochs=2,
                      checkpoint_dir=str(directory), checkpoint_every_n_steps=3, progress=False,
                      schedulers=schedulers(opt) if schedulers else None, **limits)


def _loader(batch_size=4, n=48):
    return DataLoader(Indexed(n), batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(3))


@pytest.fixture
def saved(tmp_path):
    """Checkpoints at steps 3 and 6 of a run with batches of 4 (6 steps: 24 samples into epoch 0)."""
    _trainer(tmp_path, max_steps=6).fit(_loader())
    return tmp_path


def _weights(trainer):
    return [p.detach().clone() for p in trainer.model.parameters()]


def _refuses(trainer, loader):
    """Resuming raises a mismatch naming the newest checkpoint, and the model is as it was."""
    before = _weights(trainer)
    with pytest.raises(CheckpointMismatchError) as err:
        trainer.fit(loader, resume=True)
    assert err.value.path.endswith(NEWEST), err.value.path  # the newest: no fallback to step 3
    assert "does not fit this run" in str(err.value)
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(trainer))), "weights changed before the refusal"
    assert trainer.state.step == 0
    return str(err.value)


def test_another_model_is_one_clear_error_naming_the_file_and_the_shapes(saved):
    message = _refuses(_trainer(saved, hidden=32, max_steps=9), _loader())
    assert "shapes differ: 0.weight is [16, 8] there, [32, 8] here" in message
    assert isinstance(CheckpointMismatchError(saved, ["x"]), ConfigError)  # the CLI: exit 2, no traceback


def test_a_model_with_another_layer_names_the_missing_weights(saved):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3), nn.Linear(3, 3))
    trainer = tt.Trainer(model, torch.optim.AdamW(model.parameters(), lr=0.01),
                         step_fn=lambda ctx, b: F.cross_entropy(ctx.model(b[0]), b[1]), plan=tt.Plan(device="cpu"),
                         max_steps=9, checkpoint_dir=str(saved), progress=False)
    message = _refuses(trainer, _loader())
    assert "the model has 3.weight, 3.bias, which the checkpoint lacks" in message
    assert "optimizer 0 has parameter groups of [6] parameters, the checkpoint [4]" in message


def test_a_missing_key_is_named_before_the_weights_are_touched(saved):
    path = saved / NEWEST
    state = torch.load(path, weights_only=True)
    del state["trainer"]["elapsed_s"]
    torch.save(state, path)
    data = path.read_bytes()
    path.with_suffix(".json").write_text(json.dumps({"format": 1, "step": 6, "bytes": len(data),
                                                     "sha256": hashlib.sha256(data).hexdigest()}))
    message = _refuses(_trainer(saved, max_steps=9), _loader())
    assert "it lacks trainer.elapsed_s" in message


def test_another_number_of_schedulers_is_named(saved):
    sched = lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2)  # noqa: E731 - a factory for _trainer
    message = _refuses(_trainer(saved, max_steps=9, schedulers=sched), _loader())
    assert "it holds 0 scheduler(s), this run has 1" in message


def test_a_smaller_data_set_than_the_position_is_named(saved):
    message = _refuses(_trainer(saved, max_steps=9), _loader(n=16))
    assert "saved at batch 6 of epoch 0" in message and "has 4 batches an epoch" in message


def test_a_batch_size_that_cannot_reach_the_same_sample_is_named(saved):
    message = _refuses(_trainer(saved, max_steps=9), _loader(batch_size=5))
    assert "6 batches of 4 (24 samples) into epoch 0" in message and "batch_size=4" in message


def test_a_changed_batch_size_resumes_at_the_same_sample(saved, tmp_path, caplog):
    order = []
    _trainer(tmp_path / "reference", max_steps=12, seen=order).fit(_loader())
    seen = []
    result = _trainer(saved, max_steps=9, seen=seen).fit(_loader(batch_size=8), resume=True)
    # The rest of epoch 0 (samples 24 to 48 of its order) in 3 batches of 8: the same samples, in the same order.
    assert result.steps == 9 and seen == order[24:48]
    assert "the batch size changed from 4 to 8" in caplog.text


def test_damage_still_falls_back_and_a_mismatch_is_not_damage(saved):
    path = saved / NEWEST
    path.write_bytes(path.read_bytes()[:-10])  # truncated: damaged, so the older one is used
    assert _trainer(saved, max_steps=9).fit(_loader(), resume=True).steps == 9
    assert not issubclass(CheckpointError, ConfigError)  # damage stays a CheckpointError only


def test_the_cli_names_a_checkpoint_that_does_not_fit_the_recipe(tmp_path, capsys):
    from turbotrain.cli import main

    recipe = tmp_path / "r.yaml"
    trainer = f"trainer: {{max_steps: 3, checkpoint_dir: {tmp_path / 'ckpt'}, progress: false}}\n"
    recipe.write_text("workload: mlp\n" + trainer)
    assert main(["train", str(recipe)]) == 0
    recipe.write_text("workload: mlp\nbatch_size: 40\nresume: true\n" + trainer)  # 96 samples: not 40s
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "step-000000003.pt: does not fit this run" in err and "batch_size=32" in err
