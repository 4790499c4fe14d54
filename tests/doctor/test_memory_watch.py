"""The memory a training step holds, measured: its parts against what the shapes imply, the module whose
activations are largest, graphs kept alive across steps, out-of-memory errors, and the fixes' measured peaks."""

from __future__ import annotations

import copy
import pickle
import runpy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from doctor_helpers import script
from turbotrain.doctor.record import graph_watch as gw
from turbotrain.doctor.record import memory_watch as mw
from turbotrain.doctor.record import out_of_memory as om
from turbotrain.doctor.analysis import memory_fixes as mf
from turbotrain.doctor.analysis.memory import blocks_to_checkpoint

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane


def _cross_entropy(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _big_activations():
    ns = runpy.run_path(str(script("memory_big_activations")))
    torch.manual_seed(0)
    return ns["Net"](), ns["make_batch"]()


def test_parameter_gradient_and_adam_state_bytes_follow_the_shapes():
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 3), nn.BatchNorm1d(3))
    opt = torch.optim.Adam(model.parameters())
    batch = (torch.randn(8, 10), torch.randint(0, 3, (8,)))
    memory = mw.measure_step(model, [opt], [batch], _cross_entropy)
    numels = [p.numel() for p in model.parameters()]
    assert memory.parameter_bytes == 4 * sum(numels)
    assert memory.gradient_bytes == 4 * sum(numels)
    assert memory.optimizer_state_bytes == sum(2 * 4 * n + 4 for n in numels)  # exp_avg, exp_avg_sq, step
    assert memory.buffer_bytes == 4 * (3 + 3) + 8  # running mean and var, num_batches_tracked (int64)
    assert memory.input_bytes == 8 * 10 * 4 + 8 * 8


def test_the_peak_is_its_parts_and_holds_the_saved_activations():
    model, batch = _big_activations()
    memory = mw.measure_step(model, [torch.optim.SGD(model.parameters(), lr=0.1)], [batch], _cross_entropy)
    peak = memory.peak
    assert memory.peak_bytes == sum(getattr(peak, f) for f in type(peak).__slots__)
    assert 0 < peak.activations <= memory.activation_bytes
    assert memory.peak_phase in ("forward", "backward", "optimizer")
    assert memory.allocator_held_bytes is None and memory.allocator_peak_bytes is None  # not known on the CPU
    assert memory.memory.total_bytes and 0 < memory.memory.free_bytes <= memory.memory.total_bytes


def test_blocks_in_a_module_list_are_named_each_not_as_the_list_that_never_runs():
    """A ``ModuleList``'s forward never runs: checkpointing it would recompute nothing, so its children are the
    rows (seen in the memory calibration: the list was named, and its checkpointing measured as no change)."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 256), nn.GELU(), nn.Linear(256, 16))
                                        for _ in range(2))

        def forward(self, x):
            for block in self.blocks:
                x = x + block(x)
            return x

    model = Net()
    batch = (torch.randn(64, 16), torch.randint(0, 16, (64,)))
    memory = mw.measure_step(model, [torch.optim.SGD(model.parameters(), lr=0.1)], [batch], _cross_entropy)
    names = [m.name for m in memory.modules]
    assert "blocks" not in names and {"blocks.0", "blocks.1"} <= set(names), names
    assert sorted(blocks_to_checkpoint(memory.modules, memory.activation_bytes)) == ["blocks.0", "blocks.1"]
    cost = mf.checkpointing(model, [torch.optim.SGD(model.parameters(), lr=0.1)], batch, ["blocks.0", "blocks.1"],
                            _cross_entropy, repeats=1)
    assert cost.fixed.peak_bytes < cost.baseline.peak_bytes, cost


def test_the_module_with_the_biggest_activations_is_named():
    model, batch = _big_activations()
    memory = mw.measure_step(model, [torch.optim.SGD(model.parameters(), lr=0.1)], [batch], _cross_entropy)
    biggest = next(m for m in memory.modules if m.name)  # "" is the whole model
    assert (biggest.name, biggest.class_name) == ("wide", "WideBlock")
    assert biggest.total_bytes > memory.activation_bytes / 2
    assert biggest.site is not None and biggest.site.file.endswith("memory_big_activations.py")
    assert sum(m.self_bytes for m in memory.modules) <= memory.activation_bytes


def test_checkpointing_the_block_lowers_the_saved_activation_bytes():
    model, batch = _big_activations()
    plain = copy.deepcopy(model)
    mf.checkpoint_blocks(model, ["wide"])
    before = mw.measure_step(plain, [torch.optim.SGD(plain.parameters(), lr=0.1)], [batch], _cross_entropy)
    after = mw.measure_step(model, [torch.optim.SGD(model.parameters(), lr=0.1)], [batch], _cross_entropy)
    wide_before, wide_after = ({m.name: m for m in r.modules}["wide"] for r in (before, after))
    assert after.activation_bytes < before.activation_bytes / 2
    assert wide_after.total_bytes == wide_after.self_bytes == 4 * batch[0].numel()  # the checkpoint keeps its input
    assert wide_after.total_bytes < wide_before.total_bytes / 4


def test_measuring_leaves_no_hook_and_measures_the_same_twice():
    model, batch = _big_activations()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = mw.measure_step(model, [opt], [batch], _cross_entropy)
    second = mw.measure_step(model, [opt], [batch], _cross_entropy)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert first.activation_bytes == second.activation_bytes


def _watched(name: str, adds: str) -> tuple[gw.GraphWatch, int]:
    """The corpus script ``name`` run under a GraphWatch sampled at optimizer steps, and the line starting ``adds``."""
    path = script(name)
    with gw.sampling_at_optimizer_steps(gw.GraphWatch()) as watch:
        runpy.run_path(str(path), run_name="__main__")
    lines = path.read_text().splitlines()
    return watch, next(i for i, text in enumerate(lines, 1) if text.strip().startswith(adds))


def test_a_loss_kept_in_a_list_is_flagged_with_its_line():
    watch, line = _watched("memory_loss_kept", "losses.append(loss)")
    growth = watch.result()
    assert growth is not None and growth.growing
    assert growth.tensors_per_step == 1 and growth.nodes_per_step > 0 and growth.bytes_per_step >= 4
    assert growth.holder == "losses"
    assert growth.site is not None and (growth.site.line, growth.site.function) == (line, "main")


def test_outputs_gathered_every_step_are_found_with_their_line_and_no_graph():
    watch, line = _watched("memory_outputs_kept", "preds.append(")
    kept = watch.kept_result()
    # The logits (256 x 10 float32) grow faster in bytes than the labels (256 int64): they are named.
    assert kept is not None and kept.holder == "preds" and not kept.with_graphs and kept.device == "cpu"
    # Sampled after optimizer steps 2 to 5, before that step's append.
    assert kept.bytes_per_step == 256 * 10 * 4 and kept.tensors == (1, 2, 3, 4), kept
    assert kept.site is not None and (kept.site.line, kept.site.function) == (line, "main")
    assert watch.result() is not None and not watch.result().growing  # no graph kept: not graph-kept-alive's


def test_a_clean_loop_is_not_flagged():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    total = 0.0
    with gw.sampling_at_optimizer_steps(gw.GraphWatch()) as watch:
        for _ in range(6):
            loss = nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 2, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
    growth = watch.result()
    assert growth is not None and not growth.growing
    assert growth.tensors_per_step == 0 and growth.holder == "" and growth.site is None
    assert watch.kept_result() is None  # the running sum is a float


def test_a_view_torch_refuses_to_give_the_graph_of_is_skipped_not_raised():
    """FSDP's flat parameters are such views: asking their grad_fn raises, and a count of the graphs alive taken
    at a step boundary must never end the user's script."""
    base = torch.randn(4, requires_grad=True).clone()
    view, _ = base.split(2)  # a view of a function that returns several
    base.mul_(2)  # its base changed in place: torch now raises on view.grad_fn
    with pytest.raises(RuntimeError):
        _ = view.grad_fn
    watch = gw.GraphWatch()
    watch.sample(0)
    assert watch.samples == 1 and gw._grad_fn(view) is None


def test_outputs_kept_without_a_backward_count_the_activations_they_hold():
    model = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 2))
    watch, kept = gw.GraphWatch(), []
    for step in range(4):
        kept.append(model(torch.randn(64, 16)))
        watch.sample(step)
    growth = watch.result()
    assert growth is not None and growth.growing and growth.holder == "kept"
    assert growth.bytes_per_step >= 64 * 256 * 4  # at least the saved hidden layer of each step


def test_a_real_cpu_out_of_memory_is_classified_with_its_request_and_line():
    with pytest.raises(RuntimeError) as raised:
        torch.empty(2**50, dtype=torch.uint8)
    oom = om.out_of_memory(raised.value)
    assert oom is not None and oom.device == "cpu" and oom.requested_bytes == 2**50
    assert oom.site is not None and oom.site.file == __file__ and oom.site.function.startswith("test_a_real_cpu")


def test_an_out_of_memory_raised_from_is_found_and_others_are_not():
    try:
        try:
            torch.empty(2**50, dtype=torch.uint8)
        except RuntimeError as exc:
            raise ValueError("the step failed") from exc
    except ValueError as wrapped:
        assert om.out_of_memory(wrapped) is not None
    with pytest.raises(RuntimeError) as ordinary:
        torch.randn(2, 3) @ torch.randn(2, 3)
    assert om.out_of_memory(ordinary.value) is None
    assert om.out_of_memory(ValueError("out of memory")) is None  # the text alone does not make one


def test_the_cuda_message_gives_the_device_and_the_bytes():
    message = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 15.77 GiB"
    oom = om.out_of_memory(torch.OutOfMemoryError(message))
    assert oom is not None and (oom.device, oom.requested_bytes) == ("cuda", 20 * 2**20)


def test_the_fixes_measure_both_sides_and_the_smaller_micro_batch_holds_less():
    model, (x, y) = _big_activations()
    opt = torch.optim.Adam(model.parameters())
    batch = ((x,), {})
    split = mf.micro_batches(model, [opt], batch, k=4, rows=x.shape[0], repeats=1)
    none = mf.set_to_none(model, [opt], batch, repeats=1)
    assert split.fixed.peak_bytes < split.baseline.peak_bytes
    assert none.fixed.peak_bytes < none.baseline.peak_bytes  # zero-filled grads are held through the forward
    for fix in (split, none, mf.bf16_autocast(model, [opt], batch, repeats=1)):
        assert fix.baseline.step_seconds > 0 and fix.fixed.step_seconds > 0
    assert all(p.grad is None for p in model.parameters())  # the user's model is left as it was
    with pytest.raises(ValueError):
        mf.micro_batches(model, [opt], batch, k=3, rows=x.shape[0])


@pytest.mark.parametrize(("fixed_s", "rounds"), [(0.12, 3), (0.5, 1), (0.02, 1)])
def test_a_fix_clearly_apart_after_one_round_is_not_timed_again(monkeypatch, fixed_s, rounds):
    """Rounds beyond the first tell a few percent from noise: a fix over 3x the step either way is said after one."""
    steps = {"baseline": 0.1, "fixed": fixed_s}
    timed: list[str] = []

    def timed_step(variant):
        timed.append(variant)
        return steps[variant]

    monkeypatch.setattr(mf, "_memory", lambda variant: SimpleNamespace(peak_bytes=100, allocator_peak_bytes=None))
    monkeypatch.setattr(mf, "_timed", timed_step)
    cost = mf._compare("bf16-autocast", "cpu", "baseline", "fixed", repeats=3)
    assert timed == ["baseline", "fixed"] * (1 + rounds)  # the warm-up, then the rounds
    assert (cost.baseline.step_seconds, cost.fixed.step_seconds) == (0.1, fixed_s)


def test_a_fix_whose_warm_up_says_its_rounds_would_not_fit_the_budget_is_not_measured_further(monkeypatch):
    asked: list[float] = []
    monkeypatch.setattr(mf, "_timed", lambda variant: {"baseline": 0.1, "fixed": 4.0}[variant])
    monkeypatch.setattr(mf, "_memory", lambda variant: pytest.fail("measured the peak past the budget"))

    def allows(seconds: float) -> bool:
        asked.append(seconds)
        return seconds <= 10.0

    with pytest.raises(mf.OverBudget, match="bf16-autocast: a step took 4000 ms against 100 ms"):
        mf._compare("bf16-autocast", "cpu", "baseline", "fixed", repeats=2, allows=allows)
    assert asked == [pytest.approx(3 * 4.1)]  # the peak's step and two rounds, of both


def test_the_results_pickle():
    model, batch = _big_activations()
    memory = mw.measure_step(model, [torch.optim.SGD(model.parameters(), lr=0.1)], [batch], _cross_entropy)
    with gw.sampling_at_optimizer_steps(gw.GraphWatch()) as watch:
        runpy.run_path(str(script("memory_loss_kept")), run_name="__main__")
    oom = om.out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    fix = mf.FixCost("set-to-none", "", mf.Cost(1, 0.5), mf.Cost(2, 0.25))
    for value in (memory, watch.result(), oom, fix):
        # our own bytes, made on this line
        assert pickle.loads(pickle.dumps(value)) == value  # noqa: S301 - our own bytes, just written


def test_growth_is_read_past_two_first_boundaries_that_saw_the_same_step():
    """memory_loss_kept.py under the doctor's defaults: the boundaries 1 and 2 both saw step 1's loss being made
    (2 tensors with a graph each time), then 23 and 24 held one kept loss a step more. Equal counts one boundary
    apart (boundary 1 closes in step 2: the tracker waits for a second optimizer) say nothing; a clean loop's equal
    counts, later or further apart, still say "not growing"."""
    from turbotrain.doctor.record.graph_watch import GraphWatch, _Census

    def watch(counts: dict[int, int]) -> GraphWatch:
        w = GraphWatch()
        w._samples = [(step, _Census(n, 10 * n, 4 * n)) for step, n in counts.items()]
        return w

    leak = watch({1: 2, 2: 2, 23: 23, 24: 24}).result()
    assert leak is not None and leak.growing and leak.tensors_per_step == 1.0
    for clean in ({1: 2, 2: 2, 23: 2, 24: 2}, {1: 2, 2: 3, 23: 3, 24: 3}, {1: 2, 2: 2, 23: 23, 24: 22},
                  {2: 1, 3: 2, 4: 2, 5: 2}):
        flat = watch(clean).result()
        assert flat is not None and not flat.growing, clean


@torch.compile(backend="eager", fullgraph=True)
def _fused_update(p, g, lr):
    p.sub_(lr * g)


class _CompiledStepSGD(torch.optim.Optimizer):
    """nanochat's optimizer in small: its step calls a function compiled with fullgraph=True."""

    def __init__(self, params):
        super().__init__(params, defaults={"lr": 0.1})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                _fused_update(p, p.grad, group["lr"])


def test_an_optimizer_that_steps_through_a_fullgraph_compile_is_measured():
    # Dynamo skips frames under the measuring dispatch mode; fullgraph=True makes that an error ("found no compiled
    # frames"), and nanochat's memory section read "no model and batch were captured".
    model = torch.nn.Linear(8, 4)
    before = model.weight.detach().clone()
    memory = mw.measure_step(model, [_CompiledStepSGD(model.parameters())], [torch.randn(16, 8)],
                             lambda m, b: m(b).sum())
    assert memory.gradient_bytes == sum(p.numel() * 4 for p in model.parameters())
    assert not torch.equal(model.weight, before)  # the compiled update ran (eagerly)


def test_a_step_whose_peak_is_in_the_optimizer_is_estimated_at_a_larger_batch_by_its_backward():
    # modded-nanogpt at 128 of its 1024 rows peaked in the optimizer (parameters, gradients and Muon's state); scaled
    # from that split the whole batch "needed ~764.4 MiB" of a 900 MiB limit, where the script had died in its
    # backward. Each candidate peak is scaled on its own now: at 8x the rows the backward's is the largest.
    def step(rows):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 64))
        opt = torch.optim.Adam(model.parameters())
        batch = torch.randn(rows, 64)
        loss = lambda m, b: m(b).square().mean()  # noqa: E731 - the step's loss, named for the two calls
        loss(model, batch).backward()
        opt.step()  # Adam's state exists before the measured step, as in the doctor's
        return mw.measure_step(model, [opt], [batch], loss)

    small, large = step(16), step(128)
    assert small.peak_phase == "optimizer" and large.peak_phase == "backward", (small.peak_phase, large.peak_phase)
    assert small.at_rows(16, 16) == small.peak_bytes  # at its own rows, the measured peak
    estimate = small.at_rows(16, 128)
    assert abs(estimate - large.peak_bytes) <= 0.1 * large.peak_bytes, (estimate, large.peak_bytes)
    # The peak's own split scaled (the optimizer's temporaries read as the batch's) misses it by far: here over.
    fixed = small.peak.parameters + small.peak.gradients + small.peak.optimizer_state
    assert abs(fixed + 8 * (small.peak_bytes - fixed) - large.peak_bytes) > 0.5 * large.peak_bytes
