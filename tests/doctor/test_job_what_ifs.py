"""Fixes timed on every rank of a job: the launcher re-run with a RankChange applied on every rank, alternately
with the job as it is.

One real job (gloo, 2 ranks, three habits switched on) and the pieces on their own: each change applied in one
process, and the timing loop on job runs built by hand.
"""

from __future__ import annotations

import dataclasses
import json
import inspect
import tempfile

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from doctor_helpers import SCRIPTS, doctor_job, job_processes, rank_recording
from turbotrain.doctor.findings import Finding, Fix, severity_for
from turbotrain.doctor.job.launcher import JobRun, RankOutcome
from turbotrain.doctor.rank_change import RankChange
from turbotrain.doctor.apply.change import APPLIED, apply_change
from turbotrain.doctor.requests import JobRequest
from turbotrain.doctor.whatif.job import JobTiming, time_on_the_job


HABITS = ("accumulation-syncs", "ddp-static-graph", "cpu-oversubscribed")


@pytest.fixture(scope="module")
def habits(tmp_path_factory):
    """Every rank: threads sized to all cores, find_unused_parameters=True with the same parameters unused at every
    step (a static graph not declared), 4 micro-batches without no_sync. (find_unused_parameters=True with nothing
    unused is timed on a job in test_job_fixes.py.)"""
    tmp = tmp_path_factory.mktemp("habits")
    # Only the three habits' fixes are timed (not DDP's bucket settings or bf16 autocast, which their own tests
    # time); the budget fits them in two rounds while one run of this job takes up to 50 s (it fits (budget / (2
    # rounds x a run)) - 1 fixes); about 5-10 s on 2 cores, over 22 s on a loaded machine, where 180 s left
    # ddp-static-graph untimed. With --job-what-if-rounds 2 the budget only decides which fixes fit: a larger one
    # runs no more rounds.
    proc, report = doctor_job(tmp, "--job-what-if-rounds", "2", "--what-if-budget", "20",
                              "--job-what-if-budget", "400",
                              "--job-what-if-rules", ",".join(HABITS), "--nproc-per-node", "2",
                              str(SCRIPTS / "ddp_habits.py"), "--threads-all", "--find-unused", "--unused-head",
                              "--accumulate", "4",
                              what_if=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return report


def _finding(report: dict, rule: str) -> dict:
    found = [f for f in report["findings"] if f["rule"] == rule]
    assert len(found) == 1, [f["rule"] for f in report["findings"]]
    return found[0]


@pytest.mark.parametrize("rule, fact, value", [
    ("accumulation-syncs", "synced_passes_per_step", 1.0),
    ("ddp-static-graph", "static_graph", [True]),
    ("cpu-oversubscribed", "threads", None),  # None: the recommended count
])
def test_each_fix_is_timed_on_every_rank_and_took_effect_there(habits, rule, fact, value):
    f = _finding(habits, rule)
    what_if = f["what_if"]
    assert what_if["kind"] == "job" and what_if["ranks"] == 2, what_if
    assert len(what_if["rounds"]) >= 2
    expected = [f["evidence"]["recommended_threads"]] if value is None else value
    assert what_if["observed"][fact] == expected, what_if["observed"]
    # Each candidate run carries its own fix only: the other habits are still there.
    others = {"synced_passes_per_step": 4.0, "static_graph": [False]}
    for other, before in others.items():
        if other != fact:
            assert what_if["observed"][other] == before, what_if["observed"]
    # The severity follows what the job measured, whichever way it went on this machine.
    if what_if["verdict"] == "faster":
        assert f["severity"] == severity_for(f["gain_share"])
    else:
        assert f["severity"] == "low"


def test_the_job_findings_point_at_the_lines_to_change(habits):
    lines = (SCRIPTS / "ddp_habits.py").read_text().splitlines()
    threads = _finding(habits, "cpu-oversubscribed")
    assert "torch.set_num_threads(" in lines[int(threads["where"].rsplit(":", 1)[1]) - 1]
    assert threads["evidence"]["threads"] == [threads["evidence"]["usable_cores"]] * 2
    static = _finding(habits, "ddp-static-graph")
    assert "find_unused_parameters=" in lines[int(static["where"].rsplit(":", 1)[1]) - 1]
    assert static["what_if"]["observed"]["find_unused_parameters"] == [False]  # static_graph finds them itself
    assert any("fixes timed on every rank" in m for m in habits["messages"]), habits["messages"]
    assert job_processes("ddp_habits.py") == []


# -- each change in one process -------------------------------------------------------------------------


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _all_reduces(model: DistributedDataParallel, forwards: int, step_after: int | None = None) -> int:
    """All-reduces in ``forwards`` micro-batches of ``model`` (an optimizer step after the first ``step_after``)."""
    calls = []

    def counting(state, bucket):
        calls.append(1)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    model.register_comm_hook(None, counting)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(forwards):
        model(torch.randn(4, 8)).sum().backward()
        if i + 1 == step_after:
            opt.step()
    return len(calls)


def test_forced_ddp_keywords_win_even_when_passed_by_position(one_rank_group):
    params = list(inspect.signature(DistributedDataParallel.__init__).parameters.values())[2:]
    upto = next(i for i, p in enumerate(params) if p.name == "find_unused_parameters")
    positional = [p.default for p in params[:upto]] + [True]  # find_unused_parameters=True, given by position
    patcher = apply_change(RankChange(ddp={"find_unused_parameters": False, "gradient_as_bucket_view": True}))
    try:
        model = DistributedDataParallel(nn.Linear(8, 1), *positional)
    finally:
        patcher.restore()
    assert model.find_unused_parameters is False and model.gradient_as_bucket_view is True
    assert DistributedDataParallel(nn.Linear(8, 1), find_unused_parameters=True).find_unused_parameters is True


def test_sync_every_all_reduces_once_per_that_many_backward_passes(one_rank_group):
    patcher = apply_change(RankChange(sync_every=3))
    try:
        assert _all_reduces(DistributedDataParallel(nn.Linear(8, 1)), forwards=6) == 2
        # An optimizer step starts the count again: a stray forward shifts one step's micro-batches, not the run's.
        assert _all_reduces(DistributedDataParallel(nn.Linear(8, 1)), forwards=4, step_after=2) == 0
    finally:
        patcher.restore()
    assert _all_reduces(DistributedDataParallel(nn.Linear(8, 1)), forwards=6) == 6


def _fsdp_synced(model: nn.Module) -> bool:
    """Whether FSDP is set to reduce-scatter in the next backward of ``model`` (either FSDP's flags)."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    if isinstance(model, FSDPModule):
        states = [m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)]
        flags = {group.reduce_grads for state in states for group in state._fsdp_param_groups}
    else:
        flags = {m._sync_gradients for m in model.modules() if isinstance(m, FullyShardedDataParallel)}
    assert len(flags) == 1, flags  # the root and every sharded module under it alike
    return flags.pop()


def _fsdp_syncs(model: nn.Module, script: str) -> list[bool]:
    """Run ``script`` on ``model``: ``m`` a micro-batch (forward, backward), ``e`` an evaluation forward (no grad),
    ``s`` an optimizer step; after each micro-batch, whether FSDP reduce-scattered it."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    syncs = []
    for action in script:
        if action == "m":
            model(torch.randn(4, 8)).sum().backward()
            syncs.append(_fsdp_synced(model))
        elif action == "e":
            with torch.no_grad():
                model(torch.randn(4, 8))
        else:
            opt.step()
            opt.zero_grad()
    return syncs


def _fully_shard() -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    net = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    fully_shard(net[0])
    return fully_shard(net)


def _older_fsdp() -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FullyShardedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1)), device_id=torch.device("cpu"),
                                    auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))


@pytest.mark.parametrize("build", [_fully_shard, _older_fsdp], ids=["fully_shard", "FullyShardedDataParallel"])
def test_sync_every_makes_fsdp_reduce_scatter_one_micro_batch_in_that_many(one_rank_group, build):
    patcher = apply_change(RankChange(sync_every=3))
    try:
        # Every third micro-batch since the last optimizer step; an evaluation forward is not one, and an
        # optimizer step after an uneven count starts the count again.
        assert _fsdp_syncs(build(), "mmmsmemsmmmmm") == [False, False, True, False, False, False, False, True,
                                                          False, False]
    finally:
        patcher.restore()
    assert _fsdp_syncs(build(), "mmsm") == [True, True, True]


def test_a_forward_run_again_inside_the_backward_is_not_a_micro_batch():
    """Activation checkpointing runs a block's forward again inside the backward: not a micro-batch to count."""
    from turbotrain.doctor.apply.sync_every import _training_forward

    model, seen = nn.Linear(2, 2), []
    x = torch.ones(2, requires_grad=True)
    x.register_hook(lambda grad: seen.append(_training_forward(model)))
    assert _training_forward(model)
    (x * 2).sum().backward()
    assert seen == [False]
    model.eval()
    assert not _training_forward(model)


def test_forced_threads_outlast_the_scripts_own_call():
    before = torch.get_num_threads()
    patcher = apply_change(RankChange(threads=1))
    try:
        torch.set_num_threads(2)  # what the script does: ignored while the change is timed
        assert torch.get_num_threads() == 1
    finally:
        patcher.restore()
        torch.set_num_threads(before)
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(before)


def test_rarer_saves_write_one_call_in_every_n_from_the_named_line_only(tmp_path):
    def save_here(i):
        torch.save({"i": i}, tmp_path / f"here-{i}.pt")  # the line the change names

    line = save_here.__code__.co_firstlineno + 1
    patcher = apply_change(RankChange(save_every=3, save_at=f"{__file__}:{line}"))
    try:
        for i in range(7):
            save_here(i)
            torch.save({"i": i}, tmp_path / f"other-{i}.pt")
    finally:
        patcher.restore()
    # The third and sixth calls write, as ``if (step + 1) % 3 == 0:`` around the save would; other lines all do.
    assert sorted(p.name for p in tmp_path.glob("here-*")) == ["here-2.pt", "here-5.pt"]
    assert len(list(tmp_path.glob("other-*"))) == 7
    torch.save({}, tmp_path / "after.pt")  # restored: every call writes again
    assert (tmp_path / "after.pt").exists()


def test_forced_workers_reach_every_map_style_loader_and_keep_its_signature():
    """Every DataLoader the script builds gets the workers being timed, however it passed num_workers; one over an
    IterableDataset keeps its own (workers would each yield all of it); Lightning reads the signature."""
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    data = TensorDataset(torch.arange(8.0))
    patcher = apply_change(RankChange(loader_workers=3))
    try:
        by_keyword, by_position = DataLoader(data, batch_size=2, num_workers=0), DataLoader(data, 2, False)
        stream = DataLoader(Stream(), batch_size=2)
        assert "num_workers" in inspect.signature(DataLoader.__init__).parameters
    finally:
        patcher.restore()
    assert [(lo.num_workers, lo.persistent_workers) for lo in (by_keyword, by_position)] == [(3, True)] * 2
    assert (stream.num_workers, stream.persistent_workers) == (0, False)
    assert DataLoader(data).num_workers == 0  # restored


def test_forced_fsdp_keywords_reach_every_name_of_fully_shard_and_its_result_comes_back(monkeypatch):
    """Every name a script imports ``fully_shard`` by takes the keyword; the call still returns the sharded module
    (a script that writes ``model = fully_shard(model)`` keeps its model)."""
    import torch.distributed._composable.fsdp as composable
    import torch.distributed.fsdp as fsdp
    import torch.distributed.fsdp._fully_shard as inner

    def fully_shard(module, *, mesh=None, reshard_after_forward=None):
        return ("sharded", module, reshard_after_forward)

    for module in (fsdp, inner, composable):
        monkeypatch.setattr(module, "fully_shard", fully_shard)
    APPLIED.clear()
    patcher = apply_change(RankChange(fsdp={"reshard_after_forward": False}))
    try:
        results = [fsdp.fully_shard("block"), inner.fully_shard("model", reshard_after_forward=True),
                   composable.fully_shard("head")]
    finally:
        patcher.restore()
    assert results == [("sharded", "block", False), ("sharded", "model", False), ("sharded", "head", False)]
    assert APPLIED["fully_shard calls with reshard_after_forward=False"] == 3
    assert fsdp.fully_shard is fully_shard  # restored


def test_the_older_fsdp_shards_grad_and_optimizer_state_only_where_it_was_left_to_full_sharding(monkeypatch):
    """reshard_after_forward=False for FullyShardedDataParallel: its default and FULL_SHARD become SHARD_GRAD_OP,
    HYBRID_SHARD its ZeRO-2 twin; a strategy the script chose otherwise stays."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    def __init__(self, module, process_group=None, sharding_strategy=None, **kwargs):
        self.__dict__["chosen"] = sharding_strategy

    monkeypatch.setattr(FullyShardedDataParallel, "__init__", __init__)
    APPLIED.clear()
    patcher = apply_change(RankChange(fsdp={"reshard_after_forward": False}))
    try:
        strategies = [{}, *({"sharding_strategy": getattr(ShardingStrategy, name)}
                             for name in ("FULL_SHARD", "HYBRID_SHARD", "NO_SHARD"))]
        chosen = [FullyShardedDataParallel(nn.Linear(2, 2), **kw).__dict__["chosen"] for kw in strategies]
    finally:
        patcher.restore()
    assert chosen == [ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy.SHARD_GRAD_OP,
                      ShardingStrategy._HYBRID_SHARD_ZERO2, ShardingStrategy.NO_SHARD]
    assert APPLIED["FullyShardedDataParallel with sharding_strategy=SHARD_GRAD_OP"] == 2
    assert FullyShardedDataParallel.__init__ is __init__  # restored


RARER = """\
import json, sys
hits = []
for step in range(10):
    if step % 2 == 0:
        hits.append(step)
json.dump(hits, open(sys.argv[1], "w"))
raise RuntimeError("the end of the script")
"""


def _hits_when_rarer(tmp_path, every: int) -> list[int]:
    from turbotrain.doctor.apply.rarer_branch import TAKE, rarer_branch_code, taking_one_in
    from turbotrain.doctor.record.recorder import Recorder
    from turbotrain.doctor.record.runner import run_script

    script, out = tmp_path / "loop.py", tmp_path / "hits.json"
    script.write_text(RARER)
    code = rarer_branch_code(str(script), f"{script}:4", every)
    run = run_script(script, [str(out)], Recorder(measure=1), code, {TAKE: taking_one_in(every)})
    # The code compiled with the wrapped test keeps every other line's number.
    assert run.error == "RuntimeError: the end of the script" and run.error_site.line == 7, run
    return json.loads(out.read_text())


def test_a_rarer_branch_runs_its_body_on_one_allowed_pass_in_n(tmp_path):
    """Of the passes ``step % 2 == 0`` allows (steps 0, 2, 4, 6, 8), every n-th runs the body, as a period n times
    longer would."""
    from turbotrain.doctor.apply.rarer_branch import rarer_branch_code

    assert _hits_when_rarer(tmp_path, 3) == [4]
    assert _hits_when_rarer(tmp_path, 2) == [2, 6]
    with pytest.raises(ValueError, match="no `if` starts on this line"):
        rarer_branch_code(str(tmp_path / "loop.py"), f"{tmp_path / 'loop.py'}:3", 2)
    with pytest.raises(ValueError, match="not a line of the script"):
        rarer_branch_code(str(tmp_path / "loop.py"), "other.py:4", 2)


@pytest.mark.parametrize("bad", [dict(threads=0), dict(sync_every=1), dict(save_every=1),
                                 dict(branch_every=4), dict(branch_every=1, branch_at="t.py:3"),
                                 dict(loader_workers=0)])
def test_a_change_that_cannot_be_applied_is_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        RankChange(**bad)


# -- the timing loop on job runs built by hand ----------------------------------------------------------


def _job(step_ms: float) -> JobRun:
    outcomes = [RankOutcome(r, recording=rank_recording(r, [1.0] * 9, [1.0] * 9, step_ms=step_ms)) for r in (0, 1)]
    return JobRun(["torchrun"], 0, 1.0, outcomes)


def _asking(change: RankChange) -> Finding:
    f = Finding("accumulation-syncs", message="m", fix=Fix("f"), request=JobRequest(change))
    f.provisional("medium")
    return f


def test_the_ratio_is_the_job_as_it_is_over_the_job_with_the_fix():
    fast, broken = RankChange(sync_every=4), RankChange(threads=1)
    runs = []

    def run(change):
        runs.append(change)
        if change is broken:
            return dataclasses.replace(_job(40.0), failure="rank 1 failed at step 3: RuntimeError: boom")
        return _job(20.0 if change is fast else 40.0)

    findings = [_asking(fast), _asking(broken)]
    time_on_the_job(JobTiming(run, run_s=1.0, budget_s=100.0), findings)
    assert runs[:3] == [None, fast, broken]  # the job as it is first in every round, then each fix
    timed, failed = findings
    assert timed.what_if.kind == "job" and timed.what_if.rounds[:2] == (2.0, 2.0)
    assert timed.gain_share == pytest.approx(0.5) and timed.severity == "high"
    assert failed.severity == "low" and failed.what_if is None and "RuntimeError: boom" in failed.note


def _every_other_step(long_ms: float, short_ms: float) -> JobRun:
    """A job whose even steps take ``long_ms`` (rank 0 evaluating every other step) and odd ones ``short_ms``."""
    def recording(rank):
        built, t, steps = rank_recording(rank, [1.0] * 10, [1.0] * 10), 100.0, []
        for s in built.steps:
            duration = (long_ms if s.index % 2 == 0 else short_ms) / 1e3
            steps.append(dataclasses.replace(s, start=t, end=t + duration))
            t += duration
        return dataclasses.replace(built, steps=tuple(steps))

    return JobRun(["torchrun"], 0, 1.0, [RankOutcome(r, recording=recording(r)) for r in (0, 1)])


def test_each_timed_run_measures_half_a_second_of_steps_within_bounds():
    from turbotrain.doctor.whatif.job import MAX_STEPS, STEPS, timed_steps

    assert timed_steps(0.010) == 50  # a 10 ms step: half a second of them
    assert timed_steps(0.300) == STEPS  # a slow step: no fewer than enough for a median
    assert timed_steps(0.0005) == MAX_STEPS and timed_steps(0.0) == STEPS


def test_a_fix_that_makes_work_rarer_compares_the_jobs_mean_step():
    """Of 9 measured steps, 4 evaluate (50 ms) and 5 do not (10 ms): the median is an ordinary step, so only the
    mean (27.8 ms) says what evaluating on one pass in 4 buys; a fix of every step compares the medians."""
    rarer, threads = RankChange(branch_every=4, branch_at="train.py:40"), RankChange(threads=1)
    findings = [_asking(rarer), _asking(threads)]
    time_on_the_job(JobTiming(lambda change: _job(10.0) if change else _every_other_step(50.0, 10.0), run_s=1.0,
                              budget_s=100.0), findings)
    assert findings[0].what_if.rounds[0] == pytest.approx((4 * 50 + 5 * 10) / 9 / 10, abs=1e-3)
    assert findings[1].what_if.rounds[0] == pytest.approx(1.0)


def test_only_the_rules_asked_for_are_timed_on_the_job(habits):
    timed = {f["rule"] for f in habits["findings"] if (f.get("what_if") or {}).get("kind") == "job"}
    assert timed == set(HABITS), habits["findings"]
    left = [f for f in habits["findings"] if f["rule"] not in HABITS and "--job-what-if-rules" in (f["note"] or "")]
    assert all(f.get("what_if") is None for f in left), left


def test_an_unknown_rule_to_time_is_an_error_naming_it(capsys):
    from turbotrain.cli import main

    assert main(["doctor", "--job-what-if-rules", "straggler,stragler", "--nproc-per-node", "2",
                 str(SCRIPTS / "ddp_clean.py")]) == 2
    err = capsys.readouterr().err
    assert "stragler is not a rule id" in err and "straggler," not in err.split("rule ids:")[0], err


def test_rounds_stop_at_the_most_asked_for_whatever_the_budget():
    findings = [_asking(RankChange(sync_every=2))]
    runs = []

    def run(change):
        runs.append(change)
        return _job(40.0 if change is None else 20.0)

    time_on_the_job(JobTiming(run, run_s=1.0, budget_s=1000.0, max_rounds=2), findings)
    assert len(runs) == 4 and len(findings[0].what_if.rounds) == 2
    runs.clear()
    time_on_the_job(JobTiming(run, run_s=1.0, budget_s=1000.0), [_asking(RankChange(sync_every=2))])
    assert len(runs) == 6  # three rounds where the budget has room, by default


def test_a_fix_whose_rounds_disagree_gets_two_rounds_more_and_a_clear_one_does_not():
    """A fix worth nothing on a machine where one launch of the job runs 20% faster than the next: its three
    rounds say x1.22, x1.02, x1.29 (the judge would call that a gain); a fourth says x1.0, and the four no longer
    clear the noise they show, so no fifth is run."""
    noisy, clear = RankChange(sync_every=2), RankChange(threads=1)
    ratios = iter([1.22, 1.02, 1.29, 1.0, 0.95])
    runs = []

    def run(change):
        runs.append(change)
        if change is noisy:
            return _job(40.0 / next(ratios))
        return _job(20.0 if change is clear else 40.0)

    findings = [_asking(noisy), _asking(clear)]
    time_on_the_job(JobTiming(run, run_s=1.0, budget_s=1000.0), findings)
    assert findings[0].what_if.rounds == pytest.approx((1.22, 1.02, 1.29, 1.0), abs=1e-3)
    assert findings[0].what_if.verdict == "within noise" and findings[0].severity == "low"
    assert len(findings[1].what_if.rounds) == 3 and findings[1].what_if.verdict == "faster"
    assert runs.count(clear) == 3 and runs.count(None) == 4  # the extra round runs only the disputed fix
    # Where the user asked for two rounds at most, two it is.
    ratios = iter([1.22, 1.02])
    time_on_the_job(JobTiming(run, run_s=1.0, budget_s=1000.0, max_rounds=2), [f := _asking(noisy)])
    assert len(f.what_if.rounds) == 2


def test_fixes_beyond_the_budget_are_said_not_timed():
    findings = [_asking(RankChange(sync_every=2)), _asking(RankChange(threads=1))]
    time_on_the_job(JobTiming(lambda change: _job(40.0), run_s=10.0, budget_s=45.0), findings)
    timed, skipped = findings
    assert timed.what_if is not None and skipped.what_if is None
    assert "Not timed" in skipped.note and "--job-what-if-budget" in skipped.note


def test_autocast_wraps_every_ddp_call_and_counts_the_training_forwards(one_rank_group):
    from turbotrain.doctor.apply.change import APPLIED

    key, seen = "forwards under autocast bfloat16", []
    before = APPLIED[key]
    patcher = apply_change(RankChange(autocast="bfloat16"))
    try:
        model = DistributedDataParallel(nn.Linear(8, 4))
        model.register_forward_pre_hook(lambda *_: seen.append(torch.is_autocast_enabled("cpu")))
        assert model(torch.randn(2, 8)).dtype == torch.bfloat16
        with torch.no_grad():
            model(torch.randn(2, 8))  # not a training forward: not counted
    finally:
        patcher.restore()
    assert model(torch.randn(2, 8)).dtype == torch.float32
    assert seen == [True, True, False]
    assert APPLIED[key] - before == 1  # what the rank's result reports: the fix ran


def test_autocast_off_disables_the_script_s_autocasts_in_that_dtype_and_counts_them():
    """The slow-mixed-precision fix on every rank: the script's own autocasts in bfloat16 (given, by default, or
    through torch.cpu.amp's) run in float32; one in another dtype, and one already off, are left alone."""
    from turbotrain.doctor.apply.change import APPLIED

    key = "autocasts in bfloat16 turned off"
    before = APPLIED[key]
    layer, x = nn.Linear(8, 4), torch.randn(2, 8)
    patcher = apply_change(RankChange(autocast_off="bfloat16"))
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer(x).dtype == torch.float32
        with torch.autocast("cpu"):  # the CPU's default autocast dtype is bfloat16
            assert layer(x).dtype == torch.float32
        with pytest.warns(FutureWarning):  # torch's deprecated spelling, which scripts still use
            legacy = torch.cpu.amp.autocast()
        with legacy:
            assert layer(x).dtype == torch.float32
        with torch.autocast("cpu", torch.bfloat16, False):  # off already, by position: not counted
            assert layer(x).dtype == torch.float32
        with torch.autocast("cpu", dtype=torch.float16):  # another dtype: as the script wrote it
            assert layer(x).dtype == torch.float16
    finally:
        patcher.restore()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16
    assert APPLIED[key] - before == 3
    assert "enabled=False" in RankChange(autocast_off="bfloat16").describe()
    with pytest.raises(ValueError, match="autocast_off"):
        RankChange(autocast_off="float32")


def test_mixed_precision_on_a_job_is_asked_of_every_rank():
    """On a job the model is in the ranks, not the doctor: bf16 is timed as autocast on every rank, where this
    CPU has bf16 at all (hardware facts, not speed)."""
    import dataclasses

    from doctor_helpers import rank_recording
    from turbotrain.doctor.analysis.context import build_context
    from turbotrain.doctor.requests import JobRequest
    from turbotrain.doctor.rules import evaluate

    recs = [rank_recording(r, [1.0] * 9, [2.0] * 9) for r in (0, 1)]
    ctx = build_context(dataclasses.replace(recs[0], job=tuple(recs)))
    found = evaluate(ctx, only=["no-mixed-precision"])
    if not ctx.hw.bf16:
        assert all(not isinstance(f.request, JobRequest) for f in found)
        return
    (finding,) = found
    assert isinstance(finding.request, JobRequest) and finding.request.change == RankChange(autocast="bfloat16")
    assert evaluate(build_context(recs[0]), only=["no-mixed-precision"]) == []  # one process, no model: nothing
