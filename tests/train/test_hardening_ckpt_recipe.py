"""Recipe and Trainer values that used to mean something else (or crash) are errors naming the key."""

import pytest
import torch
import torch.nn.functional as F

import turbotrain as tt
from turbotrain.cli import main
from turbotrain.config import ConfigError
from turbotrain.recipe import load_recipe

BAD = [
    ("trainer: {max_time: -1}", r"trainer.max_time: -1.0 is not allowed; expected a duration > 0"),  # trained 0 steps
    ("trainer: {max_time: 0}", r"trainer.max_time: 0.0 is not allowed"),
    ("trainer: {max_time: '00:00'}", r"trainer.max_time: '00:00' is not allowed"),
    ("trainer: {max_time: .nan}", r"trainer.max_time: nan is not allowed"),  # meant: no limit
    ("trainer: {max_time: .inf}", r"trainer.max_time: inf is not allowed.*or null for no limit"),
    ("trainer: {checkpoint_dir: ''}", r"trainer.checkpoint_dir: '' is not allowed"),  # wrote into the working folder
    ("trainer: {log_dir: ''}", r"trainer.log_dir: '' is not allowed"),
    ("seed: 18446744073709551616", r"seed: 18446744073709551616 is not allowed; expected an integer from 0"),
    ("seed: -1", r"seed: -1 is not allowed"),
    ("plan: {num_workers: 100000}", r"plan.num_workers: 100000 is not allowed; expected at most 256"),
    ("plan: {intra_op_threads: 100000}", r"plan.intra_op_threads: 100000 is not allowed; expected at most 1024"),
]


@pytest.mark.parametrize("line, match", BAD, ids=[b[0] for b in BAD])
def test_values_that_meant_something_else_are_errors_naming_the_key(line, match):
    with pytest.raises(ConfigError, match=match):
        load_recipe(f"workload: mlp\n{line}\n")


def test_the_limits_still_take_what_they_should():
    recipe = load_recipe("workload: mlp\nseed: 18446744073709551615\ntrainer: {max_time: '00:01:00'}\n"
                         "plan: {num_workers: 256, intra_op_threads: 64}\n")
    assert recipe.trainer.max_time_s == 60 and recipe.seed == 2**64 - 1


def test_the_trainer_names_its_own_key():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match=r"^Trainer.max_time: -5.0 is not allowed"):
        tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.mse_loss, max_time=-5.0)


def test_the_cli_reports_a_huge_seed_as_a_recipe_error(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("workload: mlp\nseed: 100000000000000000000000\n")
    assert main(["train", str(recipe)]) == 2  # was a traceback from torch.manual_seed, exit 1
    assert "seed: 100000000000000000000000 is not allowed" in capsys.readouterr().err
