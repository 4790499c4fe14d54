"""``turbotrain tune`` for a reference workload and for a recipe, writing the three outputs."""

from __future__ import annotations

import turbotrain as tt
from turbotrain.cli import main


def test_tune_a_workload_and_write_yaml_lightning_and_accelerate(tmp_path, capsys):
    out = {name: tmp_path / name for name in ("plan.yaml", "lightning.py", "accelerate.yaml")}
    rc = main(["tune", "--workload", "mlp", "--time-budget", "30", "--exclude", "compile", "--no-cache",
               "--yaml", str(out["plan.yaml"]), "--lightning", str(out["lightning.py"]),
               "--accelerate", str(out["accelerate.yaml"])])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "turbotrain tune on" in printed and "compile: excluded by the caller" in printed
    plan = tt.Plan.from_yaml(out["plan.yaml"])
    assert plan.compile is False
    assert out["plan.yaml"].read_text().startswith("# turbotrain tune, mlp workload:")
    assert "L.Trainer(" in out["lightning.py"].read_text()
    assert "distributed_type: 'NO'" in out["accelerate.yaml"].read_text()


def test_tune_a_recipe_prints_the_plan_yaml(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("workload: mlp\nseed: 3\nbatch_size: 64\nplan:\n  device: cpu\n  grad_accum_steps: 2\n")
    rc = main(["tune", str(recipe), "--time-budget", "30", "--include", "fused_optimizer", "--no-workers",
               "--no-cache"])
    assert rc == 0
    printed = capsys.readouterr().out
    yaml_text = printed[printed.index("# turbotrain tune, mlp workload:"):]
    plan = tt.Plan.from_yaml(yaml_text)
    assert plan.device == "cpu" and plan.grad_accum_steps == 2   # what the recipe fixed is kept


def test_nothing_to_tune_is_a_usage_error(capsys):
    assert main(["tune"]) == 2
    assert "give a recipe YAML or --workload" in capsys.readouterr().err
