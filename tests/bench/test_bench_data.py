"""The data workload: small files behind a real nginx, two timed epochs per plan, and a clear skip without nginx."""

import json
import math

import pytest
from torch.utils.data import DataLoader

from turbotrain.bench import data_workload
from turbotrain.bench.report import markdown, summary_lines, write_json, write_plot
from turbotrain.bench.runner import BenchSettings, run_bench
from turbotrain.cli import main
from turbotrain.data import FileDataset, servers
from turbotrain.data.cache import DiskCache
from turbotrain.plan import Plan
from turbotrain.speedups.registry import all_speedups

FILES = 64
TINY = dict(workloads=("data",), warmup=1, repeats=2, compile=False, device="cpu", data_files=FILES,
            data_latency_ms=2, seed=0)
needs_nginx = pytest.mark.skipif(servers.nginx_binary() is None,
                                 reason="nginx is not installed: bash scripts/ci-deps.sh (apt-get install nginx-light)")


@pytest.fixture(scope="module")
def data_run():
    tuned_on = []

    def fake_tune(model, loss_fn, loader, optimizer_fn, time_budget_s, **options):
        tuned_on.append(loader)
        return Plan(num_workers=1)

    result = run_bench(BenchSettings(**TINY, tune=True), tune_fn=fake_tune)
    (data,) = result.workloads
    return result, data, tuned_on


def _rows(data, label):
    return {r.path: r for r in data.rows if r.label.startswith(label + " (epoch") or (r.label == label)}


@needs_nginx
def test_every_registry_entry_has_a_row_and_the_worker_entries_are_measured_per_epoch(data_run):
    _, data, _ = data_run
    assert data.skip is None and data.steps == FILES // 32
    names = {r.speedup_name for r in data.rows if r.kind == "alone"}
    assert names == {e.name for e in all_speedups()}
    for name in ("num_workers", "persistent_workers"):
        rows = [r for r in data.rows if r.speedup_name == name]
        assert {r.path for r in rows} == {"epoch 1", "epoch 2"} and all(r.measured for r in rows), rows
        assert all(r.baseline == f"naive ({r.path})" for r in rows)
    assert all(r.skip.startswith("benchmarked on") for r in data.rows
               if r.kind == "alone" and r.speedup_name not in ("num_workers", "persistent_workers"))
    persistent = _rows(data, "persistent_workers")["epoch 2"]
    assert "against num_workers (epoch 2)" in persistent.note
    for row in (r for r in data.rows if r.measured):
        assert row.units_per_s > 0 and len(row.units_per_s_runs) == 2 and math.isfinite(row.final_loss)
        if row.path == "epoch 2":
            assert row.learning, f"{row.label}: the loss did not fall over two epochs"


@needs_nginx
def test_reads_come_from_the_server_and_epoch_2_of_the_cache_reads_none(data_run):
    _, data, _ = data_run
    total = FILES * (1 + 3 * 32 * 32)
    for label in ("naive", "num_workers", "persistent_workers", "tt.data.FileDataset (no cache)"):
        rows = _rows(data, label)   # no cache: both epochs read every file from nginx (workers' reads too)
        assert rows["epoch 1"].read_bytes == rows["epoch 2"].read_bytes == {"http": total}, label
    for label in ("tt.data.FileDataset + disk cache", "fast (no compile)", "tuned"):
        rows = _rows(data, label)
        assert rows["epoch 1"].read_bytes == {"http": total}, label
        assert rows["epoch 2"].read_bytes == {"cache": total}, label   # nothing from the server
    local = _rows(data, "local disk")
    assert local["epoch 1"].read_bytes == local["epoch 2"].read_bytes == {"file": total}


@needs_nginx
def test_the_tuner_sees_the_cached_loader_and_its_plan_is_measured(data_run):
    _, data, tuned_on = data_run
    (loader,) = tuned_on
    assert isinstance(loader, DataLoader) and isinstance(loader.dataset, FileDataset)
    assert isinstance(loader.dataset.cache, DiskCache)
    tuned = _rows(data, "tuned")
    assert tuned["epoch 1"].changes == {"num_workers": 1} and tuned["epoch 2"].measured


@needs_nginx
def test_data_outputs_name_the_files_and_the_bytes_read(data_run, tmp_path):
    result, data, _ = data_run
    md = markdown(result)
    assert f"{FILES} files of 3.1 KB behind nginx (2 ms to first byte" in md
    assert "| bytes read |" in md and "cache 192.1 KiB" in md
    assert any(line.startswith("data: fast plan") and "in epoch 2" in line for line in summary_lines(result))
    saved = json.loads(write_json(result, tmp_path / "b.json").read_text())
    assert saved["workloads"][0]["description"] == data.description
    assert write_plot(result, tmp_path / "b.png").stat().st_size > 5000


def test_without_nginx_the_data_rows_say_how_to_install_it_and_the_others_still_run(monkeypatch, capsys):
    monkeypatch.setattr(servers, "nginx_binary", lambda: None)
    result = run_bench(BenchSettings(workloads=("mlp", "data"), steps=2, warmup=1, repeats=1, min_trial_s=0.0,
                                     compile=False, tune=False, device="cpu"))
    mlp, data = result.workloads
    assert any(r.measured for r in mlp.rows)
    assert "nginx-light" in data.skip and "scripts/ci-deps.sh" in data.skip
    assert data.rows and all(r.skip and not r.measured for r in data.rows)
    assert {r.speedup_name for r in data.rows if r.kind == "alone"} == {e.name for e in all_speedups()}
    assert f"skipped the whole workload: {data.skip}" in markdown(result)
    assert not result.errors

    assert main(["bench", "--workload", "data", "--quick", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "data: not run" in out and "nginx-light" in out


def test_an_nginx_that_will_not_start_is_a_skip_with_its_reason(monkeypatch):
    def refuse(self):
        raise RuntimeError("latency_s needs nginx's echo module: install nginx-light")

    monkeypatch.setattr(servers, "nginx_binary", lambda: "/usr/sbin/nginx")
    monkeypatch.setattr(servers.LocalNginx, "start", refuse)
    result = run_bench(BenchSettings(**{**TINY, "data_files": 4, "repeats": 1}, tune=False))
    (data,) = result.workloads
    assert data.skip.startswith("nginx could not serve the data workload's files") and "echo module" in data.skip


def test_the_files_decode_to_the_workloads_in_memory_samples(tmp_path):
    wl = data_workload.files_workload(files=5)
    paths = wl.write_files(tmp_path)
    memory = wl.make_dataset(0)
    for path, (image, label) in zip(paths, memory):
        decoded, byte = data_workload.decode_sample(path.read_bytes())
        assert decoded.equal(image) and byte == int(label)
    assert path.stat().st_size == wl.file_bytes
