"""``with tt.doctor.watch(): ...``: the doctor around a loop in a notebook or a script, no CLI needed.

    import turbotrain as tt
    with tt.doctor.watch(steps=20) as doctor:    # ends the loop after 3 warm-up + 20 + 2 steps
        for x, y in loader:
            ...
            optimizer.step()
    doctor.report.findings                       # also printed when the block ends

Steps are optimizer steps, as with the CLI. A loop without a torch optimizer calls
``doctor.step()`` at the end of each step instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Iterator

from .diagnose import DoctorOptions, analyse
from .record.recorder import Recorder, Stop
from .report.model import Report
from .record.runner import ScriptRun, error_site_of
from .sites import is_user_file

__all__ = ["watch", "Watch"]


@dataclass
class Watch:
    recorder: Recorder
    report: Report | None = None
    options: DoctorOptions = field(default_factory=DoctorOptions)

    def step(self) -> None:
        """Mark the end of a training step (only for loops that do not call a torch optimizer)."""
        self.recorder.mark_step()


def _caller_file() -> str | None:
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame.f_code.co_filename
        frame = frame.f_back
    return None


@contextlib.contextmanager
def watch(
    steps: int | None = None,
    warmup: int = 2,
    profile_steps: int = 2,
    what_if: bool = True,
    what_if_budget_s: float | None = None,
    compile: bool = False,
    print_report: bool = True,
    json: str | None = None,
    html: str | None = None,
    trace: str | None = None,
) -> Iterator[Watch]:
    """Record the training steps run inside the block and report on them when it ends.

    ``steps``: measure this many steps after ``warmup``, profile ``profile_steps`` more, then end
    the block (the loop stops there, nothing after it inside the block runs). None records
    until the block ends by itself. An exception from the block is reported (with where it
    came from) and then re-raised.
    """
    options = DoctorOptions(  # checked as the command's are: watch(steps=0) is an error naming steps
        steps=steps if steps is not None else 1,
        warmup=warmup,
        profile_steps=profile_steps,
        what_if=what_if,
        what_if_budget_s=what_if_budget_s,
        compile=compile,
        trace_path=trace,
    )
    # The block ends after exactly warm-up + steps + profile steps: no watch of the step clock beyond them.
    recorder = Recorder(measure=steps, warmup=warmup, profile=profile_steps, stop=steps is not None, watch_s=0.0)
    handle = Watch(recorder=recorder, options=options)
    script = _caller_file()
    run = ScriptRun(script=script or "<watch>", argv=[], status="finished", seconds=0.0)
    started = time.perf_counter()
    error: BaseException | None = None
    recorder.install()
    try:
        yield handle
    except Stop:
        run.status = "stopped"
    except BaseException as exc:  # noqa: BLE001 - reported below, then re-raised
        error = exc
        run.status, run.exit_code = "error", 1
        run.error = f"{type(exc).__name__}: {exc}"
        run.error_site = error_site_of(exc.__traceback__)
    finally:
        recorder.uninstall()
        run.seconds = time.perf_counter() - started
    if steps is None:
        # Every step after warm-up counts; the report compares with what ran, not with a target.
        options = dataclasses.replace(
            options, steps=max(1, len(recorder.steps) - warmup - len(recorder.profiled_steps))
        )
        handle.options = options
    report = analyse(
        recorder.recording(), recorder.live_objects(), run, options, script=script, run_seconds=run.seconds
    )
    handle.report = report
    from .report.outputs import write_reports

    write_reports(report, json=json, html=html)  # one that cannot be written is a failure in the report
    if print_report:
        from .report.terminal import print_report as show

        show(report)
    if error is not None:
        raise error
