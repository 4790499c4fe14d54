"""Remote data at the store's speed? Epoch 1 against what the store can serve, epoch 2 from the cache.

    python benchmarks/data_remote.py [--files 2000] [--size 65536] [--latency-ms 20] [--json out.json]

Files: ``--files`` files of ``--size`` random bytes, served by a real nginx on loopback. The
server models an object store: every response waits ``--latency-ms`` before its first byte
(nginx's echo_sleep), and each connection is held to ``--limit-rate`` by nginx's limit_rate.
On nginx 1.22 (Debian 12) limit_rate does slow a 64 KB response: after each write nginx pauses
bytes_sent / rate, so at 1m a 64 KB file takes about 31 ms more (measured with curl), and a
request costs about 52 ms in all, like a small-object GET on S3 or GCS.

Printed in one run, rounds interleaved (each round measures every row once, on a fresh cache):
- the store's ceiling: 64 concurrent ``fs.cat_file`` reads from a plain thread pool, continuously,
  over all the files (files/s);
- FileDataset with a disk cache and default settings through a shuffled DataLoader (batch 64) read
  ahead with ``tt.data.read_ahead``: epoch 1 with 0 and with 2 workers, each followed by epoch 2 (from
  the cache: what the loader delivers when the store is out of the way, the consumer's own ceiling);
- the longest wait for one batch in each, and local disk as a reference.
Parquet (rows/s): the same for ParquetDataset: its ceiling is 64 concurrent range reads of the part
size ParquetDataset fetches, over all the files' bytes (converted to rows/s); epoch 1 includes
building the dataset (reading the footers). Ratios are against the ceiling of the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import turbotrain as tt  # noqa: E402
from turbotrain.data.servers import LocalNginx  # noqa: E402

BATCH = 64
CEILING_IN_FLIGHT = 64


def _raw(batch):
    return batch


def timed_batches(batches, count=len) -> tuple[float, float, int]:
    """(seconds, longest wait for one batch, items) for iterating ``batches``."""
    t0 = last = time.perf_counter()
    longest, n = 0.0, 0
    for batch in batches:
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
        n += count(batch)
    return time.perf_counter() - t0, longest, n


def ceiling(read, jobs: list) -> float:
    """Items/s with CEILING_IN_FLIGHT reads in flight from a plain thread pool, continuously."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(CEILING_IN_FLIGHT) as pool:
        for _ in pool.map(read, jobs):
            pass
    return len(jobs) / (time.perf_counter() - t0)


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def file_benchmarks(args, work: Path) -> dict:
    import fsspec

    files = work / "files"
    files.mkdir()
    for i in range(args.files):
        (files / f"{i:05d}.bin").write_bytes(os.urandom(args.size))
    local = [str(files / f"{i:05d}.bin") for i in range(args.files)]
    rows: dict[str, list[float]] = {}
    waits: dict[str, float] = {}

    def add(name: str, value: float, wait: float | None = None) -> None:
        rows.setdefault(name, []).append(value)
        if wait is not None:
            waits[name] = max(waits.get(name, 0.0), wait)

    with LocalNginx(files, latency_s=args.latency_ms / 1000, limit_rate=args.limit_rate, workers=2) as server:
        urls = [f"{server.url}/{i:05d}.bin" for i in range(args.files)]
        fs = fsspec.filesystem("http", skip_instance_cache=True)
        for r in range(args.repeats):
            top = ceiling(fs.cat_file, urls)
            add("store ceiling (64 concurrent reads)", top)
            for workers in (0, 2):
                cache = work / f"cache-{r}-{workers}"
                ds = tt.data.FileDataset(urls, cache=cache)  # default settings
                loader = tt.data.read_ahead(DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers,
                                                       collate_fn=_raw))
                took, wait, n = timed_batches(loader)
                assert n == args.files, n
                add(f"epoch 1, {workers} workers", n / took / top, wait)
                took, wait, n = timed_batches(loader)
                add(f"epoch 2 (from the cache), {workers} workers", n / took / top, wait)
                shutil.rmtree(cache)
            local_ds = tt.data.FileDataset(local)
            took, _, n = timed_batches(DataLoader(local_ds, batch_size=BATCH, shuffle=True, collate_fn=_raw))
            add("local disk, no cache", n / took / top)
    return {"rows": {k: summary(v) for k, v in rows.items()}, "longest_wait_s": waits}


def parquet_benchmarks(args, work: Path) -> dict:
    import fsspec
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
    paths = sorted(root.iterdir())
    rows_total = per_file * args.parquet_files
    total_bytes = sum(p.stat().st_size for p in paths)
    rows: dict[str, list[float]] = {}
    waits: dict[str, float] = {}

    def count(batch) -> int:
        return len(batch["label"])

    with LocalNginx(root, latency_s=args.latency_ms / 1000, limit_rate=args.limit_rate, workers=2) as server:
        urls = [f"{server.url}/{p.name}" for p in paths]
        fs = fsspec.filesystem("http", skip_instance_cache=True)
        part = tt.data.ParquetDataset.PART_BYTES
        jobs = [(u, start, min(start + part, p.stat().st_size))
                for u, p in zip(urls, paths) for start in range(0, p.stat().st_size, part)]
        for r in range(args.repeats):
            top = ceiling(lambda job: fs.cat_file(*job), jobs) * part * rows_total / total_bytes
            rows.setdefault("store ceiling (64 concurrent range reads), rows/s", []).append(top)
            for workers in (0, 2):
                cache = work / f"pcache-{r}-{workers}"
                t0 = time.perf_counter()
                ds = tt.data.ParquetDataset(urls, batch_rows=8192, shuffle=True, cache=cache)
                build = time.perf_counter() - t0
                loader = DataLoader(ds, batch_size=None, num_workers=workers)
                took, wait, n = timed_batches(loader, count)
                assert n == rows_total, (n, rows_total)
                name = f"epoch 1, {workers} workers"
                rows.setdefault(name, []).append(n / (build + took) / top)
                waits[name] = max(waits.get(name, 0.0), wait, build)
                took, wait, n = timed_batches(loader, count)
                name = f"epoch 2 (from the cache), {workers} workers"
                rows.setdefault(name, []).append(n / took / top)
                waits[name] = max(waits.get(name, 0.0), wait)
                shutil.rmtree(cache)
    return {"rows": {k: summary(v) for k, v in rows.items()}, "longest_wait_s": waits,
            "bytes": total_bytes, "parts": len(jobs)}


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except Exception:  # noqa: BLE001 - lscpu missing: say what Python knows
        return platform.processor() or platform.machine()


def _print(title: str, result: dict, unit: str) -> None:
    print(title)
    print(f"{'row':52s} {'median':>9s} {'min':>9s} {'max':>9s}  {'longest wait':>12s}")
    for name, s in result["rows"].items():
        wait = result["longest_wait_s"].get(name)
        if name.startswith("store ceiling"):
            print(f"{name:52s} {s['median']:9.0f} {s['min']:9.0f} {s['max']:9.0f}  {unit}")
        else:
            print(f"{name:52s} {s['median']:8.2f}x {s['min']:8.2f}x {s['max']:8.2f}x  "
                  f"{'' if wait is None else f'{wait:11.2f}s'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64 * 1024)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--limit-rate", default="1m", help="nginx limit_rate per connection")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parquet-rows", type=int, default=8_000_000)
    parser.add_argument("--parquet-files", type=int, default=16)
    parser.add_argument("--skip-parquet", action="store_true")
    parser.add_argument("--skip-files", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    machine = (f"{_cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start, "
               f"torch {torch.__version__}, python {platform.python_version()}")
    out: dict = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="tt-bench-data-") as tmp:
        if not args.skip_files:
            out["files"] = file_benchmarks(args, Path(tmp))
        if not args.skip_parquet:
            out["parquet"] = parquet_benchmarks(args, Path(tmp))
    print(f"# {machine}; load average {os.getloadavg()[0]:.1f} at the end")
    print(f"# nginx with {args.latency_ms:g} ms first-byte latency, limit_rate {args.limit_rate} per connection; "
          f"{args.repeats} interleaved rounds; ratios are against the round's own ceiling")
    if "files" in out:
        _print(f"\n# files: {args.files} x {args.size // 1024} KB, shuffled DataLoader, batch {BATCH}",
               out["files"], "files/s")
    if "parquet" in out:
        p = out["parquet"]
        _print(f"\n# Parquet: {args.parquet_rows} rows x 9 columns in {args.parquet_files} files "
               f"({p['bytes'] / 1e6:.0f} MB, {p['parts']} parts), shuffled, batches of 8192", p, "rows/s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
