"""Fixtures for the tuner's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own tune cache, never the user's ~/.cache."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(folder))
    return folder / "tune"
