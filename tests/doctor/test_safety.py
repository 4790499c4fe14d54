"""A failing script, a script that never steps, a short one: the doctor still reports, and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from doctor_helpers import run_doctor, script

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

REPO = Path(__file__).resolve().parents[2]


def test_a_script_that_raises_gets_a_report_of_what_ran():
    report = run_doctor("raises_midway", what_if=False)
    data = report.to_dict()
    assert report.status == "error" and report.exit_code == 1
    assert data["error"]["where"] == "raises_midway.py:13"
    assert "RuntimeError: the data ran out of disk" in data["error"]["message"]
    assert data["steps_completed"] == 8 and data["steps_measured"] >= 5
    assert abs(sum(data["breakdown"].values()) - 1.0) < 1e-9
    assert any("raises_midway.py:13" in m for m in data["messages"])


def test_a_script_that_never_steps_gets_a_clear_message():
    report = run_doctor("never_steps")
    assert report.status == "no-steps" and report.exit_code == 1
    assert report.findings == []
    assert "never called optimizer.step()" in report.messages[-1]
    assert report.to_dict()["bottleneck"] is None


def test_fewer_steps_than_asked_reports_on_what_ran():
    report = run_doctor("short_run", "5", what_if=False)
    data = report.to_dict()
    assert report.status == "incomplete" and report.exit_code == 0
    assert data["steps_completed"] == 5 and data["steps_measured"] == 3
    assert any("after 5 optimizer step(s)" in m for m in data["messages"])


def test_too_short_for_warmup_uses_what_there_is():
    report = run_doctor("short_run", "2", what_if=False, warmup=3)
    data = report.to_dict()
    assert data["steps_measured"] == 1 and data["warmup_included"] is True
    assert any("warm-up" in m for m in data["messages"])


def _cli(*args, cwd=REPO):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "turbotrain", "doctor", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_exit_codes_json_and_the_scripts_own_argv(tmp_path, capsys):
    from turbotrain.cli import main

    out = tmp_path / "report.json"
    assert main(["doctor", "--steps", "3", "--warmup", "1", "--no-what-if", "--json", str(out),
                 str(script("short_run")), "40"]) == 0
    data = json.loads(out.read_text())
    assert data["argv"] == ["40"] and data["status"] == "ok" and data["steps_measured"] == 3
    assert "Bottleneck:" in capsys.readouterr().out
    assert main(["doctor", "--quiet", str(script("never_steps"))]) == 1
    assert main(["doctor", "--steps", "0", str(script("short_run"))]) == 2
    assert "--steps" in capsys.readouterr().err


def test_the_real_command_exits_non_zero_when_the_script_fails():
    failed = _cli("--no-what-if", "--quiet", str(script("raises_midway")))
    assert failed.returncode == 1
    assert "the data ran out of disk" in failed.stderr


def test_the_real_command_keeps_kineto_banners_out_of_the_report():
    """torch 2.13's profiler prints 'USDT: ... profiler_start' on stderr unless kineto is told not to."""
    env_level = os.environ.pop("KINETO_LOG_LEVEL", None)
    try:
        done = _cli("--steps", "3", "--warmup", "1", "--no-what-if", str(script("short_run")), "40")
    finally:
        if env_level is not None:
            os.environ["KINETO_LOG_LEVEL"] = env_level
    assert done.returncode == 0, done.stderr[-2000:]
    assert "profiler_start" not in done.stderr + done.stdout
    assert "Bottleneck:" in done.stdout
