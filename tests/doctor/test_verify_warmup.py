"""--verify's runs warm up past the recorded run's last torch.compile compile: the original's recompiles until the
recompile limit are seconds paid once, not its steps; and where the limit was hit, a run counts as its mean step
(on recordings built by hand)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from doctor_helpers import rank_recording
from turbotrain.doctor.fixes.attach import _timed_window
from turbotrain.doctor.record.compile_watch import CompileFacts, CompileSpan

STEPS = 12  # rank_recording: step i runs from 100 + i * 40 ms


def _context(*compiles: tuple[int, float], fell_back: int = 0) -> SimpleNamespace:
    """A run whose compiles start 2 ms into step ``i`` and last ``seconds``; ``fell_back`` codes hit the limit."""
    spans = tuple(CompileSpan(f"0/{n}", 100.0 + i * 0.040 + 0.002, seconds, "recompile" if n else "first")
                  for n, (i, seconds) in enumerate(compiles))
    facts = CompileFacts(codes=(), graphs=1, recompiles=max(0, len(spans) - 1), compile_s=0.0,
                         fell_back=fell_back, spans=spans) if spans else None
    return SimpleNamespace(recording=dataclasses.replace(rank_recording(0, [1.0] * STEPS, [1.0] * STEPS),
                                                         compiled=facts))


def test_the_warm_up_ends_after_the_last_compile():
    assert _timed_window(_context(), 3) == (3, False)  # nothing compiled
    assert _timed_window(_context((0, 0.030), (1, 0.020)), 3) == (3, False)  # all within the warm-up already
    assert _timed_window(_context((0, 0.030), (4, 0.020), (7, 0.010)), 3) == (8, False)
    # A compile that runs past its step's end (the step's own clock stops at optimizer.step()) ends in the next.
    assert _timed_window(_context((0, 0.030), (7, 0.045)), 3) == (9, False)
    # One that ends after the recording's last step: nothing to go by, the asked warm-up.
    assert _timed_window(_context((0, 0.030), (11, 0.500)), 3) == (3, False)


def test_a_run_past_the_recompile_limit_counts_as_its_mean_step():
    assert _timed_window(_context((0, 0.030), (5, 0.020), fell_back=1), 3) == (6, True)
