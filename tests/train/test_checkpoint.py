import pickle

import pytest
import torch
import torch.nn.functional as F
from tiny import make_loader, make_mlp

import turbotrain as tt
from turbotrain.train.checkpoint import (CheckpointError, clean_temporary_files, latest_checkpoint, list_checkpoints,
    load_checkpoint, save_checkpoint)


def _state(step):
    return {"format": 1, "step": step, "w": torch.full((3,), float(step))}


def test_save_commits_data_then_manifest(tmp_path):
    path = save_checkpoint(_state(5), tmp_path, 5)
    assert path.name == "step-000000005.pt" and path.with_suffix(".json").exists()
    assert load_checkpoint(path)["step"] == 5
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_uncommitted_data_is_never_picked_up_and_is_cleaned(tmp_path):
    save_checkpoint(_state(1), tmp_path, 1)
    path = save_checkpoint(_state(2), tmp_path, 2)
    path.with_suffix(".json").unlink()  # as if killed between writing the data and the commit
    (tmp_path / ".step-000000003.pt.tmp-999").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("the user's own file")
    found, state = latest_checkpoint(tmp_path)
    assert state["step"] == 1
    removed = {p.name for p in clean_temporary_files(tmp_path)}
    assert removed == {"step-000000002.pt", ".step-000000003.pt.tmp-999"}
    assert (tmp_path / "notes.txt").exists()


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, damage):
    save_checkpoint(_state(1), tmp_path, 1)
    path = save_checkpoint(_state(2), tmp_path, 2)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[len(data) // 2] ^= 0x40
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=str(path.name)):
        load_checkpoint(path)
    assert latest_checkpoint(tmp_path)[1]["step"] == 1


class _Payload:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_pickle_payload_is_refused_and_never_runs(tmp_path):
    import hashlib
    import json

    target = tmp_path / "written-by-payload"
    path = tmp_path / "step-000000009.pt"
    data = pickle.dumps({"format": 1, "evil": _Payload(str(target))})
    path.write_bytes(data)  # even with a manifest that matches, weights_only refuses it
    path.with_suffix(".json").write_text(json.dumps({"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}))
    with pytest.raises(CheckpointError, match="not a loadable turbotrain checkpoint"):
        load_checkpoint(path)
    assert not target.exists()


def test_trainer_keeps_the_newest_checkpoints(tmp_path):
    model = make_mlp()
    tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, checkpoint_dir=str(tmp_path),
               checkpoint_every_n_steps=2, keep_checkpoints=2, max_steps=8, progress=False).fit(make_loader())
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000000006.pt", "step-000000008.pt"]
    state = load_checkpoint(list_checkpoints(tmp_path)[-1])
    assert set(state) >= {"model", "optimizers", "schedulers", "position", "runtime", "plan"}
    # Saved at the step boundary of the epoch's last batch: resuming finishes that epoch first.
    assert (state["position"]["epoch"], state["position"]["batches_done"], state["step"]) == (0, 8, 8)


def test_disk_full_leaves_no_half_written_file(tmp_path, monkeypatch):
    import builtins

    real_open = builtins.open

    class FullFile:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(builtins, "open", lambda p, mode="r", *a, **k: FullFile(real_open(p, mode, *a, **k))
                        if "w" in mode and ".tmp-" in str(p) else real_open(p, mode, *a, **k))
    with pytest.raises(CheckpointError, match="No space left.*nothing was committed"):
        save_checkpoint(_state(1), tmp_path, 1)
    assert list(tmp_path.iterdir()) == []
