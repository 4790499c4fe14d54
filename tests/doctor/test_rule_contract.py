"""Every rule is one module that registers a complete Rule (rules/rule.py), documented and tested, and says nothing
(without failing) about a run that recorded nothing; the registry refuses a rule that leaves a part out."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from pathlib import Path
from typing import Iterator

import pytest

from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.findings import Finding, Fix
from turbotrain.doctor.rules import all_rules, by_id, evaluate, habit_rules, rule_ids
from turbotrain.cli import main
from turbotrain.doctor.rules.rule import Card, Detect, Rule, parse_card, register
from turbotrain.hardware import detect
from turbotrain.speedups.registry import all_speedups

ROOT = Path(__file__).resolve().parents[2]
RULES = all_rules()
TESTS = "\n".join(p.read_text() for p in (ROOT / "tests" / "doctor").glob("test_*.py") if p.name != Path(__file__).name)


def test_every_rule_module_registers_its_rule_and_the_ids_are_the_modules():
    assert [r.id for r in RULES] == sorted(rule_ids()) and len(RULES) >= 37
    assert set(habit_rules()) == set(rule_ids()) - {r for s in all_speedups() for r in s.doctor_rules}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_every_rule_is_documented_and_tested(rule):
    card = rule.card  # its module's docstring: what `turbotrain doctor --rules` prints
    assert card.fires_when and card.reads and (card.edit is None) == (rule.edit is None)
    assert f'"{rule.id}"' in TESTS, f"{rule.id}: no test in tests/doctor names it"
    assert by_id(rule.id) is rule


@pytest.mark.parametrize("doc, says", [
    ("A rule.\n\nReads: run.", "does not open with '`some-rule`: '"),
    ("`some-rule`: fires on a slow step.", "says nothing after 'Reads:'"),
    ("`some-rule`: fires on a slow step.\n\nIt reads the run.", "second paragraph is not its fields"),
])
def test_a_rule_docstring_without_its_card_is_refused_naming_what_is_missing(doc, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_card(doc, "some-rule")


def test_a_card_reads_its_fields_over_wrapped_lines():
    card = parse_card("`some-rule`: fires when a step\n  waits.\n\nReads: run,\nsource.\nEdit: `x=1` in the\ncall.\n\n"
                      "Reads: this paragraph is for maintainers.", "some-rule")
    assert card == Card("fires when a step waits.", "run, source", None, "`x=1` in the call")


def test_the_command_lists_every_rule_with_its_edit(capsys):
    assert main(["doctor", "--rules"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{r.id}  reads {r.card.reads}" in out for r in RULES)
    assert "`zero_grad(set_to_none=True)`" in out and f"{len(RULES)} rules" in out


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_every_rule_says_nothing_about_a_run_that_recorded_nothing(rule, monkeypatch):
    for name in [n for n in os.environ if n.startswith("NCCL_")]:
        monkeypatch.delenv(name)  # nccl-env reads the environment
    ctx = Context(script=None, base=None, hw=detect("cpu"), device="cpu", breakdown=compute_breakdown([], 1),
                  measured_steps=[])
    failed: list = []
    assert evaluate(ctx, only=[rule.id], failed=failed) == [] and failed == []


def _a_detector(ctx):
    return ()


@pytest.mark.parametrize("change, says", [
    ({"detect": ()}, "no Detect"),
    ({"detect": (Detect("guessed", _a_detector),)}, "source 'guessed'"),
    ({"id": "Num_Workers"}, "not lower-case words"),
    ({"edits_without_site": True, "edit": None}, "has no edit"),
    ({"edit": None}, "has no edit but its docstring has an 'Edit:'"),
    ({"rewrite": _a_detector}, "its detectors and edit come from 2 modules"),
    ({"rewrite": _a_detector, "edit": None}, "rewrite is set but it has no edit to plan it"),
])
def test_an_incomplete_rule_is_refused_naming_what_is_missing(change, says):
    rule = dataclasses.replace(by_id("zero-grad-not-none"), **change)
    with pytest.raises(ValueError, match=says):
        register(rule)


def test_a_rule_outside_its_own_module_or_registered_twice_is_refused():
    elsewhere = Rule("zero-grad-not-none", detect=(Detect("live", _a_detector),))
    with pytest.raises(ValueError, match=r"lives in .*test_rule_contract; a rule lives in turbotrain\.doctor\.rules\."):
        register(elsewhere)
    again = dataclasses.replace(by_id("zero-grad-not-none"))
    with pytest.raises(ValueError, match="registered already"):
        register(again)


def _rule_id_literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """String literals the code uses as rule ids: compared with a ``.rule``, ``rule_id``/``rule``/``only``
    arguments, ``by_id(...)``, and the speed-up registry's ``doctor_rules``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "rule" for s in sides):
                for s in sides:
                    for c in ast.walk(s):
                        if isinstance(c, ast.Constant) and isinstance(c.value, str):
                            yield node.lineno, c.value
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            values = [kw.value for kw in node.keywords if kw.arg in ("rule", "rule_id", "doctor_rules", "only")]
            if name in ("by_id", "speedup_for_rule") and node.args:
                values.append(node.args[0])
            for value in values:
                for c in ast.walk(value):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                        yield node.lineno, c.value


def test_every_rule_id_the_code_names_is_a_rule():
    """Rule ids are the rule modules' names (rules/rule.py: rule_ids); a Finding made with another is refused when
    it is made, and an id mistyped in a comparison or a registry entry is caught here."""
    known, wrong, seen = set(rule_ids()), [], 0
    for path in sorted((ROOT / "src" / "turbotrain").rglob("*.py")):
        for line, value in _rule_id_literals(ast.parse(path.read_text())):
            seen += 1
            if value not in known:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {value!r}")
    assert seen > 40 and not wrong, wrong
    with pytest.raises(ValueError, match="'num-worker' is not a rule id; rule ids: .*num-workers"):
        Finding("num-worker", "message", Fix("fix"))


def test_every_rule_loads_without_libcst_which_only_fix_needs():
    """libcst is the `fix` extra: a plain `pip install turbotrain` has none. Two rule modules imported it at their
    top (their `--fix` edits), so the doctor could not load its rules at all without it."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['libcst'] = None\n"
            "from turbotrain.doctor.rules import all_rules\n"
            "print(sorted(r.id for r in all_rules()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(sorted(r.id for r in RULES))
