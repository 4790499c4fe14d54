"""The doctor end to end: record the run, read it, apply the rules, measure the fixes, report."""

from __future__ import annotations

import dataclasses
import os
import time

from .analysis.context import Context, build_context
from .record.process_starts import KIND as PROCESS_START
from .record.profiling import EVENTS_PER_MODULE_CALL
from .record.recording import LiveObjects, Recording
from .analysis.machine import noise_state
from .record.recorder import Recorder
from .lifeline import guarded
from .report.files import check_outputs, write_output
from .report.model import Report, ReportStatus
from .report.ranks import reducer_disagreement
from .rules import evaluate, order
from .analysis.periodic import watch_message
from .report.tables import copy_table, sync_table
from .job.own_ranks import StartsRanks, refusing_own_ranks
from .job.spawned_ranks import as_typed, refusing_spawned_ranks
from .record.memory_limit import memory_limit
from .record.process_group import process_group_kept
from .record.runner import ScriptRun, run_script
from .options import DoctorOptions
from .findings import framework_named
from .sites import Site, relative_where

__all__ = ["DoctorOptions", "diagnose_script", "diagnose_job", "analyse", "script_in"]


@guarded()  # what it starts and the temporary folders it makes end with it, whatever ends it
def diagnose_script(
    script: str | os.PathLike, argv: list[str] | None = None, options: DoctorOptions | None = None
) -> Report:
    """Run ``script`` with ``argv`` under the doctor and return its report."""
    options = options or DoctorOptions()
    with memory_limit(options.memory_limit_bytes):  # counted from here: the script's own memory is what counts
        return _diagnose_script(script, list(argv or []), options)


def _diagnose_script(script: str | os.PathLike, argv: list[str], options: DoctorOptions) -> Report:
    check_outputs(str(script), {"--fix": options.fix, "--trace": options.trace_path})
    recorder = Recorder(
        measure=options.steps,
        warmup=options.warmup,
        profile=options.profile_steps,
        sees_construction=True,
        watch_s=options.watch_s,
        record_s=options.record_budget_s or None,
    )
    started = time.perf_counter()
    environ = dict(os.environ)
    # The copies the doctor steps after the script may all-reduce (a one-process DDP job's optimizer): the
    # script's process group outlives it until then.
    with process_group_kept():
        try:
            with refusing_own_ranks(), refusing_spawned_ranks():
                run = run_script(script, argv, recorder)
        except StartsRanks as started_ranks:
            as_job = started_ranks
        else:
            return analyse(
                recorder.recording(),
                recorder.live_objects(),
                run,
                options,
                script=str(script),
                run_seconds=time.perf_counter() - started,
            )
    # Lightning set its rank variables in this process before it started the others: the job starts clean.
    os.environ.clear()
    os.environ.update(environ)
    report = diagnose_job(as_job.command(str(script), argv), options)
    report.argv = argv
    report.messages.insert(0, as_job.said(os.path.dirname(os.path.realpath(script))))
    return report


def script_in(command: list[str]) -> str | None:
    """The training script a launcher command runs: its first argument that is a ``.py`` file."""
    return next((arg for arg in command if arg.endswith(".py") and os.path.isfile(arg)), None)


@guarded()
def diagnose_job(command: list[str], options: DoctorOptions | None = None) -> Report:
    """Run a multi-process job (``command``: a launcher such as torchrun and its arguments) with every rank
    recorded, and return one report for the whole job: rank 0's breakdown and findings, every rank side by
    side, the straggler and the exposed communication. A rank that crashes or hangs ends the job; the report
    then says which rank and what it was doing."""
    options = options or DoctorOptions()
    with memory_limit(options.memory_limit_bytes):  # the job's runs (run_job) pass it to every rank
        return _diagnose_job(command, options)


def _diagnose_job(command: list[str], options: DoctorOptions) -> Report:
    from .analysis.ranks import analyse_ranks
    from .job.launcher import run_job

    check_outputs(script_in(command), {"--fix": options.fix, "--trace": options.trace_path})
    started = time.perf_counter()
    job = run_job(
        command,
        steps=options.steps,
        warmup=options.warmup,
        profile=options.profile_steps,
        hang_timeout_s=options.hang_timeout_s,
    )
    seconds = time.perf_counter() - started
    script = script_in(command)
    recordings = job.recordings
    lead = next((r for r in job.ranks if r.recording is not None), None)
    if job.failure is not None or lead is None or lead.recording is None:
        failure = job.failure or (
            "No rank sent a recording. The doctor records the Python processes the launcher "
            "starts with RANK or LOCAL_RANK set that run a script file (python train.py); "
            "ranks started as python -m module are not recorded yet."
        )
        if job.left_behind:
            failure += f" Processes still running after the clean-up: {job.left_behind}."
        run = ScriptRun(
            script=script or command[0],
            argv=list(command),
            status="error",
            seconds=seconds,
            error=failure,
            exit_code=job.returncode or 1,
        )
        return Report(
            status="error",
            breakdown=None,
            findings=[],
            script=relative_where(os.path.realpath(script)) if script else None,
            argv=list(command),
            run=run,
            steps_requested=options.steps,
            warmup_steps=options.warmup,
            messages=[failure],
            doctor_seconds={"run": seconds},
        )
    info = lead.run or {}
    run = ScriptRun(
        script=script or command[0],
        argv=list(command),
        status=str(info.get("status", "finished")),
        seconds=float(info.get("seconds") or seconds),
        error=info.get("error"),
        traceback=info.get("traceback"),
        exit_code=int(info.get("exit_code") or 0),
    )
    recording = dataclasses.replace(lead.recording, job=tuple(recordings))
    # The single-process what-ifs and --fix re-run the model in the doctor's process; a job's fixes are timed
    # below, on every rank, as runs of the whole job.
    single = dataclasses.replace(options, what_if=False, fix=None, verify=False)
    report = analyse(recording, None, run, single, script=script, run_seconds=seconds)
    report.argv = as_typed(command)
    report.ranks = analyse_ranks(recordings)
    for said in (_compute_waits(report, lead.rank), reducer_disagreement(report.ranks) if report.ranks else None):
        if said:
            report.messages.append(said)
    timed = ""
    if options.what_if and job.nodes > 1:
        timed = (
            f"The job spans {job.nodes} nodes: its fixes are not timed (each timing re-runs the whole job, which "
            "would take every node's doctor at once). "
        )
    elif options.what_if:
        timed = _time_on_the_job(command, report, options, seconds)
    world = lead.recording.world_size or len(recordings)
    missing = f" of {world}" if len(recordings) < world else ""
    report.messages.append(
        f"{len(recordings)}{missing} ranks recorded; the step breakdown is rank {lead.rank}'s (the per-rank table "
        f"follows it). {timed}".rstrip()
    )
    if (options.fix or options.verify) and script:
        _job_fixes(command, report, recording, options, script, nodes=job.nodes)
    return report


def _job_fixes(
    command: list[str], report: Report, recording: Recording, options: DoctorOptions, script: str, nodes: int
) -> None:
    """``--fix``/``--verify`` on a job: the edits of the fixes timed on every rank, verified as runs of the job."""
    from .fixes.attach import attach_fixes
    from .fixes.verify_job import JobVerifier

    started = time.perf_counter()
    if nodes > 1 and options.verify:
        options = dataclasses.replace(options, verify=False)
        report.messages.append(f"--verify does not run on a job over {nodes} nodes; the patch is not verified.")
    script_path = os.path.realpath(script)
    ctx = build_context(recording, None, script_path)
    report.fixes = attach_fixes(
        report,
        ctx,
        report.findings,
        options,
        script_path,
        lambda opts: JobVerifier(command, script_path, os.path.dirname(script_path), opts, options.hang_timeout_s),
    )
    report.doctor_seconds["fix"] = time.perf_counter() - started


def _compute_waits(report: Report, rank: int) -> str | None:
    """The bar is one rank's: its compute includes its wait for the others (the gradient all-reduce, FSDP's
    collectives), said here in ms."""
    job = report.ranks
    row = next((r for r in job.ranks if r.rank == rank), None) if job is not None else None
    wait = row.median_s.get("communication", 0.0) if row is not None else 0.0
    if job is None or row is None or wait < 0.05 * row.step_s:
        return None
    return (
        f"Rank {rank}'s compute in the bar includes {wait * 1e3:.1f} ms a step ({wait / row.step_s:.0%}) waiting for "
        f"{job.waited_on}: the comm column of the per-rank table."
    )


def _time_on_the_job(command: list[str], report: Report, options: DoctorOptions, run_s: float) -> str:
    """Time the findings' fixes on every rank (re-runs of the whole job); a sentence on what was timed."""
    from .analysis.machine import noise_floor
    from .requests import JobRequest
    from .whatif.job import JobTiming, job_runner, time_on_the_job, timed_steps

    asked = [f for f in report.findings if isinstance(f.request, JobRequest)]
    if not asked:
        return ""
    started = time.perf_counter()
    step_s = max((r.step_s for r in report.ranks.ranks), default=0.0) if report.ranks else 0.0
    timing = JobTiming(
        job_runner(command, options.hang_timeout_s, timed_steps(step_s)),
        run_s=run_s,
        budget_s=options.job_what_if_budget_s,
        noise_floor=noise_floor(report.machine) if report.machine is not None else 0.0,
        max_rounds=options.job_what_if_rounds,
    )
    time_on_the_job(timing, report.findings, options.job_what_if_rules)
    report.findings = order(report.findings)
    report.doctor_seconds["what_if"] = time.perf_counter() - started
    timed = sum(1 for f in asked if f.measured)
    return f"{timed} of {len(asked)} fixes timed on every rank, as runs of the whole job with and without each. "


def _trained_elsewhere(recording: Recording, base: str | None) -> str | None:
    """Where a run that stepped no optimizer in its own process started processes running its own functions
    (Hogwild!'s ``mp.Process(target=train)``): what they ran, and how to have that measured."""
    starts = [e for e in recording.events if e.kind == PROCESS_START and e.site is not None]
    if not starts:
        return None
    said = "; ".join(
        f"{sum(cell[1] for cell in e.cells)} running {e.detail['target']}() "
        f"({Site(e.detail['file'], e.detail['line'], e.detail['target']).where(base)}), started at {e.site.where(base)}"
        for e in starts
        if e.site is not None
    )
    return (
        f"The script stepped no optimizer in its own process; it started processes that run its code: {said}. "
        "The doctor records the processes it runs and the ranks a script starts (torch.multiprocessing.spawn, "
        "Lightning's and Fabric's DDP), not other processes a script starts itself. To diagnose that training, "
        "run the function in the script's own process for the doctor's run (one process, no multiprocessing)."
    )


def what_if_budget_s(options: DoctorOptions, ctx: Context) -> float:
    """``--what-if-budget``, else sized by the script's step and compiles (:func:`.whatif.common.default_budget_s`)."""
    from .whatif.common import default_budget_s

    if options.what_if_budget_s is not None:
        return options.what_if_budget_s
    return default_budget_s(ctx.step_s, _first_compiles_s(ctx))


def _first_compiles_s(ctx: Context) -> float:
    """Seconds the script's torch.compile took for its first compiles (recompiles left out: a trial compiles once)."""
    facts = ctx.compiled
    return sum(code.first_compile_s for code in facts.codes) if facts is not None else 0.0


def _budget_message(options: DoctorOptions, ctx: Context) -> str | None:
    """Where the step or the script's compiles were long enough to size the what-ifs' budget, the seconds given."""
    from .whatif.common import BUDGET_CAP_S, BUDGET_S, BUDGET_STEPS

    budget = what_if_budget_s(options, ctx)
    if not options.what_if or options.what_if_budget_s is not None or budget <= BUDGET_S:
        return None
    compiles_s = _first_compiles_s(ctx)
    if compiles_s + BUDGET_S > BUDGET_STEPS * ctx.step_s:  # the compile's room set it, not the steps
        why = f"torch.compile took {compiles_s:.3g} s in this run: the what-ifs had {budget:.0f} s, room for one fresh"
        return f"{why} compile beside the other fixes (at most {BUDGET_CAP_S:.0f} s); --what-if-budget SECONDS sets it."
    return (
        f"Steps of {ctx.step_s:.3g} s: the what-ifs had {budget:.0f} s to measure the fixes (the time of "
        f"{BUDGET_STEPS} steps, at most {BUDGET_CAP_S:.0f} s); --what-if-budget SECONDS sets it."
    )


def _messages(recording: Recording, run: ScriptRun | None, ctx: Context | None, requested: int) -> list[str]:
    """The notes a report prints about the run itself: how it ended and how the window moved."""
    out = []
    done, window = len(recording.steps), recording.window
    if run is not None and run.failed:
        where = f" at {run.error_site.where(ctx.base if ctx else None)}" if run.error_site else ""
        out.append(
            f"The script failed{where} after {done} optimizer step(s): {run.error}. "
            "The report shows what was measured before."
        )
    elif run is not None and run.status == "finished" and done < requested:
        out.append(
            f"The script ended by itself after {done} optimizer step(s) ({requested} were asked for, warm-up "
            "and profiling included); the report covers what ran."
        )
    if ctx is not None and ctx.breakdown.warmup_included:
        out.append(
            "Too few steps ran to skip the warm-up: its steps are in the numbers (compile and cache effects included)."
        )
    if ctx is not None and window.asked is not None and window.measure is not None and window.measure > window.asked:
        every = [row for row in ctx.breakdown.periodic if row.every and not row.watched]
        out.append(
            f"The window was extended from {window.asked} to {window.measure} steps to see the period of the "
            "work that recurs between steps"
            + (f" (every {every[0].every} steps)." if every else " (it did not come back within the extension).")
        )
    if window.cut_for_step_s is not None and window.asked is not None and (window.measure or 0) < window.asked:
        profiled = f" (and {window.profile_steps} profiled)" if window.profile_steps else ""
        out.append(
            f"Steps of {window.cut_for_step_s:.3g} s: {window.measure} of the {window.asked} asked were measured"
            f"{profiled}, which fit in --record-budget; --record-budget 0 measures all."
        )
    if window.warmup_extended_by:
        out.append(
            f"Warm-up was extended by {window.warmup_extended_by} steps, the batches the DataLoader's workers "
            "queue ahead (num_workers x prefetch_factor, and those they still held ready after them): a window "
            "that opened on a full queue would not see the loader."
        )
    if window.profile_left_out:
        out.append(
            f"No profiler window: a step calls modules {window.profile_left_out // EVENTS_PER_MODULE_CALL:,} times, "
            f"about {window.profile_left_out:,} profiler events, which would take gigabytes to hold and minutes to "
            "read; no op table or trace (the step's timing stands)."
        )
    elif not window.profiler_ran and done:
        out.append("No profiler window ran (the script stopped first): no op table or trace.")
    watched = watch_message(ctx) if ctx is not None else None
    if watched:
        out.append(watched)
    return out


@guarded()  # watch() analyses here: its what-ifs' processes too
def analyse(
    recording: Recording,
    live: LiveObjects | None,
    run: ScriptRun | None,
    options: DoctorOptions,
    script: str | None = None,
    run_seconds: float = 0.0,
) -> Report:
    """Turn a finished recording into a report (rules, what-ifs, tables, trace)."""
    window = recording.window
    requested = window.warmup + options.steps + options.profile_steps
    script_path = os.path.realpath(script) if script else None
    base = os.path.dirname(script_path) if script_path else None
    timings = {"run": run_seconds}
    if not recording.steps and recording.out_of_memory is None:  # a run that died of one is explained
        message = _trained_elsewhere(recording, base) or (
            "The script never called optimizer.step() nor loss.backward(), so there was no training step to "
            "measure. The doctor marks steps at the optimizer, or at the backward when no optimizer steps; "
            "for anything else, put the loop inside `with turbotrain.doctor.watch() as w:` and call "
            "`w.step()` at the end of each step."
        )
        messages = _messages(recording, run, None, requested) if run is not None and run.failed else []
        return Report(
            status="error" if run is not None and run.failed else "no-steps",
            breakdown=None,
            findings=[],
            script=relative_where(script_path) if script_path else None,
            argv=run.argv if run else [],
            run=run,
            steps_requested=options.steps,
            warmup_steps=options.warmup,
            messages=[*messages, message],
            base=base,
            doctor_seconds=timings,
        )
    started = time.perf_counter()
    ctx = build_context(recording, live, script_path)
    ctx.memory_allowed = options.what_if  # one measured step of copies: a what-if's cost
    ctx.run_steps = recording.steps_run if run is not None and run.status == "finished" else None
    rules_failed: list[tuple[str, str]] = []
    findings = evaluate(ctx, failed=rules_failed)
    timings["rules"] = time.perf_counter() - started
    if options.what_if:
        started = time.perf_counter()
        from .whatif import run_what_ifs

        run_what_ifs(ctx, findings, budget_s=what_if_budget_s(options, ctx), allow_compile=options.compile)
        timings["what_if"] = time.perf_counter() - started
        findings = order(findings)
    trace = trace_failed = None
    profiler = live.profiler if live is not None else None
    if options.trace_path and profiler is not None:
        try:
            # torch's export does not raise on a path it cannot write: the file must be there and not empty.
            write_output(options.trace_path, profiler.export_chrome_trace, nonempty=True)
            trace = str(options.trace_path)
        except Exception as exc:  # noqa: BLE001 - a trace that cannot be written costs the trace, not the report
            trace_failed = (
                f"The trace was not written to {options.trace_path}: {exc}. Give --trace a path in a folder "
                "you can write to."
            )
    status: ReportStatus
    if run is None or run.failed:
        status = "error"
    elif len(recording.steps) < requested and run.status != "stopped":
        status = "incomplete"
    else:
        status = "ok"
    messages = _messages(recording, run, ctx, requested)
    budget_said = _budget_message(options, ctx)
    if budget_said:
        messages.append(budget_said)
    started = time.perf_counter()
    from .report.memory import memory_section

    memory = memory_section(ctx) if live is not None else None
    timings["memory"] = time.perf_counter() - started
    if options.trace_path and trace is None and trace_failed is None:
        messages.append("No trace was written: the script stopped before the profiler window.")
    report = Report(
        status=status,
        breakdown=ctx.breakdown,
        findings=findings,
        device=ctx.device,
        hardware=ctx.hw.summary(),
        script=relative_where(script_path) if script_path else None,
        argv=run.argv if run else [],
        run=run,
        steps_requested=options.steps,
        warmup_steps=window.warmup,
        steps_completed=len(recording.steps),
        messages=messages,
        syncs=sync_table(ctx),
        copies=copy_table(ctx),
        top_ops=list(recording.top_ops),
        trace_path=trace,
        doctor_seconds=timings,
        base=base,
        step_delimiter=recording.step_delimiter,
        periodic=list(ctx.periodic_rows),
        machine=ctx.machine,
        noise=noise_state(ctx.machine) if ctx.machine is not None else None,
        memory=memory,
        compiled=ctx.compiled,
        driver=framework_named(recording.driver),
    )
    for rule_id, error in rules_failed:
        report.fail(
            f"rule {rule_id}",
            f"The rule {rule_id} failed ({error}): what it would find is missing from this report. This is a bug "
            "in turbotrain; please report it with this message.",
        )
    if trace_failed:
        report.fail("trace", trace_failed)
    if (options.fix or options.verify) and script_path:
        started = time.perf_counter()
        from .fixes.attach import attach_fixes

        report.fixes = attach_fixes(report, ctx, findings, options, script_path)
        timings["fix"] = time.perf_counter() - started
    return report
