"""A Parquet cache claim left by a killed process is taken over at once, not honoured for an hour (issue 43, item 9)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

import turbotrain as tt
from turbotrain.data import cache as cache_mod
from turbotrain.data.cache import DiskCache

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# Without the fix a waiter gives up after attempts x (timeout_s + max_backoff_s) = 6.2 s a file.
PATIENT = tt.data.RetryPolicy(attempts=2, backoff_s=0.01, max_backoff_s=0.1, timeout_s=3.0)


def claim_in_a_child(root: Path, url: str) -> int:
    """A forked process that claims ``url`` in the cache at ``root`` and then hangs; returns its pid once claimed."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.write(ready_w, b"1" if DiskCache(root).claim(url) else b"0")
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"1"
    finally:
        os.close(ready_r)
    return pid


def test_a_killed_claimers_file_is_fetched_by_the_restart_without_waiting(tmp_path):
    urls = []
    for k in range(2):
        path = tmp_path / f"part-{k}.parquet"
        pq.write_table(pa.table({"id": list(range(k * 200, (k + 1) * 200))}), path, row_group_size=50)
        urls.append(str(path))
    root = tmp_path / "cache"
    cache = DiskCache(root)
    pid = claim_in_a_child(root, urls[0])
    try:
        assert cache.claimed(urls[0]) and not cache.claim(urls[0])  # its process lives: the claim stands
        os.kill(pid, signal.SIGKILL)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped: a zombie
        assert not cache.claimed(urls[0])
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert not cache.claimed(urls[0])  # reaped: no such process at all
    started = time.monotonic()
    ds = tt.data.ParquetDataset(urls, batch_rows=100, cache=root, retry=PATIENT)
    ids = sorted(int(i) for batch in ds for i in batch["id"])
    assert ids == list(range(400))
    assert time.monotonic() - started < 2.0  # the restart did not wait for the dead claim
    assert ds.cache.local_path(urls[0]) is not None and not os.path.exists(cache._claim_path(urls[0]))


def write_claim(cache: DiskCache, url: str, **owner) -> str:
    path = cache._claim_path(url)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Path(path).write_text(json.dumps({**cache_mod._this_process(), **owner}))
    return path


def test_a_claim_whose_pid_now_belongs_to_another_process_is_taken_over(tmp_path):
    cache = DiskCache(tmp_path / "cache")
    write_claim(cache, "http://h/a.parquet", start="1")  # this pid, but a process started at another time
    assert not cache.claimed("http://h/a.parquet") and cache.claim("http://h/a.parquet")


def test_a_claim_from_a_previous_boot_is_taken_over(tmp_path):
    cache = DiskCache(tmp_path / "cache")
    write_claim(cache, "http://h/a.parquet", boot="00000000-0000-0000-0000-000000000000")
    assert cache.claim("http://h/a.parquet")


def test_a_claim_from_another_host_stands_until_it_is_old(tmp_path):
    cache = DiskCache(tmp_path / "cache")
    path = write_claim(cache, "http://h/a.parquet", host="another-node", pid=1)
    assert cache.claimed("http://h/a.parquet") and not cache.claim("http://h/a.parquet")
    old = time.time() - cache_mod.STALE_TMP_S - 60
    os.utime(path, (old, old))
    assert cache.claim("http://h/a.parquet")


def test_a_claim_left_empty_by_a_writer_that_died_is_taken_over_after_seconds(tmp_path):
    cache = DiskCache(tmp_path / "cache")
    path = cache._claim_path("http://h/a.parquet")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Path(path).touch()
    assert cache.claimed("http://h/a.parquet")  # its owner may be writing it right now
    old = time.time() - cache_mod.CLAIM_WRITE_S - 1
    os.utime(path, (old, old))
    assert cache.claim("http://h/a.parquet")


def test_release_leaves_a_claim_another_process_took_over(tmp_path):
    cache = DiskCache(tmp_path / "cache")
    assert cache.claim("http://h/a.parquet")
    path = write_claim(cache, "http://h/a.parquet", pid=os.getppid(), start="taken-over")
    cache.release("http://h/a.parquet")
    assert os.path.exists(path)
