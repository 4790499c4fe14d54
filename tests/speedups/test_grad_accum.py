import torch
import torch.nn.functional as F
from tiny import make_loader, make_mlp

import turbotrain as tt
from turbotrain.speedups.grad_accum import is_last_micro_batch


def _train(batch_size, accum, steps):
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    tt.Trainer(model, opt, F.cross_entropy, tt.Plan(device="cpu", grad_accum_steps=accum), max_steps=steps,
               progress=False).fit(make_loader(n=64, batch_size=batch_size, shuffle=False))
    return model


def test_accumulating_four_micro_batches_equals_one_batch_four_times_larger():
    big = _train(batch_size=16, accum=1, steps=4)
    small = _train(batch_size=4, accum=4, steps=4)
    for a, b in zip(big.parameters(), small.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    plain = _train(batch_size=4, accum=1, steps=4)  # and it is not what no accumulation does
    assert not torch.allclose(next(plain.parameters()), next(small.parameters()))


def test_last_micro_batch_rule():
    assert [is_last_micro_batch(i, 3) for i in range(6)] == [False, False, True, False, False, True]
    assert is_last_micro_batch(4, 3, total=5)  # the epoch's last batch always ends a step
