"""`make test`'s one-core part: each pytest-xdist worker, and every process it starts, keeps to one core, and the
doctor's load readings cover that core only (so the other worker is no neighbour of its runs)."""

import os
import subprocess
import sys

import pytest

from turbotrain.hardware import sample_load

pytestmark = pytest.mark.one_core
ONE_CORE_ENV = "TURBOTRAIN_TEST_ONE_CORE"  # what `make test` sets for its one-core part (tests/conftest.py)


@pytest.mark.skipif(os.environ.get(ONE_CORE_ENV) != "1" or "PYTEST_XDIST_WORKER" not in os.environ,
                    reason="only in make test's one-core part (pinned pytest-xdist workers)")
def test_a_one_core_worker_and_its_children_keep_to_one_core():
    (core,) = os.sched_getaffinity(0)
    child = subprocess.run([sys.executable, "-c", "import os; print(*os.sched_getaffinity(0))"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.split() == [str(core)]
    assert sample_load().cpus == 1
