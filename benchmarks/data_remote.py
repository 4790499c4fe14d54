"""Remote data at local speed? FileDataset and ParquetDataset against local disk and plain reads.

    python benchmarks/data_remote.py [--files 2000] [--size 65536] [--latency-ms 20] [--json out.json]

Files: ``--files`` files of ``--size`` random bytes, served by a real nginx on loopback. The
server models an object store: every response waits ``--latency-ms`` before its first byte
(nginx's echo_sleep), and each connection is held to ``--limit-rate`` by nginx's limit_rate.
On nginx 1.22 (Debian 12) limit_rate does slow a 64 KB response: after each write nginx pauses
bytes_sent / rate, so at 1m a 64 KB file takes about 31 ms more (measured with curl), and a
request costs about 52 ms in all, like a small-object GET on S3 or GCS.

Measured (samples/s, decode = the raw bytes, DataLoader batch 64, median of repeats):
- local disk: FileDataset over the same files as local paths, no cache;
- plain fsspec, no cache: a Dataset whose __getitem__ is ``fsspec.open(url).read()``, with 0 and 2 workers;
- FileDataset with a disk cache: epoch 1 (fresh cache, fetched 64 at a time) and epoch 2 (from the cache).
Parquet (rows/s): ParquetDataset against pyarrow's own ``iter_batches`` over the same local files,
and ParquetDataset over nginx with a cache, epochs 1 and 2. Ratios are against baselines measured
in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import turbotrain as tt  # noqa: E402
from turbotrain.data.servers import LocalNginx  # noqa: E402

BATCH = 64


class PlainFsspec(Dataset):
    """What a user writes without turbotrain: one blocking fsspec read per item."""

    def __init__(self, urls):
        self.urls = urls

    def __len__(self):
        return len(self.urls)

    def __getitem__(self, i):
        import fsspec

        with fsspec.open(self.urls[i], "rb") as f:
            return f.read()


def _raw(batch):
    return batch


def samples_per_s(dataset, workers: int = 0) -> float:
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=_raw)
    t0 = time.perf_counter()
    n = sum(len(b) for b in loader)
    return n / (time.perf_counter() - t0)


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def file_benchmarks(args, work: Path) -> dict:
    files = work / "files"
    files.mkdir()
    for i in range(args.files):
        (files / f"{i:05d}.bin").write_bytes(os.urandom(args.size))
    local = [str(files / f"{i:05d}.bin") for i in range(args.files)]
    out: dict = {}
    out["local disk"] = summary([samples_per_s(tt.data.FileDataset(local)) for _ in range(args.repeats)])
    with LocalNginx(files, latency_s=args.latency_ms / 1000, limit_rate=args.limit_rate, workers=2) as server:
        urls = [f"{server.url}/{i:05d}.bin" for i in range(args.files)]
        subset = urls[: args.plain_files]  # sequential remote reads are slow: a subset gives the same rate
        out["plain fsspec, no cache"] = summary([samples_per_s(PlainFsspec(subset)) for _ in range(3)])
        out["plain fsspec, no cache, 2 workers"] = summary([samples_per_s(PlainFsspec(subset), 2) for _ in range(3)])
        epoch1, epoch2, epoch1_w = [], [], []
        for r in range(args.repeats):
            cache = work / f"cache-{r}"
            ds = tt.data.FileDataset(urls, cache=cache, max_in_flight=BATCH)
            epoch1.append(samples_per_s(ds))
            epoch2.append(samples_per_s(ds))
            shutil.rmtree(cache)
            if r < 2:
                ds = tt.data.FileDataset(urls, cache=work / f"cache-w{r}", max_in_flight=BATCH)
                epoch1_w.append(samples_per_s(ds, workers=2))
                shutil.rmtree(work / f"cache-w{r}")
        out["FileDataset + cache, epoch 1"] = summary(epoch1)
        out["FileDataset + cache, epoch 1, 2 workers"] = summary(epoch1_w)
        out["FileDataset + cache, epoch 2"] = summary(epoch2)
    return out


def parquet_benchmarks(args, work: Path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = work / "parquet"
    root.mkdir()
    rng = np.random.default_rng(0)
    per_file = args.parquet_rows // args.parquet_files
    for k in range(args.parquet_files):
        cols = {f"f{c}": rng.standard_normal(per_file, dtype=np.float32) for c in range(8)}
        cols["label"] = rng.integers(0, 10, per_file)
        pq.write_table(pa.table(cols), root / f"part-{k}.parquet", row_group_size=50_000)
    paths = sorted(str(p) for p in root.iterdir())
    rows = per_file * args.parquet_files

    def pyarrow_direct(to_torch: bool) -> float:
        t0 = time.perf_counter()
        for path in paths:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=8192):
                if to_torch:  # copied like ParquetDataset does: a tensor must not alias Arrow's read-only memory
                    {n: torch.from_numpy(c.to_numpy(zero_copy_only=False).copy()) for n, c in
                     zip(batch.schema.names, batch.columns)}
        return rows / (time.perf_counter() - t0)

    def through(ds) -> float:
        t0 = time.perf_counter()
        n = sum(len(b["label"]) for b in ds)
        assert n == rows, (n, rows)
        return rows / (time.perf_counter() - t0)

    out = {
        "pyarrow iter_batches (Arrow only)": summary([pyarrow_direct(False) for _ in range(args.repeats)]),
        "pyarrow iter_batches + torch.from_numpy": summary([pyarrow_direct(True) for _ in range(args.repeats)]),
        "ParquetDataset (torch)": summary([through(tt.data.ParquetDataset(paths, batch_rows=8192))
                                           for _ in range(args.repeats)]),
        "ParquetDataset (arrow)": summary([through(tt.data.ParquetDataset(paths, batch_rows=8192, format="arrow",
                                                                          transform=lambda t: {"label": t["label"]}))
                                           for _ in range(args.repeats)]),
        "ParquetDataset (torch, shuffle)": summary([through(tt.data.ParquetDataset(paths, batch_rows=8192,
                                                                                   shuffle=True))
                                                    for _ in range(args.repeats)]),
    }
    with LocalNginx(root, latency_s=args.latency_ms / 1000, limit_rate=args.limit_rate, workers=2) as server:
        urls = [f"{server.url}/{Path(p).name}" for p in paths]
        first, second = [], []
        for r in range(3):
            t0 = time.perf_counter()
            ds = tt.data.ParquetDataset(urls, batch_rows=8192, cache=work / f"pcache-{r}")
            build = time.perf_counter() - t0
            first.append(rows / (build + rows / through(ds)))
            second.append(through(ds))
            shutil.rmtree(work / f"pcache-{r}")
        out["ParquetDataset over nginx + cache, epoch 1"] = summary(first)
        out["ParquetDataset over nginx + cache, epoch 2"] = summary(second)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64 * 1024)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--limit-rate", default="1m", help="nginx limit_rate per connection")
    parser.add_argument("--plain-files", type=int, default=400, help="files read by the slow no-cache baselines")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--parquet-rows", type=int, default=2_000_000)
    parser.add_argument("--parquet-files", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
               f"torch {torch.__version__}, python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="tt-bench-data-") as tmp:
        files = file_benchmarks(args, Path(tmp))
        parquet = parquet_benchmarks(args, Path(tmp))

    local = files["local disk"]["median"]
    plain = files["plain fsspec, no cache"]["median"]
    print(f"# {args.files} files x {args.size // 1024} KB, nginx with {args.latency_ms:g} ms first-byte latency and "
          f"limit_rate {args.limit_rate} per connection; {machine}")
    print(f"{'files: samples/s':48s} {'median':>10s} {'min':>10s} {'max':>10s}  vs local  vs plain")
    for name, s in files.items():
        print(f"{name:48s} {s['median']:10.0f} {s['min']:10.0f} {s['max']:10.0f}  "
              f"{s['median'] / local:7.2f}x {s['median'] / plain:7.1f}x")
    direct = parquet["pyarrow iter_batches + torch.from_numpy"]["median"]
    print(f"\n# Parquet: {args.parquet_rows} rows x 9 columns in {args.parquet_files} files, batches of 8192")
    print(f"{'Parquet: rows/s':48s} {'median':>10s} {'min':>10s} {'max':>10s}  vs pyarrow+torch")
    for name, s in parquet.items():
        print(f"{name:48s} {s['median']:10.0f} {s['min']:10.0f} {s['max']:10.0f}  {s['median'] / direct:7.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
                                         "files": files, "parquet": parquet}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
