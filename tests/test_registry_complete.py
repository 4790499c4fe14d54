"""The registry stays complete: every speed-up has its test module and declares its policy (the models it is
for, how the tuner decides it, how it is exported, its doctor rules); every Plan switch has its entry."""

import ast
import dataclasses
from pathlib import Path

import pytest

import turbotrain as tt
from turbotrain.hardware import detect
from turbotrain.speedups.policy import FRAMEWORKS, timed
from turbotrain.speedups.registry import DECLARATIONS, UNDECLARED, all_speedups, get, register, undeclared

TESTS = Path(__file__).parent / "speedups"
ENTRIES = all_speedups()
CPU = detect("cpu")
AMPERE = dataclasses.replace(CPU, device_type="cuda", device_name="fake A100", capability=(8, 0), bf16=True,
                             fp16=True, tf32=True, cudnn=True)


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


# -- each entry owns its policy: every declaration made, and each one read by the part that uses it ----------


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_speedup_declares_its_policy(entry):
    assert undeclared(entry) == [], f"{entry.name} leaves undeclared: {undeclared(entry)}"
    for name, (kind, _) in DECLARATIONS.items():
        assert isinstance(getattr(entry, name), kind), f"{entry.name}.{name} is not a {kind.__name__}"


@pytest.mark.parametrize("name", [*DECLARATIONS, "doctor_rules"])
def test_register_refuses_an_entry_that_leaves_a_declaration_out(name):
    entry = dataclasses.replace(get("tf32"), name="tf32_sketch",
                                **{name: () if name == "doctor_rules" else UNDECLARED})
    with pytest.raises(ValueError, match=f"'tf32_sketch' leaves undeclared: {name}: "):
        register(entry)
    assert "tf32_sketch" not in {e.name for e in all_speedups()}


def test_register_refuses_a_flip_of_a_switch_that_is_not_boolean():
    entry = dataclasses.replace(get("batch_size"), name="batch_size_sketch", tune=timed())
    with pytest.raises(ValueError, match="Plan.batch_size is not one; pass values="):
        register(entry)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_declared_doctor_rule_is_a_rule_the_doctor_runs(entry):
    from turbotrain.doctor.rules import all_rules, rule_ids

    implemented = {rule.id for rule in all_rules()}
    assert set(entry.doctor_rules) <= implemented, f"{entry.name}: no doctor rule module for " \
        f"{sorted(set(entry.doctor_rules) - implemented)}"
    assert set(entry.doctor_rules) <= set(rule_ids())   # the doctor's table reads the declaration


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_switching_an_exported_entry_on_changes_what_it_writes(entry):
    """An entry that declares an export writes something once switched on; one that writes nothing says why."""
    export = entry.export
    if export.unexported:
        return
    on, naive = tt.Plan(**entry.bench.changes), tt.Plan()
    wrote = [export.lightning_flags(on) != export.lightning_flags(naive),
             export.accelerate_keys(on) != export.accelerate_keys(naive),
             any(export.code_lines(on, fw) for fw in FRAMEWORKS),
             export.dataloader is not None and getattr(on, entry.field) is not None]
    assert any(wrote), f"{entry.name}: Plan({entry.bench.changes}) writes nothing for Lightning, Accelerate or code"


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.tune.kind == "timed" and e.tune.values],
                         ids=lambda e: e.name)
def test_timed_values_are_values_the_plan_accepts(entry):
    for hw in (CPU, AMPERE):
        for value in entry.tune.values(hw, tt.Plan()):
            tt.Plan(**{entry.field: value})   # a bad value raises ConfigError here
