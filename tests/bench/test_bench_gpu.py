"""On a GPU: MFU for GPT, the data-path rows, CUDA-only switches measured (run with -m gpu)."""

import gc

import pytest
import torch

from turbotrain.bench.runner import BenchSettings, run_bench

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SMALL = dict(steps=3, warmup=1, repeats=2, min_trial_s=0.0, compile=False, tune=False, scale="cpu", device="cuda")


def test_gpt_rows_report_mfu_against_the_device_peak():
    res = run_bench(BenchSettings(workloads=("gpt",), peak_tflops=100.0, **SMALL))
    rows = [r for r in res.workloads[0].rows if r.measured]
    assert rows and all(r.mfu is not None and 0 < r.mfu < 1 for r in rows)
    by_name = {r.speedup_name: r for r in rows}
    assert "precision" in by_name and by_name["precision"].applied == ["precision"]


def test_cnn_data_path_rows_go_through_the_loader_and_cuda_switches_are_measured():
    res = run_bench(BenchSettings(workloads=("cnn",), **SMALL))
    rows = {r.label: r for r in res.workloads[0].rows}
    assert rows["naive (data path)"].measured and rows["naive (data path)"].path == "loader"
    for name in ("pin_memory", "non_blocking", "device_prefetch"):
        assert rows[name].measured and rows[name].baseline == "naive (data path)", rows[name]
    for name in ("cudnn_benchmark", "channels_last", "precision"):
        assert rows[name].measured and rows[name].baseline == "naive"
    if torch.cuda.get_device_capability() >= (8, 0):
        assert rows["tf32"].measured
    assert rows["naive"].peak_memory_bytes < 2 ** 34        # CUDA allocator peak, not the host's RSS


def test_data_workload_trains_on_the_gpu_and_the_fast_plan_pins_and_reads_the_cache():
    gc.collect()
    held = torch.cuda.memory_allocated()  # earlier tests' leftovers count in the allocator's peak too
    res = run_bench(BenchSettings(workloads=("data",), warmup=1, repeats=1, compile=False, tune=False, device="cuda",
                                  data_files=64, data_latency_ms=2))
    (data,) = res.workloads
    if data.skip:
        pytest.skip(data.skip)                              # no nginx on this machine
    fast = next(r for r in data.rows if r.kind == "fast" and r.path == "epoch 2")
    assert fast.measured and fast.changes.get("pin_memory") is True
    assert fast.read_bytes == {"cache": 64 * 3073}          # epoch 2 from the disk cache, nothing from nginx
    naive = next(r for r in data.rows if r.kind == "naive" and r.path == "epoch 1")
    # The CUDA allocator's peak (a 5k-parameter model, 400 KB batches), not the host's resident set (~400 MiB).
    assert naive.measured and 0 < naive.peak_memory_bytes - held < 64 * 2 ** 20
