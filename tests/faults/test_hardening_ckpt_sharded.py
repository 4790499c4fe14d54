"""A checkpoint is data only: a rewritten one (with a manifest that matches it) never runs code on resume.

A sharded checkpoint (FSDP, through torch.distributed.checkpoint) is a step file naming a folder whose
``.metadata`` is a pickle. Resume reads that folder only when it is a plain folder of checkpoint_dir
that the manifest's hashes cover, unpickles its ``.metadata`` with DCP's metadata classes only, and every
other pickle in it with ``weights_only``; each refusal names the file.
"""

import hashlib
import json
import logging
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import turbotrain as tt
from turbotrain.train.checkpoint import CheckpointError, CheckpointMismatchError, load_checkpoint

NEWEST = "step-000000008.pt"


class Payload:
    """Unpickling this runs ``os.system``: it creates ``target``."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return os.system, (f"touch {self.target}",)


def _trainer(directory, max_steps, sharded, hidden=16):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    trainer = tt.Trainer(model, opt, F.cross_entropy, plan=tt.Plan(device="cpu"), max_steps=max_steps,
                         checkpoint_dir=str(directory), checkpoint_every_n_steps=4, progress=False)
    trainer.ranks.sharded = sharded  # writes what FSDP writes (a DCP folder), in one process without FSDP
    return trainer


def _loader():
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    return DataLoader(TensorDataset(x, x[:, :3].argmax(1)), batch_size=8, shuffle=True,
                      generator=torch.Generator().manual_seed(2))


def _fit(directory, max_steps, resume=False, sharded=False):
    trainer = _trainer(directory, max_steps, sharded)
    trainer.fit(_loader(), resume=resume)
    return trainer


def _file_entry(path: Path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _resign(path: Path, state: dict, folders=()) -> None:
    """Write ``state`` and a manifest matching it and ``folders``: what an attacker who can write files does."""
    torch.save(state, path)
    manifest = {"format": 1, "step": state["step"], **_file_entry(path)}
    if folders:
        manifest["folders"] = {name: {f.name: _file_entry(f) for f in (path.parent / name).iterdir()}
                               for name in folders}
    path.with_suffix(".json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    directory = tmp_path_factory.mktemp("plain")
    _fit(directory, 8)
    return directory


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sharded")
    _fit(directory, 8, sharded=True)
    return directory


def _copy(src, tmp_path):
    directory = tmp_path / "ckpt"
    shutil.copytree(src, directory)
    os.chmod(directory, 0o700)
    return directory


@pytest.mark.parametrize("where", ["absolute", "dot-dot"])
def test_a_sharded_folder_outside_checkpoint_dir_is_refused_and_its_payload_never_runs(plain, tmp_path, where):
    directory, marker = _copy(plain, tmp_path), tmp_path / "payload-ran"
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    path = directory / NEWEST
    state = torch.load(path, weights_only=True)
    state["sharded"] = str(evil) if where == "absolute" else "../evil"
    _resign(path, state)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert err.value.path == str(path) and "does not cover" in err.value.reason
    (directory / "step-000000004.pt").unlink()  # no older checkpoint to fall back to: resume must refuse
    with pytest.raises(CheckpointError, match=f"{NEWEST}.*does not cover"):
        _fit(directory, 12, resume=True)
    assert not marker.exists(), "the checkpoint ran code"


def test_a_sharded_checkpoint_round_trips_with_every_file_hashed(sharded, tmp_path):
    directory = _copy(sharded, tmp_path)
    manifest = json.loads((directory / "step-000000008.json").read_text())
    folder = directory / "step-000000008.dcp"
    assert set(manifest["folders"]["step-000000008.dcp"]) == {p.name for p in folder.iterdir()}
    resumed = _fit(directory, 12, resume=True, sharded=True)
    assert resumed.state.step == 12
    # The same weights as one uninterrupted run (the data position is exact): the shards were loaded.
    straight = _fit(tmp_path / "straight", 12)
    for a, b in zip(resumed.model.state_dict().values(), straight.model.state_dict().values()):
        assert torch.equal(a, b)


def test_a_changed_shard_is_refused_naming_it_and_resume_falls_back(sharded, tmp_path, caplog):
    directory = _copy(sharded, tmp_path)
    shard = next((directory / "step-000000008.dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(directory / NEWEST)
    assert err.value.path == str(shard) and "SHA-256" in err.value.reason
    caplog.set_level(logging.WARNING, logger="turbotrain")
    assert _fit(directory, 12, resume=True, sharded=True).state.step == 12
    assert f"skipping checkpoint {shard}" in caplog.text


def test_a_file_the_manifest_does_not_cover_is_refused(sharded, tmp_path):
    directory = _copy(sharded, tmp_path)
    (directory / "step-000000008.dcp" / "__9_0.distcp").write_bytes(b"planted")
    with pytest.raises(CheckpointError, match=r"not covered by it: __9_0.distcp"):
        load_checkpoint(directory / NEWEST)


def test_hostile_metadata_covered_by_a_resigned_manifest_is_never_unpickled(sharded, tmp_path):
    directory, marker = _copy(sharded, tmp_path), tmp_path / "payload-ran"
    metadata = directory / "step-000000008.dcp" / ".metadata"
    metadata.write_bytes(pickle.dumps(Payload(marker)))
    path = directory / NEWEST
    _resign(path, torch.load(path, weights_only=True), folders=["step-000000008.dcp"])
    assert load_checkpoint(path)["sharded"] == "step-000000008.dcp"  # the hashes match: the attacker re-signed
    (directory / "step-000000004.pt").unlink()
    with pytest.raises(CheckpointError) as err:
        _fit(directory, 12, resume=True, sharded=True)
    assert err.value.path == str(metadata) and "posix.system is not part of" in err.value.reason
    assert not marker.exists(), "the checkpoint ran code"


def test_a_hostile_value_inside_a_shard_is_never_unpickled(sharded, tmp_path):
    """A non-tensor entry of a shard (an optimizer setting) is a torch.save pickle DCP loads with
    weights_only=False; turbotrain loads it as data."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    directory, marker = _copy(sharded, tmp_path), tmp_path / "payload-ran"
    trainer = _trainer(directory, 12, sharded=True)
    model_state, optim_state = get_state_dict(trainer.model, trainer.rt.optimizers)
    optim_state["param_groups"][0]["lr"] = Payload(marker)
    folder = directory / "step-000000008.dcp"
    shutil.rmtree(folder)
    dcp.save({"model": model_state, "optimizers": optim_state}, checkpoint_id=str(folder), no_dist=True)
    path = directory / NEWEST
    _resign(path, torch.load(path, weights_only=True), folders=["step-000000008.dcp"])
    (directory / "step-000000004.pt").unlink()
    with pytest.raises(CheckpointError, match=r"8.dcp: could not be loaded .UnpicklingError: .*GLOBAL posix.system"):
        trainer.fit(_loader(), resume=True)
    assert not marker.exists(), "the checkpoint ran code"


def test_a_sharded_checkpoint_of_another_model_is_refused_before_anything_is_loaded(sharded, tmp_path):
    directory = _copy(sharded, tmp_path)
    trainer = _trainer(directory, 12, sharded=True, hidden=32)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(CheckpointMismatchError, match=r"8.dcp: does not fit this run: shapes differ: model.0.weight "
                                                      r"is \[16, 8\] there, \[32, 8\] here"):
        trainer.fit(_loader(), resume=True)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
