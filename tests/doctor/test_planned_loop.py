"""The stepping loop's length, read from its frame where it is a ``for`` over ``range()``: what compile-pays-back
weighs compiling against when the doctor stops the run before it ends."""

from __future__ import annotations

import runpy
import sys
import textwrap
from types import SimpleNamespace

import pytest

from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.record.cadence import PlannedLoop, planned_loop
from turbotrain.doctor.sites import Site
from turbotrain.hardware import detect

pytestmark = pytest.mark.reads_no_time

LOOP = """
import argparse
args = argparse.Namespace(num_iterations=10, accum=2)
seen = []

def step():
    seen.append(planned_loop(sys._getframe(0)))

for it in {iterable}:
    {body}
"""


def _read(tmp_path, iterable: str, body: str = "step()") -> list:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(LOOP.format(iterable=iterable, body=body)))
    return runpy.run_path(str(script), init_globals={"planned_loop": planned_loop, "sys": sys})["seen"]


def test_a_range_with_bounds_from_argparse_is_read_with_its_counter(tmp_path):
    # llm.c: `for step in range(args.num_iterations + 1):`
    seen = _read(tmp_path, "range(args.num_iterations + 1)")
    assert len(seen) == 11 and all(s.iterations == 11 for s in seen)
    assert seen[0].code == "range(args.num_iterations + 1)" and seen[0].site.line == 9
    assert [s.counter for s in seen[:3]] == [0, 1, 2]
    assert _read(tmp_path, "range(2, 20, 3)")[0].iterations == len(range(2, 20, 3))


def test_epochs_of_ranged_steps_multiply_and_a_loop_further_up_makes_it_unknown(tmp_path):
    nested = _read(tmp_path, "range(3)", "for i in range(args.num_iterations):\n        step()")
    assert len(nested) == 30 and nested[0].iterations == 30
    assert nested[0].code == "range(3) x range(args.num_iterations)"
    assert [s.counter for s in nested[9:12]] == [9, 0, 1]  # the innermost's: a window across epochs reads no rate
    # The stepping loop in a function called from a loop: it runs again each time, its length is not the run's.
    looped = _read(tmp_path, "range(2)", "def epoch():\n        for i in range(5):\n            step()\n    epoch()")
    assert looped and set(looped) == {None}


@pytest.mark.parametrize("iterable", ["[1, 2, 3]", "range(len([1, 2]))", "range(int(\"3\"))"])
def test_a_loop_whose_length_cannot_be_read_without_running_code_is_none(tmp_path, iterable):
    assert set(_read(tmp_path, iterable)) == {None}


def _context(readings) -> Context:
    return Context(script="train.py", base="/home/me", hw=detect("cpu"), device="cpu",
                   breakdown=compute_breakdown([], 1), measured_steps=[],
                   recording=SimpleNamespace(planned_loop=tuple(readings)))  # type: ignore[arg-type]  # a stand-in


def _at(counter: int) -> PlannedLoop:
    return PlannedLoop(Site("/home/me/train.py", 796, "<module>"), "range(args.num_iterations + 1)", 5001, counter)


def test_the_loops_steps_are_its_iterations_over_how_far_its_counter_moves_a_step():
    assert _context([(3, _at(3)), (23, _at(23))]).planned_steps[0] == 5001
    # `if (it + 1) % 2 == 0: opt.step()` in the loop: two iterations a step.
    assert _context([(3, _at(6)), (23, _at(46))]).planned_steps[0] == 2500
    assert _context([(3, _at(3))]).planned_steps is None  # read once: a step's iterations unknown
    assert _context([(3, _at(3)), (23, _at(33))]).planned_steps is None  # 1.5 a step: not a loop of steps
