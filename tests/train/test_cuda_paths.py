"""On a GPU: the CUDA paths the CPU suite cannot reach (run with -m gpu).

- a trial times its steps on the device's clock without a sync per step, and its times add up to the wall time;
- CUDA graphs (compile mode "reduce-overhead") train through the Trainer, losses as eager's;
- fp16 with a GradScaler trains a transformer as bf16 does, and skips an overflowing step;
- the NaN guard launches one kernel per step in stop mode (a profiler counts them).
"""

import math
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import turbotrain as tt
from turbotrain.bench.datasets import text_dataset
from turbotrain.bench.models import GPT, lm_loss
from turbotrain.measure import run_trial

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _mlp(width=256):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def _batches(n=4, batch=512, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n * batch, 64, generator=g)
    y = x[:, :10].argmax(1)
    return [(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]) for i in range(n)]


def test_a_trial_times_the_device_without_a_sync_per_step():
    model, batches = _mlp(2048), _batches()
    opt_fn = lambda params: torch.optim.AdamW(params, lr=1e-3)  # noqa: E731 - a factory per trial
    started = time.perf_counter()
    trial = run_trial(model, opt_fn, F.cross_entropy, batches, tt.Plan(device="cuda"), steps=40, warmup=3)
    wall = time.perf_counter() - started
    assert trial.ok and len(trial.step_times_s) == 40 and len(trial.losses) == 43
    assert all(0 < t < wall for t in trial.step_times_s)
    assert sum(trial.step_times_s) < wall  # measured inside the trial's wall time, setup and warm-up excluded
    # The same steps, read and synchronized one by one, give the same losses: only the reading moved.
    reference = []
    torch.manual_seed(0)
    copy = _mlp(2048).cuda()
    opt = opt_fn(copy.parameters())
    for i in range(43):
        x, y = (t.cuda() for t in batches[i % len(batches)])
        loss = F.cross_entropy(copy(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        reference.append(loss.item())
    assert trial.losses == pytest.approx(reference, rel=1e-5)


def test_cuda_graphs_train_through_the_trainer_like_eager():
    data = _batches(n=8, batch=256)
    losses = {}
    for mode in (False, "reduce-overhead"):
        torch.compiler.reset()
        model = _mlp()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        result = tt.Trainer(model, opt, F.cross_entropy, plan=tt.Plan(device="cuda", compile=mode), max_epochs=3,
                            log_every_n_steps=8, progress=False).fit(data)
        losses[mode] = [row["train_loss"] for row in result.history if "train_loss" in row]
        assert result.steps == 24
    assert losses[False][-1] < losses[False][0]
    assert losses["reduce-overhead"] == pytest.approx(losses[False], rel=2e-3)
    from torch._dynamo.utils import counters

    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])  # graphs were really used


def test_fp16_with_a_grad_scaler_trains_a_transformer_like_bf16_and_skips_an_overflow():
    text = text_dataset(64, 64, seed=2)  # bytes of Python's own source: the loss really falls
    data = [text[i:i + 8] for i in range(0, 64, 8)]
    finals = {}
    for precision in ("bf16-mixed", "fp16-mixed"):
        torch.manual_seed(0)
        model = GPT(vocab_size=256, seq_len=64, dim=128, layers=2, heads=4)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        trainer = tt.Trainer(model, opt, lm_loss, plan=tt.Plan(device="cuda", precision=precision), max_epochs=4,
                             log_every_n_steps=8, progress=False)
        result = trainer.fit(data)
        losses = [row["train_loss"] for row in result.history if "train_loss" in row]
        assert losses[-1] < losses[0] - 0.5, (precision, losses)
        finals[precision] = losses[-1]
        if precision == "fp16-mixed":
            assert trainer.rt.scaler is not None and math.isfinite(trainer.rt.scaler.get_scale())
    assert finals["fp16-mixed"] == pytest.approx(finals["bf16-mixed"], abs=0.15)
    # An overflow in fp16: the scaler skips the step, the guard reports it, the weights stay finite.
    torch.manual_seed(0)
    model = GPT(vocab_size=256, seq_len=64, dim=128, layers=2, heads=4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    calls = []

    def overflowing(logits, targets):
        calls.append(1)
        loss = lm_loss(logits, targets)
        return loss * 1e30 if len(calls) == 3 else loss

    result = tt.Trainer(model, opt, overflowing, plan=tt.Plan(device="cuda", precision="fp16-mixed"), max_steps=8,
                        log_every_n_steps=4, progress=False).fit(data)
    assert result.skipped_steps >= 1 and all(torch.isfinite(p).all() for p in model.parameters())


def test_the_guard_costs_one_kernel_per_step_on_a_gpu():
    from torch.profiler import ProfilerActivity, profile

    data = [(x.cuda(), y.cuda()) for x, y in _batches(n=4, batch=64)]

    def kernels(on_nonfinite):
        model = _mlp(64)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def fit(steps):
            tt.Trainer(model, opt, F.cross_entropy, plan=tt.Plan(device="cuda"), max_steps=steps,
                       log_every_n_steps=1000, progress=False, on_nonfinite=on_nonfinite).fit(data * 5)

        fit(2)  # warm-up: cuBLAS handles, the allocator's blocks
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fit(20)
            torch.cuda.synchronize()
        return sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")

    with_guard, without = kernels("stop"), kernels("ignore")
    per_step = (with_guard - without) / 20
    assert 0.9 <= per_step <= 1.5, (with_guard, without)  # one check a step; the read at the end is the rest
