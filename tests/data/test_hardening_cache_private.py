"""Another user cannot read or replace what turbotrain caches (issue 43, item 2), played by a real second uid.

We run as root, so a forked child that drops to uid/gid 65534 ('nobody') is the attacker: it takes the
predictable /dev/shm folder name first, or makes the folder a user names as cache=, then tries to read
the victim's cached sample and swap it for its own.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable

import pytest

from turbotrain.data import cache as cache_mod
from turbotrain.data.cache import DiskCache, UnsafeCacheDirError, open_cache

ATTACKER = 65534  # 'nobody': a uid no test file belongs to

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="becoming a second user (uid 65534) in a forked child needs root; run as root to check this",
)


def as_user(uid: int, fn: Callable[[], int]) -> int:
    """``fn()`` in a forked child running as ``uid`` (and gid ``uid``, no extra groups); returns its result.

    The child does only plain os calls and leaves with os._exit, so nothing of pytest's runs twice.
    """
    pid = os.fork()
    if pid == 0:
        code = 98
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            code = fn()
        except BaseException:  # noqa: BLE001 - the child reports any failure as an exit code
            code = 99
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture
def shared_tmp():
    """A world-writable sticky folder like /dev/shm itself (pytest's tmp_path is closed to other users)."""
    base = Path(tempfile.mkdtemp(prefix="tt-test-shared-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    os.chmod(base, 0o1777)
    yield base
    shutil.rmtree(base)


READ, REPLACED = 1, 2


def attack(entry: Path, planted: bytes) -> Callable[[], int]:
    """What the attacker did in the issue: read the victim's cached sample, then replace it (bit mask of successes)."""

    def run() -> int:
        done = 0
        try:
            with open(entry, "rb") as f:
                f.read()
            done |= READ
        except OSError:
            pass
        try:  # the entry's folder belongs to the victim: move it aside and put one of ours in its place
            os.rename(entry.parent, f"{entry.parent}.old")
            os.mkdir(entry.parent, 0o755)
        except OSError:
            pass
        try:
            with open(entry, "wb") as f:
                f.write(planted)
            done |= REPLACED
        except OSError:
            pass
        return done

    return run


def test_an_shm_folder_another_user_made_first_is_passed_over_for_a_private_one(shared_tmp, monkeypatch, caplog):
    monkeypatch.setattr(cache_mod, "SHM_ROOT", str(shared_tmp))
    taken = shared_tmp / f"turbotrain-cache-{os.getuid()}"

    def take_the_name() -> int:
        os.mkdir(taken)
        os.chmod(taken, 0o777)
        return 0

    assert as_user(ATTACKER, take_the_name) == 0
    with caplog.at_level(logging.WARNING, logger="turbotrain"):
        cache = open_cache("shm")
    assert isinstance(cache, DiskCache)
    assert cache.root != taken and cache.root.parent == shared_tmp
    assert any(str(taken) in r.getMessage() and "uid 65534" in r.getMessage() for r in caplog.records)
    st = os.stat(cache.root)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o700)

    url = "http://store/sample-7.bin"
    cache.put(url, b"the victim's sample", version={"etag": "v1"})
    assert stat.S_IMODE(os.stat(cache.entry_path(url)).st_mode) == 0o600
    # The attacker can list /dev/shm and find the folder, but cannot read or replace anything in it.
    assert as_user(ATTACKER, attack(cache.entry_path(url), b"cos\nsystem\n(S'echo pwned'\ntR.")) == 0
    assert cache.get(url) == b"the victim's sample"
    again = open_cache("shm")  # the next run finds the same private folder: one shm cache per user still
    assert isinstance(again, DiskCache) and again.root == cache.root
    assert list(taken.iterdir()) == []  # nothing of the victim's went into the attacker's folder


def test_a_cache_dir_another_user_owns_is_refused_with_what_to_do(shared_tmp):
    folder = shared_tmp / "team-cache"

    def make_it() -> int:
        os.mkdir(folder, 0o777)
        os.chmod(folder, 0o777)
        return 0

    assert as_user(ATTACKER, make_it) == 0
    with pytest.raises(UnsafeCacheDirError, match=r"team-cache belongs to uid 65534 .*not to you.*folder of your own"):
        DiskCache(folder)
    assert list(folder.iterdir()) == []  # not even the marker was written there


def test_a_link_another_user_planted_at_the_cache_path_is_refused(shared_tmp, tmp_path, monkeypatch):
    mine = tmp_path / "root-only"
    mine.mkdir(mode=0o700)
    link = shared_tmp / "cache"

    def plant() -> int:
        os.symlink(mine, link)  # points turbotrain at a folder of the victim's choosing... or of theirs
        return 0

    assert as_user(ATTACKER, plant) == 0
    with pytest.raises(UnsafeCacheDirError, match="symbolic link made by uid 65534"):
        DiskCache(link)
    monkeypatch.setattr(cache_mod, "SHM_ROOT", str(shared_tmp))
    os.rename(link, shared_tmp / f"turbotrain-cache-{os.getuid()}")
    shm = open_cache("shm")
    assert isinstance(shm, DiskCache) and not shm.root.is_symlink() and list(mine.iterdir()) == []

