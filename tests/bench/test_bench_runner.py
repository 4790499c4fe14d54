"""The ablation runner end to end on the tiny MLP: rows, outputs, errors, the CLI."""

import json
import math

import pytest
import torch

from turbotrain.bench.report import markdown, write_json, write_markdown, write_plot
from turbotrain.bench.runner import BenchSettings, run_bench
from turbotrain.cli import main
from turbotrain.plan import Plan
from turbotrain.speedups.registry import all_speedups

TINY = dict(workloads=("mlp",), steps=3, warmup=1, repeats=2, min_trial_s=0.0, compile=False, device="cpu", seed=0)


@pytest.fixture(scope="module")
def result():
    seen = []
    res = run_bench(BenchSettings(**TINY, tune=True), tune_fn=lambda *a, **k: Plan(fused_optimizer=True),
                    progress=seen.append)
    assert any("round 2/2" in msg for msg in seen)
    return res


def test_every_registry_entry_is_a_row_measured_or_skipped_with_a_reason(result):
    (mlp,) = result.workloads
    by_name = {r.speedup_name: r for r in mlp.rows if r.kind == "alone"}
    assert set(by_name) == {e.name for e in all_speedups()}
    for row in mlp.rows:
        assert row.measured or row.skip, f"{row.label}: neither measured nor skipped"
    assert by_name["fused_optimizer"].measured
    assert by_name["strategy"].skip and "benchmarks/ddp.py" in by_name["strategy"].skip  # needs torchrun
    assert by_name["precision"].skip.startswith("benchmarked on")


def test_measured_rows_carry_every_column(result):
    (mlp,) = result.workloads
    naive = next(r for r in mlp.rows if r.kind == "naive")
    assert naive.verdict == "baseline" and naive.speedup == 1.0
    for row in (r for r in mlp.rows if r.measured):
        assert len(row.units_per_s_runs) == 2 and row.units_per_s > 0 and row.step_s > 0
        assert row.speedup > 0 and row.verdict in ("baseline", "unverified")   # two repeats: nothing is called
        assert row.warmup_cold_s is not None and row.warmup_warm_s is not None
        assert row.peak_memory_bytes is not None and row.peak_memory_bytes > 0
        assert row.first_loss > 0 and math.isfinite(row.final_loss)
        assert row.mfu is None                      # MFU is for GPT on a GPU
    tuned = next(r for r in mlp.rows if r.kind == "tuned")
    assert tuned.measured and tuned.changes == {"fused_optimizer": True}
    accum = next(r for r in mlp.rows if r.speedup_name == "grad_accum")
    # Four micro-batches per optimizer step: throughput counts all of their samples.
    assert naive.samples_per_step == 32 and accum.samples_per_step == 4 * 32


def test_json_markdown_and_plot_are_written(result, tmp_path):
    data = json.loads(write_json(result, tmp_path / "out" / "bench.json").read_text())
    assert data["machine"]["torch"] and data["settings"]["repeats"] == 2
    assert {r["label"] for r in data["workloads"][0]["rows"]} >= {"naive", "fused_optimizer", "fast", "tuned"}
    md = write_markdown(result, tmp_path / "bench.md").read_text()
    assert md == markdown(result)
    assert "| naive |" in md and "| fused_optimizer |" in md and "skipped strategy:" in md
    png = write_plot(result, tmp_path / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_a_plan_that_fails_is_an_error_row_not_a_crash():
    res = run_bench(BenchSettings(**TINY, tune=True), tune_fn=lambda *a, **k: Plan(batch_size=10**6))
    tuned = next(r for r in res.workloads[0].rows if r.kind == "tuned")
    assert tuned.error and "larger than" in tuned.error
    assert res.errors and res.errors[0].startswith("mlp/tuned")


def test_cli_writes_the_outputs(tmp_path, capsys):
    code = main(["bench", "--workload", "mlp", "--quick", "--steps", "3", "--repeats", "2", "--min-time", "0",
                 "--device", "cpu", "--json", str(tmp_path / "b.json"), "--markdown", str(tmp_path / "b.md"),
                 "--plot", str(tmp_path / "b.png")])
    out = capsys.readouterr().out
    assert code == 0
    assert "fused_optimizer" in out and "mlp: fast plan" in out
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["settings"]["quick"] is True and data["settings"]["compile"] is False
    assert (tmp_path / "b.md").stat().st_size > 0 and (tmp_path / "b.png").stat().st_size > 0


def test_cli_rejects_bad_settings(capsys):
    assert main(["bench", "--workload", "mlp", "--repeats", "0"]) == 2
    assert "must all be >= 1" in capsys.readouterr().out


def test_threads_apply_during_the_run_and_are_restored():
    before = torch.get_num_threads()
    seen = []

    def tune_fn(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return Plan()

    res = run_bench(BenchSettings(**{**TINY, "repeats": 1, "threads": 1}, tune=True), tune_fn=tune_fn)
    assert seen == [1] and res.machine["torch_threads"] == 1
    assert torch.get_num_threads() == before
