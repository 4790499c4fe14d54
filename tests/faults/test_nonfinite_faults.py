"""Non-finite values injected at a chosen step: they never reach the weights or the optimizer state.

Beyond tests/train/test_nonfinite.py: every injection is compared bitwise with a clean run
that stopped one step earlier (weights, optimizer state, schedule), across injection steps,
NaN/inf in the loss or in a single gradient element, foreach and fused AdamW, two
optimizers, gradient clipping and accumulation; the skip count survives a resume; and the
GradScaler's own skips under fp16 are reported.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from faultharness import assert_same
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import turbotrain as tt
from turbotrain.train.checkpoint import list_checkpoints, load_checkpoint
from turbotrain.train.nonfinite import FiniteGuard


class Poison:
    """Puts a non-finite value into the loss, or into one element of one gradient, at step ``at``."""

    def __init__(self, at: int | None, where: str = "loss", value: float = math.nan, micro_batch: int = 0):
        self.at, self.where, self.value, self.micro_batch = at, where, value, micro_batch
        self.step, self.micro = 0, 0

    def hook(self, grad):
        if self.where.startswith("grad") and self.due:
            grad = grad.clone()
            grad.view(-1)[3] = self.value
        return grad

    @property
    def due(self) -> bool:
        return self.step + 1 == self.at and self.micro == self.micro_batch

    def step_fn(self, accum: int):
        calls = [0]

        def step(ctx, batch):
            self.step, self.micro = ctx.global_step, calls[0] % accum
            calls[0] += 1
            x, y = batch
            loss = F.cross_entropy(ctx.model(x), y)
            return loss * self.value if self.where == "loss" and self.due else loss

        return step


def _run(tmp_path, poison: Poison, max_steps: int, optimizer: str = "foreach", accum: int = 1, **limits):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    if optimizer == "two":
        opts = [torch.optim.AdamW(model[0].parameters(), lr=0.01), torch.optim.SGD(model[2].parameters(), lr=0.1,
                                                                                   momentum=0.9)]
    else:
        opts = [torch.optim.AdamW(model.parameters(), lr=0.01, **{optimizer: True})]
    scheds = [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9) for opt in opts]
    model[2 if poison.where == "grad-last" else 0].weight.register_hook(poison.hook)
    x = torch.randn(96, 8, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(x, x[:, :3].argmax(1)), batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(2))
    trainer = tt.Trainer(model, opts if len(opts) > 1 else opts[0], step_fn=poison.step_fn(accum),
                         plan=tt.Plan(device="cpu", grad_accum_steps=accum), schedulers=scheds, max_steps=max_steps,
                         progress=False, checkpoint_dir=str(tmp_path), checkpoint_every_n_steps=2, **limits)
    state = {"model": model, "optimizers": opts, "schedulers": scheds}
    try:
        state["result"] = trainer.fit(loader, resume=True)
    except tt.NonFiniteError as exc:
        state["error"] = exc
    return state


def _assert_same_training_state(a, b):
    assert_same(a["model"].state_dict(), b["model"].state_dict(), "model")
    for i, (x, y) in enumerate(zip(a["optimizers"], b["optimizers"])):
        assert_same(x.state_dict(), y.state_dict(), f"optimizer {i}")
    for i, (x, y) in enumerate(zip(a["schedulers"], b["schedulers"])):
        assert_same(x.state_dict(), y.state_dict(), f"scheduler {i}")


CASES = [  # (what is poisoned, value, at step, optimizer, accumulation, clipping)
    ("loss", math.nan, 1, "foreach", 1, None),
    ("loss", math.inf, 4, "foreach", 1, None),
    ("grad", math.inf, 4, "foreach", 1, None),
    ("grad", math.nan, 8, "fused", 1, None),
    ("grad", math.inf, 5, "foreach", 1, 1.0),       # clipping an inf gradient would spread NaN everywhere
    ("grad", math.inf, 3, "two", 1, None),          # the first optimizer's parameter
    ("grad-last", math.inf, 3, "two", 1, None),     # the second optimizer's parameter
    ("loss", math.nan, 3, "foreach", 2, None),      # first micro-batch of an accumulation window
    ("grad", math.inf, 3, "foreach", 2, None),
]
IDS = [f"{w}-{v}-step{s}-{o}-accum{a}" + ("-clip" if c else "") for w, v, s, o, a, c in CASES]


@pytest.mark.parametrize("where, value, at, optimizer, accum, clip", CASES, ids=IDS)
def test_stop_mode_stops_at_the_step_with_weights_and_optimizer_as_after_the_previous_step(
        tmp_path, where, value, at, optimizer, accum, clip):
    micro = 0 if where == "loss" else accum - 1
    poisoned = _run(tmp_path / "p", Poison(at, where, value, micro), 8, optimizer, accum, gradient_clip_val=clip)
    err = poisoned.get("error")
    assert err is not None and err.step == at and f"at step {at}" in str(err)
    if at > 1:
        clean = _run(tmp_path / "c", Poison(None), at - 1, optimizer, accum, gradient_clip_val=clip)
        _assert_same_training_state(poisoned, clean)
    # Checkpoints: none of the bad step or later, and every tensor in them is finite.
    for path in list_checkpoints(tmp_path / "p"):
        state = load_checkpoint(path)
        assert state["step"] < at
        assert all(torch.isfinite(t).all() for t in state["model"].values())


@pytest.mark.parametrize("where, value, at, optimizer, accum, clip", CASES, ids=IDS)
def test_skip_mode_leaves_weights_optimizer_and_schedule_untouched_and_counts(
        tmp_path, where, value, at, optimizer, accum, clip):
    micro = 0 if where == "loss" else accum - 1
    skipped = _run(tmp_path / "p", Poison(at, where, value, micro), at, optimizer, accum, gradient_clip_val=clip,
                   on_nonfinite="skip")
    result = skipped["result"]
    assert result.steps == at and result.skipped_steps == 1 and result.history[-1]["skipped_steps"] == 1
    # The skipped step changed nothing: the state is the state after the step before it.
    if at > 1:
        clean = _run(tmp_path / "c", Poison(None), at - 1, optimizer, accum, gradient_clip_val=clip)
        _assert_same_training_state(skipped, clean)


def test_the_skip_count_survives_a_resume(tmp_path):
    first = _run(tmp_path, Poison(2), 6, on_nonfinite="skip")["result"]
    assert first.skipped_steps == 1
    resumed = _run(tmp_path, Poison(8), 10, on_nonfinite="skip")["result"]  # resumes from step 6
    assert resumed.skipped_steps == 2 and resumed.history[-1]["skipped_steps"] == 2


def _scaled_steps(scaler, guard, model, opt, inf_at, steps):
    for step in range(1, steps + 1):
        loss = model(torch.ones(2, 4)).sum()
        scaler.scale(loss).backward()
        if step in inf_at:
            model.weight.grad.view(-1)[0] = math.inf
        assert guard.check(loss, step)  # under a GradScaler the scaler decides, the guard reports
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()


def test_gradscaler_skips_are_reported_from_the_first_step_and_after_a_resume():
    """The guard's fp16 bookkeeping, on the CPU's GradScaler (the end-to-end run needs a GPU)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    guard = FiniteGuard([opt], torch.device("cpu"), "stop", scaler)
    _scaled_steps(scaler, guard, model, opt, inf_at={2, 5}, steps=6)
    assert guard.report() == 2  # both skips happened before the first report
    # A resumed run: a new scaler loads the saved scale, a new guard continues the count.
    saved = scaler.state_dict()
    scaler = torch.amp.GradScaler("cpu")
    guard = FiniteGuard([opt], torch.device("cpu"), "stop", scaler)
    scaler.load_state_dict(saved)
    guard.resume(skipped=2)
    _scaled_steps(scaler, guard, model, opt, inf_at={3}, steps=4)
    assert guard.report() == 3


@pytest.mark.gpu
def test_fp16_gradscaler_skips_are_reported_not_hidden(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    poison = Poison(4, "grad", math.inf)
    model[0].weight.register_hook(poison.hook)
    x = torch.randn(96, 8, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(x, x[:, :3].argmax(1)), batch_size=8)
    result = tt.Trainer(model, opt, step_fn=poison.step_fn(1), plan=tt.Plan(device="cuda", precision="fp16-mixed"),
                        max_steps=10, progress=False).fit(loader)
    assert result.skipped_steps >= 1 and result.history[-1]["skipped_steps"] == result.skipped_steps
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("where", ["grad", "loss"])
def test_deferred_stop_raises_before_the_next_checkpoint_and_none_holds_the_bad_step(tmp_path, where):
    """A GPU without fused optimizers reads the verdict at the logging cadence and before each
    checkpoint, not per step. Exercised on the CPU by putting the guard on that path."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    poison = Poison(3, where, math.nan)
    model[0].weight.register_hook(poison.hook)
    x = torch.randn(96, 8, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(x, x[:, :3].argmax(1)), batch_size=4)
    trainer = tt.Trainer(model, opt, step_fn=poison.step_fn(1), plan=tt.Plan(device="cpu"), max_steps=20,
                         log_every_n_steps=10, checkpoint_dir=str(tmp_path), checkpoint_every_n_steps=2,
                         progress=False)
    assert not trainer.guard.deferred  # the CPU reads every verdict at once
    trainer.guard.on_host, trainer.guard.deferred = False, True
    trainer._host = False  # losses stay tensors, as on a GPU
    with pytest.raises(tt.NonFiniteError, match="at step 3; the weights in memory hold") as err:
        trainer.fit(loader)
    assert err.value.step == 3
    assert not all(torch.isfinite(p).all() for p in model.parameters())  # the update happened...
    saved = [load_checkpoint(path) for path in list_checkpoints(tmp_path)]
    assert [s["step"] for s in saved] == [2]  # ...but the step-4 checkpoint was refused
    assert all(torch.isfinite(t).all() for t in saved[0]["model"].values())
    # What the error says to do: resume from the last checkpoint (the same Trainer, the cause gone).
    poison.at = None
    result = trainer.fit(loader, resume=True)
    assert result.steps == 20 and all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("device, fused, mode, scaled, expected", [
    ("cpu", False, "stop", False, (True, False, False)),
    ("cuda", True, "stop", False, (False, True, False)),
    ("cuda", True, "skip", False, (False, True, False)),
    ("cuda", False, "stop", False, (False, False, True)),    # deferred: no per-step sync
    ("cuda", False, "skip", False, (False, False, False)),   # one sync per step, said once
    ("cuda", False, "stop", True, (False, False, False)),    # the GradScaler decides
])
def test_where_the_verdict_is_read(device, fused, mode, scaled, expected):
    from turbotrain.train.nonfinite import verdict_paths

    assert verdict_paths(device, fused, mode, scaled) == expected


def test_a_nan_loss_and_nan_gradients_together_still_make_a_fused_optimizer_skip():
    """Fused kernels skip only when found_inf is exactly 1: the loss's flag must not add to the gradients'."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    guard = FiniteGuard([opt], torch.device("cpu"), "skip")
    guard.on_host, guard.on_device_skip = False, True  # what a CUDA device with fused optimizers gets
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.ones(2, 4, dtype=torch.bfloat16)).float().sum() * math.nan  # float32 loss, bf16 grads
    loss.backward()
    assert guard.check(loss.detach(), step=1)
    assert guard.found.item() == 1.0
    guard.arm([opt])
    opt.step()
    guard.disarm([opt])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert guard.report() == 1


@pytest.mark.gpu
def test_stop_mode_on_a_gpu_without_fused_optimizers_syncs_only_at_the_logging_cadence(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    x = torch.randn(96, 8, generator=torch.Generator().manual_seed(1)).cuda()
    loader = DataLoader(TensorDataset(x, x[:, :3].argmax(1)), batch_size=4)
    trainer = tt.Trainer(model, opt, F.cross_entropy, plan=tt.Plan(device="cuda"), max_steps=24,
                         log_every_n_steps=12, progress=False)
    assert trainer.guard.deferred
    import warnings
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(loader)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) < 12, [str(w.message) for w in syncs]  # a few per log, never one per step
