"""measure.run_epochs: whole epochs through a loader, the loader rebuilt once, reads counted per epoch."""

import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import turbotrain as tt
from turbotrain.measure import run_epochs
from turbotrain.plan import Plan


class PidDataset(Dataset):
    """Each sample says which process loaded it."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.full((4,), float(i)), i % 2, os.getpid()


def _worker_pids_per_epoch(plan):
    seen = []

    def step_fn(model, batch):
        x, y, pid = batch
        seen.append(set(pid.tolist()))
        return F.cross_entropy(model(x), y)

    loader = DataLoader(PidDataset(), batch_size=4)
    trial = run_epochs(torch.nn.Linear(4, 2), lambda p: torch.optim.SGD(p, lr=0.1), None, loader, plan,
                       epochs=2, step_fn=step_fn)
    assert trial.ok, trial.error
    assert trial.epoch_samples == [16, 16] and trial.epoch_steps == [4, 4] and len(trial.step_times_s) == 8
    assert all(s > 0 for s in trial.epoch_s) and len(trial.samples_per_s) == 2
    return set().union(*seen[:4]), set().union(*seen[4:])


def test_persistent_workers_carry_their_process_into_the_next_epoch():
    first, second = _worker_pids_per_epoch(Plan(device="cpu", num_workers=1, persistent_workers=True))
    assert first == second and os.getpid() not in first
    first, second = _worker_pids_per_epoch(Plan(device="cpu", num_workers=1))
    assert first.isdisjoint(second), "without persistence every epoch starts a new worker"


def test_reads_are_counted_per_epoch_and_warmup_stays_out_of_the_epochs(tmp_path):
    (tmp_path / "files").mkdir()
    for i in range(8):
        (tmp_path / "files" / f"{i}.bin").write_bytes(bytes([i % 2]) * 100)

    def decode(data):
        return torch.tensor([float(data[0])]), data[0]

    ds = tt.data.FileDataset(sorted(str(p) for p in (tmp_path / "files").iterdir()), decode=decode,
                             cache=tmp_path / "cache")
    warm = [(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long))]
    trial = run_epochs(torch.nn.Linear(1, 2), lambda p: torch.optim.SGD(p, lr=0.1), F.cross_entropy,
                       DataLoader(ds, batch_size=4), Plan(device="cpu"), epochs=2, warmup=2, warmup_batches=warm)
    assert trial.ok, trial.error
    assert trial.reads[0] == {"file": 800}                # epoch 1 reads the files into the cache
    assert trial.reads[1] == {"cache": 800}               # epoch 2 reads nothing else
    assert trial.warmup_s > 0 and trial.epoch_steps == [2, 2]
