"""The doctor's folders are its stages in the order data flows; a module imports only its own stage or earlier
ones, so a reader follows one finding from the CLI down the folders and never back up."""

from __future__ import annotations

import ast
from pathlib import Path

DOCTOR = Path(__file__).resolve().parents[2] / "src" / "turbotrain" / "doctor"
# The shared vocabulary first, the stages in order, and the entry points that run them all last.
STAGES = {"lifeline": 0, "sites": 0, "edits": 0, "cst_tools": 0, "findings": 0, "requests": 0, "results": 0,
          "rank_change": 0, "rule_ids": 0, "module_stacks": 0, "record": 1, "job": 1, "apply": 1, "analysis": 2,
          "rules": 3, "whatif": 4, "report": 5, "fixes": 6, "diagnose": 7, "watching": 7, "cli": 7, "options": 7,
          "__init__": 7}


def _imports(source: str, package: list[str]) -> list[str]:
    """Every doctor module ``source`` (a module of the doctor's sub-package ``package``) imports, lazy and
    type-checking imports included, relative to the doctor."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[:len(package) - node.level + 1] if node.level > 1 else package
            parts = base + (node.module.split(".") if node.module else [])
            if node.level - 1 > len(package):
                continue  # above the doctor: not a stage
        elif (node.module or "").startswith("turbotrain.doctor."):
            parts = node.module.split(".")[2:]
        else:
            continue
        if parts:
            found.append(".".join(parts))
        else:  # ``from . import a, b`` at the doctor's top
            found += [alias.name for alias in node.names]
    return found


def _stage(module: str) -> int | None:
    return STAGES.get(module.split(".")[0])


def test_every_doctor_module_belongs_to_a_stage():
    modules = {p.relative_to(DOCTOR).parts[0].removesuffix(".py") for p in DOCTOR.rglob("*.py")}
    assert modules <= set(STAGES), modules - set(STAGES)


def test_stages_import_only_earlier_stages():
    offenders = []
    for path in sorted(DOCTOR.rglob("*.py")):
        mine = _stage(path.relative_to(DOCTOR).parts[0].removesuffix(".py"))
        for module in _imports(path.read_text(), list(path.relative_to(DOCTOR).parent.parts)):
            theirs = _stage(module)
            if theirs is not None and mine is not None and theirs > mine:
                offenders.append(f"{path.relative_to(DOCTOR)} imports {module}")
    assert offenders == []


def test_the_check_resolves_relative_and_lazy_imports():
    """The check above would pass vacuously if relative or function-level imports were not resolved."""
    source = ("from ..report.model import Report\nfrom .clock import PhaseClock\n"
              "def f():\n    from turbotrain.doctor.fixes import attach\n")
    assert _imports(source, ["record"]) == ["report.model", "record.clock", "fixes"]
    assert _stage("report.model") > _stage("record.clock")


def test_the_architecture_page_names_every_doctor_module():
    """docs/architecture.md draws the doctor module by module (a rule module by its topic: rules/<topic>/)."""
    page = (DOCTOR.parents[2] / "docs" / "architecture.md").read_text()
    unnamed = [str(p.relative_to(DOCTOR)) for p in sorted(DOCTOR.rglob("*.py"))
               if p.name != "__init__.py" and p.relative_to(DOCTOR).parts[0] != "rules"
               and f"`{p.name}`" not in page]
    topics = sorted({p.parent.name for p in (DOCTOR / "rules").glob("*/*.py")})
    assert unnamed == [] and all(f"`{t}/`" in page for t in topics), (unnamed, topics)
