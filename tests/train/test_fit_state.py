"""What one fit() call creates lives in its FitState: the Trainer gains no attributes while fitting."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny import make_loader, make_mlp

import turbotrain as tt


def _trainer(**limits):
    model = make_mlp()
    return tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, progress=False, **limits)


def test_fit_sets_no_trainer_attribute_outside_init(tmp_path):
    trainer = _trainer(max_epochs=2, val_check_interval=3, checkpoint_dir=str(tmp_path))
    before = set(vars(trainer))
    trainer.fit(make_loader(n=64), make_loader(n=16))
    assert set(vars(trainer)) == before
    run = trainer.fit_state
    assert (run.stop_reason, run.max_epochs, run.epoch_len, run.val_every) == ("max_epochs", 2, 8, 3)


def test_each_fit_starts_its_own_state_and_validate_after_fit_reads_its_loader():
    trainer = _trainer(max_steps=4)
    trainer.fit(make_loader(n=64))
    first = trainer.fit_state
    val = make_loader(n=16, shuffle=False)
    trainer.fit(make_loader(n=64), val, resume=False)
    assert trainer.fit_state is not first and trainer.fit_state.val_loader is not None
    assert first.val_loader is None
    assert trainer.validate()["val_loss"] == trainer.validate(val)["val_loss"]


def test_validate_before_any_fit_needs_a_loader():
    trainer = _trainer(max_steps=1)
    with pytest.raises(ValueError, match="no validation loader"):
        trainer.validate()
