"""`slow-mixed-precision`: autocast in a dtype the device has no fast units for is named where the hardware says so
(and only there), asks for float32 to be timed against the script's autocast, and its edit turns off the autocast
the training forward runs under, as a user writes it (build-nanogpt's `with torch.autocast(...)`, nanoGPT's
`with ctx:`)."""

from __future__ import annotations

import dataclasses
import textwrap
from types import SimpleNamespace

import pytest
from torch import nn

from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.analysis.source import load_sources
from turbotrain.doctor.cst_tools import Source
from turbotrain.doctor.edits import ByHand, EditRequest
from turbotrain.doctor.record.measurements import ForwardFacts, StepRecord
from turbotrain.doctor.record.profiling import TopOp
from turbotrain.doctor.requests import PlanRequest
from turbotrain.doctor.rules import evaluate
from turbotrain.doctor.rules.step import slow_mixed_precision
from turbotrain.doctor.rules.step.slow_mixed_precision import rewrite
from turbotrain.hardware import detect

pytestmark = pytest.mark.reads_no_time


def _steps(compute_ms: float, data_ms: float) -> list[StepRecord]:
    return [StepRecord(i, i * 0.1, i * 0.1 + (compute_ms + data_ms) / 1e3,
                       {"data": data_ms / 1e3, "forward": compute_ms / 3e3, "backward": 2 * compute_ms / 3e3},
                       forwards=1, backwards=1, optimizers=1) for i in range(8)]


def _context(tmp_path, dtype: str | None = "torch.bfloat16", bf16: bool = False, compute_ms: float = 30.0,
             data_ms: float = 2.0, mm_ms: float | None = None) -> Context:
    script = tmp_path / "train.py"
    script.write_text("x = 1\n")
    steps = _steps(compute_ms, data_ms)
    facts = ForwardFacts(module_type="Sequential", autocast=dtype is not None, autocast_dtype=dtype)
    # The profiler window's busiest ops, per step (none: the window was left out).
    ops = () if mm_ms is None else (TopOp("aten::mm", 4, mm_ms, 0.0), TopOp("aten::add", 4, 1.0, 0.0))
    return Context(script=str(script), base=str(tmp_path), hw=dataclasses.replace(detect("cpu"), bf16=bf16),
                   device="cpu", breakdown=compute_breakdown(steps, 1), measured_steps=steps,
                   sources=load_sources([str(script)]), model=nn.Linear(4, 4), facts=facts,
                   recording=SimpleNamespace(job=(), driver=None, top_ops=ops))


def test_autocast_without_fast_units_is_named_and_float32_is_timed_against_it(tmp_path):
    [f] = evaluate(_context(tmp_path), only=["slow-mixed-precision"])
    assert isinstance(f.request, PlanRequest) and f.request.changes == {"precision": "fp32"}
    assert "bfloat16" in f.message and "no bf16 instructions" in f.message
    assert f.fix.lightning == "Trainer(precision='32-true')" and f.fix.hf_trainer == "TrainingArguments(bf16=False)"
    # float16 autocast on a CPU: no fast units either.
    [f16] = evaluate(_context(tmp_path, dtype="torch.float16"), only=["slow-mixed-precision"])
    assert "float16" in f16.message and f16.fix.hf_trainer == "TrainingArguments(fp16=False)"


def test_on_a_job_float32_is_timed_with_every_rank_s_autocasts_off(tmp_path):
    """The ranks' model is not in the doctor's process: the job what-if turns the dtype's autocasts off on each rank."""
    from turbotrain.doctor.rank_change import RankChange
    from turbotrain.doctor.requests import JobRequest

    ctx = _context(tmp_path)
    ctx.model, ctx.recording.job = None, ("rank 0", "rank 1")
    [f] = evaluate(ctx, only=["slow-mixed-precision"])
    assert isinstance(f.request, JobRequest) and f.request.change == RankChange(autocast_off="bfloat16")


def test_until_the_what_if_times_it_the_gain_is_estimated_from_the_matmul_share_and_a_probe(tmp_path, monkeypatch):
    # 24 of the step's 32 ms in matmuls, which the probe finds 4x slower in bf16: 24 * 3/4 = 18 ms saved of 32.
    monkeypatch.setattr(slow_mixed_precision, "_matmul_slowdown", lambda dtype, device: 4.0)
    [f] = evaluate(_context(tmp_path, mm_ms=24.0), only=["slow-mixed-precision"])
    assert not f.measured and f.est_speedup == pytest.approx(32 / (32 - 18), rel=1e-3) and f.severity == "high"
    assert "matmuls and convolutions take 75% of the step" in f.note and "4.0x slower in bfloat16" in f.note
    # No profiler window: no estimate, the provisional rating only.
    [bare] = evaluate(_context(tmp_path), only=["slow-mixed-precision"])
    assert bare.est_speedup is None and bare.severity == "medium"


def test_a_probe_the_device_cannot_run_gives_no_estimate_rather_than_failing_the_rule():
    assert slow_mixed_precision._matmul_slowdown("bool", "cpu") is None   # no matmul for bool on a CPU
    assert slow_mixed_precision._matmul_slowdown("bfloat16", "cpu") > 0


@pytest.mark.parametrize("change", [
    {"bf16": True},           # the device has bf16 units: autocast is what no-mixed-precision asks for
    {"dtype": None},          # no autocast at all
    {"compute_ms": 2.0, "data_ms": 30.0},  # a data-bound step: the compute is not where the time goes
])
def test_it_stays_silent_where_the_dtype_is_fast_or_absent_or_the_compute_is_small(tmp_path, change):
    assert evaluate(_context(tmp_path, **change), only=["slow-mixed-precision"]) == []


NANO = '''\
import torch
from contextlib import nullcontext

device_type = "cpu"
ctx = nullcontext() if device_type == "mps" else torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)


def evaluate(model, x):
    with torch.no_grad():
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
            return model(x)


def train(model, opt, x, y):
    for step in range(10):
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
            logits, loss = model(x, y)
        loss.backward()
        with ctx:
            other = model(x)
        with torch.autocast("cpu", dtype=torch.float16):
            kept = model(x)
        opt.step()
'''


def _rewrite(text: str, line: int) -> str:
    req = EditRequest("slow-mixed-precision", "rule", "train.py", line, f"train.py:{line}", "label",
                      params={"dtype": "bfloat16"})
    return rewrite(Source(text, "train.py"), req)


def _line(text: str, snippet: str) -> int:
    return next(n for n, t in enumerate(text.splitlines(), 1) if snippet in t)


def test_the_edit_turns_off_the_autocast_around_the_forward_and_its_likes_in_the_file():
    new = _rewrite(NANO, _line(NANO, "logits, loss = model(x, y)"))
    assert new.count("dtype=torch.bfloat16, enabled=False)") == 3      # training, evaluate(), and ctx's
    assert 'torch.autocast("cpu", dtype=torch.float16):\n' in new       # another dtype: left as it is
    assert new.replace(", enabled=False", "") == NANO                   # nothing else changed
    compile(new, "train.py", "exec")


def test_a_with_ctx_bound_to_autocast_is_followed_to_its_assignment():
    only_ctx = NANO.replace("dtype=torch.bfloat16):\n            logits", "dtype=torch.float32):\n            logits")
    new = _rewrite(only_ctx, _line(only_ctx, "other = model(x)"))
    assert "autocast(device_type=device_type, dtype=torch.bfloat16, enabled=False)\n" in new
    assert new.count("enabled=False") == 2                              # ctx's and evaluate()'s (the same dtype)


def test_calls_already_off_and_other_dtypes_are_left_and_positional_enabled_is_turned():
    text = textwrap.dedent("""\
        import torch
        with torch.cuda.amp.autocast(True, torch.bfloat16):
            y = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
            z = model(x)
        """)
    new = _rewrite(text, _line(text, "y = model(x)"))
    assert "torch.cuda.amp.autocast(False, torch.bfloat16):" in new
    assert new.count("enabled=False") == 1                              # the island of float32 stays as written


def test_an_autocast_without_a_dtype_edits_only_the_one_around_the_forward():
    text = 'import torch\nwith torch.autocast("cpu"):\n    y = model(x)\nwith torch.autocast("cuda"):\n    z = 1\n'
    new = _rewrite(text, 3)
    assert 'torch.autocast("cpu", enabled=False)' in new and 'torch.autocast("cuda"):' in new


@pytest.mark.parametrize("text, says", [
    # A framework's own autocast takes no `enabled`: its precision flag is the fix.
    ("import torch\nwith accelerator.autocast():\n    y = model(x)\n", r"no `with torch\.autocast\(\.\.\.\)` around"),
    ("import torch\n\ndef step(model, x):\n    return model(x)\n", r"no `with torch\.autocast\(\.\.\.\)` around"),
    ("import torch\nuse_amp = True\nwith torch.autocast('cpu', dtype=torch.bfloat16, enabled=use_amp):\n"
     "    y = model(x)\n", "turned on by `enabled=use_amp`"),
])
def test_what_it_cannot_edit_is_left_by_hand_saying_why(text, says):
    with pytest.raises(ByHand, match=says):
        _rewrite(textwrap.dedent(text), _line(text, "model(x)"))
