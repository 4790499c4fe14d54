"""The tune cache holds nothing another user planted, and a malformed entry is tuned again (issue 43)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from turbotrain.tuning.api import tune_report

from tune_helpers import adamw, loss_fn, tiny_loader, tiny_mlp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from test_hardening_cache_private import ATTACKER, as_user  # the real-second-user helper


def _tune():
    return tune_report(tiny_mlp(), loss_fn, tiny_loader(), adamw, 5, exclude=("compile",), find_num_workers=False,
                       verbose=False)


def test_a_malformed_cache_entry_of_the_current_version_is_tuned_again(isolated_cache, caplog):
    first = _tune()
    (entry,) = isolated_cache.glob("*.json")
    data = json.loads(entry.read_text())
    data["result"]["search"] = {"plan": "not a plan"}   # the right version, the wrong shape
    entry.write_text(json.dumps(data))
    again = _tune()
    assert not again.from_cache and first.search.attempts[0].label == again.search.attempts[0].label == "naive"
    assert "malformed tune cache entry" in caplog.text
    assert json.loads(entry.read_text())["result"]["search"]["plan"] != "not a plan"   # stored anew


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="a second user (uid 65534) needs root")
def test_a_tune_cache_folder_another_user_made_is_not_read_nor_written(isolated_cache, monkeypatch, caplog):
    """Another user makes the tune folder first (under a shared TURBOTRAIN_CACHE) and plants a plan under this
    call's key: it is not served, nothing is written there, and tuning runs and says why."""
    _tune()
    (entry,) = isolated_cache.glob("*.json")
    planted = json.loads(entry.read_text())
    planted["result"]["plan"] = {"precision": "bf16-mixed", "compile": True}
    shared = Path(tempfile.mkdtemp(prefix="tt-test-shared-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        os.chmod(shared, 0o1777)
        monkeypatch.setenv("TURBOTRAIN_CACHE", str(shared))
        folder = shared / "tune"

        def plant() -> int:
            folder.mkdir(mode=0o777)
            (folder / entry.name).write_text(json.dumps(planted))
            return 0
        assert as_user(ATTACKER, plant) == 0
        result = _tune()
        assert not result.from_cache and result.cache_path is None
        assert result.plan.compile is False   # the planted plan (bf16 + compile) was not served
        assert [p.name for p in folder.iterdir()] == [entry.name]       # and nothing was written beside it
        assert "tune cache directory" in caplog.text
    finally:
        shutil.rmtree(shared)
