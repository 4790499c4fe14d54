"""ParquetDataset: exactly-once splitting over workers and ranks, shuffling, remote reads, bad files."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

import turbotrain as tt
from turbotrain.data.servers import LocalNginx

ROWS_PER_GROUP = 50


def write_table(path, start: int, groups: int, **kwargs) -> None:
    n = groups * ROWS_PER_GROUP
    ids = np.arange(start, start + n, dtype=np.int64)
    table = pa.table({
        "id": ids,
        "x": (ids * 0.5).astype(np.float32),
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 4).astype(np.float32)), 4),
        "name": [f"row{i}" for i in ids],
    })
    pq.write_table(table, path, row_group_size=ROWS_PER_GROUP, **kwargs)


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("parquet")
    for k in range(3):
        write_table(root / f"part-{k}.parquet", start=k * 1000, groups=4)
    return root


@pytest.fixture(scope="module")
def all_ids():
    return sorted(k * 1000 + i for k in range(3) for i in range(4 * ROWS_PER_GROUP))


def ids_of(loader) -> list[int]:
    return [i for batch in loader for i in batch["id"].tolist()]


def test_batches_are_tensors_of_the_asked_columns(parquet_dir):
    ds = tt.data.ParquetDataset(str(parquet_dir / "*.parquet"), columns=["id", "vec", "name"], batch_rows=64)
    batches = list(ds)
    assert set(batches[0]) == {"id", "vec", "name"}
    assert batches[0]["id"].dtype == torch.int64 and batches[0]["vec"].shape == (64, 4)
    assert torch.equal(batches[0]["vec"][:, 0], batches[0]["id"].float())
    assert batches[0]["name"][:2] == ["row0", "row1"]
    assert [len(b["id"]) for b in batches] == [64] * 9 + [24]  # 600 rows: full batches, then the rest
    assert ds.num_rows == 600


def test_each_row_once_per_epoch_across_two_workers_and_two_ranks(parquet_dir, all_ids):
    urls = sorted(str(p) for p in parquet_dir.iterdir())
    per_epoch = []
    for epoch in range(2):
        seen: Counter = Counter()
        orders = []
        for rank in range(2):
            ds = tt.data.ParquetDataset(urls, columns=["id"], batch_rows=16, shuffle=True, shuffle_buffer_rows=64,
                                        rank=rank, world_size=2, seed=7)
            ds.set_epoch(epoch)
            ids = ids_of(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))
            seen.update(ids)
            orders.append(ids)
        assert sorted(seen) == all_ids and set(seen.values()) == {1}, "a row was skipped or read twice"
        assert min(len(o) for o in orders) > 0  # both ranks got work
        per_epoch.append(orders)
    assert per_epoch[0] != per_epoch[1]  # a new epoch, a new order
    assert per_epoch[0][0] != sorted(per_epoch[0][0])  # rows really are shuffled


def test_without_shuffle_rows_come_in_file_order(parquet_dir, all_ids):
    ds = tt.data.ParquetDataset(sorted(str(p) for p in parquet_dir.iterdir()), columns=["id"], batch_rows=100)
    assert ids_of(ds) == all_ids


def test_rank_and_world_size_come_from_the_environment(parquet_dir, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    ds = tt.data.ParquetDataset(str(parquet_dir / "*.parquet"))
    assert (ds.rank, ds.world_size) == (1, 3)
    assert len(ds.assigned_units()) == 4  # 12 row groups, every third one
    with pytest.raises(ValueError, match="outside world_size"):
        tt.data.ParquetDataset(str(parquet_dir / "*.parquet"), rank=2, world_size=2)


def test_remote_reads_with_a_cache_survive_the_server_going_away(parquet_dir, tmp_path, all_ids):
    with LocalNginx(parquet_dir) as server:
        urls = [f"{server.url}/part-{k}.parquet" for k in range(3)]
        uncached = tt.data.ParquetDataset(urls, columns=["id"], batch_rows=128)
        assert ids_of(uncached) == all_ids  # ranged reads straight from the server
        ds = tt.data.ParquetDataset(urls, columns=["id", "x"], batch_rows=128, cache=tmp_path / "cache")
        first = ids_of(DataLoader(ds, batch_size=None, num_workers=2))
    second = ids_of(DataLoader(ds, batch_size=None, num_workers=2))
    assert sorted(first) == sorted(second) == all_ids


def test_arrow_format_and_transform(parquet_dir):
    ds = tt.data.ParquetDataset(str(parquet_dir / "part-0.parquet"), columns=["x"], batch_rows=200, format="arrow",
                                transform=lambda t: t.num_rows)
    assert list(ds) == [200]


def test_unknown_columns_are_named(parquet_dir):
    with pytest.raises(KeyError, match=r"\['nope'\].*\['id', 'x', 'vec', 'name'\]"):
        tt.data.ParquetDataset(str(parquet_dir / "*.parquet"), columns=["id", "nope"])


def test_a_truncated_file_is_named(tmp_path):
    path = tmp_path / "cut.parquet"
    write_table(path, 0, 2)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(tt.data.ParquetFileError, match=r"cut\.parquet: not a readable Parquet file.*truncated"):
        tt.data.ParquetDataset([str(path)])


def test_a_corrupt_row_group_is_named_with_its_file(tmp_path):
    path = tmp_path / "bad.parquet"
    write_table(path, 0, 3, compression="snappy", write_page_checksum=True)
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    middle = chunk.data_page_offset + chunk.total_compressed_size // 2
    data[middle: middle + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))
    ds = tt.data.ParquetDataset([str(path)], batch_rows=ROWS_PER_GROUP)
    with pytest.raises(tt.data.ParquetFileError, match=r"bad\.parquet: row group 1 \(of 3\)") as info:
        list(ds)
    assert info.value.row_group == 1


def test_null_values_in_a_numeric_column_are_an_error_naming_it(tmp_path):
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"v": pa.array([1.0, None, 3.0])}), path)
    with pytest.raises(ValueError, match="column 'v' has 1 null"):
        list(tt.data.ParquetDataset([str(path)]))


def test_remote_files_are_fetched_as_many_ranges_in_flight(parquet_dir, tmp_path, all_ids, monkeypatch):
    """Several files and their parts in flight at once, joined whole into the cache."""
    import asyncio

    from fsspec.implementations.http import HTTPFileSystem

    state = {"now": 0, "peak": 0, "ranges": 0}
    original = HTTPFileSystem._cat_file

    async def counting_cat_file(self, url, start=None, end=None, **kwargs):
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        state["ranges"] += start is not None
        try:
            await asyncio.sleep(0.01)
            return await original(self, url, start=start, end=end, **kwargs)
        finally:
            state["now"] -= 1

    monkeypatch.setattr(HTTPFileSystem, "_cat_file", counting_cat_file)
    cache = tmp_path / "cache"
    with LocalNginx(parquet_dir, latency_s=0.002) as server:
        urls = [f"{server.url}/part-{k}.parquet" for k in range(3)]
        ds = tt.data.ParquetDataset(urls, batch_rows=64, cache=cache, part_bytes=2048, max_in_flight=8,
                                    storage_options={"headers": {"X-Test": "parts"}})
        assert sorted(ids_of(ds)) == all_ids
    sizes = [(parquet_dir / f"part-{k}.parquet").stat().st_size for k in range(3)]
    assert state["ranges"] >= sum(-(-s // 2048) for s in sizes)  # every part a range request
    assert state["peak"] > 4  # many parts in flight, not one file at a time
    assert [ds.cache.get(u) for u in urls] == [(parquet_dir / f"part-{k}.parquet").read_bytes() for k in range(3)]


def test_a_parquet_file_changed_between_two_runs_is_read_anew(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    write_table(root / "p.parquet", start=0, groups=2)
    cache = tmp_path / "cache"
    with LocalNginx(root, latency_s=0.002) as server:
        url = f"{server.url}/p.parquet"
        assert ids_of(tt.data.ParquetDataset([url], batch_rows=64, cache=cache))[:1] == [0]
        write_table(root / "p.parquet", start=5000, groups=2)
        assert ids_of(tt.data.ParquetDataset([url], batch_rows=64, cache=cache))[:1] == [5000]
