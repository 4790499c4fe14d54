"""The training run the fault tests kill: a tiny, real Trainer run in a child process.

Children are forked from a multiprocessing forkserver that has already imported torch,
``torch._dynamo`` (the first optimizer imports it: about 5 s here) and turbotrain, so a
child starts training in tens of milliseconds and a test can afford hundreds of them.

A child reports to the parent over a pipe, so the parent knows exactly what it did before
it was killed (messages sent before a SIGKILL stay readable in the pipe):

* ``("begin", pid)``: started, before the Trainer exists;
* ``("resumed", step, files)``: at the first batch: the step training continues from and
  the checkpoint directory's file names (the resume's clean-up has run by then);
* ``("batch", step, indices)``: each micro-batch: optimizer steps done before it, its samples;
* ``("stepped", n)``: after the n-th optimizer step of this process (from the step hook);
* ``("worker", id, pid)``: a DataLoader worker started;
* ``("paused", n)``: blocked after step n until the parent sends ``"go"`` (``Job.pause_after``);
* ``("done", steps, skipped)``, ``("preempted", step, checkpoint)``, ``("error", type, message)``.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import tempfile
import time
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import turbotrain as tt
from turbotrain.speedups.registry import all_speedups

all_speedups()  # imports every speed-up module once, in the forkserver, rather than in every child

FAULT_ENV = "TURBOTRAIN_FAULT"


@dataclass(frozen=True)
class Job:
    directory: str
    max_steps: int
    checkpoint_every: int = 4
    samples: int = 48                 # 12 steps an epoch at batch 4
    batch_size: int = 4
    num_workers: int = 0
    persistent_workers: bool = False
    fault: str = ""                   # armed fault points (TURBOTRAIN_FAULT) for this process only
    pause_after: int | None = None    # block after this many optimizer steps until the parent says "go"
    die_after_step: int | None = None   # SIGKILL itself right after optimizer step N, before its boundary
    die_before_step: int | None = None  # SIGKILL itself when step N+1 begins (step N's checkpoint is done)
    item_delay_s: float = 0.0         # a slow __getitem__, so an epoch lasts long enough to kill a worker
    own_process_group: bool = False   # lead a process group (its DataLoader workers join it), as a job step does
    tmpdir: str | None = None         # this process's temporary root (a killed worker leaves its pymp-* folder)


class Indexed(Dataset):
    """Samples that carry their index, so the parent can check the order they were trained in."""

    def __init__(self, n: int, delay_s: float = 0.0):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x[:, :3].argmax(1)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[i], self.y[i], i


def build(job: Job, conn=None):
    """Model (with dropout, so the global RNG matters), optimizer, scheduler and loader.

    With ``conn``, each DataLoader worker reports ``("worker", id, pid)`` when it starts.
    """
    random.seed(0)  # Python reseeds `random` in every forked child: seed it like a reproducible script does
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
    loader = DataLoader(Indexed(job.samples, job.item_delay_s), batch_size=job.batch_size, shuffle=True,
                        num_workers=job.num_workers, persistent_workers=job.persistent_workers,
                        worker_init_fn=None if conn is None else partial(_report_worker, conn))
    return model, opt, sched, loader


def _report_worker(conn, worker_id: int) -> None:
    conn.send(("worker", worker_id, os.getpid()))  # one small write: atomic beside the main process's


def run_job(conn, job: Job) -> None:
    """The child's main: train ``job`` with ``fit(resume=True)`` and report over ``conn``."""
    torch.set_num_threads(1)  # other helpers share the 2 cores
    # A forkserver child inherits "forkserver" as its default start method; a training script
    # on Linux forks its DataLoader workers, so this one does too.
    multiprocessing.set_start_method("fork", force=True)
    if job.own_process_group:
        os.setpgid(0, 0)
    if job.tmpdir is not None:
        tempfile.tempdir = job.tmpdir  # forked workers inherit it
    if job.fault:
        os.environ[FAULT_ENV] = job.fault
    else:
        os.environ.pop(FAULT_ENV, None)
    conn.send(("begin", os.getpid()))
    model, opt, sched, loader = build(job, conn if job.num_workers else None)
    stepped, start = [0], [0]

    def after_step(optimizer, args, kwargs):
        stepped[0] += 1
        conn.send(("stepped", stepped[0]))
        if start[0] + stepped[0] == job.die_after_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if stepped[0] == job.pause_after:
            conn.send(("paused", stepped[0]))
            conn.recv()  # "go"

    opt.register_step_post_hook(after_step)
    first = [True]

    def step(ctx, batch):
        x, y, idx = batch
        if first[0]:
            first[0], start[0] = False, ctx.global_step
            conn.send(("resumed", ctx.global_step, sorted(os.listdir(job.directory)) if os.path.isdir(job.directory)
                       else []))
        if ctx.global_step == job.die_before_step:
            os.kill(os.getpid(), signal.SIGKILL)
        conn.send(("batch", ctx.global_step, idx.tolist()))
        return F.cross_entropy(ctx.model(x), y)

    trainer = tt.Trainer(model, opt, step_fn=step, plan=tt.Plan(device="cpu"), schedulers=sched,
                         max_steps=job.max_steps, checkpoint_dir=job.directory,
                         checkpoint_every_n_steps=job.checkpoint_every, progress=False, log_every_n_steps=10**6)
    try:
        result = trainer.fit(loader, resume=True)
    except tt.Preempted as exc:
        conn.send(("preempted", exc.step, exc.checkpoint))
        raise  # a SystemExit: the process exits with its code, 143
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which asserts on it
        conn.send(("error", type(exc).__name__, str(exc)))
        raise SystemExit(1) from None
    conn.send(("done", result.steps, result.skipped_steps))
