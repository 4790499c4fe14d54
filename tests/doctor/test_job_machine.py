"""A job's ranks share their host: the doctor does not count the other ranks as other processes' load, and on
cores the ranks oversubscribe it does not rate which rank is late above low."""

from __future__ import annotations

import dataclasses

import pytest

from doctor_helpers import rank_recording
from turbotrain.doctor.analysis.context import build_context
from turbotrain.doctor.rules import evaluate
from turbotrain.hardware import LoadSample, detect


def _on_one_host(recs, threads: int):
    return [dataclasses.replace(r, host="node0", threads_seen=threads) for r in recs]


def test_a_straggler_on_oversubscribed_cores_stays_low():
    usable = detect("cpu").usable_cores
    recs = [rank_recording(r, [25.0 if r == 1 else 1.0] * 9, [1.0 if r == 1 else 25.0] * 9) for r in (0, 1)]
    fitting = _on_one_host(recs, max(1, usable // 2))
    (finding,) = evaluate(build_context(dataclasses.replace(fitting[0], job=tuple(fitting))), only=["straggler"])
    assert finding.severity == "high"
    crowded = _on_one_host(recs, usable * 2)
    (finding,) = evaluate(build_context(dataclasses.replace(crowded[0], job=tuple(crowded))), only=["straggler"])
    assert finding.severity == "low" and "cpu-oversubscribed" in finding.note


def _load(at: float, busy_jiffies: int, own_s: float) -> LoadSample:
    return LoadSample(at=at, cpu_times=(busy_jiffies, 200 * (1 + int(at))), own_s=own_s, cpus=2)


def test_the_other_ranks_on_the_host_are_not_other_processes_load():
    # Over 1 s on 2 CPUs: 1.8 cores busy in all, 0.9 of them this rank's own, 0.8 its sibling rank's.
    start, end = _load(0.0, 0, 0.0), _load(1.0, 180, 0.9)
    recs = _on_one_host([rank_recording(r, [1.0] * 9, [2.0] * 9) for r in (0, 1)], 1)
    lead = dataclasses.replace(recs[0], load_start=start, load_end=end)
    sibling = dataclasses.replace(recs[1], load_start=_load(0.0, 0, 5.0), load_end=_load(1.0, 180, 5.8))
    alone = build_context(lead)
    assert alone.machine is not None and alone.machine.other_load == pytest.approx(0.9)
    on_the_job = build_context(dataclasses.replace(lead, job=(lead, sibling)))
    assert on_the_job.machine is not None and on_the_job.machine.other_load == pytest.approx(0.1)


SPAWNING = '''import torch
import torch.multiprocessing as mp


def run(rank, world):
    torch.manual_seed(rank)


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2)
'''


def test_ranks_a_script_spawns_without_setting_threads_are_pointed_at_the_function_they_run(tmp_path):
    usable = detect("cpu").usable_cores
    if usable < 2:
        pytest.skip("one usable core: two ranks oversubscribe it whatever their threads")
    script = tmp_path / "spawning.py"
    script.write_text(SPAWNING)
    recs = _on_one_host([rank_recording(r, [1.0] * 9, [2.0] * 9) for r in (0, 1)], usable)  # each rank: every core
    ctx = build_context(dataclasses.replace(recs[0], job=tuple(recs)), None, str(script))
    (finding,) = evaluate(ctx, only=["cpu-oversubscribed"])
    assert (finding.site.file, finding.site.line, finding.site.function) == (str(script), 5, "run")
    assert f"torch.set_num_threads({usable // 2}) as the first line of run()" in finding.fix.pytorch
