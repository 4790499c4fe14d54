"""With the naive plan the Trainer and tt.setup compute exactly what a plain PyTorch loop computes."""

import torch
import torch.nn.functional as F
from tiny import make_loader, make_mlp

import turbotrain as tt


def _plain_loop(epochs=2, accum=1):
    torch.manual_seed(0)
    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = make_loader(n=64, batch_size=8)  # shuffled with a seeded generator
    for _ in range(epochs):
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                opt.step()
                opt.zero_grad()
    return model


def test_trainer_with_the_naive_plan_equals_the_plain_loop_bitwise():
    reference = _plain_loop()
    torch.manual_seed(0)
    model = make_mlp()
    tt.Trainer(model, torch.optim.AdamW(model.parameters(), lr=0.01), F.cross_entropy, max_epochs=2,
               progress=False).fit(make_loader(n=64, batch_size=8))
    for a, b in zip(reference.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_global_rng_shuffle_sees_the_same_order_as_a_plain_loop():
    def orders(use_trainer):
        model = make_mlp()  # seeds the RNG itself: build it before the seed that matters
        torch.manual_seed(5)
        loader = torch.utils.data.DataLoader(torch.arange(20), batch_size=5, shuffle=True)
        seen = []
        if not use_trainer:
            for _ in range(2):
                for batch in loader:
                    seen.append(batch.tolist())
            return seen

        def step(ctx, batch):
            seen.append(batch.tolist())
            return ctx.model(torch.zeros(1, 8)).sum()

        tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.0), step_fn=step, max_epochs=2,
                   progress=False).fit(loader)
        return seen

    assert orders(True) == orders(False)


def test_setup_helpers_equal_the_plain_loop_with_accumulation():
    reference = _plain_loop(accum=2)
    torch.manual_seed(0)
    model = make_mlp()
    model, opt, loader = tt.setup(model, torch.optim.AdamW(model.parameters(), lr=0.01),
                                  make_loader(n=64, batch_size=8), tt.Plan(device="cpu", grad_accum_steps=2))
    steps = 0
    for _ in range(2):
        for x, y in loader:
            opt.backward(F.cross_entropy(model(x), y))
            steps += opt.step()
    assert steps == 8
    for a, b in zip(reference.parameters(), model.parameters()):
        torch.testing.assert_close(a, b)
    assert list(model.state_dict()) == list(reference.state_dict())  # no wrapper prefix in the keys


def test_setup_applies_autocast_and_layout():
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    conv(torch.zeros(1, 3, 6, 6))
    model, opt, loader = tt.setup(conv, torch.optim.SGD(conv.parameters(), lr=0.1),
                                  [(torch.randn(2, 3, 6, 6), torch.tensor([0, 1]))],
                                  tt.Plan(device="cpu", precision="bf16-mixed", channels_last=True))
    x, y = next(iter(loader))
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert model(x).dtype is torch.bfloat16
