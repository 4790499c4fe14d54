"""The recording core driven by synthetic hook calls and a fake clock: each test runs in milliseconds.

The clock's exclusive times, the step boundaries (one optimizer, two, a hand-written update, watch.step()),
warm-up and its extension for queued batches, the window's extension for periodic work, the Recording's
round trips, and every note a report prints about how the run went.
"""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from turbotrain.doctor import DoctorOptions, analyse
from turbotrain.doctor.record.clock import PhaseClock
from turbotrain.doctor.record.out_of_memory import OutOfMemory
from turbotrain.doctor.record.recording import GpuPhases, from_json, to_json
from turbotrain.doctor.record.steps import Stop, StepTracker
from turbotrain.doctor.record.tallies import Tallies
from turbotrain.doctor.record.recorder import Recorder
from turbotrain.doctor.record.tallies import LoaderTally
from turbotrain.doctor.record.runner import ScriptRun
from turbotrain.doctor.sites import Site
from fakes import FakeClock, FakeOptimizer

pytestmark = pytest.mark.one_core  # one process, one thread: run beside one other such test (tests/conftest.py)


# -- the clock -------------------------------------------------------------------------------------

def test_nested_phases_are_charged_exclusively():
    now = FakeClock()
    clock = PhaseClock(now)
    clock.push("forward")
    now.tick(3)
    clock.push("sync")
    now.tick(2)
    assert clock.pop() == 2
    now.tick(1)
    assert clock.pop() == 4  # its own time: 3 before the sync, 1 after
    assert dict(clock.acc) == {"forward": 4, "sync": 2}
    assert clock.idle


def test_a_popped_phase_can_be_charged_as_another_or_given_back():
    now = FakeClock()
    clock = PhaseClock(now)
    clock.push("forward")
    clock.push("h2d")
    now.tick(2)
    clock.pop(record_as="sync")  # a copy that went to the host is a sync
    clock.push("h2d")
    now.tick(5)
    clock.pop(record_as=None)    # a .to(dtype) that copied nothing: its time is the forward's
    now.tick(1)
    clock.pop()
    assert dict(clock.acc) == {"forward": 6, "h2d": 0, "sync": 2}


def test_timed_so_far_includes_the_running_phase_and_a_cut_splits_it():
    now = FakeClock()
    clock = PhaseClock(now)
    clock.push("data")
    now.tick(2)
    assert clock.timed_so_far() == 2
    closed = clock.acc
    fresh: dict = __import__("collections").defaultdict(float)
    now.tick(1)
    clock.cut(now(), fresh)
    now.tick(4)
    assert clock.pop() == 4  # only what it ran after the cut is the new step's own time
    assert closed["data"] == 3 and fresh["data"] == 4


def test_spans_open_and_close_with_their_phase():
    opened, closed = [], []

    class Spans:
        def open(self, phase):
            opened.append(phase)
            return phase

        def close(self, span):
            closed.append(span)

    clock = PhaseClock(FakeClock())
    clock.spans = Spans()
    clock.push("forward")
    clock.push("sync")
    clock.pop()
    clock.end_spans()  # the profiler window ends while the forward runs
    clock.pop()
    assert opened == ["forward", "sync"] and closed == ["sync", "forward"]


# -- step boundaries ---------------------------------------------------------------------------------

def _tracker(sees_construction=False):
    now = FakeClock()
    closed = []
    tracker = StepTracker(PhaseClock(now), Tallies(), closed.append, sees_construction)
    return tracker, now, closed


def _optimizer_step(tracker, now, optimizer, seconds=1.0):
    tracker.before_optimizer_step(optimizer)
    now.tick(seconds)
    tracker.after_optimizer_step(optimizer)


def test_the_first_step_closes_when_its_optimizer_steps_again_the_others_at_once():
    tracker, now, closed = _tracker()
    opt = FakeOptimizer()
    for _ in range(3):
        tracker.clock.push("data")
        now.tick(2)
        tracker.clock.pop()
        now.tick(5)  # untimed compute
        _optimizer_step(tracker, now, opt)
    # The first step's end is known only when the optimizer steps again; from then on the optimizers that
    # stepped in a step are known, and the step closes as soon as they all stepped.
    assert [s.index for s in closed] == [0, 1, 2]
    assert closed[0].end == closed[1].start
    assert closed[1].duration == 8 and closed[1].phases == {"data": 2, "optimizer": 1}


def test_two_optimizers_make_one_step():
    tracker, now, closed = _tracker()
    gen, disc = FakeOptimizer(), FakeOptimizer()
    for _ in range(4):
        now.tick(1)
        _optimizer_step(tracker, now, disc)
        now.tick(1)
        _optimizer_step(tracker, now, gen)
    assert [s.optimizers for s in closed] == [2, 2, 2, 2]
    assert all(s.duration == 4 for s in closed[1:])


def test_without_an_optimizer_the_backward_delimits_and_the_update_is_timed():
    tracker, now, closed = _tracker(sees_construction=True)
    for _ in range(3):
        tracker.step_starts()   # a data fetch opens the next step
        now.tick(2)
        tracker.after_backward()
        now.tick(3)             # the hand-written update
    tracker.step_starts()
    assert tracker.delimiter == "loss.backward()"
    assert len(closed) == 3 and all(s.phases == {"update": 3} for s in closed)


def test_watch_step_marks_steps_and_ends_the_script_once_stopping():
    tracker, now, closed = _tracker()
    now.tick(1)
    tracker.mark_step()
    assert tracker.delimiter == "watch.step()" and closed[0].duration == 1
    tracker.stopping = True
    with pytest.raises(Stop):
        tracker.mark_step()


# -- the window --------------------------------------------------------------------------------------

def _fake_recorder(**kwargs):
    recorder = Recorder(capture=False, **kwargs)
    now = FakeClock()
    recorder.clock.now = now
    recorder.tracker.restart()
    return recorder, now


def _run_steps(recorder, now, count, opt, eval_at=(), step_s=0.01, eval_s=0.5):
    done = 0
    try:
        for i in range(count):
            if i in eval_at:
                recorder.clock.push("eval")
                now.tick(eval_s)
                recorder.clock.pop()
            now.tick(step_s)
            _optimizer_step(recorder.tracker, now, opt, 0.001)
            done += 1
    except Stop:
        return "stopped", done
    return "finished", done


def test_the_window_ends_the_script_after_warm_up_measured_and_profiled_steps():
    recorder, now = _fake_recorder(measure=5, warmup=2, profile=0)
    status, _ = _run_steps(recorder, now, 50, FakeOptimizer())
    assert status == "stopped" and len(recorder.steps) == 7


def _fed_by_workers(recorder, workers, prefetch_factor):
    """A DataLoader with workers, iterated in the first step."""
    loader = LoaderTally(None, None, {"num_workers": workers, "prefetch_factor": prefetch_factor})
    loader.nexts.add(0, 0.001)
    recorder.tallies.loaders[1] = loader


def test_warm_up_is_extended_by_the_batches_workers_queue():
    recorder, now = _fake_recorder(measure=4, warmup=2, profile=0)
    _fed_by_workers(recorder, 2, 3)
    _run_steps(recorder, now, 50, FakeOptimizer())
    assert recorder.schedule.warmup_extended_by == 6
    assert len(recorder.steps) == 2 + 6 + 4


def test_the_window_is_extended_until_periodic_work_shows_its_period():
    recorder, now = _fake_recorder(measure=6, warmup=1, profile=0)
    # Validation every 5 steps: the 6 measured steps (1-6) hold one, at step 3; the next comes at step 8.
    _run_steps(recorder, now, 50, FakeOptimizer(), eval_at={3, 8, 13})
    recording = recorder.recording()
    assert recording.window.asked == 6 and recording.window.measure == 8
    assert len(recording.steps) == 1 + 8


# -- the Recording -------------------------------------------------------------------------------------

def _small_recording():
    recorder, now = _fake_recorder(measure=20, warmup=2, profile=0)
    site = Site("/work/train.py", 12, "main")
    opt = FakeOptimizer()
    try:
        for _ in range(40):
            recorder.clock.push("sync")
            now.tick(0.002)
            recorder.clock.pop()
            recorder.tallies.tally("sync:item", site).add(recorder.tracker.step_index, 0.002)
            recorder.tallies.gap_samples[site] += 1
            now.tick(0.01)
            _optimizer_step(recorder.tracker, now, opt, 0.001)
    except Stop:
        pass
    return recorder.recording()


def test_a_recording_round_trips_through_json_and_pickle():
    recording = _small_recording()
    assert from_json(to_json(recording)) == recording
    assert pickle.loads(pickle.dumps(recording)) == recording  # noqa: S301 - our own bytes, made one line up
    assert recording.events[0].per_step(list(range(2, 22))) == pytest.approx((1.0, 0.002, 0.0))


def test_device_time_per_phase_and_an_out_of_memory_error_round_trip_through_json():
    # Dicts keyed by a Literal (a step's phases, the device's) come back with their keys as read.
    oom = OutOfMemory("cuda", 2**20, "CUDA out of memory.", Site("/work/train.py", 30, "main"), "backward", 4)
    recording = dataclasses.replace(
        _small_recording(), gpu_phases=(GpuPhases(3, {"forward": 0.004, "optimizer": 0.001}),), out_of_memory=oom
    )
    assert from_json(to_json(recording)) == recording


def test_a_recording_of_twenty_steps_is_small():
    text = to_json(_small_recording())
    assert len(json.loads(text)["steps"]) == 22
    assert len(text) < 16_000, len(text)  # one per rank is gathered in one place


# -- the notes a report prints ---------------------------------------------------------------------------

def _messages(recording, status="stopped", error=None, steps=6, profile_steps=0):
    run = ScriptRun(script="train.py", argv=[], status=status, seconds=1.0, error=error,
                    exit_code=1 if status == "error" else 0)
    options = DoctorOptions(steps=steps, warmup=recording.window.warmup, profile_steps=profile_steps,
                            what_if=False)
    return analyse(recording, None, run, options).messages


def test_the_report_says_the_window_was_extended():
    recorder, now = _fake_recorder(measure=6, warmup=1, profile=0)
    _run_steps(recorder, now, 50, FakeOptimizer(), eval_at={3, 8, 13})
    messages = _messages(recorder.recording())
    assert any("The window was extended from 6 to 8 steps" in m and "every 5 steps" in m for m in messages), messages


def test_the_report_says_warm_up_was_extended():
    recorder, now = _fake_recorder(measure=4, warmup=2, profile=0)
    _fed_by_workers(recorder, 1, 2)
    _run_steps(recorder, now, 50, FakeOptimizer())
    assert any("Warm-up was extended by 2 steps" in m for m in _messages(recorder.recording(), steps=4))


def test_the_report_says_the_script_ended_early_and_no_profiler_ran():
    recorder, now = _fake_recorder(measure=6, warmup=2, profile=2)
    _run_steps(recorder, now, 5, FakeOptimizer())
    messages = _messages(recorder.recording(), status="finished", profile_steps=2)
    assert any("The script ended by itself after 5 optimizer step(s) (10 were asked for" in m for m in messages)
    assert any("No profiler window ran" in m for m in messages)


def test_a_step_too_large_to_profile_leaves_the_window_out_and_says_so():
    """A step that calls modules thousands of times (an LSTMCell over a 1,000-long sequence, twenty times an LBFGS
    step) would make millions of profiler events: gigabytes held, minutes to read."""
    from turbotrain.doctor.record.profiling import EVENTS_PER_MODULE_CALL, PROFILER_EVENTS, profile_steps_for

    per_step = PROFILER_EVENTS // EVENTS_PER_MODULE_CALL  # the module calls whose events fill the budget
    assert profile_steps_for(0, 2) == 2 and profile_steps_for(per_step // 2, 2) == 2
    assert profile_steps_for(per_step // 2 + 1, 2) == 1 and profile_steps_for(per_step + 1, 2) == 0
    recorder, now = _fake_recorder(measure=3, warmup=2, profile=2)
    opt = FakeOptimizer()
    with pytest.raises(Stop):
        for _ in range(20):
            recorder.tracker.open_step.module_calls += 4000  # counted by the module hooks in warm-up
            now.tick(0.01)
            _optimizer_step(recorder.tracker, now, opt, 0.001)
    recording = recorder.recording()
    assert len(recording.steps) == 2 + 3 and not recording.window.profiler_ran  # ended without the profiled steps
    assert recording.window.profile_left_out == 4000 * EVENTS_PER_MODULE_CALL
    messages = _messages(recording, profile_steps=2)
    assert any(m.startswith("No profiler window: a step calls modules 4,000 times") for m in messages), messages


def test_the_report_says_the_script_failed():
    recorder, now = _fake_recorder(measure=6, warmup=2, profile=0)
    _run_steps(recorder, now, 9, FakeOptimizer())
    messages = _messages(recorder.recording(), status="error", error="ValueError: bad batch")
    assert any(m.startswith("The script failed after 8 optimizer step(s): ValueError: bad batch") for m in messages)


def test_the_report_says_too_few_steps_ran_to_skip_warm_up():
    recorder, now = _fake_recorder(measure=6, warmup=3, profile=0)
    _run_steps(recorder, now, 3, FakeOptimizer())
    messages = _messages(recorder.recording(), status="finished")
    assert any("Too few steps ran to skip the warm-up" in m for m in messages), messages


def test_a_threads_cpu_time_is_read_per_step_from_one_open_schedstat():
    """The comm hooks note the script thread's CPU time at every all-reduce: one file kept open, read again."""
    import os
    import time

    from turbotrain.doctor.record.collectives import ThreadCpu

    cpu = ThreadCpu()
    cpu.note(0)
    if cpu._fd is None:
        pytest.skip("no /proc/self/task/<tid>/schedstat here")
    fd, started = cpu._fd, time.process_time()
    while time.process_time() - started < 0.02:  # 20 ms on a CPU
        pass
    cpu.note(1)
    used, waited = cpu.since_last_step(1)
    assert cpu._fd == fd and used is not None and used >= 0.015 and waited is not None and waited >= 0
    assert cpu.since_last_step(2) == (None, None)  # step 2 was never noted
    cpu.follow_this_thread()  # a new thread to follow closes the old file
    assert cpu._fd is None
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_module_is_placed_where_it_is_built_not_at_its_classs_super_init():
    """The patched nn.Module.__init__ runs inside the class's own __init__ (`super().__init__()`): the site of a
    model is the line that builds it (`model = Policy()`, `self.policy = Policy()`), as a finding should name."""
    import sys

    from turbotrain.doctor.record.instrument import _building

    seen = []

    class Base:
        def __init__(self):  # stands in for nn.Module.__init__, patched: its caller is frame 1
            seen.append(_building(sys._getframe(1), self).f_lineno)

    class Policy(Base):
        def __init__(self):
            super().__init__()

    class Agent:
        def __init__(self):
            self.policy = Policy()

    first = sys._getframe().f_lineno + 1
    Policy(), Agent()
    assert seen == [first, Agent.__init__.__code__.co_firstlineno + 1]
