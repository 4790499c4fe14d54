"""An epoch that yields no batch ends training with an error naming the loader, instead of looping for ever
(and, with checkpoint_dir, writing a checkpoint every empty epoch)."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import turbotrain as tt
from turbotrain.cli import main
from turbotrain.config import ConfigError


def _trainer(**limits):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy,
                      plan=tt.Plan(device="cpu"), progress=False, **limits)


def _data(n):
    return TensorDataset(torch.randn(n, 4), torch.randint(0, 2, (n,)))


@pytest.mark.timeout(30)
def test_a_batch_larger_than_the_data_with_drop_last_is_an_error_not_an_endless_loop(tmp_path):
    loader = DataLoader(_data(10), batch_size=16, drop_last=True)
    with pytest.raises(ConfigError) as err:
        _trainer(max_steps=5, checkpoint_dir=str(tmp_path)).fit(loader)
    message = str(err.value)
    assert "yielded no batch in epoch 0" in message
    assert "10 samples an epoch" in message and "batch_size=16" in message and "drop_last=True" in message
    assert "lower the batch size to 10 or less, or set drop_last=False" in message
    assert not list(tmp_path.iterdir())  # no checkpoint of an empty epoch


@pytest.mark.timeout(30)
def test_a_used_up_iterator_is_an_error_once_its_one_pass_is_trained(tmp_path):
    batches = iter([(torch.randn(2, 4), torch.randint(0, 2, (2,))) for _ in range(3)])
    trainer = _trainer(max_steps=10)
    with pytest.raises(ConfigError, match=r"no batch in epoch 1\. A generator or iterator is used up"):
        trainer.fit(batches)
    assert trainer.state.step == 3


@pytest.mark.timeout(30)
def test_a_resumed_epoch_with_nothing_left_is_not_empty(tmp_path):
    """A checkpoint taken at an epoch's last step resumes into an epoch with no batch left: that is fine."""
    loader = DataLoader(_data(8), batch_size=4)
    _trainer(max_steps=2, checkpoint_dir=str(tmp_path), checkpoint_every_n_steps=2).fit(loader)
    result = _trainer(max_steps=4, checkpoint_dir=str(tmp_path), checkpoint_every_n_steps=2).fit(loader, resume=True)
    assert result.steps == 4 and result.stopped_by == "max_steps"


@pytest.mark.timeout(30)
def test_the_cli_reports_a_recipe_whose_batch_is_larger_than_the_data(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"workload: mlp\nbatch_size: 7000\ntrainer:\n  max_steps: 5\n"
                      f"  checkpoint_dir: {tmp_path / 'ckpt'}\n  progress: false\n")
    assert main(["train", str(recipe)]) == 2  # in this process: `turbotrain train` without importing torch again
    err = capsys.readouterr().err
    assert "batch_size=7000" in err and "drop_last=True" in err and "6400 samples" in err
    assert not list((tmp_path / "ckpt").glob("step-*"))
