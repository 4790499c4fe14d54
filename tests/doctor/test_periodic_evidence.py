"""Periodic work needs evidence of work (issue 45): synthetic watches and rows, milliseconds each.

A GAN tutorial redraws a plot every 50 steps (`if step % 50 == 0:`); on a shared machine its watch also saw
two scheduler stalls, and the doctor read "every 7 steps, no line". A character transformer on a machine with
another process spinning had slow steps at 49, 51-54, 84-87 and was told of work "every 1 steps" at x9.26.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from turbotrain.doctor.analysis.periodic import PeriodicRow
from turbotrain.doctor.record.cadence import Cadence
from turbotrain.doctor.record.measurements import StepRecord
from turbotrain.doctor.record.recurring import find_periodic, find_watched
from turbotrain.doctor.record.watch import WatchedRun
from turbotrain.doctor.rules.data.num_workers import _in_periodic_branch
from turbotrain.doctor.rules.loop import periodic_work as periodic_rule
from turbotrain.doctor.sites import Site

PLOT = Site("gan.py", 88, "train")


def _step(index: int, seconds: float) -> StepRecord:
    phases = {"forward": seconds * 0.4, "backward": seconds * 0.4}
    return StepRecord(index, index * 0.02, index * 0.02 + seconds, phases)


def _watch(spikes: dict[int, float], cadences=()) -> tuple[WatchedRun, list[StepRecord]]:
    window = [_step(i, 0.02) for i in range(1, 11)]
    spiked = tuple(_step(i, s) for i, s in spikes.items())
    return WatchedRun(11, 120, 3.0, 0.02, spiked, tuple(cadences), "periods"), window


def test_occurrences_on_the_grid_of_the_loops_test_take_its_period_and_line():
    watched, window = _watch({51: 0.3, 58: 0.08, 59: 0.08, 101: 0.3}, [Cadence(PLOT, 50)])
    [periodic] = find_watched(watched, window)
    assert (periodic.every, periodic.steps, periodic.site) == (50, [51, 101], PLOT)
    assert abs(periodic.cost_s - 0.28) < 1e-9   # the plot's own steps: the two stalls off the grid left out


def test_stalls_with_no_test_of_the_loop_behind_them_have_no_line():
    watched, window = _watch({49: 0.5, 51: 0.5, 52: 0.5, 53: 0.5, 54: 0.5, 84: 0.5, 85: 0.5, 86: 0.5, 87: 0.5})
    [periodic] = find_watched(watched, window)
    assert periodic.every == 1 and periodic.site is None


def _row(every, site, kind="work between steps", share=0.89):
    return PeriodicRow(kind=kind, category="outside_step", every=every, steps=[49, 51, 52], cost_ms=524.1,
                       share=share, where=None, site=site, suggested_every=331)


def test_the_rule_names_work_only_where_the_script_did_some():
    rows = []
    ctx = SimpleNamespace(periodic_rows=rows)  # all the rule reads
    rows[:] = [_row(1, None)]                  # every step: not periodic at all
    assert list(periodic_rule.periodic_work(ctx)) == []
    rows[:] = [_row(7, None)]                  # a period, but nothing of the script's own seen in it
    [noise] = periodic_rule.periodic_work(ctx)
    assert noise.severity == "low" and noise.est_speedup is None and not noise.measured
    assert "no work of the script's own" in noise.message
    rows[:] = [_row(50, PLOT)]                 # the loop's `% 50` test: the script's own work, at its line
    [work] = periodic_rule.periodic_work(ctx)
    assert work.severity == "high" and work.site == PLOT and work.est_speedup > 2
    rows[:] = [_row(20, None, kind="validation")]  # validation the recorder saw: work, though its line is unknown
    [validation] = periodic_rule.periodic_work(ctx)
    assert validation.severity == "high" and validation.message.startswith("Validation every 20 steps")


def test_a_line_in_the_body_of_an_every_n_steps_branch_is_periodic_not_batch_building(tmp_path):
    script = tmp_path / "gan.py"
    script.write_text(
        "for step in range(1000):\n"
        "    batch = make_batch()\n"
        "    if step % 50 == 0:\n"
        "        plt.clf()\n"
        "        plt.plot(losses)\n"
        "    train(batch)\n"
    )
    inside = [_in_periodic_branch(Site(str(script), line, "<module>")) for line in range(1, 7)]
    assert inside == [False, False, True, True, True, False]


def test_every_step_that_ran_the_evaluation_is_an_occurrence_even_one_that_lost_its_cpu():
    """Evaluation every 2 steps on a busy machine: step 3's evaluation waited for a CPU most of its time, and the
    time another process held is not the script's, so alone it falls under the spike line (5 ms of its own
    against 3 x 0 + 28 ms). Read from the clock alone the occurrences were 1, 5, 7: "every 3" (once in a full
    suite run, eval_every_other_step.py); the evaluation's phase shows step 3 ran it too."""
    steps = []
    for i in range(9):
        phases = {"forward": 0.008, "backward": 0.008}
        if i % 2:
            phases["eval"] = 0.08
        start = i * 0.2
        stolen = 0.09 if i == 3 else None
        steps.append(StepRecord(i, start, start + sum(phases.values()), phases, preempted=stolen))
    [periodic] = find_periodic(steps)
    assert periodic.steps == [1, 3, 5, 7] and periodic.every == 2, periodic


# PyTorch's DQN tutorial redraws its plot (plt.pause) when an episode ends: two steps in twenty ran 52 ms before
# their forward against 0.5 ms in the others, with no DataLoader, and the doctor called it batch building.
PAUSE = Site("dqn.py", 159, "plot_durations")
BATCH = Site("dqn.py", 188, "optimize_model")


def _rl_step(index: int, before_forward: float, preempted: float | None = None) -> StepRecord:
    record = StepRecord(index, index * 0.01, index * 0.01 + before_forward + 0.001,
                        {"forward": 0.0005, "backward": 0.0005}, gap_before_forward=before_forward, forwards=1,
                        backwards=1, optimizers=1, preempted=preempted)
    return record


def _rl_context(before: dict[int, float], samples: dict[Site, int], loader=None, preempted=None, others=0.0, rows=()):
    from turbotrain.doctor.analysis.gap_work import occasional_work

    steps = [_rl_step(i, before.get(i, 0.0005), (preempted or {}).get(i)) for i in range(3, 23)]
    ctx = SimpleNamespace(main_loader=loader, gap_samples=samples, measured_steps=[s.index for s in steps],
                          step_records=steps, machine=SimpleNamespace(other_load=others), periodic_rows=list(rows))
    ctx.occasional_work = occasional_work(ctx)  # as Context computes it once, for the rules
    return ctx


def test_work_in_a_few_steps_before_the_forward_is_occasional_work_at_the_sampled_line():
    from turbotrain.doctor.analysis.gap_work import occasional_work

    ctx = _rl_context({6: 0.052, 15: 0.051}, {PAUSE: 50, BATCH: 3})
    work = occasional_work(ctx)
    assert work.site == PAUSE and work.steps == (6, 15) and work.every == 10
    assert abs(work.cost_s - 0.051) < 1e-3 and 0.7 < work.share < 0.8
    [finding] = periodic_rule.occasional(ctx)
    assert finding.site == PAUSE and finding.severity == "high" and finding.measured
    assert "in plot_durations()" in finding.message and "2 of the 20 measured steps" in finding.message
    assert "builds no batch" in finding.message and "less often" in finding.fix.pytorch


def test_steady_untimed_time_slow_steps_of_another_process_or_no_line_are_no_occasional_work():
    from turbotrain.doctor.analysis.gap_work import occasional_work

    steady = _rl_context({i: 0.005 for i in range(3, 23)}, {BATCH: 50})  # batch building every step
    assert occasional_work(steady) is None
    no_line = _rl_context({6: 0.052, 15: 0.051}, {PAUSE: 10, BATCH: 10, Site("dqn.py", 190, "f"): 10})
    assert occasional_work(no_line) is None  # nothing of the script's holds the time
    # a few samples split over the redraw's lines: its function holds them, at its busiest line
    split = _rl_context({6: 0.052, 15: 0.051}, {PAUSE: 2, Site("dqn.py", 152, "plot_durations"): 1, BATCH: 1,
                                              Site("dqn.py", 240, "<module>"): 1})
    assert occasional_work(split).site == PAUSE
    stalled = _rl_context({6: 0.052, 15: 0.051}, {PAUSE: 50}, preempted={6: 0.052, 15: 0.051}, others=1.0)
    assert occasional_work(stalled) is None  # the CPU was another process's: not the script's work
    quiet = _rl_context({6: 0.052, 15: 0.051}, {PAUSE: 50}, preempted={6: 0.04, 15: 0.04})
    assert occasional_work(quiet).steps == (6, 15)  # no other process was busy: the waits were the run's own
    loader = _rl_context({6: 0.052, 15: 0.051}, {PAUSE: 50}, loader=object())
    assert occasional_work(loader).site == PAUSE  # beside a DataLoader too: its waits are timed apart
    waits = _rl_context({}, {PAUSE: 50}, loader=object())
    # the loader's own slow batches (timed, in its `data` phase) are num-workers'
    waits.step_records = [StepRecord(s.index, s.start, s.end + (0.05 if s.index in (6, 15) else 0.0),
                                     {**s.phases, "data": 0.05 if s.index in (6, 15) else 0.0}, s.gap_before_forward,
                                     s.forwards, s.backwards, s.optimizers) for s in waits.step_records]
    assert occasional_work(waits) is None
    once = _rl_context({6: 0.052}, {PAUSE: 50})
    [seen_once] = periodic_rule.occasional(once)  # named at its line, not priced: one occurrence is no rate
    assert seen_once.site == PAUSE and seen_once.severity == "low" and seen_once.est_speedup is None
    assert "ran once in the 20 measured steps (step 6)" in seen_once.message


def test_steps_the_windows_periodic_work_explains_are_not_occasional_work_again():
    """ci131: a character model sampling every 10 steps (48 forwards, named at its line by the periodic row); a stall
    of the sampling step, the sampler's catches mostly at `opt.step()`, was named a second time there."""
    step_line = Site("sample.py", 34, "<module>")
    sampling = PeriodicRow("sampling", "outside_step", 10, [6, 16], 60.0, 0.4, "sample.py:19",
                           Site("sample.py", 19, "generate"), 100)
    explained = _rl_context({6: 0.062, 16: 0.060}, {step_line: 12, Site("sample.py", 19, "generate"): 5},
                            rows=[sampling])
    assert explained.occasional_work is None and not list(periodic_rule.occasional(explained))
    # The same row elsewhere leaves these steps' work to be named here.
    elsewhere = _rl_context({6: 0.062, 16: 0.060}, {PAUSE: 50}, rows=[dataclasses.replace(sampling, steps=[9, 19])])
    assert elsewhere.occasional_work.steps == (6, 16)
    # A row of slow steps with no work seen in them (no line) explains nothing.
    unexplained = dataclasses.replace(sampling, kind="work between steps", site=None, where=None)
    assert _rl_context({6: 0.062, 16: 0.060}, {PAUSE: 50}, rows=[unexplained]).occasional_work.steps == (6, 16)


def test_occasional_work_is_not_told_to_move_into_a_dataloader(tmp_path):
    from turbotrain.doctor.analysis.breakdown import compute_breakdown
    from turbotrain.doctor.analysis.context import Context
    from turbotrain.doctor.rules import evaluate
    from turbotrain.hardware import detect

    def context(before: dict[int, float], samples: dict[Site, int]) -> Context:
        steps = [_rl_step(i, before.get(i, 0.0005)) for i in range(0, 23)]
        breakdown = compute_breakdown(steps, 3)
        return Context(script=str(tmp_path / "dqn.py"), base=str(tmp_path), hw=detect("cpu"), device="cpu",
                       breakdown=breakdown, measured_steps=breakdown.steps, step_records=steps,
                       gap_samples=samples)

    plotting = evaluate(context({6: 0.052, 15: 0.051}, {PAUSE: 50, BATCH: 3}), only=["num-workers", "periodic-work"])
    assert [(f.rule, f.site) for f in plotting] == [("periodic-work", PAUSE)]
    building = evaluate(context({i: 0.005 for i in range(23)}, {BATCH: 50}), only=["num-workers", "periodic-work"])
    assert [(f.rule, f.site) for f in building] == [("num-workers", BATCH)]


def test_a_periodic_finding_is_edited_at_its_own_cadence_where_another_row_names_its_line():
    """ci90: a row of timing spikes every 5 steps, one of them on the validation step, named the validation's line
    before the validation's own row (every 20); the edit took the first row and wanted `% 5` in the script."""
    site = Site("train.py", 18, "validate")
    rows = [PeriodicRow(kind="validation", category=category, every=every, steps=[4, 9, 14, 19], cost_ms=30.0,
                        share=share, where="train.py:18", site=site, suggested_every=every * 50)
            for category, every, share in (("compute", 5, 0.01), ("outside_step", 20, 0.3))]
    ctx = SimpleNamespace(periodic_rows=rows)
    (finding,) = periodic_rule.periodic_work(ctx)
    spec = periodic_rule.edit(ctx, finding)
    assert (spec.params["every"], spec.params["new_every"]) == (20, 1000), spec


def _evaluating(compile_s: float):
    """A validation every 4 steps of 4.8 s, its first calls compiling ``compile_s`` of it (airbench's evaluations
    compiled their no_grad graphs: "Validation every 8 steps costs 4860.5 ms each time")."""
    from turbotrain.doctor.analysis.breakdown import compute_breakdown
    from turbotrain.doctor.analysis.context import Context
    from turbotrain.doctor.record.compile_watch import CompileFacts, CompileSpan
    from turbotrain.hardware import detect

    steps, spans, t = [], [], 0.0
    for i in range(16):
        evaluates = i % 4 == 3
        seconds = 0.2 + (4.8 if evaluates else 0.0)
        phases = {"forward": 0.1, "optimizer": 0.1, **({"eval": 4.8} if evaluates else {})}
        steps.append(StepRecord(i, t, t + seconds, phases, forwards=1, backwards=1, optimizers=1, preempted=0.0))
        if evaluates and compile_s:
            spans.append(CompileSpan(f"1/{i}", t + 0.25, compile_s, "recompile"))
        t += seconds
    recording = SimpleNamespace(compiled=CompileFacts(spans=tuple(spans)), watched=None)
    return Context(script="train.py", base="/u", hw=detect("cpu"), device="cpu", breakdown=compute_breakdown(steps, 1),
                   measured_steps=list(range(1, 16)), recording=recording, step_records=steps)  # type: ignore[arg-type]  # a stand-in Recording


def test_compiling_inside_the_periodic_work_is_left_out_of_what_it_costs_each_time():
    from turbotrain.doctor.analysis.periodic import periodic_table

    [as_is] = periodic_table(_evaluating(0.0))
    assert as_is.cost_ms == 4800.0 and as_is.note is None
    [compiled] = periodic_table(_evaluating(4.6))
    assert compiled.cost_ms == 200.0 and compiled.share < as_is.share
    assert compiled.note.startswith("torch.compile compiled in these steps, 4600 ms an occurrence on average")
    ctx = SimpleNamespace(periodic_rows=[compiled])
    assert list(periodic_rule.periodic_work(ctx)) == []  # 200 ms every 4 steps of 1.4 s: under 5%
    [said] = periodic_rule.periodic_work(SimpleNamespace(periodic_rows=[as_is]))
    assert said.severity == "high"
