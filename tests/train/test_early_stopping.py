import pytest
import torch
import torch.nn.functional as F
from tiny import make_loader, make_mlp

import turbotrain as tt
from turbotrain.config import ConfigError


def test_patience_counts_validation_checks_without_improvement():
    es = tt.EarlyStopping(monitor="val_loss", patience=2, min_delta=0.1)
    assert [es.update({"val_loss": v}) for v in (1.0, 0.95, 0.5, 0.45, 0.44)] == [False, False, False, False, True]
    assert es.best == 0.5


def test_mode_max():
    es = tt.EarlyStopping(monitor="acc", mode="max", patience=1)
    assert [es.update({"acc": v}) for v in (0.5, 0.6, 0.55)] == [False, False, True]


def test_unknown_monitor_is_named():
    with pytest.raises(KeyError, match="monitors 'val_acc'.*val_loss"):
        tt.EarlyStopping(monitor="val_acc").update({"val_loss": 1.0})
    with pytest.raises(ConfigError, match="mode"):
        tt.EarlyStopping(mode="smallest")


class Frozen(torch.nn.Module):
    """A model whose validation loss never improves (its output ignores the weights' updates)."""

    def __init__(self):
        super().__init__()
        self.net = make_mlp()

    def forward(self, x):
        return self.net(x) if self.training else torch.zeros(x.shape[0], 3)


def _fit(**limits):
    model = Frozen()
    trainer = tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, progress=False,
                         early_stopping=tt.EarlyStopping(patience=2), **limits)
    return trainer.fit(make_loader(n=64, batch_size=8), make_loader(n=16))


def test_trainer_stops_early():
    r = _fit(max_epochs=20)
    assert r.stopped_by == "early_stopping" and r.epochs == 3  # best at epoch 1, two checks without gain


def test_min_epochs_wins_over_early_stopping():
    r = _fit(max_epochs=20, min_epochs=6)
    assert r.stopped_by == "early_stopping" and r.epochs == 6
