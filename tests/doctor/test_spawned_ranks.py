"""DDP ranks started the PyTorch tutorials' way, ``mp.spawn(train, nprocs=N)`` from ``python train.py``: the doctor
refuses the first spawn in its own process (before any process exists) and runs the script as a job, the script's
process as the launcher and each spawned process recorded as the rank of its index."""

from __future__ import annotations

import multiprocessing
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from doctor_helpers import SCRIPTS, doctor_job
from turbotrain.doctor.diagnose import DoctorOptions, diagnose_script
from turbotrain.doctor.job.rank_main import ENV_FOLDER
from turbotrain.doctor.job.spawned_ranks import ENTRY, SpawnsRanks, as_typed, refusing_spawned_ranks
from warm_command import TEST_RUN, TEST_RUN_ID


def _touch(index: int, folder: str) -> None:
    Path(folder, f"started-{index}").touch()


@pytest.mark.reads_no_time
def test_spawning_a_rank_is_refused_before_any_process_exists(tmp_path):
    original = multiprocessing.process.BaseProcess.start
    with refusing_spawned_ranks():
        with pytest.raises(SpawnsRanks) as refused:
            mp.start_processes(_touch, args=(str(tmp_path),), nprocs=2, start_method="fork")  # the line named
        # A process running library code (not the user's function as a spawned rank) starts as usual.
        other = multiprocessing.get_context("fork").Process(target=os.getpid)
        other.start()
        other.join()
    assert multiprocessing.process.BaseProcess.start is original
    assert list(tmp_path.iterdir()) == [] and other.exitcode == 0
    line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# the line named" in text)
    said = str(refused.value)  # the places relative to the working directory
    assert said.startswith("2 processes running _touch() (") and said.endswith(f"test_spawned_ranks.py:{line}")
    assert f"test_spawned_ranks.py:{_touch.__code__.co_firstlineno}), from " in said, said
    command = refused.value.command("train.py", ["--lr", "1"])
    assert command == [sys.executable, "-m", ENTRY, "train.py", "--lr", "1"]
    assert as_typed(command) == [sys.executable, "train.py", "--lr", "1"]


FORKED = """
import sys

import torch
import torch.multiprocessing as mp


def train(rank, fail_rank):  # the ranks run this
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(40):
        if rank == fail_rank and step == 2:
            raise ValueError(f"rank {rank} gave up")  # rank 1 fails here
        loss = model(torch.randn(8, 4)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    mp.start_processes(train, args=(int(sys.argv[1]),), nprocs=2, start_method="fork")
"""


@pytest.mark.reads_no_time
@pytest.mark.parametrize("fail_rank", [-1, 1], ids=["every-rank-trains", "rank-1-fails"])
def test_forked_ranks_are_recorded_each_as_its_own(tmp_path, fail_rank):
    path = tmp_path / "forked.py"
    path.write_text(textwrap.dedent(FORKED))
    lines = path.read_text().splitlines()
    trained = next(n for n, text in enumerate(lines, 1) if "# the ranks run this" in text)
    report = diagnose_script(path, [str(fail_rank)], DoctorOptions(steps=3, warmup=1, profile_steps=0, what_if=False))
    said = report.messages[0]
    assert "torch.multiprocessing.spawn (2 processes running train() " in said, report.messages
    assert f"(forked.py:{trained}), from forked.py:{len(lines)})" in said, said
    assert report.argv == [str(fail_rank)]
    if fail_rank < 0:
        assert report.status == "ok", report.messages
        assert [(r.rank, r.steps) for r in report.ranks.ranks] == [(0, 3), (1, 3)]
    else:
        failed = next(n for n, text in enumerate(lines, 1) if "# rank 1 fails here" in text)
        assert report.status == "error"
        assert "rank 1 (" in report.messages[-1] and f"at forked.py:{failed}: ValueError: rank 1 gave up" in (
            report.messages[-1]
        ), report.messages


def _job_processes() -> list[int]:
    """This test run's processes of a doctor job still running: spawned ranks show ``python -c ...`` as their
    command line, so they are found by the job's folder in their environment."""
    ours, found = f"{TEST_RUN}={TEST_RUN_ID}".encode(), []
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if ours in environ and ENV_FOLDER.encode() in environ:
            found.append(int(entry.name))
    return found


def test_the_tutorials_ddp_spawn_is_a_job_whose_straggler_is_named(tmp_path):
    script = SCRIPTS / "ddp_spawn_straggler.py"
    proc, report = doctor_job(tmp_path, str(script), "--slow-rank", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = script.read_text().splitlines()
    trained, started = (next(n for n, text in enumerate(lines, 1) if mark in text)
                        for mark in ("# the ranks run this", "# the ranks start here"))
    assert report["messages"][0].startswith(
        f"The script starts its ranks with torch.multiprocessing.spawn (2 processes running train() "
        f"(ddp_spawn_straggler.py:{trained}), from ddp_spawn_straggler.py:{started})"
    ), report["messages"]
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert all(r["steps_measured"] == 10 for r in report["ranks"]), report["ranks"]
    assert (report["straggler"]["rank"], report["straggler"]["cause"]) == (1, "compute"), report["straggler"]
    printed = " ".join(proc.stdout.split())  # the terminal report, its wrapped lines joined
    assert "ddp_spawn_straggler.py --slow-rank 1" in printed and ENTRY not in printed
    assert _job_processes() == []
