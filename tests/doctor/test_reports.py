"""Reports: the JSON contract, the HTML page rendered by a real headless browser, the Perfetto trace."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from doctor_helpers import cached_report, run_doctor
from turbotrain.doctor.report.html import write_html
from turbotrain.doctor.record.measurements import CATEGORIES
from turbotrain.doctor.report.terminal import print_report

CONTRACT = {"device", "steps_measured", "step_time_ms", "breakdown", "bottleneck", "findings"}
FINDING_KEYS = {"rule", "severity", "where", "message", "fix", "est_speedup", "measured"}


def test_json_follows_the_contract():
    data = json.loads(cached_report("data_bound_loader").to_json())
    assert CONTRACT <= set(data)
    assert data["device"] == "cpu" and data["steps_measured"] == 6
    times = data["step_time_ms"]
    assert set(times) >= {"median", "p90"} and times["p90"] >= times["median"]
    assert set(data["breakdown"]) == set(CATEGORIES)
    assert sum(data["breakdown"].values()) == pytest.approx(1.0, abs=1e-9)
    total = sum(data["breakdown_ms"].values()) + data["interference_ms"]
    assert total == pytest.approx(data["step_time_ms"]["mean"], rel=1e-3)
    assert data["bottleneck"] == max(data["breakdown"], key=data["breakdown"].get)
    for finding in data["findings"]:
        assert FINDING_KEYS <= set(finding)
        assert finding["severity"] in ("high", "medium", "low")
    assert [len(row) for row in data["timeline"]]


def test_findings_name_the_registry_entry_that_fixes_them():
    from turbotrain.speedups.registry import get

    for name in ("data_bound_loader", "non_foreach_optimizer", "conv_bias_bn", "batch_size_one"):
        for finding in cached_report(name).findings:
            if finding.speedup:
                assert finding.rule in get(finding.speedup).doctor_rules, (finding.rule, finding.speedup)
                assert finding.fix.plan, finding.rule
                assert "turbotrain: tt.Plan(" in finding.fix.text(finding.speedup)


def test_terminal_report_shows_bar_bottleneck_and_findings(tmp_path):
    with open(tmp_path / "out.txt", "w") as fh:
        print_report(cached_report("checkpoint_every_step"), file=fh, width=140)
    text = (tmp_path / "out.txt").read_text()
    assert "█" in text and "Bottleneck: outside the step" in text
    assert "save-in-loop" in text and "checkpoint_every_step.py:" in text and "measured" in text


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed: run scripts/ci-deps.sh (apt-get install chromium)")
    return exe


def _headless(tmp_path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.iterdir()))}"
    profile.mkdir()
    return subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def test_html_report_renders_in_a_headless_browser(tmp_path):
    report = cached_report("data_bound_loader")
    page = tmp_path / "report.html"
    write_html(report, page)
    html = page.read_text()
    assert "<script" not in html and "http://" not in html and "https://" not in html  # self-contained
    assert html.count("data:image/png;base64,") == 2
    dom = _headless(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    # The browser parsed the page: the findings, the code line and the bottleneck are in its DOM.
    assert 'data-rule="num-workers"' in dom.stdout
    assert "data_bound_loader.py:" in dom.stdout and "DataLoader(SlowFiles()" in dom.stdout
    assert '<b id="bottleneck">data loading</b>' in dom.stdout
    shot = tmp_path / "shot.png"
    result = _headless(tmp_path, f"--screenshot={shot}", "--window-size=1200,1400", page.as_uri())
    assert result.returncode == 0 and shot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_trace_opens_as_chrome_trace_with_phase_ranges(tmp_path):
    trace = tmp_path / "trace.json"
    report = run_doctor("conv_bias_bn", what_if=False, profile_steps=2, trace_path=str(trace))
    assert report.trace_path == str(trace)
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name", "") for e in events}
    assert {"turbotrain/forward", "turbotrain/backward", "turbotrain/optimizer", "turbotrain/data"} <= names
    assert any(n.startswith("turbotrain/step#") for n in names)
    assert any(n.startswith("aten::convolution") or n == "aten::conv2d" for n in names)
    assert report.top_ops and report.top_ops[0].self_cpu_ms_per_step > 0
