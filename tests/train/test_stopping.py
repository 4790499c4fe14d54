import time

import pytest
import torch
import torch.nn.functional as F
from tiny import make_loader, make_mlp

import turbotrain as tt
from turbotrain.config import ConfigError


def _trainer(**limits):
    model = make_mlp()
    return tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, progress=False, **limits)


def test_max_epochs_counts_epochs():
    r = _trainer(max_epochs=3).fit(make_loader(n=64, batch_size=8))
    assert (r.stopped_by, r.epochs, r.steps, r.samples) == ("max_epochs", 3, 24, 192)


def test_default_is_one_epoch():
    r = _trainer().fit(make_loader(n=64, batch_size=8))
    assert (r.epochs, r.steps) == (1, 8)


def test_max_steps_stops_mid_epoch():
    r = _trainer(max_steps=11).fit(make_loader(n=64, batch_size=8))
    assert (r.stopped_by, r.steps, r.epochs) == ("max_steps", 11, 1)


def test_max_time_stops_on_the_wall_clock():
    slow = make_loader(n=64, batch_size=8)

    class Slow:
        def __iter__(self):
            for batch in slow:
                time.sleep(0.05)
                yield batch

    r = _trainer(max_time="00:00:00:01", max_epochs=100).fit(Slow())
    assert r.stopped_by == "max_time" and 5 <= r.steps <= 30


def test_epochs_beat_steps_when_reached_first():
    r = _trainer(max_epochs=1, max_steps=1000).fit(make_loader(n=64, batch_size=8))
    assert (r.stopped_by, r.steps) == ("max_epochs", 8)


@pytest.mark.parametrize("limits, match", [
    ({"max_epoch": 3}, "unknown key 'max_epoch'.*Did you mean 'max_epochs'"),
    ({"max_steps": 0}, "max_steps: 0 is not allowed"),
    ({"val_check_interval": 1.5}, "fraction must be in"),
    ({"max_time": "soon"}, "not a duration"),
    ({"on_nonfinite": "warn"}, "one of 'stop', 'skip', 'ignore'"),
    # Checkpoints every N steps with nowhere to write them: refused here, not a TypeError at step N.
    ({"checkpoint_every_n_steps": 2}, "checkpoint_every_n_steps: checkpoints need checkpoint_dir"),
    # Manual optimization runs step_fn: without one it failed at the first batch ('NoneType' not callable).
    ({"manual_optimization": True}, "manual_optimization=True runs step_fn"),
])
def test_bad_limits_are_named(limits, match):
    with pytest.raises(ConfigError, match=match):
        _trainer(**limits)


def test_loader_without_length_and_generator_batches():
    batches = list(make_loader(n=40, batch_size=8))
    r = _trainer(max_epochs=2).fit(lambda_iterable(batches))
    assert (r.steps, r.epochs) == (10, 2)


class lambda_iterable:
    """An iterable without __len__, re-iterable each epoch (like a generator factory)."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        yield from self.items
