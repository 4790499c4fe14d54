import csv
import sys

import torch
import torch.nn.functional as F
from tiny import make_loader, make_mlp

import turbotrain as tt


def test_csv_and_tensorboard_logs(tmp_path):
    model = make_mlp()
    result = tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, max_epochs=2,
                        log_every_n_steps=4, log_dir=str(tmp_path), loggers=("csv", "tensorboard"),
                        progress=False).fit(make_loader(n=64, batch_size=8), make_loader(n=16))
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [int(r["step"]) for r in rows if r["train_loss"]] == [4, 8, 12, 16]
    assert [int(r["step"]) for r in rows if r["val_loss"]] == [8, 16]
    assert float(rows[-1]["val_loss"]) == result.metrics["val_loss"]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_quiet_lines_when_not_on_a_terminal(capsys):
    model = make_mlp()
    tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, max_steps=8,
               log_every_n_steps=4).fit(make_loader(n=64, batch_size=8))
    err = capsys.readouterr().err
    assert not sys.stderr.isatty()
    assert err.count("[turbotrain] step") == 2 and "step 8/8" in err and "samples/s" in err


def test_losses_are_read_only_at_the_logging_cadence(monkeypatch):
    """Losses stay tensors between logs: no per-step read beyond the CPU finite check."""
    from turbotrain.train.meters import LossMeter

    pops = []
    real = LossMeter.pop_mean
    monkeypatch.setattr(LossMeter, "pop_mean", lambda self: pops.append(self.count) or real(self))
    model = make_mlp()
    tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, max_steps=16,
               log_every_n_steps=8, progress=False).fit(make_loader(n=128, batch_size=8))
    assert pops[:2] == [8, 8]
