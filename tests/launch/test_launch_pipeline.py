"""Pipeline parallelism (strategy='pipeline') on two CPU processes with gloo.

The launched runs (tests/launch/workers/train_pipeline.py) are compared with one process doing gradient
accumulation over the same micro-batches as the schedule does it (pipeline_tiny.reference).

Starting torch in each process is most of a launch's time: every run of two processes that must succeed is made in
ONE launch (and both runs of four processes in another), one after the other in the same processes, each writing
into its own folder; each test asserts on its own run's files and log lines, as when it launched its own.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import pipeline_tiny as tiny
import several_runs
from launch_helpers import ROOT, read_rank, run_launch
from launch_helpers import launch as launch_cli

WORKER = ROOT / "tests" / "launch" / "workers" / "train_pipeline.py"


@dataclass
class Run:
    out: Path  # the run's own folder: <config>-rank<r>.pt
    log: str   # the lines its processes logged (each "rank r: ..."), none of the other runs'


def run_log(stderr: str, out: Path, nproc: int) -> str:
    """What the ranks logged between their ``run OUT begins`` and ``run OUT ends`` lines."""
    lines = []
    for rank in range(nproc):
        prefix = f"rank {rank}: "
        own = [line for line in stderr.splitlines() if line.startswith(prefix)]
        begin, end = own.index(f"{prefix}run {out} begins"), own.index(f"{prefix}run {out} ends")
        lines += own[begin + 1:end]
    return "\n".join(lines)


def run_all(base: Path, runs: dict[str, list[str]], nproc: int) -> dict[str, Run]:
    """``runs`` (name -> the worker's options, ``{out}`` standing for the run's folder) in one launch."""
    for name in runs:
        (base / name).mkdir()
    argv = several_runs.joined(*(["--out", str(base / name), *(o.replace("{out}", str(base / name)) for o in options)]
                                 for name, options in runs.items()))
    proc = launch_cli("--nproc-per-node", str(nproc), str(WORKER), *argv, timeout=300)
    return {name: Run(base / name, run_log(proc.stderr, base / name, nproc)) for name in runs}


TWO_PROCESS_RUNS = {
    # validation every 5 steps too: it must not change what training computes
    "trained": [arg for config in sorted(tiny.CONFIGS) for arg in ("--config", config)] + ["--validate"],
    "meta": ["--config", "1f1b", "--meta", "--balanced", "--steps", "2"],
    # validation batches of another shape: their own trace
    "resume": ["--config", "1f1b", "--checkpoint-dir", "{out}/ckpt", "--stop-at", "10", "--validate",
               "--val-batch", "16"],
    "clip": ["--config", "1f1b", "--clip", "0.3", "--steps", "5"],
    "nan": ["--config", "gpipe", "--nan-at-step", "3", "--steps", "12", "--validate", "--early-stop"],
    "bf16": ["--config", "1f1b", "--precision", "bf16-mixed", "--steps", "5"],
}
FOUR_PROCESS_RUNS = {
    "dp_pp": ["--config", "1f1b", "--steps", "6", "--checkpoint-dir", "{out}/ckpt", "--stop-at", "3", "--validate"],
    "interleaved_dp": ["--config", "interleaved", "--steps", "4"],
}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> dict[str, Run]:
    return run_all(tmp_path_factory.mktemp("pipeline-2"), TWO_PROCESS_RUNS, nproc=2)


@pytest.fixture(scope="module")
def four_processes(tmp_path_factory) -> dict[str, Run]:
    return run_all(tmp_path_factory.mktemp("pipeline-4"), FOUR_PROCESS_RUNS, nproc=4)


def merged_weights(out, config: str, ranks=(0, 1)) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for rank in ranks:
        own = read_rank(out, config, rank)["weights"]
        assert not set(own) & set(weights), "two processes hold the same parameter"
        weights.update(own)
    return weights


def logged_losses(record: dict) -> list[float]:
    return [row["train_loss"] for row in record["history"] if "train_loss" in row]


# -- correct to the bit --------------------------------------------------------------------------

@pytest.fixture(scope="module", params=sorted(tiny.CONFIGS))
def trained(request, two_processes):
    return request.param, two_processes["trained"].out


def test_pipeline_equals_gradient_accumulation_bitwise(trained):
    """GPipe and 1F1B on 2 stages, interleaved 1F1B with 4 stages on 2 processes: 20 steps, torch.equal."""
    config, out = trained
    settings, _ = tiny.CONFIGS[config]
    weights, losses = tiny.reference(settings["microbatches"])
    got = merged_weights(out, config)
    assert got.keys() == weights.keys()
    for name in weights:
        assert torch.equal(got[name], weights[name]), f"{config}: {name} differs"
    rank0 = read_rank(out, config, 0)
    assert rank0["steps"] == tiny.STEPS
    # rank 0 holds the first stage; the logged loss is the last stage's, brought to rank 0
    assert logged_losses(rank0) == losses
    # the schedule's eval, on stages traced in eval mode, at steps 5, 10, 15 and 20
    val = [row["val_loss"] for row in rank0["history"] if "val_loss" in row]
    assert len(val) == 4 and val[-1] == pytest.approx(tiny.validation_loss(weights, microbatches=4), rel=1e-6)


def test_each_process_holds_only_its_stages_and_the_optimizer_keeps_its_settings(trained):
    config, out = trained
    rank0, rank1 = read_rank(out, config, 0), read_rank(out, config, 1)
    if config == "interleaved":  # stages 0 and 2 on process 0, 1 and 3 on process 1
        assert any(n.startswith("blocks.1.") for n in rank1["real_params"])
        assert any(n.startswith("blocks.2.") for n in rank0["real_params"])
    else:
        assert {n.split(".")[0] for n in rank0["real_params"]} == {"embed", "blocks"}
        assert {n.split(".")[0] for n in rank1["real_params"]} == {"blocks", "head"}
    for record in (rank0, rank1):
        assert record["optimizer_class"] == "AdamW"
        assert record["optimizer_defaults"]["weight_decay"] == 0.01 and record["optimizer_defaults"]["lr"] == 1e-2


# -- memory per process falls with the stages ------------------------------------------------------

def test_a_model_built_on_meta_materialises_half_per_process(two_processes):
    """Parameter, gradient and optimizer-state bytes per process: exactly 1/2 of the whole (2 equal stages)."""
    run = two_processes["meta"]
    records = [read_rank(run.out, "1f1b", rank) for rank in (0, 1)]
    for rank, stages in ((0, [0]), (1, [1])):  # the user's optimizer, rebuilt over each stage's tensors: logged
        assert (f"rank {rank}: turbotrain: pipeline stage(s) {stages} of 2: AdamW rebuilt over this stage's 8 of 16 "
                "parameter tensors (same class, param groups and settings)") in run.log
    whole = records[0]["whole_param_bytes"]
    for rank, record in enumerate(records):
        assert record["param_bytes"] == whole // 2
        assert record["grad_bytes"] == whole // 2
        # AdamW: exp_avg and exp_avg_sq (the size of the parameters each) and a step count per parameter
        steps_bytes = 4 * len(record["real_params"])
        assert record["optimizer_bytes"] == 2 * (whole // 2) + steps_bytes
        assert len(record["real_params"]) == 8  # its two blocks; the other two stay on the meta device
        assert all(n.startswith(f"blocks.{2 * rank}.") or n.startswith(f"blocks.{2 * rank + 1}.")
                   for n in record["real_params"])


# -- the rest of the Trainer --------------------------------------------------------------------

def test_checkpoints_resume_exactly_and_validation_runs_through_the_schedule(two_processes):
    """Train to step 10 with checkpoints, resume in a new Trainer to 20: bitwise the uninterrupted run."""
    out = two_processes["resume"].out  # "--stop-at 10 --validate --val-batch 16", checkpoints in ckpt/
    weights, losses = tiny.reference(4)
    got = merged_weights(out, "1f1b")
    for name in weights:
        assert torch.equal(got[name], weights[name]), name
    rank0 = read_rank(out, "1f1b", 0)
    assert logged_losses(rank0) == losses[10:]  # the resumed run logs steps 11..20
    shards = sorted(p.name for p in (out / "ckpt" / "1f1b").glob("step-*.dcp"))
    assert shards[-1] == "step-000000020.dcp"
    assert len(list((out / "ckpt" / "1f1b" / shards[-1]).glob("*.distcp"))) == 2  # each stage its own part
    val = [row["val_loss"] for row in rank0["history"] if "val_loss" in row]
    assert len(val) == 2  # steps 15 and 20
    assert val[-1] == pytest.approx(tiny.validation_loss(weights, microbatches=4, batch=16), rel=1e-6)


def test_gradient_clipping_uses_the_global_norm_over_the_stages(two_processes):
    out = two_processes["clip"].out  # "--clip 0.3 --steps 5"
    got = merged_weights(out, "1f1b")
    global_ref, _ = tiny.reference(4, steps=5, clip=0.3)
    per_stage_ref, _ = tiny.reference(4, steps=5, clip=0.3, clip_groups=tiny.STAGE_GROUPS)
    unclipped, _ = tiny.reference(4, steps=5)
    assert any(not torch.allclose(global_ref[k], unclipped[k], atol=1e-4) for k in unclipped)  # the clip acts
    assert any(not torch.allclose(global_ref[k], per_stage_ref[k], atol=1e-5) for k in unclipped)
    for name in global_ref:
        torch.testing.assert_close(got[name], global_ref[name], rtol=1e-6, atol=1e-7)


def test_nan_guard_skips_the_step_on_every_stage_and_early_stopping_stops_all(two_processes):
    out = two_processes["nan"].out  # "--nan-at-step 3 --steps 12 --validate --early-stop"
    for rank in (0, 1):
        record = read_rank(out, "gpipe", rank)
        assert record["skipped_steps"] == 1  # the last stage's NaN reached the first stage's process too
        assert all(torch.isfinite(t).all() for t in record["weights"].values())
        # patience 0 with an impossible min_delta: the second validation (step 10) stops every process
        assert record["stopped_by"] == "early_stopping" and record["steps"] == 10


def test_bf16_autocast_runs_inside_the_schedule(two_processes):
    out = two_processes["bf16"].out  # "--precision bf16-mixed --steps 5"
    _, losses = tiny.reference(4, steps=5)
    got = logged_losses(read_rank(out, "1f1b", 0))
    assert got != losses  # bf16 matmuls: not the fp32 numbers...
    torch.testing.assert_close(got, losses, rtol=2e-2, atol=0)  # ...but close to them


# -- pipeline x FSDP -------------------------------------------------------------------------------

def test_pipeline_times_fsdp_on_a_dp_pp_mesh(four_processes):
    """4 processes, 2 stages: 2 pipelines whose stages FSDP shards across them; checkpointed at step 3 and
    resumed in a new Trainer to step 6, validating at step 5: matches one process doing the same arithmetic."""
    out = four_processes["dp_pp"].out  # "--steps 6 --checkpoint-dir ckpt --stop-at 3 --validate"
    weights, losses = tiny.reference_data_parallel(4, replicas=2, steps=6)
    got: dict[str, torch.Tensor] = {}
    for rank in (0, 1):  # replica 0's two stages, gathered from their shards
        got.update(read_rank(out, "1f1b", rank)["weights"])
    for name in weights:
        torch.testing.assert_close(got[name], weights[name], rtol=1e-5, atol=1e-6)
    rank0 = read_rank(out, "1f1b", 0)
    torch.testing.assert_close(logged_losses(rank0), losses[3:], rtol=1e-5, atol=1e-6)  # the resumed steps
    assert [row["step"] for row in rank0["history"] if "val_loss" in row] == [5]
    # each process holds half of its stage's parameters: stage 0 is on processes 0 and 2, stage 1 on 1 and 3
    records = [read_rank(out, "1f1b", rank) for rank in range(4)]
    for a, b in ((0, 2), (1, 3)):
        assert records[a]["param_bytes"] + records[b]["param_bytes"] == records[a]["stage_param_bytes"]
        assert records[a]["grad_bytes"] == records[a]["param_bytes"]


def test_interleaved_pipeline_times_fsdp(four_processes):
    """4 stages at 2 per process, x 2 replicas: 4 processes; process r holds stages r % 2 and r % 2 + 2."""
    out = four_processes["interleaved_dp"].out  # "--steps 4"
    weights, losses = tiny.reference_data_parallel(4, replicas=2, steps=4)
    got = merged_weights(out, "interleaved")
    for name in weights:
        torch.testing.assert_close(got[name], weights[name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logged_losses(read_rank(out, "interleaved", 0)), losses, rtol=1e-5, atol=1e-6)


# -- clear errors, before any process hangs -------------------------------------------------------

def failing_launch(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """A launch that must fail on every process (the timeout catches a hang)."""
    proc = run_launch("--nproc-per-node", "2", str(WORKER), "--out", str(tmp_path), "--config", "1f1b", *args,
                      timeout=120)
    assert proc.returncode != 0
    return proc


def test_a_batch_that_does_not_divide_into_the_microbatches_fails_every_process_fast(tmp_path):
    proc = failing_launch(tmp_path, "--batch", "6")
    assert "batch of 6 samples does not divide into Plan.microbatches=4" in proc.stderr


def test_a_stage_that_fails_alone_fails_every_process_instead_of_hanging(tmp_path):
    """Only the last stage holds the meta buffer it cannot recreate; the first stage must not wait for it."""
    proc = failing_launch(tmp_path, "--meta", "--meta-buffer")
    assert "buffer 'scale' was built on the meta device" in proc.stderr
    assert "another process of the pipeline failed to build its stage" in proc.stderr


# -- the documentation's example ------------------------------------------------------------------

def test_the_docs_pipeline_examples_run_as_is_on_two_processes(tmp_path):
    """docs/launch.md, 'Pipeline parallelism': the Trainer example, then the own-loop one, under launch."""
    text = (ROOT / "docs" / "launch.md").read_text()
    section = text[text.index("## Pipeline parallelism"):]
    section = section[:section.index("\n## ", 10)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2
    script = tmp_path / "train.py"
    script.write_text("\n".join(blocks))
    proc = launch_cli("--nproc-per-node", "2", str(script))
    # printed by both processes (their lines may interleave): 2 epochs of 8 steps
    assert proc.stdout.count("max_epochs") == 2 and proc.stdout.count("16") >= 2
