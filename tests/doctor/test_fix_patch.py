"""doctor --fix's patch file: git-apply-able diffs (header skipped), fixes combined through each other's line
shifts, by-hand entries naming the line, and no patch that does not compile."""

from __future__ import annotations

import dataclasses
import textwrap
from types import SimpleNamespace

import pytest

pytest.importorskip("libcst", reason="doctor --fix needs libcst: pip install -e '.[fix]'")

from doctor_helpers import git_apply
from turbotrain.doctor.fixes.model import EditRequest
from turbotrain.doctor.report.fix_results import FixResult
from turbotrain.doctor.fixes.diff import PatchError, check_compiles, combine, make_diffs, render_patch, unified_diff

TRAIN = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(ds, batch_size=32, num_workers=cfg.workers)
    for x, y in loader:
        loss = model(x).mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()""")  # no newline at the end: the diff must say so


def _result(path, kind, line, rule, **params) -> FixResult:
    request = EditRequest(rule=rule, kind=kind, file=str(path), line=line, where=f"train.py:{line}", label=rule,
                          params=params)
    return FixResult(rule=rule, where=request.where, label=rule, request=request)


def test_fixes_combine_through_each_others_line_shifts_and_the_patch_applies(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    results = [_result(path, "autocast", 6, "no-mixed-precision", device="cpu", dtype="bfloat16"),
               _result(path, "zero_grad", 7, "zero-grad-not-none"),
               _result(path, "loader", 4, "num-workers", num_workers=2)]
    originals = make_diffs(results, str(tmp_path))
    assert [r.diff is not None for r in results] == [True, True, False]
    assert "cfg.workers" in results[2].by_hand and "`loader = DataLoader(ds, batch_size=32, num_workers=cfg.workers)`" \
        in results[2].by_hand
    texts = combine(results, originals, str(tmp_path))
    patch = tmp_path / "fixes.patch"
    patch.write_text(render_patch(["turbotrain doctor --fix: train.py", "by hand  num-workers ..."], originals,
                                  texts, str(tmp_path)))
    git_apply(tmp_path, patch)
    applied = path.read_text()
    assert applied == texts[str(path)] and not applied.endswith("\n")
    assert "    with torch.autocast('cpu', dtype=torch.bfloat16):\n        loss = model(x).mean()\n" \
           "    opt.zero_grad(set_to_none=True)\n" in applied
    check_compiles(applied, "train.py")


def test_a_diff_of_a_file_without_a_final_newline_applies(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\ny = 2")
    patch = tmp_path / "p.patch"
    patch.write_text(unified_diff("x = 1\ny = 2", "x = 1\ny = 3", "a.py"))
    git_apply(tmp_path, patch)
    assert (tmp_path / "a.py").read_text() == "x = 1\ny = 3"


def test_text_that_does_not_compile_is_refused():
    with pytest.raises(PatchError, match="does not compile"):
        check_compiles("def f(:\n", "train.py")


def test_a_patch_verified_slower_together_keeps_only_fixes_verified_faster_alone(monkeypatch):
    """On an H200, gpu_habits.py's patch (pin_memory, cudnn.benchmark) verified x0.84 together with no time left to
    verify each alone, and was written anyway. --verify must not hand over a patch it measured slower."""
    from turbotrain.doctor.fixes import attach
    from turbotrain.doctor.report.fix_results import FixReport, FixResult, Verification
    from turbotrain.measure import FASTER, SLOWER

    def fix(rule: str, alone: Verification | None = None) -> FixResult:
        return FixResult(rule=rule, where=f"train.py:{len(rule)}", label=rule, predicted=1.02, diff="-a\n+b\n",
                         verification=alone)

    class NoTimeToVerifyAlone:
        options = SimpleNamespace(budget_s=25.0)

        def affords(self, comparisons: int, run_s: float) -> bool:
            return False

    slower = Verification(speedup=0.84, verdict=SLOWER, ratios=[0.83, 0.85])
    monkeypatch.setattr(attach._VerifyRun, "check", lambda *args: slower)
    unverified = [fix("pin-memory"), fix("cudnn-benchmark-off")]
    report = FixReport(fixes=unverified)
    attach._verify(report, unverified, attach._VerifyRun(NoTimeToVerifyAlone(), {}, "/tmp", 10, 1.0))
    assert report.together is slower and report.kept == []
    assert all("verified slower (x0.84)" in f.dropped for f in unverified)
    assert any("x0.84 (slower)" in m and "0 of 2" in m for m in report.messages), report.messages

    faster_alone = fix("non-blocking", Verification(speedup=1.3, verdict=FASTER, ratios=[1.3, 1.3]))
    mixed = [faster_alone, fix("pin-memory")]
    report = FixReport(fixes=mixed)
    attach._verify(report, mixed, attach._VerifyRun(NoTimeToVerifyAlone(), {}, "/tmp", 10, 1.0))
    assert report.kept == [faster_alone]

    # A memory fix that saved memory alone stays whatever its time; a fix for time that lowered the peak by chance
    # is still judged by its time.
    saved = {"original_bytes": 100 << 20, "patched_bytes": 50 << 20}
    memory_fix = fix("activation-memory", Verification(speedup=0.7, verdict=SLOWER, ratios=[0.7], peak_memory=saved))
    memory_fix.purpose = "memory"
    time_fix = fix("pin-memory", Verification(speedup=0.99, verdict="within noise", ratios=[0.99], peak_memory=saved))
    both = [memory_fix, time_fix]
    report = FixReport(fixes=both)
    attach._verify(report, both, attach._VerifyRun(NoTimeToVerifyAlone(), {}, "/tmp", 10, 1.0))
    assert report.kept == [memory_fix] and "not faster alone" in time_fix.dropped


def test_fixes_together_that_one_fix_alone_beat_in_every_round_keep_only_the_fixes_verified_alone(monkeypatch):
    """On the DDP tutorial spawned on 2 cores, torch.set_num_threads(1) verified x3.60 alone and, with 2 workers per
    rank that were never verified alone, x1.54 together: "faster", and the patch held both."""
    from turbotrain.doctor.fixes import attach
    from turbotrain.doctor.report.fix_results import FixReport, FixResult, Verification
    from turbotrain.measure import FASTER

    class NoTimeLeft:
        options = SimpleNamespace(budget_s=120.0)

        def affords(self, comparisons: int, run_s: float) -> bool:
            return False

    def fixes() -> list[FixResult]:
        threads = FixResult(rule="cpu-oversubscribed", where="multigpu.py:83", label="threads", predicted=3.2,
                            diff="-a\n+b\n", verification=Verification(speedup=3.6, verdict=FASTER, ratios=[3.5, 3.7]))
        workers = FixResult(rule="num-workers", where="multigpu.py:74", label="workers", predicted=1.12,
                            diff="-c\n+d\n")
        return [threads, workers]

    together = Verification(speedup=1.54, verdict=FASTER, ratios=[1.5, 1.58])
    monkeypatch.setattr(attach._VerifyRun, "check", lambda *args: together)
    threads, workers = both = fixes()
    report = FixReport(fixes=both)
    attach._verify(report, both, attach._VerifyRun(NoTimeLeft(), {}, "/tmp", 10, 1.0))
    assert report.kept == [threads] and report.together is threads.verification
    assert "cpu-oversubscribed alone x3.60" in workers.dropped
    assert any("x1.54, slower than cpu-oversubscribed alone" in m and "1 of 2" in m for m in report.messages)

    # Rounds that overlap are no evidence that the fix alone is better: both stay.
    close = Verification(speedup=3.3, verdict=FASTER, ratios=[3.2, 3.55])
    monkeypatch.setattr(attach._VerifyRun, "check", lambda *args: close)
    threads, workers = both = fixes()
    report = FixReport(fixes=both)
    attach._verify(report, both, attach._VerifyRun(NoTimeLeft(), {}, "/tmp", 10, 1.0))
    assert report.kept == both and report.together is close


def test_fixes_for_time_are_not_dropped_for_the_price_of_a_fix_for_memory_beside_them(monkeypatch):
    """Checkpointing beside fused AdamW and SDPA made the patch x0.62 (minGPT, 2-core EPYC) and took both time fixes
    out with it: with time for one more comparison, the time fixes are judged together without the memory fix."""
    from turbotrain.doctor.fixes import attach
    from turbotrain.doctor.report.fix_results import FixReport, FixResult, Verification
    from turbotrain.measure import SLOWER

    class OneMoreComparison:
        """A budget that holds none of the three fixes alone, then one comparison (``at``: the call it allows)."""

        options = SimpleNamespace(budget_s=120.0)

        def __init__(self, at: int = 4):
            self.at, self.calls = at, 0

        def affords(self, comparisons: int, run_s: float) -> bool:
            self.calls += 1
            return self.calls == self.at

    def verified(run, results) -> Verification:
        memory = any(r.purpose == "memory" for r in results)
        return Verification(speedup=0.62 if memory else 1.04, verdict=SLOWER if memory else "within noise",
                            ratios=[0.62 if memory else 1.04])

    monkeypatch.setattr(attach._VerifyRun, "check", verified)
    recompute = FixResult(rule="activation-memory", where="model.py:90", label="checkpoint", diff="-a\n+b\n")
    recompute.purpose = "memory"
    timed = [FixResult(rule=r, where="model.py:64", label=r, diff="-a\n+b\n")
             for r in ("manual-attention", "non-foreach-optimizer")]
    report = FixReport(fixes=[recompute, *timed])
    attach._verify(report, [recompute, *timed], attach._VerifyRun(OneMoreComparison(), {}, "/tmp", 10, 1.0))
    assert report.kept == [recompute, *timed] and report.together.speedup == 0.62
    assert any("the price of activation-memory" in m and "x1.04 (within noise), and stay" in m
               for m in report.messages), report.messages
    # Without the time for that comparison, as before: only what was verified faster alone stays.
    report = FixReport(fixes=[recompute, *timed])
    for fix in report.fixes:
        fix.dropped = None
    attach._verify(report, report.fixes, attach._VerifyRun(OneMoreComparison(at=0), {}, "/tmp", 10, 1.0))
    assert all("not faster alone" in f.dropped for f in timed)


def test_graphs_kept_from_step_to_step_are_verified_beside_the_time():
    """--verify's children count the autograd graphs alive at a few step boundaries: where either side kept
    some, the verification says what each kept a step; where neither did, it says nothing."""
    from turbotrain.doctor.fixes.verify import graphs_kept
    from turbotrain.doctor.report.fix_results import Verification
    from turbotrain.doctor.report.fix_section import fix_line

    leak = {"steps": [1, 2, 23, 24], "tensors": [2, 2, 23, 24], "bytes": [8, 8, 92, 96], "growing": True,
            "bytes_per_step": 4.0, "nodes_per_step": 10.0}
    clean = {"steps": [1, 2, 23, 24], "tensors": [1, 1, 1, 1], "bytes": [4, 4, 4, 4], "growing": False,
             "bytes_per_step": 0.0, "nodes_per_step": 0.0}
    kept = graphs_kept(leak, clean)
    assert kept["original"] == {"growing": True, "bytes_per_step": 4, "nodes_per_step": 10.0,
                                "tensors": [2, 2, 23, 24]} and not kept["patched"]["growing"]
    assert graphs_kept(clean, clean) is None and graphs_kept(leak, None) is None
    check = Verification(speedup=1.01, verdict="within noise", ratios=[1.01], graphs_kept=kept)
    assert fix_line(None, check).endswith("graphs kept a step: original 10 nodes and 4 bytes, patched none")
    assert check.to_dict()["graphs_kept"] == kept
    assert "graphs_kept" not in Verification(speedup=1.0, verdict="within noise").to_dict()


def test_the_predicted_speed_up_together_adds_shares_and_keeps_a_lone_slower_fix_slower():
    """A lone fix predicted slower (checkpointing, made for memory) is predicted slower together too, not x1.00;
    fixes of two categories add their shares of the step; within one category only the largest counts."""
    from turbotrain.doctor.fixes.attach import predicted_together

    def fix(predicted: float, category: str) -> FixResult:
        request = EditRequest(rule=category, kind="keywords", file="/tmp/train.py", line=1, where="train.py:1",
                              label=category, category=category)
        return FixResult(rule=category, where=request.where, label=category, request=request, predicted=predicted)

    assert predicted_together([fix(0.71, "compute")]) == 0.71
    assert predicted_together([fix(2.0, "data_loading"), fix(1.25, "compute")]) == round(1 / (1 - 0.5 - 0.2), 3)
    assert predicted_together([fix(2.0, "data_loading"), fix(1.25, "data_loading")]) == 2.0
    assert predicted_together([]) is None


def test_an_edit_the_loop_does_not_take_is_made_as_the_one_its_rule_names_instead(tmp_path):
    """activation-memory may choose micro-batches, with checkpointing instead: a batch made outside the loop takes no
    micro-batches, so the blocks' recomputation is written, its label saying why; with nothing instead, by hand."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent("""\
        import torch
        class Net(torch.nn.Module):
            def forward(self, x):
                for block in self.blocks:
                    x = block(x)
                return x
        x, y = torch.randn(64, 8), torch.randn(64, 1)
        for step in range(10):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
    """))
    recompute = EditRequest(rule="activation-memory", kind="checkpoint", file=str(path), line=5,
                            where="train.py:5", label="recompute blocks.0", params={"blocks": ["blocks.0"]},
                            purpose="memory")
    micro = EditRequest(rule="activation-memory", kind="micro_batches", file=str(path), line=9, where="train.py:9",
                        label="2 micro-batches", params={"k": 2, "dim": 0}, purpose="memory", instead=recompute)
    made = FixResult(rule="activation-memory", where="train.py:5", label="2 micro-batches", request=micro)
    alone = FixResult(rule="activation-memory", where="train.py:5", label="2 micro-batches",
                      request=dataclasses.replace(micro, instead=None))
    make_diffs([made, alone], str(tmp_path))
    assert made.request is recompute and "torch.utils.checkpoint.checkpoint(block, x" in made.diff
    assert made.label.startswith("recompute blocks.0; micro_batches not made: no batch made in the loop") \
        and "(line train.py:9: `loss = " in made.label, made.label
    assert alone.diff is None and alone.request is None and alone.by_hand.startswith("no batch made in the loop")


def test_two_rules_fixes_that_are_the_same_edit_are_made_once_and_both_kept(tmp_path):
    """bf16 autocast at the forward, for speed (no-mixed-precision) and for memory (activation-memory)."""
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    results = [_result(path, "autocast", 6, rule, device="cpu", dtype="bfloat16")
               for rule in ("no-mixed-precision", "activation-memory")]
    originals = make_diffs(results, str(tmp_path))
    texts = combine(results, originals, str(tmp_path))
    assert [r.in_patch for r in results] == [True, True], [r.dropped for r in results]
    assert texts[str(path)].count("torch.autocast") == 1
