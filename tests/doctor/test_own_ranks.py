"""A script that starts its own ranks (Lightning's ``Trainer(strategy="ddp", devices=2)`` run as ``python train.py``)
is diagnosed as a job: every rank recorded, the first process as rank 0, whether the user ran
``turbotrain doctor train.py`` or ``turbotrain doctor -- python train.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from doctor_helpers import doctor_job, job_processes, marked_lines
from turbotrain.doctor.job.launcher import script_is_launcher
from turbotrain.doctor.job.own_ranks import StartsOwnRanks, refusing_own_ranks
from turbotrain.doctor.record.recorder import Recorder

SCRIPTS = Path(__file__).parent / "scripts"


def test_starting_a_rank_is_refused_before_the_process_exists(tmp_path):
    marker = tmp_path / "started"
    child = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    original = subprocess.Popen
    with refusing_own_ranks():
        with pytest.raises(StartsOwnRanks, match="rank 1 of 2 with LOCAL_RANK=1"):
            subprocess.Popen(child, env={**os.environ, "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
        assert not marker.exists()
        subprocess.run(child, check=True)  # any other process starts as usual
        assert marker.exists()
    assert subprocess.Popen is original


@pytest.mark.parametrize(
    "command, expected",
    [
        ([sys.executable, "train.py", "--lr", "3"], True),
        (["python3", "train.py"], True),
        ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"], False),
        ([sys.executable, "-m", "turbotrain", "launch", "train.py"], False),
        (["torchrun", "--nproc-per-node", "2", "train.py"], False),
    ],
)
def test_only_python_on_a_script_makes_the_script_its_own_launcher(command, expected):
    assert script_is_launcher(command) is expected


def test_lightning_rebuilds_a_recorded_loader_with_its_own_batch_size():
    """Under the doctor, Lightning's DDP rebuilt every DataLoader with batch size 1: it reads the loader's
    attributes by the names of ``DataLoader.__init__``'s parameters, which the doctor's wrapper had hidden."""
    from lightning.pytorch.utilities.data import _update_dataloader

    data = TensorDataset(torch.randn(256, 4))
    with Recorder(measure=2, warmup=1, profile=0, capture=False):
        loader = DataLoader(data, batch_size=64, drop_last=True)
        rebuilt = _update_dataloader(loader, DistributedSampler(data, num_replicas=2, rank=0))
    assert (rebuilt.batch_size, rebuilt.drop_last) == (64, True)
    assert len(next(iter(rebuilt))[0]) == 64


def test_a_lightning_script_starting_its_own_ranks_names_its_straggler(tmp_path):
    """Rank 1, started by Lightning itself, loads its data slower: the doctor, given only the script, records
    both ranks and names rank 1 at the loader's line; nothing of the job is left running."""
    script = SCRIPTS / "lightning_ddp_slow_rank.py"
    proc, report = doctor_job(tmp_path, str(script))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]
    assert any("starts its own ranks" in m for m in report["messages"]), report["messages"]
    straggler = report["straggler"]
    assert straggler is not None and (straggler["rank"], straggler["cause"]) == (1, "data_loading"), report["ranks"]
    (line,) = [n for rule, n in marked_lines("lightning_ddp_slow_rank") if rule == "straggler"]
    assert straggler["where"].endswith(f"lightning_ddp_slow_rank.py:{line}")
    assert job_processes(str(script)) == []
