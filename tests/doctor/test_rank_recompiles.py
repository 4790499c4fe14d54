"""A rank that recompiles where the others do not is a straggler with a cause (issue 47): on two rank recordings
built by hand, the straggler's cause is its recompiles (or its eager run after the recompile limit) only where the
other rank did not compile the same; the rule's finding, the JSON's ranks and the recorder's compile times."""

from __future__ import annotations

import dataclasses

import pytest

from doctor_helpers import rank_recording
from turbotrain.doctor.analysis.ranks import analyse_ranks
from turbotrain.doctor.record.compile_watch import (
    NEW_SHAPE,
    CompiledCode,
    CompileFacts,
    CompileSpan,
    Fallback,
    Recompile,
)
from turbotrain.doctor.record.recording import Recording
from turbotrain.doctor.sites import Site

STEPS = 9  # rank_recording: step i runs from 100 + i * 40 ms; step 0 is the warm-up
CALL = Site("/home/me/train.py", 30, "<module>")
GUARD = "tensor 'L['x']' size mismatch at index 1. expected 16, actual 17"


def compiled(recompile_steps: range, limit_step: int | None = None) -> CompileFacts:
    """A compiled forward: its first compile in step 0, a 20 ms recompile in each of ``recompile_steps`` and, at
    ``limit_step``, the compile that hit the recompile limit."""
    start = {i: 100.0 + i * 0.040 + 0.002 for i in range(STEPS)}
    recompiles = tuple(
        Recompile(f"0/{n}", NEW_SHAPE, GUARD, GUARD, None, CALL, 0.020) for n, _ in enumerate(recompile_steps, 1)
    )
    spans = [CompileSpan("0/0", start[0], 0.030, "first")]
    spans += [CompileSpan(r.compile_id, start[i], r.seconds, "recompile") for r, i in zip(recompiles, recompile_steps)]
    fallback = None
    if limit_step is not None:
        fallback = Fallback("recompile_limit", 8, NEW_SHAPE, GUARD, CALL)
        spans.append(CompileSpan("0/9", start[limit_step], 0.001, "limit"))
    code = CompiledCode("forward", Site("/home/me/train.py", 12, "forward"), CALL, compiles=1 + len(recompiles),
                        graphs=1 + len(recompiles), breaks=(), recompiles=recompiles, first_compile_s=0.030,
                        fallback=fallback)
    return CompileFacts(codes=(code,), graphs=code.graphs, recompiles=len(recompiles),
                        compile_s=sum(s.seconds for s in spans), fell_back=int(fallback is not None),
                        spans=tuple(spans))


def rank(r: int, late: bool, facts: CompileFacts | None) -> Recording:
    """Rank ``r`` of two: the late one waits 1 ms a step at the all-reduce, the other 21 ms; the late one's forward
    runs 21 ms against 1 ms."""
    rec = rank_recording(r, [1.0] * STEPS, [1.0 if late else 21.0] * STEPS)
    forward = {"forward": 0.021 if late else 0.001}
    steps = tuple(dataclasses.replace(s, phases={**s.phases, **forward}) for s in rec.steps)
    return dataclasses.replace(rec, steps=steps, compiled=facts)


def test_a_rank_late_from_recompiles_only_it_made_is_the_straggler_with_that_cause():
    plain = analyse_ranks([rank(0, False, None), rank(1, True, None)])
    assert plain is not None and plain.straggler is not None and plain.straggler.cause == "compute"
    job = analyse_ranks([rank(0, False, compiled(range(0))), rank(1, True, compiled(range(1, STEPS)))])
    assert job is not None and job.straggler is not None
    s = job.straggler
    assert (s.rank, s.cause, s.site) == (1, "recompile", CALL)
    assert s.compile is not None and s.compile.recompiles == STEPS - 1 and not s.compile.eager_in_window
    # Step 0's first compile is the warm-up's.
    assert s.compile.window_s == s.compile.recompile_s == pytest.approx(0.020 * (STEPS - 1))
    assert (s.compile.guard, s.compile.kind) == (GUARD, NEW_SHAPE)
    other = job.ranks[0].compile
    assert other is not None and (other.recompiles, other.window_s, other.run_recompiles) == (0, 0.0, 0)


def test_ranks_that_recompile_alike_leave_the_cause_to_the_work():
    facts = compiled(range(1, STEPS))
    job = analyse_ranks([rank(0, False, facts), rank(1, True, facts)])
    assert job is not None and job.straggler is not None
    assert (job.straggler.rank, job.straggler.cause, job.straggler.compile) == (1, "compute", None)


def test_a_rank_eager_after_the_recompile_limit_where_the_other_runs_compiled_is_late_from_it():
    job = analyse_ranks([rank(0, False, compiled(range(0))), rank(1, True, compiled(range(0), limit_step=0))])
    assert job is not None and job.straggler is not None
    s = job.straggler
    assert s.cause == "recompile" and s.compile is not None and s.compile.eager_in_window
    assert (s.compile.recompiles, s.compile.guard, s.site) == (0, GUARD, CALL)
    # A limit hit after the window ends did not make the window eager.
    late = dataclasses.replace(compiled(range(0), limit_step=0), spans=(CompileSpan("0/9", 999.0, 0.001, "limit"),))
    job = analyse_ranks([rank(0, False, compiled(range(0))), rank(1, True, late)])
    assert job is not None and job.straggler is not None and job.straggler.cause == "compute"


def test_the_straggler_finding_and_the_json_say_the_recompiles():
    from turbotrain.doctor.analysis.context import build_context
    from turbotrain.doctor.report.ranks import ranks_json
    from turbotrain.doctor.rules import evaluate

    recs = [rank(0, False, compiled(range(0))), rank(1, True, compiled(range(1, STEPS)))]
    ctx = build_context(dataclasses.replace(recs[0], job=tuple(recs)))
    (finding,) = evaluate(ctx, only=["straggler"])
    assert finding.category == "recompile" and finding.site == CALL
    assert f"{STEPS - 1} recompile(s) in the measured steps, 0.16 s of compiling" in finding.message
    assert GUARD in finding.message and "train.py:30" in finding.message
    assert "dynamic=True" in finding.fix.pytorch and "rank 1" in finding.fix.pytorch
    said = finding.evidence.to_dict()["recompile"]
    assert (said["recompiles"], said["others_recompiles"], said["compile_ms"]) == (STEPS - 1, 0, 160.0)
    assert ctx.job is not None
    ranks = ranks_json(ctx.job, "/home/me")["ranks"]
    assert [r["compile"]["recompiles"] for r in ranks] == [0, STEPS - 1]
    assert ranks[1]["compile"]["where"] == "train.py:30" and ranks[1]["compile"]["window_ms"] == 160.0


def test_the_recorder_puts_each_compile_on_the_step_clock_a_backward_of_its_forwards_kind():
    from turbotrain.doctor.record.compile_watch import _build_facts, _Entry

    code = ("/home/me/train.py", 12, "forward")

    def entry(compile_id, forward, start, recompile=None, fail=""):
        return _Entry(compile_id, 0, forward, code, 0.1, True, recompile, fail, (CALL,), start=start)

    facts = _build_facts(
        [entry("0/0", True, 1000.0), entry("0/0", False, 1000.5), entry("0/1", True, 1002.0, f"0/1: {GUARD}"),
         entry("0/1", False, None, f"0/1: {GUARD}"), entry("0/2", True, 1003.0, fail="recompile limit exceeded")],
        [],
        offset=900.0,
    )
    assert [(s.compile_id, s.start, s.kind) for s in facts.spans] == [
        ("0/0", 100.0, "first"), ("0/0", 100.5, "first"), ("0/1", 102.0, "recompile"), ("0/2", 103.0, "limit")]


def test_the_terminals_compile_section_names_its_rank_and_a_rank_that_recompiled_more():
    from turbotrain.doctor.report.model import Report
    from turbotrain.doctor.report.terminal import compiled_lines

    recs = [rank(0, False, compiled(range(0))), rank(1, True, compiled(range(1, STEPS), limit_step=STEPS - 1))]
    job = analyse_ranks(recs)
    report = Report(status="ok", breakdown=None, findings=[], compiled=recs[0].compiled, base="/home/me", ranks=job)
    lines = compiled_lines(report)
    assert lines[0].startswith("torch.compile (rank 0): 0.0 s compiling; 1 graphs, 0 graph breaks, 0 recompiles")
    assert lines[-1] == (f"  rank 1: {STEPS - 1} recompiles in its run, 0.2 s compiling in the measured steps; "
                         "hit the recompile limit, eager since")
    # Ranks that compiled alike: nothing past the first rank's lines.
    alike = analyse_ranks([rank(0, False, recs[1].compiled), rank(1, True, recs[1].compiled)])
    report = dataclasses.replace(report, compiled=recs[1].compiled, ranks=alike)
    assert not any(line.startswith("  rank ") for line in compiled_lines(report))


def by_step(r: int, own: tuple[int, ...], others: tuple[int, ...], facts: CompileFacts | None) -> Recording:
    """Rank ``r`` of two, late only in ``own`` steps (its forward 21 ms, its wait 1 ms) and waiting 21 ms in
    ``others`` (the other rank late there); 1 ms of forward and of wait in every other step."""
    exposed = [21.0 if i in others else 1.0 for i in range(STEPS)]
    rec = rank_recording(r, [1.0] * STEPS, exposed)
    steps = tuple(dataclasses.replace(s, phases={**s.phases, "forward": 0.021 if s.index in own else 0.001})
                  for s in rec.steps)
    return dataclasses.replace(rec, steps=steps, compiled=facts)


def test_a_rank_late_only_in_the_steps_it_recompiles_is_the_straggler_in_those_steps():
    late = (2, 5, 7)
    plain = analyse_ranks([by_step(0, (), late, None), by_step(1, late, (), None)])
    assert plain is not None and plain.straggler is None  # not late in 3 steps of 4: no steady straggler
    job = analyse_ranks([by_step(0, (), late, compiled(range(0))), by_step(1, late, (), compiled(late))])
    assert job is not None and job.straggler is not None
    s = job.straggler
    assert (s.rank, s.cause, s.site, s.periodic) == (1, "recompile", CALL, True)
    assert s.last_share == pytest.approx(3 / (STEPS - 1)) and s.compile is not None and s.compile.recompiles == 3
    # The others' 20 ms wait in those three steps, averaged over the eight measured ones.
    assert s.cost_s == pytest.approx(3 * 0.020 / (STEPS - 1))


def test_ranks_late_in_turns_each_in_the_steps_it_recompiles_are_uneven_work_from_recompiles():
    from turbotrain.doctor.analysis.context import build_context
    from turbotrain.doctor.report.ranks import ranks_json
    from turbotrain.doctor.rules import evaluate

    zero, one = (2, 6), (3, 5, 7)
    recs = [by_step(0, zero, one, compiled(zero)), by_step(1, one, zero, compiled(one))]
    job = analyse_ranks(recs)
    assert job is not None and job.straggler is None and job.imbalance is not None
    u = job.imbalance
    assert u.cause == "recompile" and u.evidenced and u.compile_gap_s == pytest.approx(5 * 0.020 / (STEPS - 1))
    assert u.recompiled is not None and u.recompiled.recompiles == 3  # rank 1's: the most
    # The same turns without compile data: a phase, capped low (the batches are one size).
    plain = analyse_ranks([by_step(0, zero, one, None), by_step(1, one, zero, None)])
    assert plain is not None and plain.imbalance is not None and plain.imbalance.cause == "compute"
    ctx = build_context(dataclasses.replace(recs[0], job=tuple(recs)))
    (finding,) = evaluate(ctx, only=["uneven-work"])
    assert finding.category == "recompile" and finding.site == CALL and finding.severity != "low"
    assert "recompiles in the measured steps: rank 0 2, rank 1 3" in finding.message and GUARD in finding.message
    assert "dynamic=True" in finding.fix.pytorch
    said = finding.evidence.to_dict()
    assert (said["recompiles"], said["where"], said["compile_gap_ms"]) == (3, CALL.where(None), 12.5)
    assert ctx.job is not None
    assert ranks_json(ctx.job, "/home/me")["imbalance"]["compile_gap_ms"] == 12.5
