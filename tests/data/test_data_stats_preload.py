"""Read accounting across worker processes, the slow-storage finding, preload, and DeviceLoader."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import turbotrain as tt
from turbotrain.data import stats
from turbotrain.data.stats import ReadStats, SchemeReads, slow_storage_finding


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_reads_in_worker_processes_are_counted(served_urls, served_dir, context, tmp_path):
    ds = tt.data.FileDataset(served_urls[:12], cache=tmp_path / "cache")
    expected = sum(p.stat().st_size for p in sorted(served_dir.iterdir())[:12])
    before = stats.snapshot()
    loader = DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context=context, collate_fn=list,
                        persistent_workers=True)
    list(loader)
    epoch1 = stats.snapshot() - before
    assert epoch1.schemes["http"].files == 12 and epoch1.schemes["http"].bytes == expected
    assert epoch1.schemes["http"].seconds > 0
    list(loader)
    epoch2 = stats.snapshot() - before - epoch1
    assert "http" not in epoch2.schemes  # the second epoch never went to the server
    assert epoch2.schemes[stats.CACHE_SCHEME].files == 12


def test_finding_names_scheme_and_measured_rate():
    reads = ReadStats({"http": SchemeReads(bytes=20_000_000, seconds=8.0, files=400),
                       stats.CACHE_SCHEME: SchemeReads(bytes=5, seconds=50.0, files=1)})
    finding = slow_storage_finding(reads, data_wait_s=6.0, total_s=10.0)
    assert finding["rule"] == "slow-storage" and finding["severity"] == "high"
    assert "http://" in finding["message"] and "2.50 MB/s" in finding["message"]
    assert "cache=" in finding["fix"] and "FileDataset" in finding["fix"]
    assert finding["est_speedup"] == 2.5  # 6 s of 10 s waiting on reads removed
    assert set(finding) >= {"rule", "severity", "where", "message", "fix", "est_speedup", "measured"}


def test_finding_severity_and_when_there_is_none():
    slowish = ReadStats({"s3": SchemeReads(bytes=1_000_000, seconds=3.0, files=10)})
    assert slow_storage_finding(slowish, data_wait_s=3.0, total_s=10.0)["severity"] == "medium"
    assert slow_storage_finding(slowish, data_wait_s=1.0, total_s=10.0) is None  # the loop barely waits
    slow = ReadStats({"s3": SchemeReads(bytes=1_000_000, seconds=8.0, files=10)})
    assert slow_storage_finding(slow, data_wait_s=8.0, total_s=10.0)["severity"] == "high"
    # The loop waits, but not on reads (decoding, say): not a storage problem.
    assert slow_storage_finding(slowish, data_wait_s=9.0, total_s=10.0) is None
    cached = ReadStats({stats.CACHE_SCHEME: SchemeReads(bytes=1, seconds=9.0, files=1)})
    assert slow_storage_finding(cached, data_wait_s=9.0, total_s=10.0) is None
    assert slow_storage_finding(ReadStats(), data_wait_s=9.0, total_s=10.0) is None


def test_local_files_get_a_preload_fix():
    local = ReadStats({"file": SchemeReads(bytes=1_000_000, seconds=5.0, files=10)})
    finding = slow_storage_finding(local, data_wait_s=5.0, total_s=8.0)
    assert "local files" in finding["message"] and "preload" in finding["fix"]


class Squares(Dataset):
    def __init__(self, n):
        self.n = n
        self.reads = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return np.full((3,), i, dtype=np.float32), i * i


def test_preload_to_shm_stacks_items_into_shared_tensors():
    ds = Squares(20)
    pre = tt.data.preload(ds, to="shm")
    assert all(leaf.is_shared() for leaf in pre.leaves)
    x, y = pre[7]
    assert x.tolist() == [7.0, 7.0, 7.0] and int(y) == 49
    batches = list(DataLoader(pre, batch_size=5, num_workers=2, multiprocessing_context="fork"))
    assert torch.cat([b[1] for b in batches]).tolist() == [i * i for i in range(20)]


def test_preload_to_memory_keeps_ragged_items_and_refuses_what_does_not_fit(monkeypatch):
    class Ragged(Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return torch.zeros(i + 1)

    pre = tt.data.preload(Ragged(), to="memory")
    assert [len(pre[i]) for i in range(3)] == [1, 2, 3]
    with pytest.raises(TypeError, match="to='memory'"):
        tt.data.preload(Ragged(), to="shm")
    monkeypatch.setattr("turbotrain.data.preloading._available_bytes", lambda to: 100)
    with pytest.raises(MemoryError, match="GB is free"):
        tt.data.preload(TensorDataset(torch.zeros(1000, 10)), to="memory")
    with pytest.raises(ValueError, match="expected one of"):
        tt.data.preload(Squares(2), to="disk")


def test_preload_of_a_file_dataset_fetches_everything_once(served_urls, nginx, served_dir):
    ds = tt.data.FileDataset(served_urls[:10], decode=len)
    before = stats.snapshot()
    pre = tt.data.preload(ds, to="memory")
    assert (stats.snapshot() - before).schemes["http"].files == 10
    assert [pre[i] for i in range(10)] == [1024 + 97 * i for i in range(10)]
    assert (stats.snapshot() - before).schemes["http"].files == 10  # reading the items fetched nothing more
    assert ds.cache is None  # the original is left as it was


def test_preload_of_a_parquet_dataset(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": np.arange(10)}), tmp_path / "t.parquet", row_group_size=4)
    pre = tt.data.preload(tt.data.ParquetDataset(str(tmp_path / "t.parquet"), batch_rows=5), to="memory")
    assert len(pre.cache) == 1
    assert [b["a"].tolist() for b in pre] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_device_loader_on_cpu_moves_each_batch_and_keeps_length():
    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)
    moved = []
    dl = tt.data.DeviceLoader(loader, lambda b: moved.append(b) or [t * 2 for t in b], torch.device("cpu"),
                              prefetch=True)
    assert dl.prefetch is False  # nothing to overlap on the CPU
    assert len(dl) == 3
    assert torch.cat([b[0] for b in dl]).tolist() == [2.0 * i for i in range(10)]
    assert len(moved) == 3


@pytest.mark.gpu
def test_device_loader_prefetches_on_a_side_stream_with_correct_values():
    from turbotrain.data.transfer import move_batch

    device = torch.device("cuda")
    data = TensorDataset(torch.randn(64, 256, 256), torch.arange(64))
    loader = DataLoader(data, batch_size=8, pin_memory=True)
    dl = tt.data.DeviceLoader(loader, lambda b: move_batch(b, device, non_blocking=True), device, prefetch=True)
    assert dl.prefetch is True
    seen = []
    for x, y in dl:
        assert x.is_cuda
        torch.cuda._sleep(1_000_000)  # compute on the main stream while the next copy runs on the side one
        seen.append((x.sum().item(), y.cpu()))
    expected = [(xb.sum().item(), yb) for xb, yb in DataLoader(data, batch_size=8)]
    assert len(seen) == len(expected)
    for (s, y), (es, ey) in zip(seen, expected):
        assert torch.equal(y, ey) and abs(s - es) <= 1e-3 * max(1.0, abs(es))
