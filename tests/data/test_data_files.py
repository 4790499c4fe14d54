"""FileDataset over real servers: concurrency, cache modes, DataLoader workers under fork and spawn."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import multiprocessing as mp

import pytest
import torch
from datahelpers import content_for, leftover_temps
from torch.utils.data import DataLoader

import turbotrain as tt
from turbotrain.data.servers import LocalNginx


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_digests(urls):
    return [digest(content_for(u.rsplit("/", 1)[1], 1024 + 97 * int(u.rsplit("f", 1)[1][:3]))) for u in urls]


def test_items_are_decoded_file_contents_over_http(served_urls):
    ds = tt.data.FileDataset(served_urls, decode=digest)
    assert len(ds) == len(served_urls)
    assert [ds[i] for i in range(len(ds))] == expected_digests(served_urls)


def test_glob_over_http_and_local_paths(nginx, served_dir):
    remote = tt.data.FileDataset(f"{nginx.url}/f00*.bin")
    local = tt.data.FileDataset(str(served_dir / "f00*.bin"))
    assert [u.rsplit("/", 1)[1] for u in remote.urls] == [f"f00{i}.bin" for i in range(10)]
    assert [remote[i] for i in range(len(remote))] == [local[i] for i in range(len(local))]
    with pytest.raises(FileNotFoundError, match="no files match"):
        tt.data.FileDataset(str(served_dir / "nothing-*.bin"))


def test_a_batch_is_fetched_with_many_requests_in_flight(served_urls, monkeypatch):
    """__getitems__ (what a batching DataLoader calls) must overlap the batch's requests."""
    from fsspec.implementations.http import HTTPFileSystem

    state = {"now": 0, "peak": 0}
    original = HTTPFileSystem._cat_file

    async def counting_cat_file(self, url, *args, **kwargs):
        state["now"] += 1  # runs on fsspec's one event-loop thread: no lock needed
        state["peak"] = max(state["peak"], state["now"])
        try:
            await asyncio.sleep(0.02)  # a slow first byte: overlapping requests must show up even on a busy CPU
            return await original(self, url, *args, **kwargs)
        finally:
            state["now"] -= 1

    monkeypatch.setattr(HTTPFileSystem, "_cat_file", counting_cat_file)
    # Options of its own so fsspec builds a new filesystem object that sees the patched method.
    ds = tt.data.FileDataset(served_urls, max_in_flight=16, storage_options={"headers": {"X-Test": "in-flight"}})
    out = ds.__getitems__(list(range(32)))
    assert [digest(b) for b in out] == expected_digests(served_urls[:32])
    assert state["peak"] > 4, f"only {state['peak']} requests were ever in flight together"


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_fill_a_disk_cache_and_epoch_two_needs_no_server(served_dir, tmp_path, context):
    cache = tmp_path / "cache"
    with LocalNginx(served_dir) as server:
        urls = [f"{server.url}/{p.name}" for p in sorted(served_dir.iterdir())]
        ds = tt.data.FileDataset(urls, decode=digest, cache=cache)
        # Persistent workers: spawn starts each worker once (importing torch), not once per epoch.
        loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context=context,
                            persistent_workers=True, collate_fn=list)
        first = [d for batch in loader for d in batch]
    # The server is gone: epoch 2 can only succeed from the cache the workers filled.
    second = [d for batch in loader for d in batch]
    assert first == second == expected_digests(urls)
    assert ds.cached_fraction() == 1.0
    assert leftover_temps(cache) == []


def test_shm_cache_is_shared_by_processes(served_urls, tmp_path, monkeypatch):
    monkeypatch.setattr("turbotrain.data.cache.shm_dir", lambda: tmp_path / "fake-shm")
    ds = tt.data.FileDataset(served_urls[:8], cache="shm").fill()
    assert ds.cache_dir == str(tmp_path / "fake-shm")
    again = tt.data.FileDataset(served_urls[:8], cache="shm")  # a new dataset (another process) sees it all
    assert again.cached_fraction() == 1.0


def test_memory_cache_serves_later_reads_without_the_server(served_dir):
    with LocalNginx(served_dir) as server:
        urls = [f"{server.url}/{p.name}" for p in sorted(served_dir.iterdir())][:6]
        ds = tt.data.FileDataset(urls, decode=digest, cache="memory")
        first = [ds[i] for i in range(len(ds))]
    assert [ds[i] for i in range(len(ds))] == first == expected_digests(urls)


def test_memory_cache_filling_in_a_worker_warns(served_urls, caplog, monkeypatch):
    ds = tt.data.FileDataset(served_urls[:4], cache="memory")
    # Workers log in their own process, out of caplog's reach: act as worker 0 in this one.
    monkeypatch.setattr("turbotrain.data.files.get_worker_info", lambda: object())
    with caplog.at_level(logging.WARNING, logger="turbotrain"):
        ds[0]
        ds[1]
    assert caplog.text.count("cache='shm'") == 1


def test_fill_needs_a_cache_and_bad_cache_specs_are_rejected(served_urls):
    with pytest.raises(ValueError, match="needs a cache"):
        tt.data.FileDataset(served_urls[:1]).fill()
    with pytest.raises(ValueError, match="local directory"):
        tt.data.FileDataset(served_urls[:1], cache="s3://bucket/cache")
    with pytest.raises(ValueError, match="no URLs"):
        tt.data.FileDataset([])


def _fill_worker(urls, cache, barrier):
    barrier.wait()  # every process starts fetching the same files at the same moment
    tt.data.FileDataset(urls, cache=cache, max_in_flight=16).fill()


def test_several_processes_share_one_cache_dir_without_corruption(served_urls, cache_dir):
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_fill_worker, args=(served_urls, str(cache_dir), barrier)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    ds = tt.data.FileDataset(served_urls, decode=digest, cache=cache_dir)
    entries = [ds.cache.entry_path(u) for u in served_urls]
    assert all(e.exists() for e in entries)
    assert [digest(e.read_bytes()) for e in entries] == expected_digests(served_urls)
    assert leftover_temps(cache_dir) == []


def test_dataloader_collates_decoded_tensors(served_urls):
    ds = tt.data.FileDataset(served_urls[:16], decode=lambda b: torch.tensor(len(b)))
    sizes = torch.cat(list(DataLoader(ds, batch_size=4)))
    assert sizes.tolist() == [1024 + 97 * i for i in range(16)]
