"""Every ```python block in README.md and docs/*.md runs, in order per file, in a fresh namespace;
every documented `turbotrain` command parses, and the README recipe loads."""

import re
import shlex
from pathlib import Path

import pytest

from turbotrain.cli import build_parser
from turbotrain.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


# The examples print what they measure and assert none of it (the doctor's verified gains are printed, its bitwise
# losses and lines asserted): they run beside other tests, not in the exclusive lane (conftest.py).
EXAMPLE_DOCS = [path for path in DOCS if _blocks(path)]


@pytest.mark.parametrize("path", EXAMPLE_DOCS, ids=lambda p: p.name)
def test_python_examples_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    for i, code in enumerate(_blocks(path)):
        try:
            exec(compile(code, f"{path.name}[block {i}]", "exec"), namespace)  # noqa: S102 - runs the docs' own examples
        except Exception as exc:  # pragma: no cover - the message is the point
            raise AssertionError(f"{path.name} block {i} failed: {exc!r}\n{code}") from exc


def _command_lines(path):
    """`turbotrain ...` lines of the ```bash blocks, without their trailing comments."""
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S):
        for line in block.splitlines():
            if line.startswith("turbotrain "):
                yield shlex.split(line, comments=True)


COMMAND_DOCS = [p for p in DOCS if any(_command_lines(p))]


@pytest.mark.parametrize("path", COMMAND_DOCS, ids=lambda p: p.name)
def test_command_examples_parse(path):
    """Each documented command names a real sub-command and only options it has."""
    parser = build_parser()
    for argv in _command_lines(path):
        try:
            args, extra = parser.parse_known_args(argv[1:])
        except SystemExit as exc:  # argparse exits on an unknown choice or a missing value
            raise AssertionError(f"{path.name}: {' '.join(argv)!r} does not parse") from exc
        assert getattr(args, "_run", None) is not None, f"{path.name}: {' '.join(argv)!r} names no command"
        if not getattr(args, "accepts_extra", False):
            assert not extra, f"{path.name}: {' '.join(argv)!r}: unknown options {extra}"


def test_readme_recipe_loads():
    """The recipe shown in the README is a valid recipe (strict keys included)."""
    (block,) = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    recipe = load_recipe(block)
    assert recipe.workload == "cnn"
