"""The registry stays complete: every speed-up has its test module, every Plan switch its entry."""

import ast
import dataclasses
from pathlib import Path

import pytest

import turbotrain as tt
from turbotrain.speedups.registry import all_speedups

TESTS = Path(__file__).parent / "speedups"
ENTRIES = all_speedups()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_speedup_has_a_test_module_with_tests(entry):
    path = TESTS / f"test_{entry.name}.py"
    assert path.is_file(), f"registry entry {entry.name!r} has no test module {path}"
    tests = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)
             and n.name.startswith("test_")]
    assert tests, f"{path} defines no test function"


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_speedup_declares_what_others_need(entry):
    assert entry.summary and entry.bench.workloads
    assert entry.field in entry.bench.changes, "the benchmark must switch the entry's own field"
    assert tt.Plan(**entry.bench.changes) != tt.Plan(), "the benchmark plan must differ from naive"


def test_every_plan_switch_has_exactly_one_entry():
    fields = {f.name for f in dataclasses.fields(tt.Plan)} - {"device"}
    owners = [name for e in ENTRIES for name in (e.field, *e.settings)]  # a switch, or a setting of one
    assert sorted(owners) == sorted(set(owners)), "two entries switch the same Plan field"
    assert fields == set(owners), f"Plan fields without a registry entry: {sorted(fields - set(owners))}"
