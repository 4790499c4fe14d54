"""The one torch.compile what-if of the suite: a tiny model, compiled and timed against eager."""

from __future__ import annotations

import shutil
import sys

import torch

import pytest

from doctor_helpers import run_doctor

pytestmark = pytest.mark.one_core  # one process, one thread: run beside one other such test (tests/conftest.py)


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                    reason="torch.compile on CPU needs a C++ compiler")
def test_compile_is_measured_when_asked():
    report = run_doctor("batch_size_one", compile=True, what_if_budget_s=120)
    finding = next(f for f in report.findings if f.rule == "jit-script")
    assert finding.measured and finding.what_if.changes == {"compile": True}, finding.note
    assert finding.what_if.compile_s > 0 and finding.what_if.candidate_ms > 0
    assert finding.est_speedup is not None and finding.speedup == "compile"


class _ScriptLayer(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x)


_ScriptLayer.__module__ = "__main__"  # as a class defined in the user's script is


def test_the_scripts_globals_are_main_while_its_layers_rerun():
    """torch.compile resolves a script-defined layer's globals through sys.modules["__main__"], also when the
    outermost module is torch's own (an nn.Sequential of the script's layers)."""
    from types import SimpleNamespace

    from turbotrain.doctor.whatif import script_as_main

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), _ScriptLayer())
    before = sys.modules["__main__"]
    with script_as_main(SimpleNamespace(capture=SimpleNamespace(module=model))):
        assert sys.modules["__main__"].__dict__.get("_ScriptLayer") is _ScriptLayer
    assert sys.modules["__main__"] is before


def test_a_model_of_repeated_blocks_is_timed_compiled_block_by_block():
    """compile-regional on eight identical blocks compiled whole: found at the torch.compile line, and timed as the
    model compiled whole against each block compiled, both compiled fresh: their first calls and their steps."""
    from doctor_helpers import marked_lines
    from turbotrain.doctor.results import CompileResult

    report = run_doctor("compile_repeated_blocks", what_if_budget_s=60)
    finding = next(f for f in report.findings if f.rule == "compile-regional")
    ((_, line),) = [m for m in marked_lines("compile_repeated_blocks") if m[0] == "compile-regional"]
    assert finding.site.line == line and finding.evidence.blocks == 8 and finding.evidence.container == "blocks"
    assert "for block in model.blocks: block.compile()" in finding.fix.pytorch
    what_if = finding.what_if
    assert finding.measured and isinstance(what_if, CompileResult), finding.note
    assert len(what_if.rounds) >= 2 and what_if.baseline_first_calls_s > 0 and what_if.candidate_first_calls_s > 0
    assert "block by block" in finding.note


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.inner(x))


@pytest.mark.parametrize("block", [_Block, lambda: torch.nn.Linear(4, 4)], ids=["own-class", "torch-class"])
def test_regional_compilation_compiles_each_block_of_a_copy_and_leaves_the_rest_eager(block):
    """A block of the script's own class is compiled in place; one of torch's, whose code Dynamo skips (its
    ``compile()`` would compile nothing), is replaced by ``torch.compile(block)``: either way each block's call
    compiles a graph, the first block's code reused by the others."""
    from torch._dynamo.utils import counters

    from turbotrain.doctor.rules.compile._common import regionally_compiled

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ModuleList(block() for _ in range(3)))
    compiled = torch.compile(model, backend="eager")
    copy = regionally_compiled(compiled, "1")
    assert copy[0]._compiled_call_impl is None and type(copy[0]) is torch.nn.Linear  # the rest stays eager
    assert all(b._compiled_call_impl is None and not hasattr(b, "_orig_mod") for b in model[1])  # untouched
    torch._dynamo.reset()
    counters.clear()
    x = copy[0](torch.randn(2, 4))
    for b in copy[1]:
        x = b(x)
    assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])
    assert copy[1][0] is not model[1][0]  # a copy: the script's model is untouched


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                    reason="torch.compile on CPU needs a C++ compiler")
def test_a_variant_compiles_without_the_graphs_the_script_cached():
    """The script compiled this graph before the what-if: Inductor's on-disk cache holds it. A variant compiled for
    a what-if must pay the compile a fresh run pays (no cache hit), or the compile seconds it is judged on are not
    comparable with those of a variant whose graph is new."""
    from torch._dynamo.utils import counters

    from turbotrain.doctor.rules.compile._common import _fresh_dynamo

    def scaled(x):
        return torch.tanh(x) * 3 + 1

    x = torch.randn(8, 8)
    torch._dynamo.reset()
    torch.compile(scaled)(x)  # the script's own compile: into the on-disk cache
    torch._dynamo.reset()
    counters.clear()
    with _fresh_dynamo():
        torch.compile(scaled)(x)
    assert counters["inductor"]["fxgraph_cache_hit"] == 0, dict(counters["inductor"])
    torch._dynamo.reset()
    torch.compile(scaled)(x)  # outside a what-if the cache serves the graph again
    assert counters["inductor"]["fxgraph_cache_hit"] == 1, dict(counters["inductor"])


def test_new_lengths_past_the_recompile_limit_are_timed_with_dynamic_against_the_eager_fallback():
    """compile_recompile_limit.py compiles with dynamic=False and meets 20 lengths: torch falls back to eager after
    8 graphs. dynamic=True is compiled fresh and timed against eager (what the script ran after the limit), then
    stepped on lengths the run's failed guards named: one graph serves them all."""
    from doctor_helpers import cached_report
    from turbotrain.doctor.results import CompileResult

    report = cached_report("compile_recompile_limit")
    finding = next(f for f in report.findings if f.rule == "compile-recompile")
    assert finding.evidence.limit == "recompile_limit" and finding.evidence.kind == "new-shape"
    what_if = finding.what_if
    assert finding.measured and isinstance(what_if, CompileResult), finding.note
    assert what_if.baseline.startswith("eager") and what_if.candidate == "compiled with dynamic=True"
    assert what_if.other_lengths == 4 and what_if.graphs_for_other_lengths == 0, what_if
    assert len(what_if.rounds) >= 2 and what_if.candidate_first_calls_s > 0
    assert "ran it eagerly after the limit" in finding.note


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                    reason="torch.compile on CPU needs a C++ compiler")
def test_a_rerun_compile_reads_the_graphs_the_run_left_in_inductors_cache():
    """The run compiled the model (Inductor wrote its graphs to disk); a fresh compile of a copy, with nothing in
    memory, reads them back: what a rerun on this machine pays. A budget under one compile times nothing."""
    from types import SimpleNamespace

    from turbotrain.doctor.record.compile_watch import CompileFacts, CompiledCode
    from turbotrain.doctor.rules.compile._common import cached_compile
    from turbotrain.doctor.sites import Site

    class Budget:
        def __init__(self, left):
            self.left = left

        def allows(self, cost_s):
            return cost_s <= self.left

    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(24, 24), torch.nn.GELU()))
    x = torch.randn(4, 24)
    model(x).pow(2).mean().backward()  # the run: compiled (or read from an earlier run), its graphs on disk
    code = CompiledCode("forward", Site("t.py", 1), None, 1, 1, (), (), first_compile_s=1.0)
    ctx = SimpleNamespace(capture=SimpleNamespace(args=(x,), kwargs={}, module=model), on_gpu=False,
                          compiled=CompileFacts(codes=(code,)), facts=SimpleNamespace(autocast=False))
    cached = cached_compile(ctx, model, Budget(60.0))
    assert cached is not None and cached.graphs_read >= 1, cached
    assert cached_compile(ctx, model, Budget(1.5)) is None
    torch._dynamo.reset()


def test_a_print_in_the_compiled_forward_is_timed_with_the_prints_taken_out():
    """compile_print_in_forward.py prints a statistic inside its compiled forward: a graph break at that line,
    timed as the model compiled as it is (its prints written nowhere) against print a no-op, which torch traces."""
    from doctor_helpers import cached_report, marked_lines
    from turbotrain.doctor.results import CompileResult

    report = cached_report("compile_print_in_forward")
    finding = next(f for f in report.findings if f.rule == "compile-graph-break")
    ((_, line),) = marked_lines("compile_print_in_forward")
    assert finding.site.line == line and finding.evidence.kind == "print-or-logging"
    what_if = finding.what_if
    assert finding.measured and isinstance(what_if, CompileResult), finding.note
    assert what_if.candidate == "compiled with the prints out of forward" and len(what_if.rounds) >= 2
    assert "print a no-op" in finding.note


def test_a_branch_on_a_tensor_in_the_compiled_forward_is_timed_as_torch_where():
    """compile_branch_in_forward.py branches in Python on a tensor's value in each block: a graph break at that
    line, timed as the model compiled as it is against a copy whose blocks compute the branch as one torch.where."""
    from doctor_helpers import cached_report, marked_lines
    from turbotrain.doctor.results import CompileResult

    report = cached_report("compile_branch_in_forward")
    finding = next(f for f in report.findings if f.rule == "compile-graph-break")
    ((_, line),) = marked_lines("compile_branch_in_forward")
    assert finding.site.line == line and finding.evidence.kind == "data-dependent-branch"
    assert finding.evidence.where == "h = torch.where(h.abs().amax() > 1.0, h / 2, h)"
    what_if = finding.what_if
    assert finding.measured and isinstance(what_if, CompileResult), finding.note
    assert what_if.candidate == "compiled with the branch as torch.where" and len(what_if.rounds) >= 2
    assert what_if.baseline_ms > 0 and what_if.candidate_ms > 0


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                    reason="torch.compile on CPU needs a C++ compiler")
def test_max_autotune_is_timed_against_the_default_mode_at_the_compile_line():
    """compile_max_autotune.py compiles with mode="max-autotune" for a short run: found at its torch.compile line,
    and timed as the model compiled in that mode against the default mode, fresh compiles of both."""
    from doctor_helpers import marked_lines
    from turbotrain.doctor.results import CompileResult

    report = run_doctor("compile_max_autotune", what_if_budget_s=60)
    finding = next(f for f in report.findings if f.rule == "compile-mode")
    ((_, line),) = marked_lines("compile_max_autotune")
    assert finding.site.line == line and finding.evidence.mode == "max-autotune"
    what_if = finding.what_if
    assert finding.measured and isinstance(what_if, CompileResult), finding.note
    assert what_if.candidate == "compiled in the default mode" and len(what_if.rounds) >= 2
    assert what_if.baseline_first_calls_s > 0 and what_if.candidate_first_calls_s > 0
    assert "in max-autotune against" in finding.note


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                    reason="torch.compile on CPU needs a C++ compiler")
def test_a_run_that_ends_before_compile_can_pay_back_is_priced_over_the_whole_run():
    """compile_short_run.py compiles a small MLP and ends by itself after 8 steps (the doctor asks for 9): the
    finding names the run's length and judges the whole run, compiling included, so it is rated high: seconds of
    compiling against milliseconds of steps, whatever the compiled step buys."""
    from doctor_helpers import marked_lines
    from turbotrain.doctor.results import CompileResult

    report = run_doctor("compile_short_run", what_if_budget_s=30)
    assert report.status == "incomplete" and report.steps_completed == 8
    finding = next(f for f in report.findings if f.rule == "compile-pays-back")
    ((_, line),) = marked_lines("compile_short_run")
    assert finding.site.line == line
    assert "This run ended by itself after 8 steps" in finding.message
    assert finding.request.first  # timed before the plan's trials: the run shows compiling dwarfs it
    what_if = finding.what_if
    assert finding.measured and isinstance(what_if, CompileResult), finding.note
    assert what_if.run_steps == 8 and what_if.compile_s > 0
    assert finding.severity == "high" and finding.est_speedup > 2, (finding.est_speedup, finding.note)
    assert "eagerly" in finding.fix.pytorch
