import torch
import torch.nn.functional as F
from tiny import make_loader, make_mlp

import turbotrain as tt


class Counter:
    def __init__(self):
        self.at = []

    def on_validation_end(self, trainer, metrics):
        self.at.append(trainer.state.step)


def _fit(val_loader=None, **limits):
    model = make_mlp()
    counter = Counter()
    trainer = tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, progress=False,
                         callbacks=[counter], **limits)
    result = trainer.fit(make_loader(n=64, batch_size=8), val_loader or make_loader(n=32, shuffle=False))
    return result, counter.at


def test_validation_at_every_epoch_end_by_default():
    _, at = _fit(max_epochs=3)
    assert at == [8, 16, 24]


def test_every_n_epochs():
    _, at = _fit(max_epochs=4, check_val_every_n_epoch=2)
    assert at == [16, 32]


def test_fraction_of_an_epoch():
    _, at = _fit(max_epochs=2, val_check_interval=0.25)
    assert at == [2, 4, 6, 8, 10, 12, 14, 16]


def test_every_n_steps_across_epochs():
    _, at = _fit(max_epochs=2, val_check_interval=5)
    assert at == [5, 10, 15]


def test_validation_runs_in_inference_mode_and_eval_mode():
    seen = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = make_mlp()

        def forward(self, x):
            seen.append((self.training, torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
            return self.net(x)

    model = Probe()
    trainer = tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, progress=False,
                         max_steps=1)
    metrics = trainer.validate(make_loader(n=8, batch_size=8))
    assert seen == [(False, True, False)] and model.training
    assert metrics["val_loss"] > 0


def test_val_loss_is_the_sample_weighted_mean():
    model = make_mlp()
    trainer = tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, progress=False)
    loader = make_loader(n=20, batch_size=8, shuffle=False)  # batches of 8, 8, 4
    with torch.no_grad():
        x = torch.cat([b[0] for b in loader])
        y = torch.cat([b[1] for b in loader])
        expected = F.cross_entropy(model(x), y).item()
    assert abs(trainer.validate(loader)["val_loss"] - expected) < 1e-5
