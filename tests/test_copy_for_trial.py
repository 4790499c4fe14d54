"""A trial copies the user's model even where a module keeps tensors of its autograd graph (an actor-critic policy's
saved log-probabilities): deepcopy alone refuses them."""

from __future__ import annotations

import copy
import runpy

import pytest
import torch
from torch import nn

from turbotrain.doctor.findings import one_line
from turbotrain.measure import copy_for_trial


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)
        self.saved_actions: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = self.head(x).softmax(-1)
        self.saved_actions.append((probs.log()[0], probs.sum()))  # kept with their graph, as the RL example does
        return probs


def test_a_module_holding_graph_tensors_is_copied_with_them_detached():
    torch.manual_seed(0)
    policy = Policy()
    policy(torch.randn(4))
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(policy)
    model, optimizers = copy_for_trial((policy, [torch.optim.SGD(policy.parameters(), lr=0.1)]))
    kept, copied = policy.saved_actions[0][0], model.saved_actions[0][0]
    assert kept.grad_fn is not None and copied.grad_fn is None and torch.equal(kept, copied)
    assert model.head.weight is not policy.head.weight and torch.equal(model.head.weight, policy.head.weight)
    assert optimizers[0].param_groups[0]["params"][0] is model.head.weight  # copied together, as deepcopy does


def test_an_error_reads_as_one_line():
    assert one_line(RuntimeError("first\nsecond\nthird")) == "RuntimeError: first (...)"


def test_an_error_without_a_message_says_where_it_was_raised(tmp_path):
    """modded-nanogpt's optimizer asserts `g is not None`: "AssertionError" alone left the user nothing to look at."""
    script = tmp_path / "train.py"
    script.write_text("def step(g):\n    assert g is not None\n")
    namespace = runpy.run_path(str(script))
    with pytest.raises(AssertionError) as raised:
        namespace["step"](None)
    assert one_line(raised.value) == "AssertionError at train.py:2 (assert g is not None)"


def test_a_long_first_line_is_cut_after_its_first_sentence():
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.ones(2), (2, 2))
    with pytest.raises(NotImplementedError) as raised:  # torch's dispatcher names every backend it has, on one line
        sparse.as_strided((2, 2), (2, 1))
    said = one_line(raised.value)
    assert said.startswith("NotImplementedError: Could not run 'aten::as_strided' with arguments from the 'SparseCPU'")
    assert said.endswith("backend. (...)") and len(said) < 200, said
    assert one_line(ValueError("x" * 500)) == f"ValueError: {'x' * 157}... (...)"
    assert one_line(ValueError("")) == "ValueError" and one_line(KeyError("k")) == "KeyError: 'k'"


class GroupedOptimizer(torch.optim.Optimizer):
    """nanochat's MuonAdamW in small: 0-D tensors and a parameter kept as attributes, a "kind" read from each group."""

    def __init__(self, param_groups: list[dict]) -> None:
        super().__init__(param_groups, defaults={})
        self._lr_t = torch.tensor(0.0)
        self.first = self.param_groups[0]["params"][0]

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            assert group["kind"] == "sgd"
            self._lr_t.fill_(group["lr"])
            for p in group["params"]:
                p.sub_(self._lr_t * p.grad)


def test_an_optimizers_own_attributes_are_copied_with_it_and_point_at_the_copied_parameters():
    # Optimizer.__getstate__ keeps defaults, state and param_groups: deepcopy alone drops the rest, and the memory
    # doctor's step of copies died on nanochat's optimizer ("no attribute '_adamw_step_t'").
    model = nn.Linear(3, 2)
    optimizer = GroupedOptimizer([{"params": list(model.parameters()), "kind": "sgd", "lr": 0.5}])
    assert not hasattr(copy.deepcopy(optimizer), "_lr_t")
    twin_model, (twin,) = copy_for_trial((model, [optimizer]))
    assert twin.first is twin_model.weight and twin._lr_t is not optimizer._lr_t
    twin_model(torch.ones(4, 3)).sum().backward()
    before = model.weight.detach().clone()
    twin.step()
    assert not torch.equal(twin_model.weight, before) and torch.equal(model.weight, before)


def test_an_optimizer_that_cannot_step_from_its_defaults_is_timed_as_sgd():
    from types import SimpleNamespace

    from turbotrain.doctor.whatif.common import optimizer_recipe

    model = nn.Linear(3, 2)
    grouped = GroupedOptimizer([{"params": list(model.parameters()), "kind": "sgd", "lr": 0.5}])
    ctx = SimpleNamespace(model=model, optimizers=[(grouped, None)])
    assert optimizer_recipe(ctx)[0] is torch.optim.SGD  # GroupedOptimizer([p]) has no "kind" in its group
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    assert optimizer_recipe(SimpleNamespace(model=model, optimizers=[(adam, None)]))[0] is torch.optim.Adam


def test_a_copied_optimizer_steps_the_copied_parameters_where_an_lr_scheduler_wrapped_the_originals_step():
    """modded-nanogpt's memory step: LambdaLR replaces `opt.step` on the instance with a wrapper that steps the
    original optimizer; copied with the instance's attributes, the copy stepped the script's parameters, whose
    gradients the script had cleared (its Muon asserted `g is not None`), and never its own."""
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    before = model.weight.detach().clone()
    twin, (twin_opt,) = copy_for_trial((model, [opt]))
    twin(torch.ones(1, 4)).sum().backward()
    twin_opt.step()
    assert torch.equal(model.weight, before) and model.weight.grad is None
    assert not torch.equal(twin.weight, before)
