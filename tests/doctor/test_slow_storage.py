"""slow-storage: the doctor sees reads through turbotrain.data dominate the data wait, names the scheme and MB/s."""

from __future__ import annotations

import pytest

from doctor_helpers import marked_lines, run_doctor
from turbotrain.data.servers import LocalNginx, nginx_binary


@pytest.fixture
def slow_server(tmp_path):
    if nginx_binary() is None:
        pytest.fail("nginx is not installed: run scripts/ci-deps.sh (make test does)")
    files = tmp_path / "files"
    files.mkdir()
    for i in range(160):
        (files / f"{i:03d}.bin").write_bytes(bytes([i % 256]) * 4096)
    with LocalNginx(files, latency_s=0.01) as server:  # 10 ms before each file's first byte
        yield server


def test_remote_reads_without_a_cache_are_named_with_scheme_and_speed(slow_server):
    report = run_doctor("remote_files", slow_server.url, what_if=False)
    assert report.status == "ok", report.messages
    assert report.bottleneck == "data_loading"
    found = [f for f in report.to_dict()["findings"] if f["rule"] == "slow-storage"]
    assert found, [f["rule"] for f in report.to_dict()["findings"]]
    finding = found[0]
    assert "http" in finding["message"] and "MB/s" in finding["message"]
    assert "cache" in finding["fix"]
    (rule, line), = marked_lines("remote_files")
    assert rule == "slow-storage" and finding["where"].endswith(f"remote_files.py:{line}")


def test_the_same_files_from_a_filled_cache_are_not_slow_storage(slow_server, tmp_path):
    report = run_doctor("remote_files", slow_server.url, str(tmp_path / "cache"), what_if=False)
    assert report.status == "ok", report.messages
    assert "slow-storage" not in {f.rule for f in report.findings}
