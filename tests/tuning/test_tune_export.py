"""The plan as YAML, as Lightning Trainer flags and as an Accelerate config, each read back by its framework."""

from __future__ import annotations

import pytest

import turbotrain as tt
from turbotrain.tuning.export import (ExportError, accelerate_config, accelerate_yaml, code_changes, lightning_flags,
    lightning_snippet, plan_yaml)

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


@pytest.mark.parametrize("export", [accelerate_yaml, accelerate_config, lightning_flags, lightning_snippet],
                         ids=lambda f: f.__name__)
def test_a_pipeline_plan_is_refused_with_what_to_do_instead(export):
    """Neither framework runs torch.distributed.pipelining stages: no file that fails later, an error now."""
    plan = tt.Plan(strategy="pipeline", pipeline_stages=2)
    with pytest.raises(ExportError, match=r"strategy='pipeline'.*turbotrain launch --nproc-per-node N train.py"):
        export(plan)


def test_each_switch_writes_its_own_flag_config_key_or_line():
    """What the registry entries declare, gathered: every flag and line of one plan that sets them all."""
    plan = tt.Plan(device="cuda:1", precision="bf16-true", cudnn_benchmark=True, tf32=True, strategy="fsdp",
                   sync_batchnorm=True, set_to_none=False, intra_op_threads=3, batch_size=64)
    assert lightning_flags(plan) == {"accelerator": "gpu", "devices": [1], "benchmark": True, "precision": "bf16-true",
                                     "sync_batchnorm": True, "strategy": "fsdp", "accumulate_grad_batches": 1}
    config = accelerate_config(plan)
    assert config["distributed_type"] == "FSDP" and "num_processes" not in config
    assert config["mixed_precision"] == "bf16"
    assert accelerate_config(tt.Plan(device="cpu", strategy="ddp"))["distributed_type"] == "MULTI_CPU"
    assert accelerate_config(tt.Plan())["num_processes"] == 1
    code = code_changes(plan, "accelerate")
    assert code[0].startswith("torch.set_num_threads(3)") and code[-1] == "DataLoader(dataset, batch_size=64)"
    assert "model = model.to(torch.bfloat16)  # bf16 weights (the config's bf16 is autocast)" in code
    assert "optimizer.zero_grad(set_to_none=False)" in code
    assert not any("bfloat16" in line for line in code_changes(plan, "lightning"))   # Lightning has the flag
