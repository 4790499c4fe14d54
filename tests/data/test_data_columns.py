"""Arrow batches to tensors: every numeric column a view of one storage, in one process and across workers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader

import turbotrain as tt
from turbotrain.data.columns import to_torch


def mixed_table(n: int, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({
        "id": ids,
        "x": (ids * 0.5).astype(np.float32),
        "half": ids.astype(np.float16),
        "small": (ids % 100).astype(np.int8),
        "flag": ids % 2 == 0,
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3).astype(np.float32)), 3),
        "y": (ids * 2.0).astype(np.float32),
        "name": [f"row{i}" for i in ids],
    })


def storages(batch: dict) -> set[int]:
    return {v.untyped_storage().data_ptr() for v in batch.values() if isinstance(v, torch.Tensor)}


def test_columns_keep_their_values_dtypes_and_order_in_one_storage():
    table = mixed_table(37)
    batch = to_torch(table)
    assert list(batch) == table.column_names
    assert batch["id"].dtype == torch.int64 and batch["x"].dtype == torch.float32
    assert batch["half"].dtype == torch.float16 and batch["small"].dtype == torch.int8
    assert batch["flag"].dtype == torch.bool and batch["vec"].shape == (37, 3)
    for name in ("id", "x", "half", "small", "flag", "y"):
        assert batch[name].numpy().tolist() == table.column(name).to_pylist(), name
    assert batch["vec"].tolist() == table.column("vec").to_pylist()
    assert batch["name"] == table.column("name").to_pylist()  # not numeric: a list, as before
    assert len(storages(batch)) == 1, "each numeric column has a storage of its own"
    for name, t in batch.items():
        if isinstance(t, torch.Tensor):
            assert t.is_contiguous() and t.data_ptr() % t.element_size() == 0, name


def test_columns_are_independent_writable_tensors():
    batch = to_torch(mixed_table(10))
    batch["x"] += 1  # Arrow's memory is read-only; these must be the batch's own
    batch["vec"][:, 0] = -1
    assert batch["x"].tolist() == [i * 0.5 + 1 for i in range(10)]
    assert batch["y"].tolist() == [i * 2.0 for i in range(10)]  # its neighbours in the buffer are untouched
    assert batch["id"].tolist() == list(range(10)) and batch["vec"][:, 1].tolist() == [float(i) for i in range(10)]


def test_chunked_and_empty_tables():
    table = pa.concat_tables([mixed_table(5), mixed_table(4, start=5)])
    batch = to_torch(table)
    assert batch["id"].tolist() == list(range(9)) and batch["vec"][:, 2].tolist() == [float(i) for i in range(9)]
    empty = to_torch(mixed_table(0))
    assert empty["x"].shape == (0,) and empty["vec"].shape == (0, 3) and empty["name"] == []


def test_a_batch_from_a_worker_arrives_as_one_shared_storage(tmp_path):
    """Each storage a worker sends costs the main process a file-descriptor handshake: one per batch."""
    for k in range(2):
        pq.write_table(mixed_table(300, start=1000 * k), tmp_path / f"part-{k}.parquet", row_group_size=100)
    ds = tt.data.ParquetDataset(str(tmp_path / "*.parquet"), batch_rows=64, shuffle=True)
    seen = []
    for batch in DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"):
        assert len(storages(batch)) == 1
        assert torch.equal(batch["x"], (batch["id"] * 0.5).float())
        assert torch.equal(batch["vec"][:, 1], batch["id"].float())
        seen += batch["id"].tolist()
    assert sorted(seen) == [1000 * k + i for k in range(2) for i in range(300)]
