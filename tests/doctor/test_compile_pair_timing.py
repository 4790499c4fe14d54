"""The interleaved timing of a compiled model against its fix sizes its rounds by the step after the compile: a
compile of seconds counted as a step (as the warm-up's mean did) made a 30-s budget refuse every round on a loaded
2-core machine, and the what-if said nothing was timed (ci78: test_branch_cond)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from turbotrain.doctor.record.measurements import StepRecord
from turbotrain.doctor.rules.compile._common import Variant, time_variants
from turbotrain.doctor.whatif.common import Budget

pytestmark = pytest.mark.reads_no_time  # asserts that rounds ran, never what they measured


class _SlowFirstCall(torch.nn.Module):
    """A model whose first call takes ``first_s`` (a compile), its others a fraction of a millisecond."""

    def __init__(self, first_s: float):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.first_s = first_s

    def forward(self, x):
        if self.first_s:
            time.sleep(self.first_s)
            self.first_s = 0.0
        return self.linear(x)


def _context(forwards: int = 1, autocast: str | None = None) -> SimpleNamespace:
    steps = [StepRecord(i, float(i), i + 1.0, {}, forwards=forwards, backwards=forwards) for i in range(6)]
    facts = SimpleNamespace(autocast=autocast is not None, autocast_dtype=autocast)  # as ForwardFacts says it
    return SimpleNamespace(capture=SimpleNamespace(args=(torch.randn(8, 4),), kwargs={}), on_gpu=False,
                           step_records=steps, measured_steps=[2, 3, 4, 5], facts=facts)


def test_rounds_are_sized_by_the_compiled_step_not_by_the_compile():
    ctx = _context()
    a, b = Variant("as is", _SlowFirstCall(1.0)), Variant("fixed", _SlowFirstCall(1.0))
    timing = time_variants(ctx, Budget(10.0), a, b, compile_s=1.0)
    # Before: a step of (1.0 s + one call) / 2 made one round cost 2 x 5 x 0.5 x 3 = 15 s of the 8 s left.
    assert timing is not None and len(timing.ratios) >= 2, timing
    assert min(timing.warm_s) >= 1.0 and max(timing.a_s, timing.b_s) < 0.5  # the compile is in warm-up only


def test_a_step_of_two_micro_batches_saves_twice_what_one_call_does(monkeypatch):
    """modded-nanogpt steps its optimizer after two micro-batches: one call's difference priced as the step's
    halved what compile saves a step (its twin: 533 ms a step, where the doctor said 304)."""
    calls = iter([0.004, 0.003] * 8)
    monkeypatch.setattr("turbotrain.doctor.rules.compile._common._timed", lambda variant, run, steps: next(calls))
    a, b = Variant("as is", _SlowFirstCall(0.0)), Variant("fixed", _SlowFirstCall(0.0))
    timing = time_variants(_context(forwards=2), Budget(10.0), a, b, compile_s=0.0)
    assert timing is not None and (timing.a_s, timing.b_s) == (0.008, 0.006)
    assert timing.ratios[0] == pytest.approx(0.004 / 0.003)  # the ratio is the calls'


class _Precision(torch.nn.Module):
    """Notes the autocast state each forward ran under."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.seen: set = set()

    def forward(self, x):
        self.seen.add(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return self.linear(x)


@pytest.mark.parametrize("autocast, expected", [("torch.bfloat16", torch.bfloat16), (None, None)])
def test_the_variants_run_forward_under_the_scripts_autocast(autocast, expected):
    """build-nanogpt's forward runs under bf16 autocast: its compiled model was timed (and compiled) in fp32,
    another graph with other kernels than the script's."""
    a, b = Variant("as is", _Precision()), Variant("fixed", _Precision())
    timing = time_variants(_context(autocast=autocast), Budget(10.0), a, b, compile_s=0.0)
    assert timing is not None
    assert a.module.seen == b.module.seen == {expected}
