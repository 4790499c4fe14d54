"""Fixtures for the tuner's tests (the root conftest already gives every test a private cache)."""

from __future__ import annotations

import pytest


@pytest.fixture
def isolated_cache(tmp_path):
    """Where this test's tune cache lives: the root conftest points TURBOTRAIN_CACHE at it."""
    return tmp_path / "turbotrain-cache" / "tune"
