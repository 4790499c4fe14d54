import subprocess
import sys
from pathlib import Path

import pytest

import turbotrain as tt
from turbotrain.config import ConfigError
from turbotrain.recipe import load_recipe

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _cli(*args, cwd=None):
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "turbotrain", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_supergradients_compile_switch_maps_onto_the_plan(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("workload: mlp\nplan: {precision: bf16-mixed}\n"
                    "training_hyperparams: {torch_compile: true, torch_compile_mode: max-autotune}\n")
    plan = load_recipe(path).resolved_plan()
    assert plan.compile == "max-autotune" and plan.precision == "bf16-mixed"


@pytest.mark.parametrize("text, match", [
    ("workload: mlp\ntrainer: {max_stepz: 3}\n",
     r"trainer.max_stepz: unknown key 'max_stepz'.*Did you mean 'max_steps'"),
    ("workload: resnet\n", r"workload: 'resnet' is not allowed; expected one of 'gpt', 'cnn', 'mlp'"),
    ("workload: mlp\nplan: {precision: fp8}\n", r"plan.precision: 'fp8' is not allowed"),
    ("workload: mlp\ntraining_hyperparams: {torch_compile_mode: fastest}\n", r"torch_compile_mode"),
    ("workload: mlp\nplan: !!python/object/apply:os.getcwd []\n", r"not valid YAML"),
])
def test_bad_recipes_name_the_key(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_recipe(path)


def test_cli_train_runs_a_recipe_and_checkpoints(tmp_path):
    recipe = tmp_path / "mlp.yaml"
    recipe.write_text(f"workload: mlp\nplan: naive\ntrainer:\n  max_steps: 20\n  log_every_n_steps: 10\n"
                      f"  checkpoint_dir: {tmp_path / 'ckpt'}\n  progress: false\n")
    out = _cli("train", str(recipe))
    assert out.returncode == 0, out.stderr
    assert "stopped by max_steps after 20 steps" in out.stdout
    assert (tmp_path / "ckpt" / "step-000000020.pt").exists()


def test_cli_reports_a_bad_recipe_without_a_traceback(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("workload: mlp\nplan: {chanels_last: true}\n")
    out = _cli("train", str(recipe))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "unknown key 'chanels_last'" in out.stderr and "Did you mean 'channels_last'" in out.stderr


def test_cli_print_plan_round_trips(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("workload: cnn\nplan: fast\n")
    out = _cli("train", str(recipe), "--print-plan")
    assert out.returncode == 0, out.stderr
    models = __import__("turbotrain.bench.models", fromlist=["x"])
    assert tt.Plan.from_yaml(out.stdout) == tt.Plan.fast(models.ResNetCNN())
