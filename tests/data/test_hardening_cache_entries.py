"""Cache entries: private modes, no secret at rest, length checked against the record, full disk raised (issue 43)."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from pathlib import Path

import pytest
from datahelpers import content_for, unmount
from torch.utils.data import DataLoader

import turbotrain as tt
from turbotrain.data import cache as cache_mod
from turbotrain.data.cache import CacheFullError, DiskCache, UnsafeCacheDirError

SECRET_URL = "https://alice:hunter2@store.example/train/x.bin?X-Amz-Signature=f00dfeedSIG&X-Amz-Credential=AKIAKEY"
SECRETS = [b"hunter2", b"f00dfeedSIG", b"AKIAKEY", b"alice", b"store.example"]


def everything_in(root: Path) -> list[Path]:
    return [root, *sorted(root.rglob("*"))]


def at_rest(path: Path) -> bytes:
    """A file's bytes and every extended attribute it carries."""
    out = path.read_bytes() if path.is_file() else b""
    try:
        names = os.listxattr(path)
    except OSError:
        names = []
    return out + b"".join(os.getxattr(path, name) for name in names)


@pytest.mark.parametrize("xattrs", [True, False], ids=["xattr-record", "side-file-record"])
def test_entries_are_private_and_keep_no_secret_of_their_url(tmp_path, monkeypatch, xattrs):
    if not xattrs:  # a filesystem without user xattrs: the record goes to a .v file beside the entry
        def no_xattrs(*args, **kwargs):
            raise OSError(errno.ENOTSUP, "Operation not supported")

        monkeypatch.setattr(cache_mod.os, "setxattr", no_xattrs)
    cache = DiskCache(tmp_path / "cache")
    cache.put(SECRET_URL, b"sample", version={"etag": "e1", "size": 6})
    assert cache.claim(SECRET_URL)
    assert cache.get(SECRET_URL) == b"sample" and cache.recorded_version(SECRET_URL) == {"etag": "e1", "size": 6}
    paths = everything_in(cache.root)
    assert len(paths) >= 5  # root, marker, entry folder, entry, claim (and the .v file without xattrs)
    for path in paths:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
        assert path.stat().st_uid == os.geteuid()
        assert not any(secret in at_rest(path) for secret in SECRETS), path
    cache.release(SECRET_URL)


def test_a_folder_of_ours_others_could_read_is_made_private(tmp_path):
    folder = tmp_path / "old-cache"
    folder.mkdir()
    os.chmod(folder, 0o755)  # what an older turbotrain (or mkdir under umask 022) left
    DiskCache(folder)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_a_folder_others_could_write_is_refused_once_it_holds_files_and_made_private_while_empty(tmp_path):
    empty, used = tmp_path / "empty", tmp_path / "used"
    for folder in (empty, used):
        folder.mkdir()
        os.chmod(folder, 0o777)
    (used / "aa").mkdir()  # anything in it could have been planted by another user
    with pytest.raises(UnsafeCacheDirError, match=r"used is writable by other users \(mode 777\).*chmod 700"):
        DiskCache(used)
    assert stat.S_IMODE(os.stat(used).st_mode) == 0o777  # refused: left as the user had it
    DiskCache(empty)
    assert stat.S_IMODE(os.stat(empty).st_mode) == 0o700


def test_an_entry_whose_length_differs_from_its_record_is_dropped_and_fetched_again(served_urls, tmp_path, caplog):
    url = served_urls[5]
    ds = tt.data.FileDataset([url], cache=tmp_path / "cache")
    good = ds[0]
    entry = ds.cache.entry_path(url)
    os.truncate(entry, len(good) // 2)  # a torn copy (a disk fault, a copy cut short)
    assert ds.cache.get(url) is None and not entry.exists()
    assert "bytes where its record says" in caplog.text
    assert ds[0] == good == content_for(Path(url).name, len(good))
    assert entry.read_bytes() == good  # fetched again and cached whole
    with open(entry, "ab") as f:
        f.write(b"junk")  # longer than recorded: the local path Parquet memory-maps is checked too
    assert ds.cache.local_path(url) is None and not entry.exists()


def test_a_parquet_entry_cut_short_is_fetched_again(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "part.parquet"
    pq.write_table(pa.table({"id": list(range(300))}), path, row_group_size=100)
    ds = tt.data.ParquetDataset(str(path), batch_rows=100, cache=tmp_path / "cache")
    assert sum(len(b["id"]) for b in ds) == 300
    entry = ds.cache.entry_path(str(path))
    os.truncate(entry, entry.stat().st_size - 10)  # the footer gone: not readable as Parquet
    again = tt.data.ParquetDataset(str(path), batch_rows=100, cache=tmp_path / "cache")
    assert sum(len(b["id"]) for b in again) == 300


@pytest.fixture
def tiny_cache(tmp_path, monkeypatch):
    """A cache folder whose disk fills after about 48 KiB: a real tmpfs where `mount` works, else injected ENOSPC."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48k,mode=0700", "tmpfs", str(mount)], capture_output=True
    ).returncode == 0
    if not mounted:
        real, room = cache_mod._write_all, {"left": 48 << 10}

        def write_all(fd, data):
            room["left"] -= len(data)
            if room["left"] < 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(fd, data)

        monkeypatch.setattr(cache_mod, "_write_all", write_all)
    yield mount / "cache"
    if mounted:
        unmount(mount)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_full_disk_on_the_read_ahead_path_raises_cache_full_error(served_urls, tiny_cache, workers):
    ds = tt.data.FileDataset(served_urls, cache=tiny_cache)  # 48 files, about 150 KB
    loader = tt.data.read_ahead(DataLoader(ds, batch_size=8, num_workers=workers, collate_fn=list))
    batches = iter(loader)
    try:
        with pytest.raises(CacheFullError, match=r"cache directory .*cache is full .* no partial file"):
            for _ in batches:
                pass
    finally:
        if workers:  # stop them now: the traceback keeps the iterator alive, and a later GC would join them
            batches._shutdown_workers()  # torch's own way to stop an iterator's workers at once
