"""Shared fixtures. Tiny models and loaders live in ``tests/tiny.py``."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _private_turbotrain_cache(tmp_path, monkeypatch):
    """Nothing a test tunes lands in (or is answered from) the user's ~/.cache/turbotrain."""
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "turbotrain-cache"))


@pytest.fixture(autouse=True)
def _restore_global_torch_state():
    """Speed-ups flip process-wide flags; each test starts from torch's defaults."""
    flags = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    threads = torch.get_num_threads()
    yield
    torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    torch.set_num_threads(threads)

