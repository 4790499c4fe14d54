"""A DataLoader worker killed mid-epoch: a clear error naming the worker within seconds, no hang.

PyTorch notices the death either in its SIGCHLD handler ("DataLoader worker (pid N) is killed
by signal: Killed.") or while waiting for data ("DataLoader worker (pid(s) N) exited
unexpectedly", without the cause); the Trainer turns both into a WorkerDied error that names
the worker, its pid, the signal, the step, and what to do.
"""

import os
import re
import signal
import tempfile
import time

import pytest
import torch
from faultharness import Child, newest_step, run_child, unloadable
from fault_trainee import Job
from torch.utils.data import DataLoader, Dataset

import turbotrain as tt


@pytest.mark.parametrize("persistent", [False, True], ids=["workers", "persistent-workers"])
def test_a_worker_killed_mid_epoch_is_a_clear_error_within_seconds(tmp_path, worker_tmp, persistent):
    job = Job(str(tmp_path), max_steps=40, num_workers=2, persistent_workers=persistent, item_delay_s=0.005,
              tmpdir=str(worker_tmp))  # the killed worker's multiprocessing folder goes with it
    child = Child(job)
    victim = killed_at = failed_at = None
    for msg in child.messages():
        if msg == ("stepped", 16):  # mid-way through the second epoch (persistent workers: the same processes)
            victim = child.run.workers[1]
            os.kill(victim, signal.SIGKILL)  # what the kernel's OOM killer does to a worker
            killed_at = time.monotonic()
        elif msg[0] == "error":
            failed_at = time.monotonic()
    run = child.finish()
    assert run.exitcode == 1 and run.outcome is not None and run.outcome[0] == "error", run.outcome
    _, kind, message = run.outcome
    print(f"{kind}: {message} ({failed_at - killed_at:.2f} s after the kill, {run.stepped - 16} steps later)")
    assert kind == "WorkerDied" and f"DataLoader worker 1 (pid {victim}) was killed by signal SIGKILL" in message
    assert re.search(r"after 1[6-9] optimizer steps \(epoch 1\)", message) and "out-of-memory" in message
    assert failed_at - killed_at < 30, "the trainer waited instead of failing"
    # As the message says, resuming continues from the last checkpoint. (PyTorch raises from its
    # SIGCHLD handler wherever the main thread is, possibly inside the step-16 save: then it is 12.)
    last = newest_step(tmp_path)
    assert last in (12, 16) and not unloadable(tmp_path)
    resumed = run_child(job)
    assert resumed.outcome == ("done", 40, 0) and resumed.resumed_at == last


class Stuck(Dataset):
    """Sample 12 never arrives: the worker that reads it hangs (a dead NFS mount, a deadlock)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 12:
            time.sleep(300)
        return torch.zeros(8), 0


def test_a_hung_worker_does_not_outlive_fit(tmp_path, worker_tmp, monkeypatch):
    """Workers ignore SIGTERM during fit (preemption is the main process's job), so the Trainer
    SIGKILLs one that does not stop when asked: otherwise the process would hang at exit."""
    # Forked workers inherit it: the killed worker's multiprocessing folder goes with it.
    monkeypatch.setattr(tempfile, "tempdir", str(worker_tmp))
    model = torch.nn.Linear(8, 2)
    loader = DataLoader(Stuck(), batch_size=4, num_workers=2,
                        worker_init_fn=lambda _: (tmp_path / str(os.getpid())).touch())
    trainer = tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.cross_entropy,
                         plan=tt.Plan(device="cpu"), max_steps=2, progress=False)
    trainer.fit(loader)  # batch 3 (worker 1) is in flight, stuck, when training ends after batch 1
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert len(pids) == 2
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} outlived fit"


def test_a_worker_death_that_surfaced_as_another_error_is_still_named():
    """PyTorch's SIGCHLD handler raises wherever the main process is: inside torch.save the checkpoint writer fails
    with its own error ("unexpected pos") and PyTorch's is lost. A dead worker is the cause whatever surfaced."""
    from types import SimpleNamespace

    from turbotrain.train.resumable import worker_death

    iterator = SimpleNamespace(_workers=[SimpleNamespace(exitcode=None, pid=11),
                                         SimpleNamespace(exitcode=-signal.SIGKILL, pid=12)])
    surfaced = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 35468 vs 35356")
    died = worker_death(surfaced, iterator, "after 16 optimizer steps (epoch 1)")
    assert died is not None and "DataLoader worker 1 (pid 12) was killed by signal SIGKILL after 16" in str(died)
    assert "surfaced where the loop was as RuntimeError: [enforce fail" in str(died)
    said = worker_death(RuntimeError("DataLoader worker (pid 12) is killed by signal: Killed."), iterator, "here")
    assert said is not None and "surfaced" not in str(said)
    alive = SimpleNamespace(_workers=[SimpleNamespace(exitcode=None, pid=11), SimpleNamespace(exitcode=0, pid=12)])
    assert worker_death(surfaced, alive, "here") is None
