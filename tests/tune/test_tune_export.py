"""The plan as YAML, as Lightning Trainer flags and as an Accelerate config, each read back by its framework."""

from __future__ import annotations

import pytest

import turbotrain as tt
from turbotrain.tune.export import accelerate_yaml, lightning_flags, lightning_snippet, plan_yaml

TUNED = tt.Plan(device="cpu", precision="bf16-mixed", compile=True, channels_last=True, fused_optimizer=True,
                grad_accum_steps=2, num_workers=2, persistent_workers=True, pin_memory=False)


def test_yaml_round_trips_with_its_header(tmp_path):
    text = plan_yaml(TUNED, "tuned: 1.9x the naive plan\non this CPU")
    assert text.startswith("# tuned: 1.9x the naive plan\n# on this CPU\n")
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    assert tt.Plan.from_yaml(path) == TUNED


def test_lightning_trainer_accepts_the_flags():
    pl = pytest.importorskip("lightning.pytorch")
    flags = lightning_flags(TUNED)
    assert flags["precision"] == "bf16-mixed" and flags["accumulate_grad_batches"] == 2
    trainer = pl.Trainer(**flags, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    assert trainer.accumulate_grad_batches == 2
    assert type(trainer.precision_plugin).__name__ == "MixedPrecision"
    assert trainer.precision_plugin.precision == "bf16-mixed"
    assert lightning_flags(tt.Plan(precision="fp16-mixed"))["precision"] == "16-mixed"


def test_lightning_snippet_carries_what_has_no_flag():
    text = lightning_snippet(TUNED)
    assert 'torch.compile(model, mode="default")' in text
    assert "memory_format=torch.channels_last" in text and "fused=True" in text
    assert "num_workers=2" in text and "persistent_workers=True" in text
    compile(text, "<lightning snippet>", "exec")     # valid Python


def test_accelerate_reads_the_config_and_launches_with_it(tmp_path):
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    path = tmp_path / "accelerate.yaml"
    path.write_text(accelerate_yaml(TUNED))
    config = ClusterConfig.from_yaml_file(str(path))
    assert config.mixed_precision == "bf16" and config.use_cpu is True
    assert config.dynamo_config["dynamo_backend"] == "INDUCTOR"
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args = _validate_launch_command(args)[0]          # fills the launch arguments from the config file
    _, env = prepare_simple_launcher_cmd_env(args)
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert env["ACCELERATE_DYNAMO_BACKEND"].upper() == "INDUCTOR"
    assert "gradient_accumulation_steps=2" in path.read_text()   # code-side, as a comment


def test_naive_plan_exports_plain_settings():
    assert "dynamo_config" not in accelerate_yaml(tt.Plan())
    assert "mixed_precision: 'no'" in accelerate_yaml(tt.Plan())
    assert lightning_flags(tt.Plan())["precision"] == "32-true"
