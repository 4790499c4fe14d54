"""The read counters a process shares with its workers leave nothing on disk, whatever kills it (issue 43)."""

from __future__ import annotations

import glob
import os
import signal
import tempfile

from turbotrain.data import stats


def test_a_process_killed_after_counting_reads_leaves_no_counter_file():
    pattern = os.path.join(tempfile.gettempdir(), "turbotrain-reads-*")
    before = set(glob.glob(pattern))
    pid = os.fork()
    if pid == 0:  # the child counts a read in a counter file of its own, then dies as a SIGKILL leaves it
        os.environ.pop(stats.ENV_VAR, None)
        counters = stats._CounterFile()
        counters.add("https", 123, 0.01)
        ok = counters.read().schemes["https"].bytes == 123
        os.kill(os.getpid(), signal.SIGKILL if ok else signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL  # it counted, then was killed
    assert set(glob.glob(pattern)) == before
