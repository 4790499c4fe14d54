"""Read-ahead across batch boundaries, one stream shared by the workers, and no stall after forked workers."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import math
import time

import pytest
import torch
from datahelpers import content_for
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import turbotrain as tt
from turbotrain.data import stats
from turbotrain.data.readahead import ReadAheadBatches


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected(url: str) -> str:
    name = url.rsplit("/", 1)[1]
    return digest(content_for(name, 1024 + 97 * int(name[1:4])))


def _names(batch):
    return batch


def test_requests_stay_in_flight_across_batch_boundaries(served_urls, monkeypatch):
    """Batches of 4 with 16 in flight: more than one batch's requests must overlap."""
    from fsspec.implementations.http import HTTPFileSystem

    state = {"now": 0, "peak": 0}
    original = HTTPFileSystem._cat_file

    async def counting_cat_file(self, url, *args, **kwargs):
        state["now"] += 1  # fsspec's one event-loop thread: no lock needed
        state["peak"] = max(state["peak"], state["now"])
        try:
            await asyncio.sleep(0.02)
            return await original(self, url, *args, **kwargs)
        finally:
            state["now"] -= 1

    monkeypatch.setattr(HTTPFileSystem, "_cat_file", counting_cat_file)
    ds = tt.data.FileDataset(served_urls, decode=digest, max_in_flight=16,
                             storage_options={"headers": {"X-Test": "read-ahead"}})
    loader = tt.data.read_ahead(DataLoader(ds, batch_size=4, shuffle=True, collate_fn=_names,
                                           generator=torch.Generator().manual_seed(0)))
    assert isinstance(loader.batch_sampler, ReadAheadBatches)
    got = [d for batch in loader for d in batch]
    assert sorted(got) == sorted(expected(u) for u in served_urls)
    assert state["peak"] > 4, f"only {state['peak']} requests were ever in flight together (one batch is 4)"


def test_the_main_process_stream_holds_a_bounded_window(served_urls):
    ds = tt.data.FileDataset(served_urls, max_in_flight=4)
    loader = tt.data.read_ahead(DataLoader(ds, batch_size=2, collate_fn=_names))
    held = []
    for _batch in loader:
        stream = ds._stream
        held.append(len(stream._ready) + len(stream._running))
        time.sleep(0.005)  # a slow consumer: the stream must stop at its window, not read the epoch
    assert max(held) <= ds._stream.window + ds._stream.in_flight


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_share_one_read_ahead_stream(served_urls, cache_dir, context):
    ds = tt.data.FileDataset(served_urls, decode=digest, cache=cache_dir, max_in_flight=8)
    loader = tt.data.read_ahead(DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, collate_fn=_names,
                                           multiprocessing_context=context))
    assert isinstance(loader.batch_sampler, ReadAheadBatches)
    before = stats.snapshot()
    got = [d for batch in loader for d in batch]
    reads = (stats.snapshot() - before).schemes.get("http")
    assert sorted(got) == sorted(expected(u) for u in served_urls)
    assert ds.cached_fraction() == 1.0
    # One plan, each file claimed once: no file fetched by both workers (a little slack for a worker
    # that asks for a file before either pump has started).
    assert reads.files <= len(served_urls) + 4, reads


def test_distributed_sampler_and_set_epoch_follow_the_sampler(served_urls, cache_dir):
    ds = tt.data.FileDataset(served_urls, decode=digest, cache=cache_dir)
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
    loader = tt.data.read_ahead(DataLoader(ds, batch_size=5, sampler=sampler, collate_fn=_names))
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        want = [expected(served_urls[i]) for i in sampler]
        got = [d for batch in loader for d in batch]
        assert got == want
        epochs.append(got)
    assert epochs[0] != epochs[1]


def test_the_cache_is_looked_up_where_indices_are_fed_never_on_the_event_loop(served_urls, cache_dir, monkeypatch):
    """The event loop's thread handles every response: a stat per file there would delay them all."""
    import threading

    from turbotrain.data.cache import DiskCache

    threads: set[str] = set()
    original = DiskCache.__contains__

    def recording_contains(self, url):
        threads.add(threading.current_thread().name)
        return original(self, url)

    monkeypatch.setattr(DiskCache, "__contains__", recording_contains)
    ds = tt.data.FileDataset(served_urls, decode=digest, cache=cache_dir, max_in_flight=8)
    ds.fill(range(0, len(served_urls), 2))  # half of them cached before: those must not be fetched
    loader = tt.data.read_ahead(DataLoader(ds, batch_size=4, shuffle=True, collate_fn=_names))
    before = stats.snapshot()
    got = [d for batch in loader for d in batch]
    reads = (stats.snapshot() - before).schemes.get("http")
    assert sorted(got) == sorted(expected(u) for u in served_urls)
    assert reads.files == len(served_urls) // 2, reads
    assert threads == {threading.main_thread().name}, threads


def test_cache_writes_run_on_a_few_threads_however_many_reads_are_in_flight(served_urls, cache_dir, monkeypatch):
    """Writing an entry is CPU work in the kernel: more writers than WRITE_THREADS only contend."""
    import threading

    from turbotrain.data import readahead

    state = {"now": 0, "peak": 0}
    lock = threading.Lock()
    original = tt.data.FileDataset.store

    def slow_store(self, url, data):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.005)  # long enough for writes to pile up if more threads took them
        try:
            original(self, url, data)
        finally:
            with lock:
                state["now"] -= 1

    monkeypatch.setattr(tt.data.FileDataset, "store", slow_store)
    ds = tt.data.FileDataset(served_urls, decode=digest, cache=cache_dir, max_in_flight=32)
    loader = tt.data.read_ahead(DataLoader(ds, batch_size=8, collate_fn=_names))
    got = [d for batch in loader for d in batch]
    assert got == [expected(u) for u in served_urls]
    deadline = time.monotonic() + 10
    while ds.cache_writer().pending and time.monotonic() < deadline:
        time.sleep(0.01)  # the batches came from memory; their entries are written behind them
    assert ds.cached_fraction() == 1.0
    assert 1 <= state["peak"] <= readahead.WRITE_THREADS


def test_loaders_without_a_shared_cache_are_left_alone(served_urls):
    plain = DataLoader(tt.data.FileDataset(served_urls), batch_size=4, num_workers=2)
    assert tt.data.read_ahead(plain) is plain  # workers without a cache every process sees
    other = DataLoader(list(range(10)), batch_size=2)
    assert tt.data.read_ahead(other) is other
    once = tt.data.read_ahead(DataLoader(tt.data.FileDataset(served_urls), batch_size=4))
    assert tt.data.read_ahead(once) is once


def _collect_garbage(batch):
    gc.collect()  # what a long epoch's garbage collector does in a worker: the inherited filesystem is freed
    return batch


def _epoch_waits(loader) -> tuple[float, int]:
    longest, n = 0.0, 0
    last = time.perf_counter()
    for batch in loader:
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
        n += len(batch)
    return longest, n


@pytest.mark.parametrize("retry", [None, tt.data.RetryPolicy(timeout_s=5.0, attempt_timeout_s=math.inf)],
                         ids=["default-settings", "no-attempt-timeouts"])
def test_no_batch_waits_over_five_seconds_around_forked_workers(served_urls, retry):
    """A 2-worker epoch then a main-process epoch, and the reverse, several times, against the real nginx.

    Before the fix, a forked worker that dropped the filesystem it inherited unregistered the main
    process's pooled sockets from fsspec's (shared) epoll, and the main process's next epoch hung for
    the socket timeout. Without attempt timeouts (the second case) only the fix at the cause keeps
    every wait short.
    """
    ds = tt.data.FileDataset(served_urls, decode=digest, retry=retry)
    main = tt.data.read_ahead(DataLoader(ds, batch_size=8, shuffle=True, collate_fn=_names))
    workers = DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, multiprocessing_context="fork",
                         collate_fn=_collect_garbage)
    waits = []
    for _ in range(3):
        for loader in (main, workers, main):
            longest, n = _epoch_waits(loader)
            assert n == len(served_urls)
            waits.append(longest)
    assert max(waits) < 5.0, f"a batch waited {max(waits):.1f} s: {['%.2f' % w for w in waits]}"
