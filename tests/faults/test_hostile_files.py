"""Hostile files: damaged or malicious checkpoints, and recipe YAML that tries to run code.

A checkpoint that is truncated, has flipped bits, is empty, is not a file, has a broken
manifest or carries a pickle payload raises one error type, CheckpointError, naming the
file; resuming falls back to the previous good checkpoint; a payload never runs. A recipe
with unknown keys, wrong types or object-constructing YAML tags is a ConfigError that says
where, and nothing in it is executed.
"""

import hashlib
import json
import logging
import os
import pickle
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import turbotrain as tt
from turbotrain.config import ConfigError
from turbotrain.recipe import load_recipe
from turbotrain.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint

SRC = str(Path(__file__).resolve().parents[2] / "src")
NEWEST = "step-000000008.pt"


def _fit(directory, max_steps, resume=False):
    """A tiny run with checkpoints at steps 4 and 8; returns the step it started from."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    started = []

    def step(ctx, batch):
        started.append(ctx.global_step)
        return F.cross_entropy(ctx.model(batch[0]), batch[1])

    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(x, x[:, :3].argmax(1)), batch_size=8, shuffle=True)
    tt.Trainer(model, opt, step_fn=step, plan=tt.Plan(device="cpu"), max_steps=max_steps, checkpoint_dir=str(directory),
               checkpoint_every_n_steps=4, progress=False).fit(loader, resume=resume)
    return started[0] if started else None


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("good")
    _fit(directory, 8)
    return directory


@pytest.fixture
def ckpt_dir(saved, tmp_path):
    directory = tmp_path / "ckpt"
    shutil.copytree(saved, directory)
    return directory


def _resign(path: Path, data: bytes) -> None:
    """Write ``data`` *and* a manifest that matches it: as if the damaged file had been committed."""
    path.write_bytes(data)
    path.with_suffix(".json").write_text(json.dumps({"format": 1, "step": 8, "bytes": len(data),
                                                     "sha256": hashlib.sha256(data).hexdigest()}))


def _refused(path: Path) -> CheckpointError:
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value) and err.value.path == str(path)
    return err.value


def test_truncated_at_many_offsets_is_refused_naming_the_file(ckpt_dir):
    path = ckpt_dir / NEWEST
    data = path.read_bytes()
    manifest = path.with_suffix(".json").read_text()
    offsets = sorted({0, 1, 2, 4, 16, 64, len(data) - 1, *range(0, len(data), max(1, len(data) // 48))})
    for offset in offsets:
        path.write_bytes(data[:offset])
        assert "truncated" in _refused(path).reason, offset
    # Committed at the wrong length (the manifest agrees): the reader still refuses, with the same error type.
    for offset in offsets:
        _resign(path, data[:offset])
        _refused(path)
    path.write_bytes(data)
    path.with_suffix(".json").write_text(manifest)
    assert load_checkpoint(path)["step"] == 8


def test_flipped_bits_are_refused_naming_the_file(ckpt_dir):
    path = ckpt_dir / NEWEST
    data = path.read_bytes()
    rng = random.Random(8)
    positions = [0, len(data) - 1, *(rng.randrange(len(data)) for _ in range(150))]
    for pos in positions:
        damaged = bytearray(data)
        damaged[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        assert "SHA-256" in _refused(path).reason, pos
    # With a manifest rewritten to match, many flips still parse (the SHA-256 is what catches
    # them); none may escape as anything but a CheckpointError or crash the process.
    parsed = 0
    for pos in positions:
        damaged = bytearray(data)
        damaged[pos] ^= 1 << rng.randrange(8)
        _resign(path, bytes(damaged))
        try:
            load_checkpoint(path)
            parsed += 1
        except CheckpointError as exc:
            assert exc.path == str(path)
    print(f"{parsed} of {len(positions)} bit flips parse once the manifest is rewritten to match")


MANIFESTS = {
    "empty": "",
    "not JSON": "step 8, trust me",
    "a list": "[1, 2]",
    "no hash": '{"bytes": 10}',
    "size is text": '{"bytes": "ten", "sha256": "00"}',
    "size is NaN": '{"bytes": NaN, "sha256": "00"}',
    "size overflows": '{"bytes": 1e400, "sha256": "00"}',
    "nested 100k deep": "[" * 100_000 + "]" * 100_000,
    "not UTF-8": "\udcff\udcfe",
}


@pytest.mark.parametrize("kind", MANIFESTS)
def test_a_broken_manifest_is_refused_naming_the_file(ckpt_dir, kind):
    path = ckpt_dir / NEWEST
    path.with_suffix(".json").write_text(MANIFESTS[kind], errors="surrogateescape")
    assert "manifest" in _refused(path).reason
    assert latest_checkpoint(ckpt_dir)[1]["step"] == 4


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["empty", "a directory", "a FIFO", "a link to /dev/zero"])
def test_a_data_file_that_is_not_a_checkpoint_file_is_refused_without_reading_it(ckpt_dir, kind):
    path = ckpt_dir / NEWEST
    path.unlink()
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "a directory":
        path.mkdir()
    elif kind == "a FIFO":
        os.mkfifo(path)  # reading it would block for ever
    else:
        path.symlink_to("/dev/zero")  # reading it would never end
    _refused(path)
    assert latest_checkpoint(ckpt_dir)[1]["step"] == 4


class Payload:
    """Unpickling this calls ``fn(*args)``: each variant would create ``target``."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _payloads(target: Path):
    return {
        "open": Payload(open, str(target), "w"),
        "os.system": Payload(os.system, f"touch {target}"),
        "exec": Payload(exec, f"open({str(target)!r}, 'w').close()"),
        "subprocess": Payload(subprocess.call, ["touch", str(target)]),
    }


FORMATS = {
    "pickle protocol 2": lambda obj, path: path.write_bytes(pickle.dumps(obj, protocol=2)),
    "pickle protocol 5": lambda obj, path: path.write_bytes(pickle.dumps(obj, protocol=5)),
    "torch.save (zip)": lambda obj, path: torch.save(obj, path),
    "torch.save (legacy)": lambda obj, path: torch.save(obj, path, _use_new_zipfile_serialization=False),
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 5")
@pytest.mark.parametrize("fmt", FORMATS)
def test_pickle_payloads_never_run_and_resume_falls_back(ckpt_dir, tmp_path, fmt, caplog):
    target = tmp_path / "written-by-payload"
    path = ckpt_dir / NEWEST
    for name, payload in _payloads(target).items():
        state = {"format": 1, "step": 8, "model": {"evil": payload}}  # where a state dict would be
        FORMATS[fmt](state, path)
        _resign(path, path.read_bytes())  # the attacker can write the manifest too
        assert "not a loadable turbotrain checkpoint" in _refused(path).reason, name
        assert not target.exists(), f"the {name} payload ran"
    caplog.set_level(logging.WARNING, logger="turbotrain")
    assert _fit(ckpt_dir, 12, resume=True) == 4  # fell back to the previous good checkpoint
    assert NEWEST in caplog.text and not target.exists()


DAMAGE = {
    "truncated": lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 3]),
    "bit flipped": lambda path: path.write_bytes(bytes([path.read_bytes()[0] ^ 1]) + path.read_bytes()[1:]),
    "empty": lambda path: path.write_bytes(b""),
    "manifest deleted": lambda path: path.with_suffix(".json").unlink(),
    "manifest nested": lambda path: path.with_suffix(".json").write_text("[" * 100_000),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_resume_falls_back_past_a_damaged_newest_checkpoint_and_trains_on(ckpt_dir, damage, caplog):
    DAMAGE[damage](ckpt_dir / NEWEST)
    caplog.set_level(logging.INFO, logger="turbotrain")
    assert _fit(ckpt_dir, 12, resume=True) == 4
    if damage != "manifest deleted":  # that one is an uncommitted leftover: cleaned up, not loaded
        assert f"skipping checkpoint {ckpt_dir / NEWEST}" in caplog.text
    assert load_checkpoint(ckpt_dir / "step-000000012.pt")["step"] == 12


# -- recipes ---------------------------------------------------------------------------------------

TAGS = [
    "!!python/object/apply:os.system ['touch {target}']",
    "!!python/object/new:subprocess.Popen [['touch', '{target}']]",
    "!!python/object/apply:builtins.exec [\"open('{target}', 'w').close()\"]",
    "!!python/name:os.system",
    "!!python/module:os",
    "!!python/object:turbotrain.plan.Plan {{precision: fp16-mixed}}",
    "!include /etc/passwd",
]
PLACES = ["workload: {tag}\n", "workload: mlp\nplan: {tag}\n", "workload: mlp\ntrainer:\n  max_steps: {tag}\n",
          "workload: mlp\ntrainer:\n  loggers: [csv, {tag}]\n"]


@pytest.mark.parametrize("tag", TAGS, ids=lambda t: t.split()[0])
def test_yaml_tags_that_construct_objects_are_refused_and_never_run(tmp_path, tag):
    target = tmp_path / "written-by-yaml"
    for place in PLACES:
        text = place.format(tag=tag.format(target=target))
        with pytest.raises(ConfigError, match=r"\(line \d+, column \d+\): not valid YAML for turbotrain"):
            load_recipe(text)
    with pytest.raises(ConfigError, match="not valid YAML"):
        tt.Plan.from_yaml(f"precision: {tag.format(target=target)}\n")
    assert not target.exists()


BAD_RECIPES = [  # beyond tests/test_recipe_cli.py: nested keys, each kind of wrong type, wrong values
    ("workload: mlp\ntraining_hyperparams: {torch_compiles: true}\n",
     r"training_hyperparams.torch_compiles: unknown key"),
    ("workload: mlp\nplan: {grad_accum_step: 2}\n", r"plan.grad_accum_step: unknown key.*'grad_accum_steps'"),
    ("workload: mlp\nplan: {grad_accum_steps: '2'}\n",
     r"plan.grad_accum_steps: '2' is not allowed; expected an integer"),
    ("workload: mlp\ntrainer: {max_steps: true}\n", r"trainer.max_steps: True is not allowed"),
    ("workload: mlp\ntrainer: {max_steps: 2.5}\n", r"trainer.max_steps: 2.5 is not allowed"),
    ("workload: mlp\ntrainer: [max_steps, 3]\n", r"trainer: .* is not allowed; expected a mapping"),
    ("workload: mlp\nplan: {channels_last: yes please}\n", r"plan.channels_last: 'yes please' is not allowed"),
    ("workload: mlp\nseed: {a: 1}\n", r"seed: .* is not allowed; expected an integer"),
    ("workload: mlp\ntrainer: {gradient_clip_val: .nan}\n", r"gradient_clip_val: nan is not allowed"),
    ("workload: mlp\nlr: .nan\n", r"lr: nan is not allowed"),
    ("workload: mlp\nlr: -0.1\n", r"lr: -0.1 is not allowed"),
    ("workload: mlp\nbatch_size: 0\n", r"batch_size: 0 is not allowed"),
    ("workload: mlp\nworkload: cnn\n", r"line 2.*duplicate key 'workload'"),
    ("- workload: mlp\n", r"expected a mapping"),
]


@pytest.mark.parametrize("text, match", BAD_RECIPES)
def test_bad_recipes_are_clear_errors(text, match):
    with pytest.raises(ConfigError, match=match):
        load_recipe(text)


def test_an_alias_bomb_is_a_short_error_not_gigabytes(tmp_path):
    """Nine levels of YAML aliases stand for 9**9 items; the error must not spell them out."""
    nested = '&l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]'
    for level in range(1, 9):
        nested = f"&l{level} [{nested}, " + ", ".join([f"*l{level - 1}"] * 8) + "]"
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"trainer.loggers\[0\]") as err:
        load_recipe("workload: mlp\ntrainer: {loggers: " + nested + "}\n")
    assert len(str(err.value)) < 2000 and time.monotonic() - started < 30


def test_the_cli_refuses_a_hostile_recipe_without_running_it(tmp_path):
    target = tmp_path / "written-by-yaml"
    recipe = tmp_path / "hostile.yaml"
    recipe.write_text(f"workload: mlp\ntrainer:\n  max_steps: !!python/object/apply:os.system ['touch {target}']\n")
    out = subprocess.run([sys.executable, "-m", "turbotrain", "train", str(recipe)], capture_output=True, text=True,
                         env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{recipe} (line 3, column 14): not valid YAML" in out.stderr
    assert not target.exists()
