import dataclasses

import pytest
import torch

import turbotrain as tt
from turbotrain.config import ConfigError


def test_default_plan_is_naive():
    plan = tt.Plan()
    assert plan.precision == "fp32" and plan.compile is False and not plan.channels_last
    assert plan.grad_accum_steps == 1 and plan.compile_mode is None
    assert plan.changes() == {}
    assert plan.describe() == "naive (plain PyTorch)"


def test_yaml_round_trip(tmp_path):
    plan = tt.Plan(precision="bf16-mixed", compile="max-autotune", channels_last=True, grad_accum_steps=4,
                   num_workers=2, persistent_workers=True, strategy="ddp", sync_batchnorm="force")
    path = tmp_path / "plan.yaml"
    plan.to_yaml(path)
    assert tt.Plan.from_yaml(path) == plan
    assert tt.Plan.from_yaml(plan.to_yaml()) == plan  # YAML text works too
    assert tt.Plan.from_dict(plan.to_dict()) == plan


def test_unknown_key_names_it_suggests_and_lists_allowed(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("precison: bf16-mixed\n")
    with pytest.raises(ConfigError) as err:
        tt.Plan.from_yaml(path)
    msg = str(err.value)
    assert "precison" in msg and "Did you mean 'precision'" in msg and "channels_last" in msg
    assert str(path) in msg
    with pytest.raises(ConfigError, match="unknown key 'chanels_last'.*Did you mean 'channels_last'"):
        tt.Plan(chanels_last=True)


@pytest.mark.parametrize("field, value, expected", [
    ("precision", "bf16", "one of 'fp32', 'bf16-mixed', 'fp16-mixed', 'bf16-true'"),
    ("compile", "fastest", "true or false or one of 'default'"),
    ("channels_last", "yes", "true or false"),
    ("grad_accum_steps", 1.5, "an integer"),
    ("grad_accum_steps", 0, ">= 1"),
    ("num_workers", True, "an integer or null"),
])
def test_bad_values_say_what_is_allowed(field, value, expected):
    with pytest.raises(ConfigError) as err:
        tt.Plan(**{field: value})
    assert field in str(err.value) and expected in str(err.value)


def test_bad_value_in_yaml_names_file_and_key(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("compile: maybe\n")
    with pytest.raises(ConfigError, match=r"p\.yaml\.compile: 'maybe' is not allowed"):
        tt.Plan.from_yaml(path)


def test_yaml_tags_that_construct_objects_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(f"precision: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        tt.Plan.from_yaml(path)
    assert not marker.exists()


def test_plan_is_immutable_and_replace_validates():
    plan = tt.Plan()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.precision = "bf16-mixed"
    assert plan.replace(channels_last=True).channels_last
    with pytest.raises(ConfigError, match="unknown key 'chanel'"):
        plan.replace(chanel=True)


def test_fast_plan_rules_on_this_cpu():
    from turbotrain.bench.models import GPT, ResNetCNN
    from turbotrain.hardware import detect

    hw = detect("cpu")
    cnn, gpt = tt.Plan.fast(ResNetCNN(), device="cpu"), tt.Plan.fast(GPT(), device="cpu")
    assert cnn.channels_last and cnn.compile and cnn.drop_conv_bias
    # On CPU compile is only recommended for conv nets (it slows small transformers here).
    assert not gpt.channels_last and gpt.compile is False and not gpt.drop_conv_bias
    expected = "bf16-mixed" if hw.bf16 else "fp32"
    assert cnn.precision == gpt.precision == expected
    # Nothing a rule picks is then skipped for this hardware.
    assert not cnn.cudnn_benchmark and not cnn.pin_memory and not cnn.device_prefetch


def test_persistent_workers_without_workers_is_refused():
    with pytest.raises(ConfigError, match="persistent_workers.*num_workers > 0"):
        tt.Plan(persistent_workers=True, num_workers=0)


def test_device_that_is_absent_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="no CUDA device"):
        tt.prepare(torch.nn.Linear(2, 2), None, tt.Plan(device="cuda"))


def test_tiny_models_get_no_bf16_on_cpu():
    from turbotrain.bench.models import TinyMLP

    plan = tt.Plan.fast(TinyMLP(), device="cpu")
    assert plan.precision == "fp32" and plan.fused_optimizer  # autocast's casts would only add overhead


def test_intra_op_threads_round_trips_and_is_validated(tmp_path):
    plan = tt.Plan(intra_op_threads=3, num_workers=1)
    assert tt.Plan.from_yaml(plan.to_yaml()) == plan and "intra_op_threads: 3" in plan.to_yaml()
    assert tt.Plan.from_dict(plan.to_dict()) == plan
    assert tt.Plan().intra_op_threads is None  # naive: torch's own thread count
    for bad, expected in ((0, ">= 1"), (2.5, "an integer"), ("four", "an integer")):
        with pytest.raises(ConfigError, match=f"intra_op_threads.*{expected}"):
            tt.Plan(intra_op_threads=bad)
    with pytest.raises(ConfigError, match="unknown key 'intra_op_thread'.*Did you mean 'intra_op_threads'"):
        tt.Plan.from_yaml("intra_op_thread: 2\n")


@pytest.mark.parametrize("field, most", [("num_workers", 256), ("intra_op_threads", 1024)])
def test_a_worker_or_thread_count_past_any_machine_is_a_typo(field, most):
    assert getattr(tt.Plan(**{field: most}), field) == most
    with pytest.raises(tt.ConfigError, match=f"Plan.{field}: {most + 1} is not allowed; expected at most {most}"):
        tt.Plan(**{field: most + 1})
