"""Checkpoint files are the user's own: a link planted at the predictable temporary name is never written
through, and a checkpoint_dir another user owns (or can write to) is refused before anything is read or
written there. New folders are 0700, files 0600."""

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny import make_loader, make_mlp

import turbotrain as tt
from turbotrain.config import ConfigError
from turbotrain.train.checkpoint import load_checkpoint, save_checkpoint

ROOT = os.geteuid() == 0
NOBODY = 65534


def _state(step):
    return {"format": 1, "step": step, "w": torch.full((3,), float(step))}


def _fit(directory, resume=False):
    model = make_mlp()
    trainer = tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy,
                         checkpoint_dir=str(directory), max_steps=2, progress=False)
    return trainer.fit(make_loader(), resume=resume)


def test_a_link_planted_at_the_temporary_names_is_never_written_through(tmp_path):
    directory = tmp_path / "ckpt"
    directory.mkdir(mode=0o700)
    victims = []
    for suffix in ("pt", "json"):
        victim = tmp_path / f"victim-{suffix}"
        victim.write_text("the user's own file")
        (directory / f".step-000000001.{suffix}.tmp-{os.getpid()}").symlink_to(victim)
        victims.append(victim)
    path = save_checkpoint(_state(1), directory, 1)
    assert all(v.read_text() == "the user's own file" for v in victims)
    assert not path.is_symlink() and load_checkpoint(path)["step"] == 1
    assert sorted(p.name for p in directory.iterdir()) == ["step-000000001.json", "step-000000001.pt"]


def test_a_new_checkpoint_dir_is_private(tmp_path):
    directory = tmp_path / "new" / "ckpt"
    path = save_checkpoint(_state(1), directory, 1)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in (path, path.with_suffix(".json"))} == {0o600}


def _as_another_user(action):
    """Run ``action()`` in a forked child as uid/gid 65534: a second user, for real (needs root)."""
    pid = os.fork()
    if pid == 0:  # the child does file system calls only, then leaves without running any cleanup
        code = 1
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            action()
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0


@pytest.fixture
def shared_parent():
    """A folder every user can create folders in (pytest's own temporary folders are 0700)."""
    parent = Path(tempfile.mkdtemp(prefix="tt-shared-"))
    parent.chmod(0o1777)
    yield parent
    shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.skipif(not ROOT, reason="a second uid needs root; the next test simulates one")
def test_a_checkpoint_dir_another_user_made_is_refused_before_anything_is_read_or_written(shared_parent, tmp_path):
    directory = shared_parent / "ckpt"
    _fit(tmp_path / "good")  # a genuine checkpoint, which the other user writes into a folder they own
    files = {p.name: p.read_bytes() for p in (tmp_path / "good").iterdir()}

    def plant():
        directory.mkdir()
        for name, data in files.items():
            (directory / name).write_bytes(data)

    _as_another_user(plant)
    assert directory.stat().st_uid == NOBODY
    before = sorted(p.name for p in directory.iterdir())
    for resume in (True, False):
        with pytest.raises(ConfigError, match=f"checkpoint_dir {directory}: belongs to uid {NOBODY}, not to you"):
            _fit(directory, resume=resume)
    assert sorted(p.name for p in directory.iterdir()) == before  # nothing written, nothing cleaned


def test_another_owner_is_refused_also_where_no_second_uid_exists(tmp_path, monkeypatch):
    directory = tmp_path / "ckpt"
    save_checkpoint(_state(1), directory, 1)
    monkeypatch.setattr(os, "geteuid", lambda: directory.stat().st_uid + 1)  # as seen by another user
    with pytest.raises(ConfigError, match="belongs to uid .*plant a checkpoint"):
        save_checkpoint(_state(2), directory, 2)
    with pytest.raises(ConfigError, match="belongs to uid"):
        _fit(directory, resume=True)
    assert not (directory / "step-000000002.pt").exists()


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o703], ids=oct)
def test_a_checkpoint_dir_everyone_can_write_to_is_refused(tmp_path, mode):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    directory.chmod(mode)
    with pytest.raises(ConfigError, match=rf"writable by everyone .*chmod go-w {directory}"):
        _fit(directory)
    assert not list(directory.iterdir())


@pytest.mark.skipif(not ROOT, reason="giving a folder to another group needs root")
def test_a_checkpoint_dir_another_group_can_write_to_is_refused(tmp_path):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    directory.chmod(0o770)
    os.chown(directory, -1, NOBODY)
    with pytest.raises(ConfigError, match=f"writable by group {NOBODY}"):
        _fit(directory)
