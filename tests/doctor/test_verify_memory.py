"""doctor --verify sets each side's memory peak over its measured steps beside the time: the probe on its own, and
a script whose steps hold a 96 MiB scratch tensor verified against its twin without it.

No assertion reads a time: these run with the shared tests.
"""

from __future__ import annotations

import ctypes
import textwrap

import pytest
import torch

from turbotrain.doctor.fixes.verify import Verifier, VerifyOptions, peak_memory
from turbotrain.doctor.record.window_memory import RESIDENT, PeakProbe
from turbotrain.doctor.report.fix_results import Verification
from turbotrain.doctor.report.fix_section import fix_line

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

MIB = 2**20

SCRIPT = textwrap.dedent("""\
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    SCRATCH_MIB = 96
    for step in range(40):
        x = torch.randn(32, 64)
        scratch = torch.ones(SCRATCH_MIB * 2**18)  # float32: SCRATCH_MIB MiB, every page written
        loss = model(x).pow(2).mean() + scratch[:1].sum() * 0
        opt.zero_grad()
        loss.backward()
        opt.step()
        del scratch
""")


def _hand_back_freed_heap() -> None:
    """glibc keeps blocks freed from its heap resident and serves a new large block from them: after earlier tests
    in this worker freed mid-sized tensors, a 64-MiB tensor can take no new page, and the resident peak rightly
    stays. The test needs new pages: the freed heap is handed back first."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator is left as it is
        pass


def test_the_probe_sees_a_tensor_made_and_freed_inside_the_window():
    _hand_back_freed_heap()
    probe = PeakProbe(gpu=False)
    probe.start()
    made = torch.ones(64 * MIB // 4)  # written: resident
    del made
    memory = probe.stop()
    assert memory is not None and memory.kind == RESIDENT
    assert memory.peak_bytes - memory.start_bytes >= 60 * MIB, memory
    # Reset at the next start: the freed tensor's peak is not counted again.
    probe.start()
    again = probe.stop()
    assert again is not None and again.peak_bytes - again.start_bytes < 32 * MIB, again


def test_a_side_without_a_peak_gives_no_memory_line_and_both_give_the_medians():
    side = {"kind": RESIDENT, "start_bytes": 100 * MIB, "peak_bytes": 200 * MIB}
    assert peak_memory([side], [None]) is None and peak_memory([], [side]) is None
    both = peak_memory([side, {**side, "peak_bytes": 220 * MIB}], [{**side, "peak_bytes": 150 * MIB}])
    assert both == {"kind": RESIDENT, "original_bytes": 210 * MIB, "patched_bytes": 150 * MIB,
                    "original_start_bytes": 100 * MIB, "patched_start_bytes": 100 * MIB}
    check = Verification(speedup=1.0, verdict="within noise", ratios=[1.0], peak_memory=both)
    assert fix_line(None, check).endswith("peak memory (process resident) 210.0 MiB, patched 150.0 MiB (-29%)")
    assert check.to_dict()["peak_memory"] == both


def test_verify_measures_the_memory_a_patch_frees_on_each_side(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    options = VerifyOptions(steps=6, warmup=2, rounds=1, budget_s=0, threads=1)
    with Verifier(str(script), [], str(tmp_path), options) as verifier:
        patched = verifier.variant({str(script): SCRIPT.replace("SCRATCH_MIB = 96", "SCRATCH_MIB = 0")})
        check = verifier.compare(patched, steps=6, numerics="exact")
    assert check.error is None, check.error
    assert verifier.warm_runs == 2  # both sides forked from one interpreter that imported torch (warm_start.py)
    peak = check.peak_memory
    assert peak is not None and peak["kind"] == RESIDENT, check
    for side in ("original", "patched"):
        assert 0 < peak[f"{side}_start_bytes"] <= peak[f"{side}_bytes"], peak
    # The original holds one scratch tensor through every step (its optimizer step, where the window opens,
    # included); the patched copy none.
    assert peak["original_bytes"] - peak["patched_bytes"] >= 64 * MIB, peak
    assert "peak memory (process resident)" in fix_line(None, check)


def test_an_original_that_runs_out_of_memory_is_run_once_and_the_patched_side_is_verified_to_fit(tmp_path):
    """The out-of-memory fix's verification: the original dies of the CPU allocator's error (an allocation of 2**45
    floats, refused at once), so only the patched script is measured, every round, and the fix is kept for memory."""
    from turbotrain.doctor.fixes.attach import saves_memory

    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("SCRATCH_MIB = 96", "SCRATCH_MIB = 2**27"))
    options = VerifyOptions(steps=4, warmup=1, rounds=2, budget_s=0, threads=1)
    with Verifier(str(script), [], str(tmp_path), options) as verifier:
        patched = verifier.variant({str(script): SCRIPT.replace("SCRATCH_MIB = 96", "SCRATCH_MIB = 1")})
        check = verifier.compare(patched, steps=4, numerics="precision")
    assert check.error is None, check.error
    assert check.original_out_of_memory and "allocate" in check.original_out_of_memory, check
    assert verifier.warm_runs == 3  # the original once, the patched script in each of the 2 rounds
    assert check.verdict == "fits" and check.speedup is None and len(check.patched_ms) == 2
    assert check.peak_memory is not None and check.peak_memory["patched_bytes"] > 0
    assert saves_memory(check)
    assert "verified: the original ran out of memory, the patched script ran (" in fix_line(None, check)
    assert check.to_dict()["original_out_of_memory"] == check.original_out_of_memory
