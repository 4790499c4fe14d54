"""Faults on the way to storage and in the cache: retries, errors naming the URL, nothing partial kept."""

from __future__ import annotations

import errno
import os
import subprocess
import time

import pytest
from datahelpers import content_for, fault_requests, leftover_temps, unmount

import turbotrain as tt
from turbotrain.data.cache import CacheFullError, DiskCache

FAST = tt.data.RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.05, timeout_s=0.5)


def test_missing_file_fails_at_once_naming_the_url(nginx):
    url = f"{nginx.url}/no-such-file.bin"
    with pytest.raises(FileNotFoundError, match="no-such-file.bin: no such file"):
        tt.data.FileDataset([url], retry=FAST)[0]


def test_http_500_is_retried_then_named(nginx):
    url = f"{nginx.base}/status/500"
    started = time.perf_counter()
    with pytest.raises(tt.data.FetchError, match=r"status/500: HTTP 500.*attempt 3 of 3") as info:
        tt.data.FileDataset([url], retry=FAST)[0]
    assert info.value.url == url
    assert time.perf_counter() - started >= 0.01  # it did back off between attempts


def test_http_403_is_not_retried(fault_server, nginx):
    with pytest.raises(tt.data.FetchError, match="attempt 1 of 3"):
        tt.data.FileDataset([f"{nginx.base}/status/403"], retry=FAST)[0]


@pytest.mark.parametrize("mode", ["flaky-2", "flakyreset-2", "flakytrunc-2"])
def test_transient_failures_are_retried_until_the_file_arrives_whole(fault_server, cache_dir, mode):
    url = f"{fault_server}/{mode}/item.bin"
    ds = tt.data.FileDataset([url], cache=cache_dir, retry=FAST)
    assert ds[0] == content_for("item.bin")
    assert fault_requests(f"/{mode}/item.bin") == 3
    assert ds.cache.entry_path(url).read_bytes() == content_for("item.bin")


@pytest.mark.parametrize("mode, says", [("reset", "attempt 3 of 3"), ("stall", "timed out|Timeout"),
                                        ("truncate", "attempt 3 of 3")])
def test_persistent_faults_end_in_an_error_naming_the_url_and_cache_nothing(fault_server, cache_dir, mode, says):
    url = f"{fault_server}/{mode}/x.bin"
    ds = tt.data.FileDataset([url], cache=cache_dir, retry=FAST)
    with pytest.raises(tt.data.FetchError, match=says) as info:
        ds[0]
    assert url in str(info.value)
    assert not ds.cache.entry_path(url).exists()  # a partial download is never kept
    assert leftover_temps(cache_dir) == []


def test_an_error_in_a_worker_reaches_the_main_process_with_the_url(nginx):
    from torch.utils.data import DataLoader

    url = f"{nginx.base}/status/503"
    loader = DataLoader(tt.data.FileDataset([url], retry=FAST), batch_size=1, num_workers=1, collate_fn=list)
    with pytest.raises(Exception, match="status/503"):
        list(loader)


def short_writes(room: int | None, most: int = 64):
    """An ``os.write`` that writes at most ``most`` bytes a call (as the kernel may), failing like a full
    disk once ``room`` bytes are written (never, with None)."""
    real_write = os.write
    state = {"room": room}

    def write(fd, data):
        n = min(len(data), most)
        if state["room"] is not None:
            if state["room"] <= 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            n = min(n, state["room"])
            state["room"] -= n
        return real_write(fd, bytes(data[:n]))

    return write


def test_disk_full_gives_a_clear_error_and_no_half_written_file(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path / "cache")
    with monkeypatch.context() as patch:
        patch.setattr("turbotrain.data.cache.os.write", short_writes(room=100))
        with pytest.raises(CacheFullError, match=r"cache directory .*cache is full .* for http://h/a.bin; no partial"):
            cache.put("http://h/a.bin", b"x" * 1000)
    assert cache.get("http://h/a.bin") is None
    assert leftover_temps(tmp_path / "cache") == []


def test_short_writes_still_store_the_whole_file_with_its_version(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path / "cache")
    data = os.urandom(10_000)
    with monkeypatch.context() as patch:
        patch.setattr("turbotrain.data.cache.os.write", short_writes(room=None, most=999))
        cache.put("http://h/b.bin", data, version="etag-1")
    assert cache.get("http://h/b.bin") == data
    assert cache.recorded_version("http://h/b.bin") == "etag-1"
    assert leftover_temps(tmp_path / "cache") == []


def test_disk_full_on_a_real_tiny_filesystem(tmp_path):
    mount = tmp_path / "tiny"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root (the injected-ENOSPC test above covers the logic)")
    try:
        cache = DiskCache(mount)
        cache.put("http://h/small.bin", b"s" * 1000)
        with pytest.raises(CacheFullError, match="is full"):
            cache.put("http://h/big.bin", os.urandom(600_000))
        assert cache.get("http://h/small.bin") == b"s" * 1000
        assert cache.get("http://h/big.bin") is None
        assert leftover_temps(mount) == []
    finally:
        unmount(mount)


def test_a_crash_before_the_rename_leaves_no_entry(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path / "cache")

    def crash(src, dst):
        raise KeyboardInterrupt  # the process dies between writing and renaming

    monkeypatch.setattr("turbotrain.data.cache.os.replace", crash)
    with pytest.raises(KeyboardInterrupt):
        cache.put("http://h/a.bin", b"abc")
    monkeypatch.undo()
    assert cache.get("http://h/a.bin") is None
    assert leftover_temps(tmp_path / "cache") == []


def test_clearing_deletes_only_what_turbotrain_wrote(tmp_path):
    root = tmp_path / "cache"
    cache = DiskCache(root)
    cache.put("http://h/a.bin", b"a")
    cache.put("http://h/b.bin", b"b")
    entry_dir = cache.entry_path("http://h/a.bin").parent
    # The user's files, one of them even named like an entry but outside an entry folder.
    mine = [root / "notes.txt", entry_dir / "user-file.txt", root / ("ab" * 32)]
    for path in mine:
        path.write_text("the user's")
    stale = entry_dir / ".tmp-crashed"
    stale.write_bytes(b"partial")
    assert tt.data.clear_cache(root) == 3
    assert all(p.read_text() == "the user's" for p in mine)
    assert not stale.exists() and cache.get("http://h/b.bin") is None
    with pytest.raises(ValueError, match="not a turbotrain cache"):
        tt.data.clear_cache(tmp_path)


def test_stale_temp_files_of_dead_writers_are_swept(tmp_path):
    cache = DiskCache(tmp_path / "cache")
    cache.put("http://h/a.bin", b"a")
    sub = cache.entry_path("http://h/a.bin").parent
    old, fresh = sub / ".tmp-old", sub / ".tmp-fresh"
    old.write_bytes(b"x")
    fresh.write_bytes(b"y")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    DiskCache(tmp_path / "cache")
    assert not old.exists() and fresh.exists()  # a fresh one may belong to a writer still at work
