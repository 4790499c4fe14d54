"""Shared fixtures and the suite's split. Tiny models and loaders live in ``tests/tiny.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
# The doctor's tests time real runs and read findings from those times: a test on the other core would make a rank
# late or a loader look slow, so they run alone (`make test` runs the `exclusive` tests first, on one process). A
# doctor test file whose assertions read no time (the patch and the report, what torch.compile did, how a failing
# script or a hostile folder is handled, the bytes a step holds, how processes are forked) says so itself with
# `pytestmark = pytest.mark.reads_no_time`, and runs beside the others.

# Folders whose session-scoped fixtures are expensive (a two-rank launch, nginx): one worker runs the whole folder.
ONE_WORKER_FOLDERS = frozenset({"launch", "data"})


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the marks added here are selected on
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(item.path)
        folder = path.parent.relative_to(TESTS) if path.is_relative_to(TESTS) else None
        if folder == Path("doctor") and item.get_closest_marker("reads_no_time") is None:
            item.add_marker(pytest.mark.exclusive)
        # pytest-xdist (--dist loadgroup): a file's module-scoped fixtures are made once, on one worker (unless its
        # tests say otherwise, with a group of their own).
        if item.get_closest_marker("xdist_group") is not None:
            continue
        top = folder.parts[0] if folder is not None and folder.parts else None
        group = top if top in ONE_WORKER_FOLDERS else str(path.relative_to(TESTS) if folder is not None else path)
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session", autouse=True)
def _warm_commands():
    """warm_command.turbotrain_command's server lives for the session (or the worker) and ends with it."""
    yield
    from warm_command import close_warm_commands

    close_warm_commands()


@pytest.fixture(autouse=True)
def _warm_verify(monkeypatch):
    """--verify in a doctor run in the test's own process forks its runs from the session's server."""
    from turbotrain.doctor.fixes import verify
    from warm_command import verify_start

    monkeypatch.setattr(verify, "WarmStart", verify_start)


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

