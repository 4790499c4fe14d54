"""A resumed CPU fp32 run ends bitwise equal to an uninterrupted one, and sees every sample once."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import turbotrain as tt


class Indexed(Dataset):
    """Returns its index with the sample, so the test can check the order samples are seen in."""

    def __init__(self, n=48):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x[:, :3].argmax(1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


def _run(tmp_path, loader_kwargs, max_steps, resume, seen, every=3, accum=1):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)

    def step(ctx, batch):
        x, y, idx = batch
        seen.extend(idx.tolist())
        return F.cross_entropy(ctx.model(x), y)

    loader = DataLoader(Indexed(), batch_size=4, **loader_kwargs)
    trainer = tt.Trainer(model, opt, step_fn=step, plan=tt.Plan(device="cpu", grad_accum_steps=accum),
                         schedulers=sched, max_epochs=3, max_steps=max_steps, checkpoint_dir=str(tmp_path),
                         checkpoint_every_n_steps=every, progress=False)
    result = trainer.fit(loader, resume=resume)
    return model, opt, result


def _assert_same(a, b):
    (model_a, opt_a, _), (model_b, opt_b, _) = a, b
    for (name, p), q in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(p, q), name
    sa, sb = opt_a.state_dict(), opt_b.state_dict()
    for key in sa["state"]:
        for k, v in sa["state"][key].items():
            assert torch.equal(v, sb["state"][key][k]), (key, k)
    assert sa["param_groups"] == sb["param_groups"]


CONFIGS = {  # factories: every run gets its own, identically seeded generator
    "global-rng-shuffle": lambda: dict(shuffle=True),
    "generator-shuffle": lambda: dict(shuffle=True, generator=torch.Generator().manual_seed(3)),
    "workers-2": lambda: dict(shuffle=True, num_workers=2),
    "persistent-workers": lambda: dict(shuffle=True, num_workers=2, persistent_workers=True),
}


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("stop_at", [5, 12, 13])  # mid-epoch, exactly an epoch boundary, just after one
def test_resume_is_bitwise_exact_and_sees_each_sample_once(tmp_path, name, stop_at):
    loader_kwargs = CONFIGS[name]
    full_seen, part_seen = [], []
    full = _run(tmp_path / "full", loader_kwargs(), None, False, full_seen)
    _run(tmp_path / "part", loader_kwargs(), stop_at, False, part_seen)
    resumed = _run(tmp_path / "part", loader_kwargs(), None, True, part_seen)
    assert resumed[2].steps == full[2].steps == 36
    _assert_same(full, resumed)
    assert part_seen == full_seen  # same order: no repeats, no gaps
    for epoch in range(3):
        assert sorted(full_seen[epoch * 48:(epoch + 1) * 48]) == list(range(48))


def test_resume_with_accumulation_mid_epoch(tmp_path):
    full_seen, part_seen = [], []
    full = _run(tmp_path / "full", dict(shuffle=True), None, False, full_seen, every=2, accum=2)
    _run(tmp_path / "part", dict(shuffle=True), 7, False, part_seen, every=2, accum=2)
    resumed = _run(tmp_path / "part", dict(shuffle=True), None, True, part_seen, every=2, accum=2)
    _assert_same(full, resumed)
    assert part_seen == full_seen


def test_resume_without_checkpoint_starts_from_scratch(tmp_path):
    seen = []
    _, _, result = _run(tmp_path / "empty", dict(shuffle=True), 2, True, seen)
    assert result.steps == 2


def test_resume_of_a_finished_run_does_nothing_more(tmp_path):
    seen = []
    _run(tmp_path / "done", dict(shuffle=True), None, False, seen)
    n = len(seen)
    _, _, result = _run(tmp_path / "done", dict(shuffle=True), None, True, seen)
    assert result.steps == 36 and len(seen) == n
