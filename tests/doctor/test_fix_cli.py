"""`turbotrain doctor --fix`: the options before or after the script's own arguments, the reports that
show the fixes (terminal, JSON, HTML), and errors that name the bad input."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("libcst", reason="doctor --fix needs libcst: pip install -e '.[fix]'")

from doctor_helpers import SCRIPTS
from turbotrain.cli import build_parser, main
from turbotrain.doctor.cli import take_trailing_options


def test_patch_options_after_the_scripts_arguments_are_the_doctors_and_after_double_dash_the_scripts():
    args = build_parser().parse_args(["doctor", "train.py", "--lr", "3e-4", "--fix", "f.patch", "--verify",
                                      "--verify-budget=30", "--", "--verify"])
    take_trailing_options(args)
    assert (args.fix, args.verify, args.verify_budget_s) == ("f.patch", True, 30.0)
    assert args.script_args == ["--lr", "3e-4", "--verify"]


def test_the_cli_writes_the_patch_and_every_report_shows_it(tmp_path, capsys):
    script = tmp_path / "grad_in_validation.py"
    shutil.copy(SCRIPTS / "grad_in_validation.py", script)
    patch, report, page = tmp_path / "fixes.patch", tmp_path / "r.json", tmp_path / "r.html"
    code = main(["doctor", "--steps", "4", "--warmup", "2", "--no-what-if", "--json", str(report), "--html", str(page),
                 str(script), "--fix", str(patch), "--fix-only", "grad-in-validation"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "+    with torch.inference_mode():" in out and f"Patch: {patch}" in out
    assert "+    with torch.inference_mode():" in patch.read_text()
    fixes = json.loads(report.read_text())["fixes"]
    assert [(f["rule"], f["where"], f["in_patch"]) for f in fixes] == [
        ("grad-in-validation", "grad_in_validation.py:16", True)]
    html = page.read_text()
    assert 'id="fixes"' in html and "+    with torch.inference_mode():" in html


@pytest.mark.parametrize("argv, message", [
    (["--fix-only", "small-batch"], "small-batch is not a rule whose fix the doctor can edit"),
    (["--verify-rounds", "0"], "(--verify-rounds): 0 is not allowed"),
])
def test_bad_patch_options_are_refused_before_the_script_runs(tmp_path, capsys, argv, message):
    script = tmp_path / "never_runs.py"
    script.write_text("raise SystemExit('the script must not run')\n")
    assert main(["doctor", "--fix", str(tmp_path / "p.patch"), *argv, str(script)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "p.patch").exists()


def test_a_folder_as_the_patch_path_is_refused(tmp_path, capsys):
    script = tmp_path / "never_runs.py"
    script.write_text("raise SystemExit('the script must not run')\n")
    assert main(["doctor", "--fix", str(tmp_path), str(script)]) == 2
    assert "that is a folder" in capsys.readouterr().err
