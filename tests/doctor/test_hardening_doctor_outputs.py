"""The doctor's outputs (issue 43, items 3 and 6): no output may name the script or another output, an output
never follows a symlink onto another file, and a part that failed is said in every report with exit code 1,
the other outputs still written."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os

import pytest

from doctor_helpers import ZERO_GRAD_LOOP

from turbotrain.cli import main
from turbotrain.config import ConfigError
from turbotrain.doctor.report.files import check_outputs, write_output

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

SCRIPT = ZERO_GRAD_LOOP
FAST = ["--steps", "3", "--warmup", "1", "--no-what-if", "--watch", "0"]
OUTPUTS = ("--fix", "--json", "--html", "--trace")


@pytest.fixture
def train(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.parametrize("first, second", list(itertools.combinations(("script", *OUTPUTS), 2)))
def test_two_outputs_or_an_output_and_the_script_on_one_file_are_refused(tmp_path, train, capsys, first, second):
    same = str(train) if first == "script" else str(tmp_path / "same.out")
    argv = [arg for option in (first, second) if option != "script" for arg in (option, same)]
    assert main(["doctor", *FAST, *argv, str(train)]) == 2
    err = capsys.readouterr().err
    assert second in err and (first in err if first != "script" else "the script" in err), err
    assert train.read_text() == SCRIPT and not (tmp_path / "same.out").exists()


def test_an_output_through_a_symlink_onto_the_script_is_refused(tmp_path, train, capsys):
    (tmp_path / "report.json").symlink_to(train)
    assert main(["doctor", *FAST, "--json", str(tmp_path / "report.json"), str(train)]) == 2
    assert "--json" in capsys.readouterr().err and train.read_text() == SCRIPT


def test_an_output_onto_a_python_file_beside_the_script_is_refused(tmp_path, train):
    (tmp_path / "helpers.py").write_text("X = 1\n")
    with pytest.raises(ConfigError, match="--html .*helpers.py.*Python"):
        check_outputs(str(train), {"--html": str(tmp_path / "helpers.py")})
    assert (tmp_path / "helpers.py").read_text() == "X = 1\n"


def test_writing_an_output_replaces_a_symlink_instead_of_writing_through_it(tmp_path, train):
    link = tmp_path / "report.json"
    link.symlink_to(train)  # planted after the argument checks
    write_output(link, lambda path: open(path, "w").write("{}"))
    assert train.read_text() == SCRIPT
    assert not link.is_symlink() and link.read_text() == "{}"
    assert oct(link.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "train.py"]  # no temporary file left


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _failures(data: dict) -> dict[str, str]:
    return {f["part"]: f["message"] for f in data["failures"]}


def test_a_trace_that_cannot_be_written_is_a_failure_not_a_trace_named(tmp_path, train, capsys):
    (tmp_path / "afile").write_text("")
    trace, report, page = tmp_path / "afile" / "trace.json", tmp_path / "r.json", tmp_path / "r.html"
    code = main(["doctor", *FAST, "--trace", str(trace), "--json", str(report), "--html", str(page), str(train)])
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert code == 1 and data["exit_code"] == 1 and data["status"] == "partial"
    assert "trace" not in data and "Trace:" not in out
    assert str(trace) in _failures(data)["trace"]
    assert "The trace was not written" in page.read_text() and "The trace was not written" in out


def test_a_rule_that_crashes_is_a_failure_in_every_report(tmp_path, train, capsys, monkeypatch):
    from turbotrain.doctor import rules
    from turbotrain.doctor.rules.rule import Detect

    def broken(ctx):
        raise ValueError("a bug in the rule")

    every = rules.all_rules()
    monkeypatch.setattr(rules, "all_rules", lambda: tuple(
        dataclasses.replace(r, detect=(Detect("live", broken),)) if r.id == "zero-grad-not-none" else r
        for r in every))
    report, page = tmp_path / "r.json", tmp_path / "r.html"
    assert main(["doctor", *FAST, "--json", str(report), "--html", str(page), str(train)]) == 1
    data = json.loads(report.read_text())
    assert data["status"] == "partial" and "a bug in the rule" in _failures(data)["rule zero-grad-not-none"]
    assert "zero-grad-not-none" in page.read_text() and "zero-grad-not-none failed" in capsys.readouterr().out


def test_a_patch_that_cannot_be_written_is_a_failure_and_the_reports_are_still_written(tmp_path, train, capsys):
    pytest.importorskip("libcst", reason="doctor --fix needs libcst")
    (tmp_path / "afile").write_text("")
    report, page = tmp_path / "r.json", tmp_path / "r.html"
    code = main(["doctor", *FAST, "--json", str(report), "--html", str(page), "--fix", str(tmp_path / "afile" / "p"),
                 "--fix-only", "zero-grad-not-none", str(train)])
    assert code == 1
    data = json.loads(report.read_text())
    assert "patch was not written" in _failures(data)["fix"] and data["patch"]["path"] is None
    assert "patch was not written" in page.read_text()
    assert "patch was not written" in capsys.readouterr().err


def test_a_json_report_that_cannot_be_written_leaves_the_html_saying_so(tmp_path, train, capsys):
    (tmp_path / "afile").write_text("")
    page = tmp_path / "r.html"
    assert main(["doctor", *FAST, "--json", str(tmp_path / "afile" / "r.json"), "--html", str(page), str(train)]) == 1
    assert "The JSON report was not written" in page.read_text()
    assert "The JSON report was not written" in capsys.readouterr().err
