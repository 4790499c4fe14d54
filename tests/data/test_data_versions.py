"""A persistent cache is never stale: a file changed on the store between two runs is fetched again."""

from __future__ import annotations

import os
import time

import fsspec
import pytest

import turbotrain as tt
from turbotrain.data.servers import LocalNginx, LocalS3
from turbotrain.data.versions import same_version


def _rewrite(path, data: bytes, seconds_later: float = 5.0) -> None:
    """A new upload of the file: new bytes (same size), a later modification time."""
    stat = path.stat()
    path.write_bytes(data)
    os.utime(path, (stat.st_atime + seconds_later, stat.st_mtime + seconds_later))


def test_a_file_changed_on_nginx_between_two_runs_is_fetched_again(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    for name in ("a.bin", "b.bin"):
        (root / name).write_bytes(name.encode() * 100)
    cache = tmp_path / "cache"
    with LocalNginx(root, latency_s=0.002) as server:
        urls = [f"{server.url}/a.bin", f"{server.url}/b.bin"]
        first = tt.data.FileDataset(urls, cache=cache)
        assert [first[0], first[1]] == [b"a.bin" * 100, b"b.bin" * 100]
        _rewrite(root / "a.bin", b"A.BIN" * 100)  # same size, within the same minute
        second = tt.data.FileDataset(urls, cache=cache)  # the next run
        assert second[0] == b"A.BIN" * 100
        assert second[1] == b"b.bin" * 100
        assert second.cache.get(urls[0]) == b"A.BIN" * 100


def test_old_files_are_validated_by_one_listing_without_a_request_per_file(tmp_path, monkeypatch):
    from fsspec.implementations.http import HTTPFileSystem

    root = tmp_path / "served"
    root.mkdir()
    long_ago = time.time() - 86400
    for i in range(20):
        path = root / f"{i:02d}.bin"
        path.write_bytes(bytes([i]) * 50)
        os.utime(path, (long_ago, long_ago))
    cache = tmp_path / "cache"
    heads = []
    original = HTTPFileSystem._info

    async def counting_info(self, url, **kwargs):
        heads.append(url)
        return await original(self, url, **kwargs)

    monkeypatch.setattr(HTTPFileSystem, "_info", counting_info)
    with LocalNginx(root, latency_s=0.002) as server:
        urls = [f"{server.url}/{i:02d}.bin" for i in range(20)]
        tt.data.FileDataset(urls, cache=cache).fill()
        again = tt.data.FileDataset(urls, cache=cache)
        assert again.cached_fraction() == 1.0
        assert heads == []  # one listing per run, no HEAD per file
        old = root / "07.bin"
        old.write_bytes(b"new" * 20)  # a new upload: its listed size and minute differ
        third = tt.data.FileDataset(urls, cache=cache)
        assert third.cached_fraction() == 19 / 20
        assert third[7] == b"new" * 20


def test_a_file_changed_on_s3_between_two_runs_is_fetched_again(tmp_path):
    pytest.importorskip("s3fs", reason="s3fs is in the test extra: pip install -e '.[test]'")
    cache = tmp_path / "cache"
    with LocalS3() as server:
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **server.storage_options)
        fs.mkdir("versioned")
        fs.pipe("versioned/d/x.bin", b"old bytes")
        fs.pipe("versioned/d/y.bin", b"unchanged")
        urls = ["s3://versioned/d/x.bin", "s3://versioned/d/y.bin"]
        first = tt.data.FileDataset(urls, cache=cache, storage_options=server.storage_options)
        assert first.__getitems__([0, 1]) == [b"old bytes", b"unchanged"]
        fs.pipe("versioned/d/x.bin", b"new bytes")  # same size, another ETag
        second = tt.data.FileDataset(urls, cache=cache, storage_options=server.storage_options)
        assert second.cached_fraction() == 0.5
        assert second.__getitems__([0, 1]) == [b"new bytes", b"unchanged"]


def test_entries_without_a_recorded_version_are_not_trusted(served_urls, cache_dir):
    ds = tt.data.FileDataset(served_urls[:3], cache=cache_dir)
    ds.cache.put(served_urls[0], b"written by an older turbotrain, no version")
    again = tt.data.FileDataset(served_urls[:3], cache=cache_dir)
    assert served_urls[0] not in again.cache
    assert again[0] != b"written by an older turbotrain, no version"


def test_same_version_compares_the_fields_both_carry():
    assert same_version({"size": 3, "mtime": "x"}, {"size": 3, "mtime": "x", "etag": "e"})
    assert not same_version({"size": 3, "mtime": "x"}, {"size": 3, "mtime": "y"})
    assert not same_version({"etag": "e"}, {"size": 3})  # nothing in common: unknown, so not the same
    assert not same_version(None, {"size": 3})
