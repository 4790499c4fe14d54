"""Shared fixtures and the suite's split. Tiny models and loaders live in ``tests/tiny.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
# The doctor's tests time real runs and read findings from those times: a test on the other core would make a rank
# late or a loader look slow, so they run alone (`make test` runs the `exclusive` tests first, on one process). A
# doctor test file whose assertions read no time (the patch and the report, what torch.compile did, how a failing
# script or a hostile folder is handled, the bytes a step holds, how processes are forked) says so itself with
# `pytestmark = pytest.mark.reads_no_time`, and runs beside the others. One whose runs need one core only (the script
# in the test's own process on one intra-op thread, no DataLoader workers and no ranks: its trials' processes, if any,
# run one at a time) says `pytest.mark.one_core`: `make test` runs those two at a time, each pytest-xdist worker on a
# core of its own (TURBOTRAIN_TEST_ONE_CORE=1), where the doctor sees a one-core machine with no neighbour, since it
# reads the load of the cores it may run on only (hardware.sample_load).
ONE_CORE_ENV = "TURBOTRAIN_TEST_ONE_CORE"

# Folders whose session-scoped fixtures are expensive (a two-rank launch, nginx): one worker runs the whole folder.
ONE_WORKER_FOLDERS = frozenset({"launch", "data"})


def pytest_configure(config):
    """In `make test`'s one-core part, each pytest-xdist worker (and all it starts) keeps to one core of its own."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if os.environ.get(ONE_CORE_ENV) == "1" and worker is not None:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(worker.removeprefix("gw")) % len(cores)]})


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the marks added here are selected on
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(item.path)
        folder = path.parent.relative_to(TESTS) if path.is_relative_to(TESTS) else None
        doctor_timing = folder == Path("doctor") and item.get_closest_marker("reads_no_time") is None
        if doctor_timing or item.get_closest_marker("one_core") is not None:
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


@pytest.fixture
def worker_tmp():
    """A temporary root of the test's own for processes whose DataLoader workers are killed or terminated (each leaves
    its multiprocessing folder, pymp-*, in the root), removed after the test. Short, in the system's temporary root:
    a worker binds a socket under it, and a socket's path holds at most 107 bytes, which pytest's tmp_path under
    pytest-xdist (/tmp/pytest-of-USER/pytest-N/popen-gwK/test_name0/) leaves too little of."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="tt-")
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _restore_global_torch_state():
    """Speed-ups flip process-wide flags; each test starts from torch's defaults."""
    flags = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    threads = torch.get_num_threads()
    yield
    torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    torch.set_num_threads(threads)

