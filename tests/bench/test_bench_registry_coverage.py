"""Meta-test: every registry speed-up has a benchmark entry the bench can run (or a script that measures it)."""

from pathlib import Path

import pytest

from turbotrain.bench.ablation import candidates
from turbotrain.bench.cli import WORKLOAD_NAMES
from turbotrain.bench.workloads import WORKLOADS, get_workload
from turbotrain.hardware import detect
from turbotrain.plan import Plan
from turbotrain.speedups.registry import BenchEntry, all_speedups

REPO = Path(__file__).resolve().parents[2]
ENTRIES = all_speedups()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_entry_has_a_bench_entry_the_ablation_can_run(entry):
    bench = entry.bench
    assert isinstance(bench, BenchEntry) and bench.workloads, f"{entry.name} has no benchmark entry"
    unknown = [w for w in bench.workloads if w not in WORKLOADS]
    assert not unknown, f"{entry.name}: unknown bench workload(s) {unknown}"
    plan = Plan().replace(**bench.changes)  # a bad field or value raises here
    assert entry.active(plan), f"{entry.name}: the bench changes {bench.changes} leave the switch inactive"


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.bench.script], ids=lambda e: e.name)
def test_dedicated_benchmark_script_exists(entry):
    script = REPO / entry.bench.script
    assert script.is_file(), f"{entry.name}: BenchEntry.script {entry.bench.script} does not exist"


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_entry_gets_one_row_per_workload(name):
    wl = get_workload(name)
    model, _ = wl.build()
    rows = candidates(wl, model, detect("cpu"), device="cpu")
    by_entry = [c.speedup for c in rows if c.kind == "alone"]
    assert sorted(by_entry) == sorted(e.name for e in ENTRIES)
    for cand in rows:
        assert cand.measured or cand.skip, f"{name}/{cand.label}: neither measured nor skipped with a reason"


def test_the_commands_workload_names_are_the_workloads():
    assert WORKLOAD_NAMES == tuple(WORKLOADS)
