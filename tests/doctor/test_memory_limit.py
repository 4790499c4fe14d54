"""``doctor --memory-limit``: a run told its device holds so much runs out of memory beyond it, and the
out-of-memory finding, its patch and its ``--verify`` are checked at a size CI runs.

Each check runs in a process of its own: the limit fixes glibc's mmap threshold for the rest of a process's life,
which the test session's other tests should not inherit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from turbotrain.cli import build_parser
from turbotrain.config import ConfigError
from turbotrain.doctor.options import DoctorOptions

from doctor_helpers import marked_lines, script

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

MIB = 2**20


def _python(code: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_a_limit_refuses_what_exceeds_it_only_while_it_is_enforced():
    proc = _python(f"""
        import json, resource, torch
        from turbotrain.doctor.record.memory_limit import active, enforced, memory_limit
        from turbotrain.doctor.record.memory_watch import device_memory
        from turbotrain.doctor.record.out_of_memory import out_of_memory

        def refused(nbytes):
            try:
                torch.empty(nbytes // 4).fill_(1.0)
            except RuntimeError as exc:
                oom = out_of_memory(exc)
                return [oom.device, oom.requested_bytes] if oom is not None else str(exc)
            return None

        before = resource.getrlimit(resource.RLIMIT_DATA)
        out = {{}}
        with memory_limit(64 * {MIB}) as limit:
            out["device"] = [device_memory("cpu").total_bytes, device_memory("cpu").limit_bytes, limit.device]
            out["unenforced"] = refused(96 * {MIB})
            with enforced():
                out["over"], out["under"] = refused(96 * {MIB}), refused(16 * {MIB})
            with enforced(held_bytes=60 * {MIB}):  # a measured step that holds 60 MiB of it already
                out["held"] = refused(16 * {MIB})
        out["after"] = [refused(96 * {MIB}), active() is None, resource.getrlimit(resource.RLIMIT_DATA) == before]
        print(json.dumps(out))
    """)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["device"] == [64 * MIB, 64 * MIB, "cpu"]
    assert out["unenforced"] is None and out["under"] is None  # the limit holds only inside enforced()
    assert out["over"] == ["cpu", 96 * MIB]  # the CPU allocator's own error, read as out of memory
    assert out["held"] == ["cpu", 16 * MIB]
    assert out["after"] == [None, True, True]


def test_the_doctors_own_work_is_not_counted_and_leaves_the_step_its_room():
    # The profiler window's events are the doctor's: nanoGPT's char model at 32 rows fitted a 100 MiB limit for 23
    # steps and ran out of memory in the first profiled one.
    proc = _python(f"""
        import json, torch
        from turbotrain.doctor.record.memory_limit import enforced, lift, memory_limit
        from turbotrain.doctor.record.out_of_memory import out_of_memory

        def refused(nbytes):
            try:
                return torch.empty(nbytes // 4).fill_(1.0) is None
            except RuntimeError as exc:
                return out_of_memory(exc) is not None

        with memory_limit(64 * {MIB}), enforced():
            out = {{"before": [refused(96 * {MIB}), refused(16 * {MIB})]}}
            restore = lift()
            kept = torch.empty(96 * {MIB} // 4).fill_(1.0)  # what the doctor's work keeps (the profiler's events)
            restore()
            out["after"] = [refused(96 * {MIB}), refused(16 * {MIB})]
        print(json.dumps(out))
    """)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["before"] == [True, False]
    assert out["after"] == [True, False]  # the limit holds again, with the step's room as before


def test_the_limit_is_a_size_checked_where_it_is_given():
    args = build_parser().parse_args(["doctor", "--memory-limit", "1.5GiB", "train.py"])
    assert args.memory_limit_bytes == int(1.5 * 2**30)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["doctor", "--memory-limit", "lots", "train.py"])
    with pytest.raises(ConfigError, match=r"memory_limit_bytes \(--memory-limit\): 0 is not allowed"):
        DoctorOptions(memory_limit_bytes=0)


def test_torchs_own_imports_and_thread_stacks_are_in_the_base_not_the_limit():
    # The limit stands for the device's memory: Inductor's modules (~45 MiB of data, imported by torch.compile(model))
    # and the stacks of torch's threads (8 MiB each, started by the first parallel op) are the host's. Counted, they
    # made nanoGPT's compiled twin die under 100 MiB where its step needs 81 MiB.
    proc = _python("""
        import json, torch
        from turbotrain.doctor.record.memory_limit import data_bytes, memory_limit

        with memory_limit(64 * 2**20) as limit:
            import torch._inductor.compile_fx  # what torch.compile(model) imports
            torch.ones(1 << 20).add_(1)  # the first parallel op: torch's threads start
            print(json.dumps(data_bytes() - limit.base_bytes))
    """)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) < 4 * MIB


def test_a_step_timed_on_the_plain_heap_maps_no_block_of_its_own():
    # Under the limit every block of 128 KiB or more is mapped on its own (the data segment follows what is live),
    # which no device pays for: nanoGPT's compiled step took 188 ms that way, 139-143 ms timed on the plain heap.
    proc = _python("""
        import ctypes, json, torch
        from turbotrain.doctor.record.memory_limit import memory_limit, plain_heap

        class Info(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = Info

        def mapped_by(blocks):  # 1 MiB tensors: how many of them glibc mapped on their own
            before, kept = libc.mallinfo2().hblks, [torch.empty(2**18) for _ in range(blocks)]
            return libc.mallinfo2().hblks - before

        with memory_limit(256 * 2**20):
            limited = mapped_by(8)
            with plain_heap():
                plain = mapped_by(40)
            print(json.dumps([limited, plain]))
    """)
    assert proc.returncode == 0, proc.stderr
    limited, plain = json.loads(proc.stdout.splitlines()[-1])
    assert limited == 8 and plain == 0


def test_a_run_out_of_memory_under_the_limit_is_patched_and_verified_to_fit(tmp_path):
    pytest.importorskip("libcst", reason="doctor --fix needs libcst: pip install -e '.[fix]'")
    (tmp_path / "train.py").write_text(script("memory_out_of_memory").read_text())
    proc = subprocess.run(
        [sys.executable, "-m", "turbotrain", "doctor", "--memory-limit", "96MiB", "--steps", "2", "--warmup", "1",
         "--verify-rounds", "1", "--json", "report.json", "train.py", "512", "512", "--fix", "fix.patch", "--verify"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "error", proc.stdout + proc.stderr  # the script itself died of it
    [(_, line)] = marked_lines("memory_out_of_memory")
    [finding] = [f for f in report["findings"] if f["rule"] == "out-of-memory"]
    assert finding["where"] == f"train.py:{line}" and "at step 1 in the forward" in finding["message"]
    memory = report["memory"]
    assert memory["memory_limit_bytes"] == memory["capacity_bytes"] == 96 * MIB
    # Measured at a halving that fits under the limit; the whole batch estimated beyond it.
    assert memory["rows"] < memory["full_rows"] and memory["peak_bytes"] <= 96 * MIB
    assert memory["estimated_bytes_at_full_batch"] > 96 * MIB
    [fix] = report["fixes"]
    k = int(fix["label"].split()[0])
    assert fix["rule"] == "out-of-memory" and fix["in_patch"] and "micro-batches" in fix["label"]
    assert memory["estimated_bytes_at_full_batch"] / k <= 96 * MIB
    patch = (tmp_path / "fix.patch").read_text()
    assert f"+        for x_micro, y_micro in zip(x.chunk({k}), y.chunk({k})):" in patch, patch
    # --verify ran both under the same limit: the original ran out of memory, the patched script ran its steps.
    check = fix["verification"]
    assert check["verdict"] == "fits" and "can't allocate memory" in check["original_out_of_memory"]
    assert len(check["patched_ms_per_step"]) == 1 and check["peak_memory"]["patched_bytes"] > 0


def test_an_out_of_memory_inside_a_compiled_graph_names_the_users_line(tmp_path):
    # Inductor's generated code (a file in its cache folder) allocates a compiled graph's buffers: an error raised
    # there is torch's, and the line to name is the script's (build-nanogpt's was "failed at
    # .../.inductor_cache/r4/cr4p....py:1349"), its call of the compiled function.
    (tmp_path / "train.py").write_text(textwrap.dedent(f"""
        import json, torch
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        from turbotrain.doctor.record.memory_limit import enforced, memory_limit
        from turbotrain.doctor.record.out_of_memory import out_of_memory

        @torch.compile
        def double(x):
            return x * 2 + 1

        x = torch.ones(24 * {MIB} // 4)
        double(x)  # compiled here, with no limit
        with memory_limit(16 * {MIB}), enforced():
            try:
                double(x)  # marked: the graph's output of 24 MiB is refused
            except RuntimeError as exc:
                oom = out_of_memory(exc)
                tb, files = exc.__traceback__, []
                while tb is not None:
                    files.append(tb.tb_frame.f_code.co_filename)
                    tb = tb.tb_next
        generated = [f for f in files if f.startswith(cache_dir())]
        print(json.dumps([oom.site.file, oom.site.line, len(generated)]))
    """))
    proc = subprocess.run([sys.executable, "train.py"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    file, line, generated = json.loads(proc.stdout.splitlines()[-1])
    assert generated >= 1  # the error was raised in Inductor's code
    assert file.endswith("train.py") and "# marked" in (tmp_path / "train.py").read_text().splitlines()[line - 1]


def _compiled_mlp(tmp_path, features: int, hidden: int, classes: int, rows: int, steps: int) -> None:
    """train.py: a compiled two-layer MLP trained ``steps`` steps on ``rows`` random rows a step."""
    (tmp_path / "train.py").write_text(textwrap.dedent(f"""
        import torch
        from torch import nn

        torch.manual_seed(0)
        model = torch.compile(nn.Sequential(nn.Linear({features}, {hidden}), nn.ReLU(), nn.Linear({hidden}, {classes})))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range({steps}):
            x, y = torch.randn({rows}, {features}), torch.randint(0, {classes}, ({rows},))
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    """))


def test_torch_compile_compiles_outside_the_limit_and_the_steps_run_under_it(tmp_path):
    # Inductor's compile is the compiler's host memory, not the step's: under 100 MiB nanoGPT's first compile failed
    # ("can't start new thread"), and this model's, cold, under 80 MiB ("BackendCompilerFailed ... MemoryError"),
    # where its steps need about a MiB.
    _compiled_mlp(tmp_path, features=32, hidden=64, classes=8, rows=64, steps=6)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # cold: the compile's whole work
    proc = subprocess.run(
        [sys.executable, "-m", "turbotrain", "doctor", "--memory-limit", "80MiB", "--steps", "2", "--warmup", "1",
         "--no-what-if", "--json", "report.json", "train.py"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env,
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "ok" and report["steps_completed"] >= 3, (report.get("error"), proc.stderr[-2000:])


def test_a_compiled_models_fix_said_to_fit_is_run_compiled_and_the_one_that_ran_is_written(tmp_path):
    # The fixes are measured on eager copies; a compiled model's graphs hold buffers of their own (modded-nanogpt's
    # "4 x 256 fits" died compiled). The fix said to fit runs compiled at the script's batch under the limit, and
    # the patch makes the one that ran. 8192 rows through a 4096-wide hidden layer: 128 MiB saved for the backward.
    pytest.importorskip("libcst", reason="doctor --fix needs libcst: pip install -e '.[fix]'")
    _compiled_mlp(tmp_path, features=64, hidden=4096, classes=10, rows=8192, steps=3)
    proc = subprocess.run(
        [sys.executable, "-m", "turbotrain", "doctor", "--memory-limit", "96MiB", "--steps", "2", "--warmup", "1",
         "--what-if-budget", "1", "--json", "report.json", "train.py", "--fix", "fix.patch"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "error", proc.stdout + proc.stderr  # the script itself died of it
    [finding] = [f for f in report["findings"] if f["rule"] == "out-of-memory"]
    check = finding["evidence"]["compiled"]
    *refused, ran = check["runs"]
    # Run in order until one ran: those before it ran out of memory compiled, the last fitted under the limit.
    assert all(not run["ran"] for run in refused) and ran["ran"], check
    assert ran["fix"] == "micro-batches" and 0 < ran["held_bytes"] < ran["peak_bytes"] <= 96 * MIB, ran
    assert "Run compiled at its 8192 rows:" in finding["message"], finding["message"]
    k = int(ran["detail"].split(" x ")[0])
    patch = (tmp_path / "fix.patch").read_text()
    assert f"for x_micro, y_micro in zip(x.chunk({k}), y.chunk({k})):" in patch, patch
