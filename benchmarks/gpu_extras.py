"""GPU extras beside the bench: Trainer overhead, device prefetch's copy waits, host syncs, the doctor.

Four parts, one command, each printed as a markdown table with the machine named:

- overhead: the Trainer (naive plan) against a plain PyTorch loop on the device, same tiny MLP
  and the same batches (already on the device), wall clock with ``torch.cuda.synchronize`` at the
  two ends only; us/step and the ratio to the plain loop (benchmarks/overhead.py is the CPU-time
  version; its batches and model are reused here).
- prefetch: turbotrain's DeviceLoader with and without device prefetch, and the Trainer with
  ``device_prefetch`` on and off, on large uint8 image batches from pinned memory. "Waiting" is
  the compute stream's time from the step's start marker (recorded before the loader is asked for
  the batch) to the point right after the loader handed it out: the copy itself when it runs on
  the compute stream, the wait for the side stream's copy with prefetch. The host batches are
  pre-pinned in memory, so the host's own time in ``next()`` is a few microseconds and what is
  left is the copy. On the CPU there is no copy: host time in ``next()`` is shown instead.
- syncs: the Trainer for N steps under ``torch.cuda.set_sync_debug_mode("warn")``; every
  "synchronizing CUDA operation" warning is counted and sorted by where it came from (the
  Trainer's logging and other events, the per-step path, or setup and the end of fit), with the
  Python line that made it. The target: no sync on the per-step path. CUDA only.
- doctor: ``turbotrain doctor`` on tests/doctor/scripts/gpu_data_bound.py and gpu_sync_bound.py
  (its JSON and terminal report saved beside ``--json``), and the rules each finding named.

    python benchmarks/gpu_extras.py [--device cuda|cpu] [--json OUT.json] [--markdown OUT.md]
                                    [--parts overhead prefetch syncs doctor]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

import turbotrain as tt
from turbotrain.data import DeviceLoader
from turbotrain.data.transfer import move_batch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from overhead import Batches, fresh, plain_steps, plain_steps_dropping_grads  # noqa: E402  # the CPU benchmark's batches, model and loops

DOCTOR_SCRIPTS = ("gpu_data_bound.py", "gpu_sync_bound.py")
STARTED = time.perf_counter()


def say(message: str) -> None:
    print(f"[gpu_extras +{time.perf_counter() - STARTED:5.1f}s] {message}", flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine(device: torch.device) -> str:
    cpu = f"{os.cpu_count()} CPU cores"
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, {cpu}, torch {torch.__version__}"
    return f"CPU {platform.processor() or platform.machine()}, {cpu}, torch {torch.__version__}"


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# -- overhead: the Trainer against a plain loop on the device ----------------------------------

def timed(device: torch.device, run: Callable[[], None]) -> float:
    sync(device)
    start = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - start


def plain(data: list, device: torch.device) -> float:
    model, opt = fresh(device)
    return timed(device, lambda: plain_steps(model, opt, data))


def plain_dropping_grads(data: list, device: torch.device) -> float:
    """The plain loop dropping gradients with ``p.grad = None``, as the Trainer does."""
    model, opt = fresh(device)
    return timed(device, lambda: plain_steps_dropping_grads(model, opt, data))


def trainer_runner(guard: bool) -> Callable[[list, torch.device], float]:
    def run(data: list, device: torch.device) -> float:
        model, opt = fresh(device)
        trainer = tt.Trainer(model, opt, F.cross_entropy, plan=tt.Plan(device=device.type), max_epochs=1,
                             log_every_n_steps=len(data), progress=False,
                             on_nonfinite="stop" if guard else "ignore")
        return timed(device, lambda: trainer.fit(data))
    return run


def measure_overhead(device: torch.device, steps: int, repeats: int) -> dict[str, Any]:
    data = [(x.to(device), y.to(device)) for x, y in Batches(steps).items]
    runners = {"plain loop": plain, "plain, p.grad = None": plain_dropping_grads,
               "turbotrain Trainer": trainer_runner(guard=True),
               "Trainer, no NaN guard": trainer_runner(guard=False)}
    for fn in runners.values():  # warm-up: CUDA context, cuBLAS handles, the allocator's first blocks
        fn(data[:50], device)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for r in range(repeats):
        for name, fn in runners.items():  # interleaved, so drift hits every runner alike
            times[name].append(fn(data, device) / steps)
        say(f"overhead: repeat {r + 1}/{repeats} done")
    ref = min(times["plain loop"])
    rows = [{"runner": name, "us_per_step_min": min(ts) * 1e6, "us_per_step_median": statistics.median(ts) * 1e6,
             "vs_plain": min(ts) / ref} for name, ts in times.items()]
    return {"steps": steps, "repeats": repeats, "model": "TinyMLP 32-64-10, batch 32", "rows": rows}


def overhead_markdown(result: dict[str, Any]) -> str:
    rows = [[r["runner"], f"{r['us_per_step_min']:.1f}", f"{r['vs_plain']:.2f}x", f"{r['us_per_step_median']:.1f}"]
            for r in result["rows"]]
    return (f"{result['steps']} steps x {result['repeats']} repeats, {result['model']}, batches on the device, "
            "wall clock, synchronized at the ends only\n\n"
            + table(["runner", "us/step (min)", "vs plain", "us/step (median)"], rows))


# -- prefetch: the share of step time spent waiting on host-to-device copies ---------------------

class ImageNet(nn.Module):
    """A small conv net reading uint8 images: cheap enough that the copy of its batch matters."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 64, 7, stride=4, padding=3), nn.ReLU(),
                                      nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU())
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float().div_(255.0)
        return self.head(self.features(x).mean((2, 3)))


def pinned_batches(device: torch.device, batch: int, side: int, distinct: int = 6) -> list:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(distinct):
        x = torch.randint(0, 256, (batch, 3, side, side), dtype=torch.uint8, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        out.append((x.pin_memory(), y.pin_memory()) if device.type == "cuda" else (x, y))
    return out


class StepMarks:
    """Per step: the step's start, the moment its batch was handed out; CUDA events on a GPU, else the host clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[Any, Any]] = []

    def now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def wait_and_step_ms(self, skip: int) -> tuple[float, float]:
        """Total ms waiting for batches and total ms of steps, over the steps after the first ``skip``."""
        wait = step = 0.0
        for (start, ready), (next_start, _) in zip(self.marks[skip:], self.marks[skip + 1:]):
            if self.cuda:
                wait += start.elapsed_time(ready)
                step += start.elapsed_time(next_start)
            else:
                wait += (ready - start) * 1e3
                step += (next_start - start) * 1e3
        return wait, step


def loader_run(device: torch.device, batches: list, steps: int, mode: str) -> dict[str, Any]:
    """A plain loop over turbotrain's DeviceLoader: ``mode`` is blocking, non-blocking or prefetch."""
    torch.manual_seed(0)
    model = ImageNet().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    to_device = functools.partial(move_batch, device=device, non_blocking=mode != "blocking")
    data = [batches[i % len(batches)] for i in range(steps + 1)]
    loader = iter(DeviceLoader(data, to_device, device, prefetch=mode == "prefetch"))
    marks = StepMarks(device)
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        begin = marks.now()
        x, y = next(loader)
        marks.marks.append((begin, marks.now()))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        for p in model.parameters():
            p.grad = None
    marks.marks.append((marks.now(), None))
    sync(device)
    wall = time.perf_counter() - start
    skip = min(5, steps // 4)
    wait, step = marks.wait_and_step_ms(skip)
    counted = len(marks.marks) - 1 - skip
    return {"run": f"DeviceLoader, {mode}", "ms_per_step_wall": wall / steps * 1e3,
            "ms_per_step_marked": step / counted, "wait_ms_per_step": wait / counted,
            "wait_share": wait / step if step else 0.0}


def trainer_prefetch_run(device: torch.device, batches: list, steps: int, prefetch: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    model = ImageNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    plan = tt.Plan(device=device.type, non_blocking=True, device_prefetch=prefetch and device.type == "cuda")
    data = [batches[i % len(batches)] for i in range(steps)]
    warm = tt.Trainer(model, opt, F.cross_entropy, plan=plan, max_steps=3, progress=False)
    warm.fit(data[:3])  # warm-up: the first kernels, the allocator
    trainer = tt.Trainer(model, opt, F.cross_entropy, plan=plan, max_steps=steps, log_every_n_steps=steps,
                         progress=False)
    wall = timed(device, lambda: trainer.fit(data))
    state = "on" if trainer.rt.device_prefetch else ("off" if not prefetch else "off (GPU only)")
    return {"run": f"Trainer, device_prefetch={state}", "ms_per_step_wall": wall / steps * 1e3}


def measure_prefetch(device: torch.device, steps: int, batch: int, side: int) -> dict[str, Any]:
    batches = pinned_batches(device, batch, side)
    megabytes = batches[0][0].numel() / 1e6
    rows = []
    for mode in ("blocking", "non-blocking", "prefetch"):
        loader_run(device, batches, 8, mode)  # warm-up
        rows.append(loader_run(device, batches, steps, mode))
        say(f"prefetch: DeviceLoader {mode}: {rows[-1]['ms_per_step_wall']:.2f} ms/step, "
            f"waiting {100 * rows[-1]['wait_share']:.0f}%")
    for prefetch in (False, True):
        rows.append(trainer_prefetch_run(device, batches, steps, prefetch))
        say(f"prefetch: {rows[-1]['run']}: {rows[-1]['ms_per_step_wall']:.2f} ms/step")
    note = ("compute stream's time from the step's start to the batch being handed out (CUDA events)"
            if device.type == "cuda" else "host time in next() (CPU: no copies, device prefetch is off by design)")
    return {"steps": steps, "batch": f"{batch}x3x{side}x{side} uint8 ({megabytes:.1f} MB) from "
            f"{'pinned' if device.type == 'cuda' else 'host'} memory, int64 labels",
            "waiting": note, "rows": rows}


def prefetch_markdown(result: dict[str, Any]) -> str:
    rows = []
    for r in result["rows"]:
        marked = "wait_share" in r
        rows.append([r["run"], f"{r['ms_per_step_wall']:.2f}",
                     f"{r['wait_ms_per_step']:.3f}" if marked else "-",
                     f"{100 * r['wait_share']:.1f}%" if marked else "-"])
    return (f"{result['steps']} steps, batch {result['batch']}, conv net 3-64-128 (stride 4, 2); "
            f"waiting = {result['waiting']}\n\n"
            + table(["run", "ms/step (wall)", "waiting ms/step", "waiting share of step"], rows))


# -- syncs: host syncs per step under torch.cuda.set_sync_debug_mode("warn") ---------------------

SYNC_MESSAGE = "synchronizing CUDA operation"
EVENT_FRAMES = {"_events", "_log_metrics", "_end_epoch", "_save_checkpoint", "_run_validation", "_read_guard"}


@dataclass
class SyncSite:
    where: str          # per-step, events (logging cadence), setup/end
    line: str           # the Python line that made the call
    via: str            # the nearest turbotrain frame (or the line itself)
    count: int = 0


@dataclass
class SyncCount:
    run: str
    steps: int
    cadence: int
    sites: list[SyncSite] = field(default_factory=list)

    def total(self, where: str) -> int:
        return sum(s.count for s in self.sites if s.where == where)


def classify(stack: list[traceback.FrameSummary]) -> tuple[str, str, str]:
    names = {f.name for f in stack}
    if names & EVENT_FRAMES:
        where = "events"
    elif "_train" in names or "loop" in names:
        where = "per-step"
    else:
        where = "setup/end"
    outside = [f for f in stack if "warnings" not in Path(f.filename).name]
    line = f"{Path(outside[-1].filename).name}:{outside[-1].lineno} {outside[-1].name}" if outside else "?"
    ours = [f for f in outside if f"turbotrain{os.sep}" in f.filename]
    via = f"{Path(ours[-1].filename).name}:{ours[-1].lineno} {ours[-1].name}" if ours else line
    return where, line, via


def count_syncs(name: str, steps: int, cadence: int, run: Callable[[], None]) -> SyncCount:
    result = SyncCount(name, steps, cadence)
    sites: dict[tuple[str, str, str], SyncSite] = {}

    show = warnings.showwarning

    def hook(message, category, filename, lineno, file=None, line=None):  # warnings.showwarning's signature
        if SYNC_MESSAGE not in str(message):
            show(message, category, filename, lineno, file, line)  # any other warning is shown as usual
            return
        key = classify(traceback.extract_stack()[:-1])
        sites.setdefault(key, SyncSite(*key)).count += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    result.sites = sorted(sites.values(), key=lambda s: -s.count)
    return result


def wide_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def measure_syncs(device: torch.device, steps: int, cadence: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    host = [(torch.randn(256, 1024, generator=g).pin_memory(), torch.randint(0, 10, (256,), generator=g).pin_memory())
            for _ in range(8)]
    data = [host[i % len(host)] for i in range(steps)]
    plans = {"Trainer, naive plan": tt.Plan(device="cuda"),
             "Trainer, non_blocking + device_prefetch": tt.Plan(device="cuda", non_blocking=True, device_prefetch=True),
             "Trainer, Plan.fast (compile off)": tt.Plan.fast(wide_mlp(), device="cuda").replace(compile=False)}
    counts = []
    for name, plan in plans.items():
        model = wide_mlp()
        trainer = tt.Trainer(model, torch.optim.AdamW(model.parameters(), lr=1e-3), F.cross_entropy, plan=plan,
                             max_steps=steps, log_every_n_steps=cadence, progress=False)
        counts.append(count_syncs(name, steps, cadence, functools.partial(trainer.fit, data)))
        say(f"syncs: {name}: {counts[-1].total('per-step')} on the per-step path, "
            f"{counts[-1].total('events')} at events, {counts[-1].total('setup/end')} in setup/end")

    model = wide_mlp().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loop() -> None:  # the reference: a plain loop, non-blocking copies from pinned memory, no reads
        for x, y in data:
            loss = F.cross_entropy(model(x.to(device, non_blocking=True)), y.to(device, non_blocking=True))
            loss.backward()
            opt.step()
            opt.zero_grad()
    counts.append(count_syncs("plain loop, non_blocking, no reads", steps, cadence, loop))
    say(f"syncs: plain loop: {counts[-1].total('per-step')} on the per-step path")
    plan_fast = plans["Trainer, Plan.fast (compile off)"]
    return {"steps": steps, "cadence": cadence, "model": "MLP 1024-1024-1024-10, batch 256, AdamW, pinned host batches",
            "fast_plan": {k: v for k, v in plan_fast.to_dict().items() if tt.Plan().to_dict().get(k) != v},
            "runs": [asdict(c) | {"per_step": c.total("per-step"), "events": c.total("events"),
                                  "setup_end": c.total("setup/end")} for c in counts]}


def syncs_markdown(result: dict[str, Any]) -> str:
    steps, cadence = result["steps"], result["cadence"]
    rows = [[r["run"], r["per_step"], f"{r['per_step'] / steps:.2f}", r["events"], r["setup_end"]]
            for r in result["runs"]]
    sites = [[r["run"], s["where"], s["count"], f"`{s['line']}`", f"`{s['via']}`"]
             for r in result["runs"] for s in r["sites"]]
    return (f"{steps} steps, logging every {cadence} steps ({steps // cadence} logs), {result['model']}; "
            f"Plan.fast here: {result['fast_plan']}. Target: 0 syncs on the per-step path.\n\n"
            + table(["run", "syncs on the per-step path", "per step", "at events (logging cadence)",
                     "setup / end of fit"], rows)
            + "\n\nWhere they came from:\n\n"
            + table(["run", "where", "count", "line", "via turbotrain"], sites))


# -- doctor: the report on a data-bound and a sync-bound GPU script ------------------------------

def run_doctor(out_dir: Path, timeout_s: int) -> dict[str, Any]:
    results = {}
    for script in DOCTOR_SCRIPTS:
        path = ROOT / "tests" / "doctor" / "scripts" / script
        stem = Path(script).stem
        report = out_dir / f"doctor_{stem}.json"
        command = [sys.executable, "-m", "turbotrain", "doctor", "--json", str(report), "--watch", "0", str(path)]
        say(f"doctor: {script} ...")
        started = time.perf_counter()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
            text, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            partial = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            text, rc = f"{partial}\ntimed out after {timeout_s} s", -1
        (out_dir / f"doctor_{stem}.txt").write_text(text)
        entry: dict[str, Any] = {"rc": rc, "seconds": round(time.perf_counter() - started, 1)}
        if report.exists():
            data = json.loads(report.read_text())
            entry["bottleneck"] = data.get("bottleneck")
            entry["step_ms_median"] = (data.get("step_time_ms") or {}).get("median")
            entry["breakdown"] = data.get("breakdown")
            entry["syncs"] = [f"{s['kind']} {s['where']} x{s['per_step']:g}/step" for s in data.get("syncs") or []]
            entry["findings"] = [f"{f.get('rule')} ({f.get('where')})" for f in data.get("findings", [])]
        results[script] = entry
        say(f"doctor: {script}: rc {rc}, {entry.get('findings')}")
    return results


def doctor_markdown(result: dict[str, Any]) -> str:
    rows = [[f"`{script}`", r["rc"], r["seconds"], r.get("step_ms_median", "-"), r.get("bottleneck", "-"),
             ", ".join(r.get("findings", [])) or "-", ", ".join(r.get("syncs", [])) or "-"]
            for script, r in result.items()]
    return table(["script", "rc", "doctor s", "step ms (median)", "bottleneck", "findings (rule, where)",
                  "host syncs the doctor saw"], rows)


# -- main ------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    parser.add_argument("--json", type=Path, help="write every figure as JSON here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    parser.add_argument("--parts", nargs="+", default=["overhead", "prefetch", "syncs", "doctor"],
                        choices=("overhead", "prefetch", "syncs", "doctor"))
    parser.add_argument("--doctor-timeout", type=int, default=150, help="seconds per doctor run")
    parser.add_argument("--quick", action="store_true", help="a few steps of each part: checks the script runs")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this torch sees no CUDA device (torch.cuda.is_available() is False); "
                     "use --device cpu")
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    out_dir = (args.json or args.markdown or Path("runs/gpu_extras.json")).resolve().parent
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine(device), "device": args.device}
    sections = [f"## GPU extras: {results['machine']}"]
    say(f"on {results['machine']}; parts: {' '.join(args.parts)}")
    if "overhead" in args.parts:
        steps, repeats = (20, 1) if args.quick else (2000, 5) if on_gpu else (300, 3)
        results["overhead"] = measure_overhead(device, steps=steps, repeats=repeats)
        sections += ["### Trainer overhead per step vs a plain loop", overhead_markdown(results["overhead"])]
    if "prefetch" in args.parts:
        size = (256, 224) if on_gpu else (16, 64)
        results["prefetch"] = measure_prefetch(device, steps=8 if args.quick else 60 if on_gpu else 20,
                                               batch=size[0], side=size[1])
        sections += ["### Device prefetch: time waiting on host-to-device copies",
                     prefetch_markdown(results["prefetch"])]
    if "syncs" in args.parts:
        if on_gpu:
            results["syncs"] = measure_syncs(device, steps=200, cadence=50)
            sections += ["### Host syncs per step (torch.cuda.set_sync_debug_mode)", syncs_markdown(results["syncs"])]
        else:
            say("syncs: skipped: torch.cuda.set_sync_debug_mode counts CUDA syncs only (run with --device cuda)")
            results["syncs"] = {"skipped": "CUDA only"}
    if "doctor" in args.parts:
        results["doctor"] = run_doctor(out_dir, args.doctor_timeout)
        sections += ["### The doctor on a data-bound and a sync-bound script", doctor_markdown(results["doctor"])]
    markdown = "\n\n".join(sections) + "\n"
    print("\n" + markdown, flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    if args.markdown:
        args.markdown.write_text(markdown)
    say("done")


if __name__ == "__main__":
    main()
