"""The doctor on a multi-process job (gloo, 2 ranks): every rank recorded, the straggler named with its cause
whichever rank it is, a crashed rank ending the job with a message and no process left behind.

Four real jobs, one per module-scoped fixture, each a few seconds of training on 2 ranks; the rest are unit
tests of the per-rank analysis on recordings built by hand.
"""

from __future__ import annotations

import dataclasses
import io
import re
import shutil
import statistics
import sys
from pathlib import Path

import pytest

from doctor_helpers import doctor_job, git_apply, job_processes, marked_lines, rank_recording
from turbotrain.doctor.analysis.ranks import analyse_ranks
from turbotrain.doctor.record.recording import from_json, to_json

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(scope="module")
def slow_data_rank0(tmp_path_factory):
    """The doctor starts the ranks itself; rank 0 loads its data slower. The straggler's fix is timed on both ranks
    (the budget fits it, the highest rated, while one run of the job takes up to 50 s: with --job-what-if-rounds 2
    it decides only what fits, never how many rounds run) and written as a patch."""
    tmp = tmp_path_factory.mktemp("data")
    return doctor_job(tmp, "--job-what-if-rounds", "2", "--html", str(tmp / "report.html"),
                      "--job-what-if-budget", "200",
                      "--job-what-if-rules", "straggler", "--fix",
                      str(tmp / "fixes.patch"), "--fix-only", "straggler", "--nproc-per-node", "2",
                      str(SCRIPTS / "ddp_straggler_data.py"), "--slow-rank", "0", what_if=True, timeout=400)


@pytest.fixture(scope="module")
def slow_compute_rank1(tmp_path_factory):
    """The user's own torchrun, wrapped; rank 1 computes more."""
    return doctor_job(tmp_path_factory.mktemp("compute"), "--", sys.executable, "-m", "torch.distributed.run",
                  "--standalone", "--nproc-per-node", "2", str(SCRIPTS / "ddp_straggler_compute.py"),
                  "--slow-rank", "1")


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return doctor_job(tmp_path_factory.mktemp("clean"), "--nproc-per-node", "2", str(SCRIPTS / "ddp_clean.py"))


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """Rank 1 is killed (SIGKILL) in the middle of the measured steps."""
    return doctor_job(tmp_path_factory.mktemp("killed"), "--nproc-per-node", "2", str(SCRIPTS / "ddp_clean.py"),
                  "--kill-rank", "1", "--kill-at", "8")


def _ok(result) -> dict:
    proc, report = result
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return report


def test_every_rank_is_reported(slow_data_rank0):
    report = _ok(slow_data_rank0)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for rank in report["ranks"]:
        assert rank["steps_measured"] == 10
        assert rank["host"]
        assert abs(sum(rank["breakdown"].values()) - 1.0) < 0.01
        assert rank["step_time_ms"]["median"] > 0
        # DDP's own reducer statistics (its logger samples iteration 10), beside the doctor's wall clock.
        assert rank["ddp_reducer_ms"]["backward_comm"] > 0 and rank["clock_offset_ms"] is not None
        # ... checked against the doctor's own timing of the same all-reduces.
        check = rank["reducer_check"]
        assert check["ddp_backward_comm_ms"] == rank["ddp_reducer_ms"]["backward_comm"] and check["timed_comm_ms"] > 0
        assert check["ratio"] == pytest.approx(check["ddp_backward_comm_ms"] / check["timed_comm_ms"], rel=0.01)
        assert check["agrees"] == (0.5 <= check["ratio"] <= 2.0)


@pytest.mark.parametrize("fixture, rank, cause", [("slow_data_rank0", 0, "data_loading"),
                                                   ("slow_compute_rank1", 1, "compute")])
def test_the_straggler_is_named_with_its_cause(fixture, rank, cause, request):
    report = _ok(request.getfixturevalue(fixture))
    straggler = report["straggler"]
    assert straggler is not None, report["ranks"]
    assert (straggler["rank"], straggler["cause"]) == (rank, cause)
    assert straggler["host"]
    assert straggler["cost"]["ms_per_step"] > 0 and straggler["cost"]["share"] >= 0.05
    # The others wait for it: their exposed communication is the larger.
    exposed = {r["rank"]: r["exposed_communication_ms"] for r in report["ranks"]}
    assert exposed[1 - rank] > exposed[rank]
    finding = next(f for f in report["findings"] if f["rule"] == "straggler")
    assert f"Rank {rank}" in finding["message"] and finding["severity"] in ("high", "medium")
    assert 0.0 < report["communication"]["exposed_share"] < 1.0


def test_the_html_report_has_the_ranks(slow_data_rank0, tmp_path_factory):
    _ok(slow_data_rank0)
    page = next(Path(tmp_path_factory.getbasetemp()).glob("data*/report.html")).read_text()
    assert 'id="ranks"' in page and "Straggler: rank 0" in page


def test_the_data_straggler_points_at_its_loader(slow_data_rank0):
    report = _ok(slow_data_rank0)
    line = next(n for n, text in enumerate((SCRIPTS / "ddp_straggler_data.py").read_text().splitlines(), 1)
                if "# doctor: straggler" in text)
    assert report["straggler"]["where"].endswith(f"ddp_straggler_data.py:{line}")


def test_the_data_stragglers_loader_is_timed_with_workers_on_every_rank_and_patched(slow_data_rank0,
                                                                                    tmp_path_factory):
    """Rank 0 waits 25 ms for each batch from a loader without workers: every rank's DataLoader is timed with the
    workers that fetch a batch in the other rank's step, and that count is written at the loader's line."""
    report = _ok(slow_data_rank0)
    finding = next(f for f in report["findings"] if f["rule"] == "straggler")
    workers = finding["evidence"]["num_workers"]
    assert workers["now"] == 0 and 2 <= workers["timed"] <= 8, workers
    timed = finding["what_if"]
    assert timed["kind"] == "job" and timed["ranks"] == 2, timed
    assert timed["observed"]["num_workers"] == [workers["timed"]], timed
    (fix,) = report["fixes"]
    assert fix["in_patch"] and fix["where"] == report["straggler"]["where"].rsplit("/", 1)[-1], fix
    patch = next(Path(tmp_path_factory.getbasetemp()).glob("data*/fixes.patch")).read_text()
    assert f"num_workers={workers['timed']}, persistent_workers=True" in patch, patch


def test_wrapping_torchrun_prints_the_rank_table(slow_compute_rank1):
    proc, _ = slow_compute_rank1
    assert "Ranks (2)" in proc.stdout and "Straggler: rank 1" in proc.stdout


def test_the_bottleneck_line_says_how_much_of_the_compute_is_the_wait(slow_compute_rank1):
    """Rank 1 computes more, so rank 0 (whose bar it is) waits at the all-reduce: that wait sits in its backward."""
    proc, report = slow_compute_rank1
    lead = min(report["ranks"], key=lambda r: r["rank"])
    wait = lead["breakdown_ms"]["communication"] / lead["step_time_ms"]["median"]
    assert report["bottleneck"] == "compute" and wait >= 0.05, (report["bottleneck"], lead)
    line = " ".join(" ".join(proc.stdout[proc.stdout.index("Bottleneck:"):].split("\n")[:2]).split())
    said = re.search(r"(\d+)% of it waiting for the gradient all-reduce", line)
    assert said is not None and abs(int(said.group(1)) - 100 * wait) <= 1, line  # the JSON's ms are rounded


def test_a_clean_job_has_no_straggler(clean):
    """No rank does more work; on a shared machine one rank may still wait for a CPU other processes hold,
    which is named as such and kept at ``low``."""
    report = _ok(clean)
    straggler = report["straggler"]
    assert straggler is None or straggler["cause"] == "cpu_contention", (straggler, report["ranks"])
    assert not [f for f in report["findings"] if f["severity"] in ("high", "medium")], report["findings"]


def test_ddp_default_buckets_are_read_from_every_ranks_reducer(clean):
    """ddp_clean.py's DDP keeps its defaults: the finding's layout is its reducer's (1.5 MiB of gradients in
    6 tensors, in 2 buckets), and it asks for gradient_as_bucket_view only (too small to re-bucket)."""
    report = _ok(clean)
    found = [f for f in report["findings"] if f["rule"] == "ddp-bucket-settings"]
    step = statistics.median(r["step_time_ms"]["median"] for r in report["ranks"])
    if not found:  # even the last rank to arrive waited little (JSON values are rounded: 0.01 ms either way)
        assert report["communication"]["shared_wait_ms"] < 0.10 * step + 0.01, report["communication"]
        return
    (finding,) = found
    evidence = finding["evidence"]
    params = 256 * 512 + 512 + 512 * 512 + 512 + 512 + 1
    assert evidence["gradient_mib"] == pytest.approx(params * 4 / 2**20, abs=0.01) and evidence["buckets"] == 2
    assert evidence["keywords"] == {"gradient_as_bucket_view": True}
    assert finding["severity"] == "low" and not finding["measured"]  # what-ifs off: not timed
    line = next(n for n, text in enumerate((SCRIPTS / "ddp_clean.py").read_text().splitlines(), 1)
                if "= DistributedDataParallel(" in text)
    assert finding["where"].endswith(f"ddp_clean.py:{line}")


def test_exposed_gradient_sync_is_named_when_no_rank_is_late(clean):
    """The all-reduce wait every rank shares is named (low: measured, its fix not yet timed on a job) exactly
    when it is a quarter of the step or more and neither a straggler nor uneven work shown explain it (ranks late
    in turns with batches of one size, which this balanced job may show by chance, do not)."""
    report = _ok(clean)
    found = [f for f in report["findings"] if f["rule"] == "exposed-gradient-sync"]
    uneven = report["imbalance"] is not None and report["imbalance"]["evidenced"]
    explained = report["straggler"] is not None or uneven
    expected = not explained and report["communication"]["exposed_share"] >= 0.25
    assert bool(found) == expected, (report["communication"], report["straggler"], report["imbalance"], found)
    for finding in found:
        assert finding["severity"] == "low" and not finding["measured"], finding
        assert f"{report['communication']['exposed_share']:.0%}" in finding["message"]
    # The bar is rank 0's, its backward holding the wait: the report says how much of its compute that is.
    wait = next(r for r in report["ranks"] if r["rank"] == 0)["breakdown_ms"]["communication"]
    said = [m for m in report["messages"] if m.startswith("Rank 0's compute in the bar includes")]
    floor = 0.05 * report["ranks"][0]["step_time_ms"]["median"]  # JSON values are rounded: 0.01 ms either way
    assert (wait >= floor - 0.01) if said else (wait < floor + 0.01), (wait, report["messages"])
    for message in said:
        shown = float(re.search(r"includes ([\d.]+) ms a step", message).group(1))
        assert abs(shown - wait) <= 0.051, (wait, message)  # one decimal shown


def test_a_killed_rank_ends_the_job_with_its_name_and_no_process_left(killed):
    proc, report = killed
    assert proc.returncode != 0
    assert report["status"] == "error"
    message = " ".join(report["messages"])
    assert "rank 1" in message and "killed or crashed" in message, message
    assert "rank 1" in proc.stderr
    assert job_processes("ddp_clean.py") == []


# -- the analysis on recordings built by hand -----------------------------------------------------------

def test_a_reducer_that_disagrees_with_the_clock_is_said():
    from turbotrain.doctor.report.ranks import ranks_json, reducer_disagreement

    recs = [rank_recording(r, [1.0] * 9, [1.0] * 9) for r in (0, 1)]  # 2 ms of all-reduce in flight a step
    agreeing = [dataclasses.replace(r, reducer={"avg_backward_comm_time": 0.003}) for r in recs]
    assert reducer_disagreement(analyse_ranks(agreeing)) is None
    off = [agreeing[0], dataclasses.replace(recs[1], reducer={"avg_backward_comm_time": 0.020})]
    job = analyse_ranks(off)
    text = reducer_disagreement(job)
    assert text is not None and "rank 1: DDP 20.0 ms, timed 2.0 ms" in text and "rank 0" not in text
    checks = [r["reducer_check"] for r in ranks_json(job)["ranks"]]
    assert [c["agrees"] for c in checks] == [True, False] and checks[1]["ratio"] == pytest.approx(10.0)


@pytest.mark.parametrize("slow", [0, 1])
def test_the_straggler_and_its_cost_come_from_the_others_wait(slow):
    n = 9
    recs = [rank_recording(r, [25.0 if r == slow else 1.0] * n, [1.0 if r == slow else 25.0] * n) for r in (0, 1)]
    job = analyse_ranks(recs)
    assert job is not None and job.straggler is not None
    s = job.straggler
    assert (s.rank, s.host, s.cause, s.compared_with) == (slow, f"node{slow}", "data_loading", 1 - slow)
    assert s.cost_s == pytest.approx(0.024)
    assert s.cost_share == pytest.approx(0.6)
    assert job.exposed_share == pytest.approx((0.001 + 0.025) / 0.080)
    assert job.overlap == pytest.approx((0.5 + 0.5) / ((1 + 1) + (25 + 1)))


def test_a_rank_slowed_by_other_processes_is_named_as_contention_and_kept_low():
    """Rank 1 does the same work (same CPU time) but waits 20 ms per step for a core other processes hold."""
    from turbotrain.doctor.analysis.context import build_context
    from turbotrain.doctor.rules import evaluate

    recs = [rank_recording(r, [1.0] * 9, [1.0 if r == 1 else 21.0] * 9, cpu_ms=10.0,
                           cpu_wait_ms=22.0 if r == 1 else 1.0) for r in (0, 1)]
    job = analyse_ranks(recs)
    assert job is not None and job.straggler is not None
    assert (job.straggler.rank, job.straggler.cause) == (1, "cpu_contention")
    ctx = build_context(dataclasses.replace(recs[0], job=tuple(recs)))
    (finding,) = evaluate(ctx, only=["straggler"])
    assert finding.severity == "low" and "waited for a core" in finding.message
    # The same wait with 20 ms more CPU time is the rank's own compute, and it costs the job.
    recs = [rank_recording(r, [1.0] * 9, [1.0 if r == 1 else 21.0] * 9, cpu_ms=30.0 if r == 1 else 10.0,
                       cpu_wait_ms=22.0 if r == 1 else 1.0) for r in (0, 1)]
    ctx = build_context(dataclasses.replace(recs[0], job=tuple(recs)))
    (finding,) = evaluate(ctx, only=["straggler"])
    assert finding.severity == "high" and finding.evidence.cause != "cpu_contention"


def test_a_rank_slower_at_the_very_work_the_others_do_is_the_machines_cause():
    """A clean 2-rank job on 2 vCPUs (ddp_clean.py, a full-suite run): rank 1's compute ran 1.2 ms (16%) longer a
    step on the same model and batches, with more CPU time than rank 0's (a shared core costs CPU time too). The
    same module calls, matmul shapes and input elements make it the machine's cause; one more module call a step
    makes it the rank's own compute."""
    from turbotrain.doctor.record.recording import MatmulShape, Recording
    from turbotrain.doctor.sites import Site

    def rank(r: int, calls: int) -> Recording:
        rec = rank_recording(r, [0.1] * 9, [1.0 if r == 1 else 2.4] * 9, step_ms=7.5, cpu_ms=7.0 if r == 1 else 5.5)
        steps = tuple(dataclasses.replace(s, phases={"forward": 4e-3}) for s in rec.steps)
        matmul = MatmulShape(Site("train.py", 20, "forward"), (64, 256), (256, 512))
        return dataclasses.replace(rec, steps=steps, module_calls_per_step=calls, matmul_shapes=(matmul,),
                                   input_numel={i: 64 * 256 for i in range(9)})

    job = analyse_ranks([rank(0, 3), rank(1, 3)])
    assert job is not None and job.straggler is not None
    assert (job.straggler.rank, job.straggler.cause) == (1, "cpu_contention")
    job = analyse_ranks([rank(0, 3), rank(1, 4)])
    assert job is not None and job.straggler is not None
    assert (job.straggler.rank, job.straggler.cause) == (1, "compute")


def test_balanced_ranks_have_no_straggler():
    recs = [rank_recording(r, [1.0] * 9, [2.0 + (i % 2 == r) for i in range(9)]) for r in (0, 1)]
    job = analyse_ranks(recs)
    assert job is not None and job.straggler is None


def test_a_recording_with_communication_round_trips_and_stays_small():
    rec = rank_recording(0, [1.0] * 20, [2.0] * 20)
    text = to_json(rec)
    assert from_json(text) == rec
    assert len(text) < 20_000   # 20 steps of one rank: a few KiB to send


def test_the_rank_table_fits_80_columns_and_summarises_many_ranks():
    from rich.console import Console

    from turbotrain.doctor.report.ranks import print_ranks

    for world in (8, 16):
        recs = [rank_recording(r, [25.0 if r == 3 else 1.0] * 9, [1.0 if r == 3 else 25.0] * 9) for r in range(world)]
        recs = [dataclasses.replace(r, host=f"a-rather-long-host-name-{r.rank}") for r in recs]
        job = analyse_ranks(recs)
        assert job is not None
        out = io.StringIO()
        print_ranks(Console(file=out, width=80, highlight=False, emoji=False), job, 80)
        lines = out.getvalue().splitlines()
        assert max(len(line) for line in lines) <= 80
        table = [line for line in lines if re.match(r"\d+\*? +a-rather-long-host", line)]
        assert len(table) == (world if world <= 8 else 2)
        assert any(line.startswith("3*") for line in table)


@pytest.mark.slow
def test_a_hung_rank_ends_the_job_within_the_timeout(tmp_path):
    proc, report = doctor_job(tmp_path, "--rank-timeout", "4", "--nproc-per-node", "2", str(SCRIPTS / "ddp_clean.py"),
                          "--hang-rank", "0", "--hang-at", "6")
    assert proc.returncode != 0
    message = " ".join(report["messages"])
    assert "no progress for 4 s" in message and "Stuck: rank 0" in message and "ddp_clean.py" in message, message
    assert "rank 1" in message   # the other rank, waiting for it at the all-reduce
    assert job_processes("ddp_clean.py") == []


def _rank0_straggler_fixed(tmp_path, name: str):
    """The doctor with the straggler's fix patched, on a copy of ``name``: the script, the patch, and the report,
    whose straggler is rank 0, late from work between steps. The fix is not timed on the job here: the change each
    makes rarer is applied in one process in test_job_what_ifs.py, and a straggler's fix is timed on every rank of
    a job in test_the_data_stragglers_loader_is_timed_with_workers_on_every_rank_and_patched."""
    script = tmp_path / "job" / name
    script.parent.mkdir()
    shutil.copy(SCRIPTS / name, script)
    patch = tmp_path / "fixes.patch"
    proc, report = doctor_job(script.parent, "--fix", str(patch), "--fix-only", "straggler", "--nproc-per-node", "2",
                              name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    straggler = report["straggler"]
    assert straggler is not None and (straggler["rank"], straggler["cause"]) == (0, "outside_step"), \
        (straggler, report["ranks"])
    return script, patch, report


def test_work_only_rank_0_does_is_named_and_patched_rarer(tmp_path):
    """Rank 0 saves a checkpoint every step; rank 1 waits for it at the next all-reduce. The save every N steps is
    written into the script (test_job_fixes verifies a patched job)."""
    script, patch, report = _rank0_straggler_fixed(tmp_path, "ddp_rank0_checkpoint.py")
    straggler = report["straggler"]
    ((_, line),) = marked_lines("ddp_rank0_checkpoint")
    assert straggler["where"].endswith(f"ddp_rank0_checkpoint.py:{line}")
    finding = next(f for f in report["findings"] if f["rule"] == "straggler")
    assert finding["where"].endswith(f":{line}") and "work only it does" in finding["message"]
    # One finding for the one cause: rank 0's save-in-loop at that line is the straggler's, with its framework fixes.
    assert not [f for f in report["findings"] if f["rule"] == "save-in-loop"], report["findings"]
    assert finding["evidence"]["absorbed"] == ["save-in-loop"] and finding["fixes"]["lightning"], finding
    every = finding["evidence"]["save_every"]
    (fix,) = report["fixes"]
    assert fix["in_patch"] and fix["where"].endswith(f":{line}") and f"every {every} steps" in fix["label"], fix
    git_apply(script.parent, patch)
    assert f"if (step + 1) % {every} == 0:" in script.read_text()
    assert job_processes(script.name) == []


def test_work_rank_0_does_every_other_step_is_named_with_the_wait_averaged_and_patched_rarer(tmp_path):
    """Rank 0 alone evaluates every other step: late in half the steps, which the median wait (the steady
    straggler's test) does not see; its cost is rank 1's wait averaged over every step. The ``if`` that runs the
    evaluation is made rarer: its period is written into the script."""
    script, patch, report = _rank0_straggler_fixed(tmp_path, "ddp_rank0_eval.py")
    straggler = report["straggler"]
    assert straggler["periodic"] and 0.35 <= straggler["last_share"] <= 0.65, straggler
    ((_, line),) = marked_lines("ddp_rank0_eval")
    assert straggler["where"].endswith(f"ddp_rank0_eval.py:{line}")
    lanes = {r["rank"]: r["lane_ms"] for r in report["ranks"]}
    waits = [max(0.0, one["parts"]["communication"] - zero["parts"]["communication"])
             for zero, one in zip(lanes[0], lanes[1])]
    # Rank 1's wait beyond rank 0's, averaged over every step (not only the evaluating ones), less the steps
    # rank 0's evaluation does not explain; those hold little of it (JSON values are rounded: 0.01 ms).
    assert 0.25 * statistics.fmean(waits) <= straggler["cost"]["ms_per_step"] <= statistics.fmean(waits) + 0.01, \
        (straggler, waits)
    finding = next(f for f in report["findings"] if f["rule"] == "straggler")
    assert "averaged over every step" in finding["message"]
    # The wait is rank 0's evaluation, not the all-reduce itself: no finding says no rank is late.
    assert not [f for f in report["findings"] if f["rule"] == "exposed-gradient-sync"], report["findings"]
    # The ``if`` in the loop that calls the evaluation, every EVAL_EVERY = 2 steps.
    branch = finding["evidence"]["branch"]
    source = script.read_text().splitlines()
    assert source[int(branch["at"].rsplit(":", 1)[1]) - 1].lstrip().startswith("if rank == 0 and step %"), branch
    assert (branch["period"], branch["call"]) == (2, "evaluate") and branch["new_period"] % 2 == 0, branch
    # Rank 0's own eval-every-step at that line is the straggler's one cause.
    assert not [f for f in report["findings"] if f["rule"] == "eval-every-step"], report["findings"]
    (fix,) = report["fixes"]
    assert fix["in_patch"] and f"every {branch['new_period']} steps" in fix["label"], fix
    git_apply(script.parent, patch)
    assert f"\nEVAL_EVERY = {branch['new_period']}  #" in script.read_text()
    assert job_processes("ddp_rank0_eval.py") == []


def test_a_wait_in_seven_steps_of_twelve_is_not_a_steady_straggler():
    """Rank 1 waits 8 ms for rank 0 in 7 of 12 steps: the median wait is 8 ms, but the steps between say the
    work skips steps; only every step's wait makes the steady straggler."""
    def job(heavy: int):
        waits = [8.0 if i < heavy else 0.2 for i in range(12)]
        return analyse_ranks([rank_recording(0, [1.0] * 12, [0.2] * 12), rank_recording(1, [1.0] * 12, waits)])

    assert job(7).straggler is None
    steady = job(12).straggler
    assert steady is not None and steady.rank == 0 and not steady.periodic


def test_a_wait_for_evaluation_every_other_step_is_periodic_whatever_the_median_of_ten_steps():
    """Rank 0 evaluates in five of ten steps (110 ms), and rank 1 waits 100-135 ms for it there; in two of the other
    five rank 1 also waits, for no work of rank 0's (a core taken away for 40 ms). With ten steps the median wait falls
    between the two modes, and those two steps make the spread around it pass for noise: the steady straggler's
    test alone took it for a wait in every step (a run of ddp_rank0_eval.py in a full suite, 69.6 ms a step). The
    evaluation explains the wait in half the steps."""
    high, low = [100.0, 105.0, 110.0, 112.0, 135.0], [-3.0, -2.0, 1.0, 40.0, 45.0]
    waits = [w for pair in zip(high, low) for w in pair]
    evals = [110.0 if i % 2 == 0 else 0.0 for i in range(10)]
    job = analyse_ranks([rank_recording(0, [0.1] * 11, [5.0] * 11, step_ms=150.0, eval_ms=[0.0, *evals]),
                         rank_recording(1, [0.1] * 11, [5.0, *(5.0 + w for w in waits)], step_ms=150.0)])
    straggler = job.straggler
    assert straggler is not None and (straggler.rank, straggler.cause) == (0, "outside_step"), straggler
    assert straggler.periodic and straggler.last_share == pytest.approx(0.5), straggler
    # Its cost is the wait in the evaluating steps, averaged over all ten.
    assert straggler.cost_s == pytest.approx(sum(high) / 10 / 1e3, rel=1e-6)


def test_a_straggler_seen_through_step_to_step_noise_is_steady():
    """FSDP's blocking collectives on two ranks sharing two cores (a run of tests/doctor/scripts/fsdp_blocks.py
    --slow-rank 0 --fsdp1): rank 1 waits 19 ms a step for rank 0 in the median, but descheduling moves single
    steps' waits by +-10 ms, three of ten below half the cost. Within the job's own noise of the cost, they are
    the same steady wait; a wait in seven steps of twelve (above) stays a wait that skips steps."""
    slow = [125, 74, 81, 76, 64, 66, 58, 91, 52, 69]
    fast = [110, 90, 110, 88, 97, 75, 81, 96, 77, 93]
    job = analyse_ranks([rank_recording(0, [0.1] * 11, [60.0, *slow], step_ms=140.0),
                         rank_recording(1, [0.1] * 11, [60.0, *fast], step_ms=140.0)])
    assert job.straggler is not None and job.straggler.rank == 0 and not job.straggler.periodic
    assert job.straggler.cost_s == pytest.approx(0.019, abs=0.001)


def test_only_a_straggler_whose_fix_is_timed_absorbs_a_finding_of_its_line_and_phase():
    from turbotrain.doctor.findings import Finding, Fix
    from turbotrain.doctor.rank_change import RankChange
    from turbotrain.doctor.requests import JobRequest
    from turbotrain.doctor.rules.job.straggler import StragglerEvidence, absorbed_by_straggler
    from turbotrain.doctor.sites import Site

    def finding(rule, line, category, **fix):
        return Finding(rule=rule, message="", fix=Fix("by hand", **fix), site=Site("train.py", line, "<module>"),
                       category=category)

    straggler = finding("straggler", 33, "outside_step")
    straggler.evidence = StragglerEvidence(rank=1, host="h", cause="outside_step", cost_ms=9.0, compared_with=0,
                                           periodic=False, gap_ms={"outside_step": 9.0})
    save = finding("save-in-loop", 33, "outside_step", lightning="ModelCheckpoint")
    other_line = finding("save-in-loop", 40, "outside_step")
    workers = finding("num-workers", 33, "data_loading")
    assert absorbed_by_straggler([straggler, save, other_line, workers]) == [straggler, save, other_line, workers]
    straggler.request = JobRequest(RankChange(save_every=12, save_at="train.py:33"))
    assert absorbed_by_straggler([straggler, save, other_line, workers]) == [straggler, other_line, workers]
    assert straggler.evidence.absorbed == ("save-in-loop",) and straggler.fix.lightning == "ModelCheckpoint"


def test_the_scripts_own_comm_hook_still_runs_under_the_timing_hook(tmp_path):
    """A hook the script registers (or a built-in one) runs inside the doctor's, and is timed; a second
    registration is refused as DDP refuses it."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from turbotrain.doctor.record.collectives import GradientSync
    from turbotrain.doctor.record.patcher import Patcher

    if dist.is_initialized():
        pytest.skip("a process group is already active in this test process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    patcher, step, calls = Patcher(), [0], []
    sync = GradientSync(lambda: (step[0], 0), lambda: True)
    try:
        sync.install(patcher)
        model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
        builtin = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))

        def mine(state, bucket):
            calls.append(state)
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        model.register_comm_hook("state", mine)
        builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
        with pytest.raises(RuntimeError, match="only be called once"):
            model.register_comm_hook(None, mine)
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            builtin(torch.randn(4, 8)).sum().backward()
            step[0] += 1
    finally:
        patcher.restore()
        dist.destroy_process_group()
    assert calls == ["state"] * 3
    steps = sync.steps()
    assert [s.step for s in steps] == [0, 1, 2] and all(s.buckets == 2 for s in steps)
    assert builtin._tt_comm_inner["hook"].__name__ == "fp16_compress_hook"


def test_failure_messages_name_the_rank_and_what_it_was_doing():
    from turbotrain.doctor.job.launcher import JobRun, RankOutcome, _failure

    def status(rank, step, doing, where, t):
        return {"rank": rank, "pid": 100 + rank, "host": "h", "step": step, "doing": doing, "where": where, "time": t}

    waiting = "waiting for the gradient all-reduce (DDP, in the backward)"
    hung = JobRun(["torchrun"], -15, 9.0, [RankOutcome(0, status=status(0, 6, None, "train.py:30", 5.0)),
                                           RankOutcome(1, status=status(1, 6, waiting, "train.py:41", 9.0))],
                  hung=True)
    text = _failure(hung, 60.0, False)
    assert text is not None and text.startswith("The job made no progress for 60 s")
    assert "Stuck: rank 0 (h, pid 100) at step 6, at train.py:30." in text and "The others: rank 1" in text
    failed = JobRun(["torchrun"], 1, 9.0, [
        RankOutcome(0, status=status(0, 7, waiting, "train.py:41", 9.0)),
        RankOutcome(1, run={"status": "error", "error": "RuntimeError: boom", "where": "train.py:12"},
                    status=status(1, 7, None, "train.py:12", 8.0))])
    assert _failure(failed, 60.0, False) == ("rank 1 (h, pid 101) failed at step 7 at train.py:12: RuntimeError: "
                                             "boom. The job was ended.")
    killed = JobRun(["torchrun"], 1, 9.0, [RankOutcome(0, status=status(0, 8, waiting, "train.py:41", 9.0)),
                                           RankOutcome(1, status=status(1, 8, "in the forward", "train.py:40", 7.5))])
    text = _failure(killed, 60.0, False)
    assert text is not None and text.startswith("rank 1 (h, pid 101) ended without finishing (killed or crashed), "
                                                "at step 8, in the forward, at train.py:40.")
    assert "Ended with it: rank 0" in text
    # The killed rank's peer may raise first (its collective breaks): the killed one is still named.
    lost = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection reset by peer [10.0.0.2]:5000"
    peer_first = JobRun(["torchrun"], 1, 9.0, [
        RankOutcome(0, run={"status": "error", "error": lost, "where": "train.py:41"},
                    status=status(0, 8, waiting, "train.py:41", 9.0)),
        RankOutcome(1, status=status(1, 8, "in the forward", "train.py:40", 7.5))])
    text = _failure(peer_first, 60.0, False)
    assert text is not None and text.startswith("rank 1 (h, pid 101) ended without finishing (killed or crashed)")
    assert f"Lost the connection to it: rank 0 (h, pid 100) ({lost})." in text
    done = JobRun(["torchrun"], 0, 9.0, [RankOutcome(r, run={"status": "stopped"},
                                                     status=status(r, 14, None, None, 9.0)) for r in (0, 1)])
    assert _failure(done, 60.0, False) is None
