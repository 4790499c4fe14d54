"""``doctor --verify`` copies the script's folder (issue 43, item 5): a named pipe or a socket in it, or the temporary
folder inside it, must not cost the report or the patch; a verification that fails is a message in the report."""

from __future__ import annotations

import json
import os
import socket
import tempfile

import pytest

pytest.importorskip("libcst", reason="doctor --fix needs libcst: pip install -e '.[fix]'")

from doctor_helpers import ZERO_GRAD_LOOP

from turbotrain.cli import main
from turbotrain.doctor.fixes import verify

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

SCRIPT = ZERO_GRAD_LOOP
ARGS = ["--steps", "3", "--warmup", "1", "--no-what-if", "--watch", "0", "--verify-rounds", "1",
        "--fix-only", "zero-grad-not-none"]


def _doctor(folder, capsys) -> tuple[int, dict, str]:
    report = folder / "r.json"
    code = main(["doctor", *ARGS, "--json", str(report), "--fix", str(folder / "fixes.patch"), "--verify",
                 str(folder / "train.py")])
    return code, json.loads(report.read_text()), capsys.readouterr().out


FIXED_LINE = "+    opt.zero_grad(set_to_none=True)"  # the diff's added line; a dropped fix is named in a comment only


def _patched(folder) -> bool:
    return FIXED_LINE in (folder / "fixes.patch").read_text().splitlines()


def _verified_and_written(data: dict, folder) -> None:
    """The fix was timed in both copies (kept or dropped as the noise has it) and the patch was written."""
    (fix,) = data["fixes"]
    assert fix["verified"] is not None and "error" not in fix["verification"], fix
    assert data["patch"]["path"] and (folder / "fixes.patch").is_file()
    assert _patched(folder) == fix["in_patch"], (folder / "fixes.patch").read_text()


def test_a_fifo_a_socket_and_the_temporary_folder_in_the_scripts_folder(tmp_path, capsys, monkeypatch):
    """One run for the three (each verify costs two fresh interpreters): the named pipe and the socket are left out
    of the copies, saying so, and the copies, made in TMPDIR, are not made inside the folder they copy."""
    (tmp_path / "train.py").write_text(SCRIPT)
    os.mkfifo(tmp_path / "a-pipe")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "a-socket"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    try:
        code, data, out = _doctor(tmp_path, capsys)
    finally:
        server.close()
    assert code == 0, out
    _verified_and_written(data, tmp_path)
    assert any("a-pipe" in m and "a-socket" in m for m in data["patch"]["messages"]), data["patch"]["messages"]
    # No copy, nested or not, is left in the folder (torch's own cache folder, torchinductor_*, may be).
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("turbotrain")] == []


def test_a_verification_that_crashes_is_a_message_and_the_report_and_patch_are_written(tmp_path, capsys, monkeypatch):
    (tmp_path / "train.py").write_text(SCRIPT)

    def cannot_copy(src, dst, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(verify.shutil, "copytree", cannot_copy)
    code, data, out = _doctor(tmp_path, capsys)
    assert code == 1 and data["status"] == "partial"
    failure = next(f["message"] for f in data["failures"] if f["part"] == "verify")
    assert "No space left on device" in failure and "--verify" in out
    assert _patched(tmp_path)  # exact and certain: kept unverified
