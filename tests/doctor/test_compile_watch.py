"""CompileWatch: what torch.compile did in a run, read from torch's own records, as plain data at the user's lines."""

from __future__ import annotations

import logging
import os
import pickle
import runpy
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch._dynamo

import turbotrain
from doctor_helpers import FAST, cached_report, marked_lines, run_doctor
from turbotrain.doctor.record.compile_watch import (
    CHANGED_VALUE,
    GRAD_MODE,
    NEW_DTYPE,
    NEW_INSTANCE,
    NEW_SHAPE,
    OTHER,
    CompileFacts,
    CompileWatch,
    classify_guard,
)

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

SCRIPTS = Path(__file__).parent / "scripts"
THIS = str(Path(__file__).resolve())
BREAK_LOGGERS = [f"torch._dynamo.{m}.__graph_breaks" for m in ("exc", "convert_frame", "symbolic_convert")]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles its own code from an empty cache (torch keeps compiled code per code object)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def line_of(text: str) -> int:
    """The line of this file that holds ``text``."""
    return next(
        n for n, line in enumerate(Path(THIS).read_text().splitlines(), 1) if text in line and "line_of" not in line
    )


def same_file(site, path: str) -> bool:
    return site is not None and Path(site.file).resolve() == Path(path).resolve()


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x).relu()


def test_item_in_forward_breaks_the_graph_at_the_users_line():
    def forward(x):
        h = torch.tanh(x)
        peak = h.abs().max().item()  # breaks here
        return h / (peak + 1.0)

    compiled = torch.compile(forward, backend="eager")
    with CompileWatch() as watch:
        compiled(torch.randn(3, 4))
    facts = watch.facts
    (code,) = facts.codes
    assert code.name == "forward" and same_file(code.site, THIS)
    (brk,) = code.breaks
    assert same_file(brk.site, THIS) and brk.site.line == line_of("peak = h.abs().max().item()  # breaks here")
    assert "item()" in brk.title and brk.gb_id == "GB0124" and brk.count == 1 and not brk.skipped
    assert code.graphs == 2 and facts.graphs == 2 and facts.breaks == 1  # before and after the break
    assert code.first_compile_s > 0 and facts.compile_s >= code.compile_s


def test_a_new_length_each_step_recompiles_for_the_new_shape():
    compiled = torch.compile(Tiny(), backend="eager")
    with CompileWatch() as watch:
        for length in (5, 6, 7):
            compiled(torch.randn(length, 4))  # the call with a new length
    (code,) = watch.facts.codes
    (recompile,) = code.recompiles  # torch makes the length dynamic after the first change
    assert recompile.kind == NEW_SHAPE and "size mismatch at index 0" in recompile.guard
    assert same_file(recompile.caller, THIS) and recompile.caller.line == line_of("# the call with a new length")
    assert recompile.site == recompile.caller and recompile.seconds > 0
    assert watch.facts.recompiles == 1 and code.fallback is None and code.compiles == 2


@pytest.mark.parametrize("how", ["dynamic=True", "mark_dynamic"])
def test_dynamic_lengths_compile_once(how):
    compiled = torch.compile(Tiny(), backend="eager", dynamic=True if how == "dynamic=True" else None)
    with CompileWatch() as watch:
        for length in (5, 6, 7):
            x = torch.randn(length, 4)
            if how == "mark_dynamic":
                torch._dynamo.mark_dynamic(x, 0)
            compiled(x)
    (code,) = watch.facts.codes
    assert code.recompiles == () and code.compiles == 1 and watch.facts.recompiles == 0


def test_the_recompile_limit_is_reported_as_falling_back_to_eager():
    compiled = torch.compile(Tiny(), backend="eager", dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2), CompileWatch() as watch:
        for length in (2, 3, 4, 5):
            compiled(torch.randn(length, 4))  # one length too many
    (code,) = watch.facts.codes
    assert code.compiles == 2 and len(code.recompiles) == 1 and watch.facts.fell_back == 1
    fallback = code.fallback
    assert fallback is not None and fallback.limit == "recompile_limit" and fallback.value == 2
    assert fallback.kind == NEW_SHAPE and "size mismatch" in fallback.guard
    assert same_file(fallback.caller, THIS) and fallback.caller.line == line_of("# one length too many")
    assert torch._dynamo.config.recompile_limit == 8  # the patch restored it, untouched by the watch


def test_a_script_that_never_compiles_has_empty_facts():
    with CompileWatch() as watch:
        Tiny()(torch.randn(2, 4)).sum().backward()
    assert watch.facts == CompileFacts() and not watch.facts.compiled


def logging_state():
    loggers = [logging.getLogger(n) for n in [*BREAK_LOGGERS, "torch._dynamo.convert_frame"]]
    return [(lg.level, lg.propagate, list(lg.filters), list(lg.handlers)) for lg in loggers]


def test_the_watch_leaves_torch_as_it_found_it():
    import torch._dynamo.utils as utils

    before = (
        logging_state(),
        torch._dynamo.config.get_config_copy(),
        utils._compilation_metrics.maxlen,
        list(sys.meta_path),
        list(torch._dynamo.callback_handler.start_callbacks),
    )
    compiled = torch.compile(Tiny(), backend="eager")
    with CompileWatch():
        compiled(torch.randn(2, 4))
        assert utils._compilation_metrics.maxlen > 64  # every compile entry kept while it watches
    after = (
        logging_state(),
        torch._dynamo.config.get_config_copy(),
        utils._compilation_metrics.maxlen,
        list(sys.meta_path),
        list(torch._dynamo.callback_handler.start_callbacks),
    )
    assert after == before


def test_breaks_stay_off_the_terminal(capfd):
    def forward(x):
        print("inside", x.shape)  # a print in the compiled region
        return x * 2

    with CompileWatch() as watch:
        torch.compile(forward, backend="eager")(torch.randn(2))
    (brk,) = watch.facts.codes[0].breaks
    assert brk.site.line == line_of("# a print in the compiled region") and brk.gb_id == "GB0059"
    assert "Graph break" not in capfd.readouterr().err


def test_the_facts_pickle():
    def forward(x, scale):
        return x * scale + x.sum().item()

    compiled = torch.compile(forward, backend="eager")
    with CompileWatch() as watch:
        compiled(torch.randn(3), 2.0)
        compiled(torch.randn(3, dtype=torch.float64), 2.0)
    facts = watch.facts
    assert facts.breaks == 1 and facts.recompiles >= 1
    # Unpickles only the bytes pickled on the same line.
    assert pickle.loads(pickle.dumps(facts)) == facts  # noqa: S301 - our own bytes, just written


@pytest.mark.parametrize(
    "guard, kind",
    [
        ("tensor 'x' size mismatch at index 1. expected 12, actual 13", NEW_SHAPE),
        ("tensor 'x' stride mismatch at index 0. expected 8, actual 24", NEW_SHAPE),
        ("tensor 'x' dtype mismatch. expected Float, actual Double", NEW_DTYPE),
        ("self.k == 1", CHANGED_VALUE),
        ("len(lst) == 1", CHANGED_VALUE),
        ("___check_type_id(mod, 94099695982656), type=<class '__main__.M'>", NEW_INSTANCE),
        ("tensor 'x' requires_grad mismatch. expected requires_grad=0", OTHER),
        ("GLOBAL_STATE changed: grad_mode", GRAD_MODE),  # Lightning's sanity check under no_grad, then training
        ("Unable to find recompilation reasons", OTHER),
    ],
)
def test_guards_are_classified(guard, kind):
    assert classify_guard(guard) == kind


def run_script(name: str) -> CompileFacts:
    """The script run in this process as the doctor runs it, under the watch."""
    with CompileWatch() as watch:
        runpy.run_path(str(SCRIPTS / f"{name}.py"), run_name="__main__")
    return watch.facts


def test_corpus_a_break_per_block_from_item():
    facts = run_script("compile_item_break")
    ((rule, line),) = marked_lines("compile_item_break")
    script = str(SCRIPTS / "compile_item_break.py")
    breaks = [b for c in facts.codes for b in c.breaks]
    assert breaks and all(same_file(b.site, script) and b.site.line == line and b.gb_id == "GB0124" for b in breaks)
    assert facts.breaks == 1  # one line, met in each block
    # The break sits in a loop over the blocks: torch runs Net.forward eagerly and compiles each block alone.
    block_line, net_line = (
        n for n, text in enumerate(Path(script).read_text().splitlines(), 1) if "def forward" in text
    )
    net = next(c for c in facts.codes if c.code.line == net_line)
    assert net.graphs == 0 and net.breaks[0].skipped
    block = next(c for c in facts.codes if c.code.line == block_line)
    assert block.graphs >= 2 and not block.breaks[0].skipped


def test_under_the_doctor_a_compiled_script_compiles_as_it_does_alone():
    """The recorder's global module hooks (warm-up) and its probes run inside the compiled script: torch guards
    its graphs on the number of global hooks, and converts every frame the script calls. Under the doctor the
    script compiles the same graphs, breaks and recompiles as under the watch alone, and no compile is the
    doctor's own code."""
    report = cached_report("compile_item_break")
    # The doctor ends the script after its window: warm-up, measured and profiled steps, and the steps it adds when a
    # slow step looks like periodic work (a loaded machine); each step's new .item() value may recompile.
    ran = report.steps_completed
    assert ran >= FAST["warmup"] + FAST["steps"] + FAST["profile_steps"]
    corpus = runpy.run_path(str(SCRIPTS / "compile_item_break.py"), run_name="corpus")
    with CompileWatch() as watch:
        corpus["main"](steps=ran)
    alone = watch.facts
    doctored = report.compiled
    assert doctored is not None and report.status == "ok", report.messages
    assert (doctored.graphs, doctored.breaks, doctored.recompiles) == (alone.graphs, alone.breaks, alone.recompiles)
    package = str(Path(turbotrain.__file__).parent)
    assert not [c.code for c in doctored.codes if c.code.file.startswith(package)]


def test_corpus_a_new_length_every_step():
    facts = run_script("compile_new_shapes")
    ((rule, line),) = marked_lines("compile_new_shapes")
    (code,) = facts.codes
    assert code.recompiles and all(r.kind == NEW_SHAPE for r in code.recompiles)
    assert all(same_file(r.caller, str(SCRIPTS / "compile_new_shapes.py")) for r in code.recompiles)
    assert {r.caller.line for r in code.recompiles} == {line} and code.breaks == () and code.fallback is None


LAZY = """
import sys, torch
from turbotrain.doctor.record.compile_watch import CompileWatch
with CompileWatch() as watch:
    torch.ones(2) + 1
assert "torch._dynamo" not in sys.modules, "the watch imported torch._dynamo"
assert watch.facts.codes == ()
with CompileWatch() as watch:
    f = torch.compile(lambda x: x.sum().item() + 1, backend="eager")
    f(torch.ones(3))
import torch._dynamo.utils as utils
assert utils._compilation_metrics.maxlen == 64, utils._compilation_metrics.maxlen
assert watch.facts.graphs == 1 and watch.facts.breaks == 1, watch.facts
"""


def test_a_script_that_imports_dynamo_late_is_seen_and_one_that_never_does_pays_nothing():
    done = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_torchs_warning_about_the_doctors_global_hooks_stays_off_the_terminal():
    """torch warns at a compiled module's call that global module hooks fire for its wrapper too: under the doctor
    those hooks are the doctor's, and the warning is not the user's. The filter goes with the hooks."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        report = run_doctor("compile_new_shapes", what_if=False)
        assert warnings.filters == before
    assert report.status == "ok", report.messages
    assert not [w for w in caught if "global hooks" in str(w.message)], [str(w.message) for w in caught]
    with pytest.warns(UserWarning, match="global hooks"):  # the user's own global hooks still get the warning
        handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
        try:
            torch.compile(torch.nn.Linear(2, 2), backend="eager")(torch.ones(1, 2))
        finally:
            handle.remove()


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                    reason="torch.compile on CPU needs a C++ compiler")
def test_graphs_read_from_inductors_cache_and_compiled_anew_are_counted():
    """A graph compiled once is read from Inductor's on-disk cache by the next fresh compile: the watch counts the
    miss, then the hit (a constant no other run used makes the graph new to the cache)."""
    offset = float(int.from_bytes(os.urandom(4), "little"))

    def scaled(x):
        return torch.tanh(x) * 3 + offset

    counts = []
    for _ in range(2):
        torch._dynamo.reset()
        with CompileWatch() as watch, torch.no_grad():
            torch.compile(scaled)(torch.randn(8, 8))
        (code,) = watch.facts.codes
        counts.append((code.cache_hits, code.cache_misses))
    assert counts == [(0, 1), (1, 0)], counts


def test_the_profiled_steps_are_split_into_time_in_compiled_graphs_and_outside_them():
    """aot_eager runs the forward in dynamo's region and the backward as AOTAutograd's node: both are counted as
    in the graphs, the optimizer and the loss outside; nothing runs in a graph without a compiled model."""
    from torch.profiler import ProfilerActivity, profile

    from turbotrain.doctor.record.profiling import graph_time

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)

    def profiled(forward):
        for _ in range(2):
            forward(x).pow(2).mean().backward()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(3):
                with torch.autograd.profiler.record_function(f"turbotrain/step#{i}"):
                    forward(x).pow(2).mean().backward()
                    opt.step()
                    opt.zero_grad()
        return graph_time(prof)

    timed = profiled(torch.compile(model, backend="aot_eager"))
    assert timed is not None and timed.forward_ms > 0 and timed.backward_ms > 0, timed
    assert timed.step_ms > timed.forward_ms + timed.backward_ms and timed.outside_ms > 0
    assert profiled(model) is None


def test_a_compiled_torch_module_is_named_after_its_class_not_torchs_wrapper():
    """torch.compile(nn.Sequential(...)) compiles torch's wrap_inline ``inner``: the code is named "Sequential"."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with CompileWatch() as watch:
        torch.compile(model, backend="eager")(torch.randn(2, 4))  # the Sequential's call
    (code,) = watch.facts.codes
    assert (code.name, code.code.function, code.graphs) == ("Sequential", "inner", 1)
    assert same_file(code.site, THIS) and code.site.line == line_of("# the Sequential's call")


def test_ddp_under_compile_breaks_inside_torchs_code_and_is_one_code_named_ddp(tmp_path):
    """torch.compile(DDP(nn.Sequential)): torch breaks in DDP's own code (its C++ logger, a context manager it
    keeps out of the graph) and compiles frames of contextlib while DDP runs eagerly, and captures no graph (the
    Sequential's forward is torch's, which dynamo does not start a frame in). Each break is at the user's line
    with torch's frame; the frames are one code named after the module; no break is a print."""
    import torch.distributed as dist

    from turbotrain.doctor.rules.compile.compile_graph_break import LIBRARY, break_kind

    if dist.is_initialized():
        pytest.skip("a process group is already active in this test process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
        model = torch.compile(torch.nn.parallel.DistributedDataParallel(net), backend="eager")
        with CompileWatch() as watch:
            for _ in range(2):
                model(torch.randn(4, 8)).sum().backward()  # the DDP call
    finally:
        dist.destroy_process_group()
    facts = watch.facts
    (code,) = facts.codes
    assert (code.name, facts.graphs) == ("DistributedDataParallel", 0), facts
    line = line_of("# the DDP call")
    assert code.breaks and all(same_file(b.site, THIS) and b.site.line == line for b in code.breaks)
    ddp = os.path.join("torch", "nn", "parallel", "distributed.py")
    assert all(b.library == "torch" and b.inside.file.endswith(ddp) for b in code.breaks), code.breaks
    assert {b.inside.function for b in code.breaks} >= {"_pre_forward"}
    assert {break_kind(b) for b in code.breaks} == {LIBRARY}


def a_break_record(traceback: list[tuple[str, int, str]], where: tuple[str, int]) -> logging.LogRecord:
    """torch's graph_breaks record for an unsupported call, with the stack it prints (outermost first)."""
    frames = "".join(f'  File "{file}", line {line}, in {name}\n    code()\n' for file, line, name in traceback)
    message = (
        f"Graph break in user code at {where[0]}:{where[1]}\nGraph Break Reason: Encountered graph break when "
        "attempting to trace CALL: a function call, e.g. f(x, y):\n\nUnsupported method call\n  Explanation: Dynamo "
        "does not know how to trace method `set_runtime_stats_and_log` of class `Logger`\n\n For more details about "
        "this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0156.html\n\n"
        f"User code traceback:\n{frames}"
    )
    return logging.LogRecord("torch._dynamo.symbolic_convert.__graph_breaks", logging.DEBUG, "", 0, message, (), None)


def test_a_break_is_placed_at_the_users_line_with_the_library_frame_and_the_doctors_own_is_left_out():
    from turbotrain.doctor.record.compile_watch import _Live, _record_break
    from turbotrain.doctor.sites import Site

    torch_dir = os.path.dirname(torch.__file__)
    module_py = os.path.join(torch_dir, "nn", "modules", "module.py")
    ddp = os.path.join(torch_dir, "nn", "parallel", "distributed.py")
    polyfill = os.path.join(torch_dir, "_dynamo", "polyfills", "__init__.py")
    live = _Live()
    user = [(THIS, 19, "<module>")]
    _record_break("0/0", a_break_record([*user, (module_py, 1778, "_wrapped_call_impl"), (ddp, 1757, "_pre_forward"),
                                         (polyfill, 513, "instantiate")], (polyfill, 513)), live)
    # A repeat names only where it broke: the place read from the first.
    _record_break("1/0", a_break_record([], (polyfill, 513)), live)
    # The doctor's own code inlined into the compiled code breaks: not the script's.
    own = os.path.join(os.path.dirname(turbotrain.__file__), "doctor", "record", "profiling.py")
    _record_break("2/0", a_break_record([*user, (module_py, 1778, "_wrapped_call_impl"), (own, 76, "open")],
                                        (own, 76)), live)
    first, repeat = live.breaks
    assert (first.site.file, first.site.line, first.gb_id) == (THIS, 19, "GB0156")
    # torch.compile's polyfill is torch's, but not DDP's code: the frame named is DDP's.
    assert (first.inside, first.library) == (Site(ddp, 1757, "_pre_forward"), "torch")
    assert (repeat.site, repeat.inside, repeat.library) == (first.site, first.inside, first.library)


def test_torchs_frames_are_folded_into_the_module_or_the_users_code_that_ran_them():
    """A frame torch compiles while a compiled torch module runs eagerly is that module's; one a user's compiled
    forward called at a break (a logging call) is that forward's."""
    from turbotrain.doctor.record.compile_watch import _build_facts, _Entry
    from turbotrain.doctor.sites import Site

    inner = (os.path.join(os.path.dirname(torch.__file__), "_dynamo", "external_utils.py"), 67, "inner")
    helper = (logging.__file__.replace("logging/__init__.py", "contextlib.py"), 299, "helper")
    info = (logging.__file__, 1479, "info")
    forward = (THIS, 30, "forward")
    call = (Site(THIS, 19, "<module>"),)

    def entry(compile_id, code, stack, graph=False):
        return _Entry(compile_id, int(compile_id.split("/")[0]), True, code, 0.1, graph, None, "", stack)

    facts = _build_facts(
        [entry("0/0", inner, call), entry("1/0", helper, call), entry("2/0", forward, call, graph=True),
         entry("3/0", info, (Site(THIS, 33, "forward"), *call))],
        [],
        {"0/0": "DistributedDataParallel", "1/0": "DistributedDataParallel", "3/0": "DistributedDataParallel"},
    )
    ddp, mine = facts.codes
    assert (ddp.name, ddp.compiles, ddp.graphs, ddp.code.function, ddp.site) == ("DistributedDataParallel", 2, 0,
                                                                                  "inner", call[0])
    assert (mine.name, mine.compiles, mine.graphs) == ("forward", 2, 1)


def _ran_after_compile(x):
    return x + 1


@pytest.mark.skipif(sys.gettrace() is not None, reason="another tracer (coverage, a debugger) is installed")
def test_the_function_trace_is_paused_while_torch_compile_compiles_and_back_after():
    # A trace hook on every call of dynamo's and Inductor's Python made a GPT's compile 1.5x as long.
    from turbotrain.doctor.record.function_trace import FunctionTracer

    seen_while_compiling = []

    def backend(gm, example_inputs):
        seen_while_compiling.append(sys.gettrace())
        return gm.forward

    tracer = FunctionTracer()
    watch = CompileWatch(on_compiling=tracer.pause)
    watch.start()
    tracer.trace(True)
    try:
        torch.compile(lambda x: torch.sin(x) * 2, backend=backend)(torch.ones(3))
        traced_after = sys.gettrace() is not None
        _ran_after_compile(1)
    finally:
        tracer.trace(False)
        watch.stop()
    assert seen_while_compiling == [None]
    assert traced_after
    assert _ran_after_compile.__code__ in tracer.ran_code.values()
    assert sys.gettrace() is None


@pytest.mark.skipif(sys.gettrace() is not None, reason="another tracer (coverage, a debugger) is installed")
def test_the_function_trace_takes_a_code_object_that_cannot_be_hashed():
    # A code object hashes its constants: modded-nanogpt's compiled forward under DDP reached the hook with a dict
    # among them, and the doctor's run of the script died in the hook with "unhashable type: 'dict'".
    from turbotrain.doctor.record.function_trace import FunctionTracer

    code = _ran_after_compile.__code__
    unhashable = types.FunctionType(code.replace(co_consts=code.co_consts + ({},)), _ran_after_compile.__globals__)
    with pytest.raises(TypeError):
        hash(unhashable.__code__)
    tracer = FunctionTracer()
    tracer.trace(True)
    try:
        unhashable(1)
    finally:
        tracer.trace(False)
    assert any(c is unhashable.__code__ for c in tracer.ran_code.values())
