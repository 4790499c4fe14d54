"""DoctorOptions in the Plan's idiom: typed, checked once, the command's flags built from its fields."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

import turbotrain as tt
from turbotrain.cli import build_parser
from turbotrain.config import ConfigError
from turbotrain.doctor.options import DoctorOptions, add_option_arguments, options_from_args


@pytest.mark.parametrize("changes, message", [
    ({"steps": 0}, "DoctorOptions.steps (--steps): 0 is not allowed; expected an integer >= 1."),
    ({"warmup": 0}, "first step holds the script's set-up"),
    ({"job_what_if_rounds": 1}, "two rounds that agree"),
    ({"what_if_budget_s": float("nan")}, "DoctorOptions.what_if_budget_s (--what-if-budget): nan is not allowed"),
    ({"fix_rules": ("num-workers", "num-wrokers")}, "num-wrokers is not a rule id"),
    ({"steps": "20"}, "DoctorOptions.steps"),            # the type, checked as the Plan's are
    ({"stpes": 20}, "Did you mean 'steps'?"),
])
def test_a_bad_option_is_an_error_naming_it(changes, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        DoctorOptions(**changes)


def test_the_command_s_flags_are_the_fields_with_their_defaults_and_docs():
    args = build_parser().parse_args(["doctor", "train.py"])
    assert options_from_args(args) == DoctorOptions()  # every default written once, in the dataclass
    args = build_parser().parse_args(["doctor", "--steps", "7", "--no-what-if", "--watch", "0", "--fix-only",
                                      "num-workers,pin-memory", "--rank-timeout", "30", "train.py"])
    options = options_from_args(args)
    assert (options.steps, options.what_if, options.watch_s, options.fix_rules, options.hang_timeout_s) == (
        7, False, 0.0, ("num-workers", "pin-memory"), 30.0)
    parser = argparse.ArgumentParser()
    add_option_arguments(parser)
    helps = {action.dest: action.help for action in parser._actions}
    docstring = "Steps to measure: optimizer steps, or backward passes when no optimizer steps"
    assert helps["steps"] == f"{docstring} (default 20)"
    assert dataclasses.is_dataclass(options) and dataclasses.fields(options)[0].metadata["flag"] == "--steps"


def test_the_what_if_budget_is_the_users_or_sized_by_the_step():
    from types import SimpleNamespace

    from turbotrain.doctor.diagnose import what_if_budget_s

    args = build_parser().parse_args(["doctor", "--what-if-budget", "45", "train.py"])
    assert options_from_args(args).what_if_budget_s == 45.0  # an Optional float's flag parses a float
    default = DoctorOptions()
    assert default.what_if_budget_s is None
    # 20 s for short steps; 60 steps' worth for long ones (llm.c's 1.39-s GPT-2 step: two trials need 42 s), <= 180.
    assert [what_if_budget_s(default, SimpleNamespace(step_s=s, compiled=None)) for s in (0.017, 1.39, 30.0)] == \
        pytest.approx([20.0, 83.4, 180.0])
    # A script that compiled its model: room for one fresh compile beside the 20 s (an HF Trainer with
    # torch_compile=True: 20.9 s of compiling, 12-ms steps; its compile trial needed 22 s of a 20-s budget).
    compiled = SimpleNamespace(codes=(SimpleNamespace(first_compile_s=20.9),))
    assert what_if_budget_s(default, SimpleNamespace(step_s=0.012, compiled=compiled)) == pytest.approx(40.9)
    assert what_if_budget_s(default, SimpleNamespace(step_s=1.39, compiled=compiled)) == pytest.approx(83.4)
    assert what_if_budget_s(DoctorOptions(what_if_budget_s=5.0), SimpleNamespace(step_s=30.0)) == 5.0


def test_watch_is_checked_as_the_command_is():
    with pytest.raises(ConfigError, match=r"DoctorOptions.steps \(--steps\): 0 is not allowed"):
        with tt.doctor.watch(steps=0, print_report=False):
            pass


def test_the_report_says_what_sized_the_what_if_budget():
    from types import SimpleNamespace

    from turbotrain.doctor.diagnose import _budget_message

    compiled = SimpleNamespace(codes=(SimpleNamespace(first_compile_s=20.9),))
    said = _budget_message(DoctorOptions(), SimpleNamespace(step_s=0.012, compiled=compiled))
    assert said.startswith("torch.compile took 20.9 s in this run: the what-ifs had 41 s, room for one fresh compile")
    said = _budget_message(DoctorOptions(), SimpleNamespace(step_s=1.45, compiled=compiled))
    assert said.startswith("Steps of 1.45 s: the what-ifs had 87 s")
    longer = SimpleNamespace(codes=(SimpleNamespace(first_compile_s=50.0),))  # 70 s beside 60 steps' 60 s
    said = _budget_message(DoctorOptions(), SimpleNamespace(step_s=1.0, compiled=longer))
    assert said.startswith("torch.compile took 50 s in this run: the what-ifs had 70 s")
    assert _budget_message(DoctorOptions(), SimpleNamespace(step_s=0.012, compiled=None)) is None  # the plain 20 s
    assert _budget_message(DoctorOptions(what_if_budget_s=41.0), SimpleNamespace(step_s=0.012, compiled=compiled)) \
        is None  # the user's own
