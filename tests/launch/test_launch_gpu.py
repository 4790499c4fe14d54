"""The same checks on GPUs with NCCL (run with `pytest -m gpu` on a machine with CUDA)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from launch_helpers import ROOT, cli_env, read_rank, run_worker

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.cuda.device_count()


def test_env_reports_gpus_nccl_and_interconnect():
    count = _gpus()
    proc = subprocess.run([sys.executable, "-m", "turbotrain", "env", "--json"], cwd=ROOT, env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    info = json.loads(proc.stdout)
    assert info["gpu_count"] == count and info["gpus"][0] == torch.cuda.get_device_name(0)
    assert info["distributed"]["nccl"] and info["distributed"]["nccl_version"]
    assert info["interconnect"] != "no GPU" and not info["interconnect"].startswith("unknown")
    assert info["precision"]["bf16"] == torch.cuda.is_bf16_supported()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_nccl_training_matches_one_process(strategy, tmp_path, single_process_reference):
    nproc = min(_gpus(), 2)
    if nproc < 2:
        pytest.skip("needs 2 GPUs for two processes")
    run_worker(tmp_path, "--config", "plain", "--strategy", strategy, "--checkpoint-dir", str(tmp_path / "ckpt"),
               launch_args=("--nproc-per-node", str(nproc)))
    rank0 = read_rank(tmp_path, "plain", 0)
    for key, value in single_process_reference["weights"].items():  # CPU reference: GPU kernels round differently
        torch.testing.assert_close(rank0["weights"][key], value, rtol=1e-4, atol=1e-5)


def test_ddp_on_one_gpu_runs_under_launch(tmp_path):
    """One process with strategy='ddp': the set-up the GPU part of benchmarks/ddp.py times."""
    _gpus()
    run_worker(tmp_path, "--config", "plain", "--strategy", "ddp", launch_args=("--nproc-per-node", "1"))
    assert read_rank(tmp_path, "plain", 0)["world"] == 1
