"""Findings that fit the script, the machine and the model (issue 30).

* the fix is said in the framework whose loop ran (plain PyTorch, a Lightning ``Trainer``, Fabric, Accelerate,
  a Hugging Face ``Trainer``), read from the frames that stepped the optimizer, never from imports alone;
* library code is judged by how the script called it: an installed package's eval decorator stacked under
  ``@torch.no_grad()`` is no finding, and a finding never points into site-packages;
* low findings that cannot matter on this machine and model are folded into one line per reason in the
  terminal, and kept whole in the JSON and HTML reports.

Each doctor run is shared by the tests that read it (module-scoped), without what-ifs: what these tests check is
decided before any what-if runs.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from doctor_helpers import marked_lines, run_doctor, script
from turbotrain.doctor import DoctorOptions, diagnose_script
from turbotrain.doctor.findings import Finding, Fix
from turbotrain.hardware import detect
from turbotrain.doctor.record.recorder import Recorder
from turbotrain.doctor.record.runner import run_script
from turbotrain.doctor.report.html import render_html
from turbotrain.doctor.report.terminal import chosen_fix, print_report
from turbotrain.doctor.sites import is_user_file

pytestmark = pytest.mark.one_core  # one process, one thread: run beside one other such test (tests/conftest.py)


def _terminal(report, width: int = 100) -> str:
    buf = io.StringIO()
    print_report(report, file=buf, width=width)
    return buf.getvalue()


def _report(name: str):
    return run_doctor(name, what_if=False)


# -- the framework whose loop ran ---------------------------------------------------------------------------

ACCELERATE_LOOP = """
import torch
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = accelerator.prepare(model, opt)
for _ in range(20):
    accelerator.backward(model(torch.randn(4, 8)).square().mean())
    opt.step()
    opt.zero_grad()
"""
# Lightning imported, never used: the loop is plain PyTorch, and so is the fix.
IMPORTED_ONLY = """
import lightning as L  # noqa: F401 - imported and never used, on purpose
import torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(20):
    model(torch.randn(4, 8)).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


def _driver(path) -> str:
    recorder = Recorder(measure=1, warmup=1, profile=0, capture=False, sees_construction=True)
    run = run_script(path, [], recorder)
    assert not run.failed, run.error
    return recorder.recording().driver


def test_the_framework_is_read_from_the_loop_that_ran(tmp_path):
    pytest.importorskip("lightning")
    (tmp_path / "accelerate_loop.py").write_text(ACCELERATE_LOOP)
    (tmp_path / "imported_only.py").write_text(IMPORTED_ONLY)
    cases = {script("lightning_slow_data"): "lightning", tmp_path / "imported_only.py": "pytorch"}
    try:
        import accelerate  # noqa: F401 - only whether it is installed
        cases[tmp_path / "accelerate_loop.py"] = "accelerate"
        import transformers  # noqa: F401 - only whether it is installed
        cases[script("hf_trainer_tiny_gpt2")] = "hf_trainer"  # steps through Accelerate's wrapper: the outer loop wins
    except ImportError:
        pass
    assert {str(path): _driver(path) for path in cases} == {str(path): name for path, name in cases.items()}


@pytest.fixture(scope="module")
def fabric():
    pytest.importorskip("lightning")
    return _report("fabric_bf16")


def test_a_fabric_script_gets_the_fabric_fix(fabric):
    assert fabric.framework == "fabric" and fabric.to_dict()["framework"] == "fabric"
    text = _terminal(fabric)
    assert "Trainer(" not in text and "fix (Lightning)" not in text, text
    if not detect("cpu").bf16:
        pytest.skip("no bf16 on this CPU: the doctor offers no mixed precision to say the Fabric way")
    (rule, line), = marked_lines("fabric_bf16")
    found = [f for f in fabric.findings if f.rule == rule]
    assert [f.site.line for f in found] == [line], [f.to_dict(fabric.base) for f in fabric.findings]
    assert found[0].to_dict()["fixes"]["fabric"] == "Fabric(precision='bf16-mixed')"
    assert "fix (Fabric): Fabric(precision='bf16-mixed')" in text, text


def test_each_framework_shows_its_own_fix_and_falls_back_to_pytorchs():
    fix = Fix("with torch.autocast('cpu', dtype=torch.bfloat16): around forward and loss",
              plan={"precision": "bf16-mixed"}, lightning="Trainer(precision='bf16-mixed')",
              accelerate="Accelerator(mixed_precision='bf16')", fabric="Fabric(precision='bf16-mixed')",
              hf_trainer="TrainingArguments(bf16=True)")
    finding = Finding("no-mixed-precision", "float32 without autocast", fix)
    shown = {how: chosen_fix(finding, how) for how in ("pytorch", "lightning", "fabric", "accelerate", "hf_trainer")}
    assert shown == {"pytorch": ("", fix.pytorch), "lightning": ("Lightning", fix.lightning),
                     "fabric": ("Fabric", fix.fabric), "accelerate": ("Accelerate", fix.accelerate),
                     "hf_trainer": ("HF Trainer", fix.hf_trainer)}
    # A fix with no Fabric text of its own is PyTorch's for a Fabric script, never the Trainer's.
    trainer_only = Finding("cudnn-benchmark-off", "off", Fix("torch.backends.cudnn.benchmark = True",
                                                             lightning="Trainer(benchmark=True)"))
    assert chosen_fix(trainer_only, "fabric") == ("", "torch.backends.cudnn.benchmark = True")
    assert "Fabric: Fabric(precision='bf16-mixed')" in fix.text() and "HF Trainer: " in fix.text()


def test_the_thread_fix_is_said_in_every_framework_with_its_workers_where_they_change():
    from turbotrain.doctor.rules.machine.cpu_oversubscribed import threads_fix

    fix = threads_fix(1, 4, 0)
    for how in ("pytorch", "lightning", "fabric", "accelerate", "hf_trainer"):
        text = fix.in_framework(how)
        assert text and "OMP_NUM_THREADS=1" in text, (how, text)
    assert "after Fabric(...)" in fix.fabric and "TrainingArguments(dataloader_num_workers=0)" in fix.hf_trainer
    assert all("num_workers=0" in fix.in_framework(how) for how in ("pytorch", "lightning", "fabric", "accelerate"))
    assert fix.plan == {"intra_op_threads": 1, "num_workers": 0}
    same_workers = threads_fix(2, 0, 0)
    assert "num_workers" not in same_workers.hf_trainer and same_workers.plan == {"intra_op_threads": 2}
    # the threads as they are, fewer workers: the workers are the fix, no call that sets what is set
    workers_only = threads_fix(2, 2, 0, threads_now=2)
    assert workers_only.pytorch.startswith("DataLoader(..., num_workers=0)") and workers_only.plan == {"num_workers": 0}
    assert "set_num_threads" not in workers_only.text() and "num_workers=0" in workers_only.hf_trainer
    finding = Finding("cpu-oversubscribed", "threads over the cores", fix)
    assert chosen_fix(finding, "fabric") == ("Fabric", fix.fabric)
    assert chosen_fix(finding, "hf_trainer") == ("HF Trainer", fix.hf_trainer)


# -- library code, judged by how it is called ----------------------------------------------------------------

def test_any_site_packages_folder_is_library_code(tmp_path):
    installed = tmp_path / "prefix" / "lib" / "python3" / "site-packages" / "somelib" / "core.py"
    distro = tmp_path / "usr" / "lib" / "python3" / "dist-packages" / "otherlib.py"
    assert not is_user_file(str(installed)) and not is_user_file(str(distro))
    assert is_user_file(str(tmp_path / "project" / "train.py"))


def test_a_library_installed_with_pip_target_outside_site_packages_is_library_code(tmp_path, monkeypatch):
    """``pip install --target libs`` with libs on PYTHONPATH: no site-packages in the path, but the distribution's
    RECORD names what it installed. An editable install's RECORD names none of the project's sources."""
    from turbotrain.doctor import sites

    libs, project = tmp_path / "libs", tmp_path / "project"
    for path, text in {
        libs / "enginelib" / "core.py": "",
        libs / "enginelib-1.0.dist-info" / "METADATA": "Metadata-Version: 2.1\nName: enginelib\nVersion: 1.0\n",
        libs / "enginelib-1.0.dist-info" / "RECORD": "enginelib/core.py,,\nhelper.py,,\n../../bin/engine,,\n",
        libs / "helper.py": "",
        project / "src" / "mine" / "model.py": "",
        project / "src" / "mine-0.1.dist-info" / "METADATA": "Metadata-Version: 2.1\nName: mine\nVersion: 0.1\n",
        project / "src" / "mine-0.1.dist-info" / "RECORD": "__editable__.mine-0.1.pth,,\n",
        project / "train.py": "",
    }.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.syspath_prepend(str(libs))
    monkeypatch.syspath_prepend(str(project / "src"))
    monkeypatch.setattr(sites, "_ROOTS", None)
    monkeypatch.setattr(sites, "USER_FILES", {})
    assert not is_user_file(str(libs / "enginelib" / "core.py")) and not is_user_file(str(libs / "helper.py"))
    assert is_user_file(str(project / "src" / "mine" / "model.py")) and is_user_file(str(project / "train.py"))


@pytest.fixture(scope="module")
def library():
    return _report("library_decorator_no_grad")


def test_a_library_decorator_under_no_grad_is_no_finding(library):
    found = [f.to_dict(library.base) for f in library.findings if f.rule == "grad-in-validation"]
    # Only the script's own call with autograd on, at its own line: not the library's decorator (stacked under
    # no_grad), not its helper's body in site-packages, not the script's copy of the decorator.
    assert [(f["rule"], int(f["where"].rsplit(":", 1)[1])) for f in found] == marked_lines(
        "library_decorator_no_grad"), found
    assert all(f["where"].startswith("library_decorator_no_grad.py:") for f in found), found
    assert not any("site-packages" in (f.to_dict(library.base)["where"] or "") for f in library.findings)


# -- low findings that cannot matter here, folded ------------------------------------------------------------

@pytest.fixture(scope="module")
def clutter():
    return _report("cpu_clutter")


def test_gpu_only_habits_and_a_float64_model_fold_into_one_line_each(clutter):
    by_rule = {f.rule: f for f in clutter.findings}
    wanted = dict(marked_lines("cpu_clutter"))
    for rule, line in wanted.items():
        assert by_rule[rule].site.line == line and by_rule[rule].folded, by_rule[rule].to_dict()
    folded = set(wanted)
    if detect("cpu").bf16:  # where the doctor offers mixed precision at all
        precision = by_rule["no-mixed-precision"]
        # Autocast leaves float64 alone: nothing to time, and the note says why.
        assert precision.folded and precision.request is None and "float64" in (precision.note or "")
        folded.add("no-mixed-precision")
    text = _terminal(clutter, 80)
    gpu_only = sum(1 for f in clutter.findings if f.folded and f.fold == "gpu-only")
    assert f"{gpu_only} GPU-only habits: " in text, text
    assert ("float32-only switch" in text) == ("no-mixed-precision" in folded), text
    for rule in folded:
        assert f"LOW    {rule}" not in text, text
    # The JSON and HTML reports keep them whole.
    data = clutter.to_dict()
    assert {f["rule"] for f in data["findings"] if f.get("folded")} >= folded
    page = render_html(clutter)
    assert all(f'data-rule="{rule}"' in page for rule in folded)


def test_a_gpu_only_finding_is_folded_only_on_the_cpu_and_only_while_low():
    def habit(on_gpu: bool) -> Finding:
        f = Finding("dims-not-multiple-of-8", "odd", Fix("pad it"))
        f.provisional("medium")
        return f.on_cpu(SimpleNamespace(on_gpu=on_gpu))

    assert habit(on_gpu=False).folded and not habit(on_gpu=True).folded
    measured = habit(on_gpu=False)
    measured.set_gain(0.3, measured=True)  # a what-if that measured a real gain here: it matters after all
    assert not measured.folded and "folded" not in measured.to_dict()


def test_a_loader_fix_without_workers_leaves_persistent_workers_out():
    """The fix line a user pastes must run: PyTorch refuses persistent_workers=True with num_workers=0 (seen
    on karpathy/makemore, where the measured best on 2 cores was num_workers=0)."""
    from torch.utils.data import DataLoader

    from turbotrain.doctor.rules.data.num_workers import loader_fix

    assert loader_fix(4) == "DataLoader(..., num_workers=4, persistent_workers=True)"
    assert loader_fix(0) == "DataLoader(..., num_workers=0)"
    with pytest.raises(ValueError, match="persistent_workers"):
        DataLoader([1], num_workers=0, persistent_workers=True)


def test_a_loader_that_no_worker_count_speeds_up_keeps_its_count_and_is_not_edited():
    """lightning-hydra-template's MNIST loader on a 2-core Xeon loaded 390 batches/s in process, 166 with one
    worker, 295 with two: the fix still said num_workers=2, and --fix asked for it by hand."""
    from turbotrain.doctor.edits import ByHand
    from turbotrain.doctor.requests import LoaderRequest
    from turbotrain.doctor.rules.data.num_workers import edit, no_faster_count_fix

    fix = no_faster_count_fix(0, {0: 390.35, 1: 166.05, 2: 294.87})
    assert fix.plan is None and fix.pytorch.startswith("Keep num_workers=0") and "2 worker(s) 295" in fix.pytorch
    f = Finding("num-workers", "waits on the DataLoader", fix, request=LoaderRequest())
    f.set_gain(0.0, measured=True)
    with pytest.raises(ByHand, match="no worker count loaded faster"):
        edit(None, f)  # type: ignore[arg-type]  # the edit reads no context here


def test_the_framework_is_the_loops_even_without_a_finding():
    """A machine where nothing is worth fixing (no fast bf16: no mixed-precision finding) still reports the Fabric
    loop as Fabric's: the framework is what stepped the optimizer, not what the findings say."""
    from turbotrain.doctor.report.model import Report

    assert Report(status="ok", breakdown=None, findings=[], driver="fabric").framework == "fabric"
    assert Report(status="no-steps", breakdown=None, findings=[]).framework is None


DATASET_READS_LABELS = """\
import torch
from torch.utils.data import DataLoader, Dataset


class Digits(Dataset):
    def __init__(self):
        self.images, self.targets = torch.randn(256, 16), torch.randint(0, 4, (256,))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        return self.images[index], int(self.targets[index])  # the host's tensor on any device: no sync


model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(20):
    for x, y in DataLoader(Digits(), batch_size=32):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen = loss.item()  # a sync where the model runs on a GPU
"""


def test_a_datasets_reads_of_its_own_tensors_are_no_host_sync(tmp_path):
    script = tmp_path / "digits.py"
    script.write_text(DATASET_READS_LABELS)
    report = diagnose_script(script, [], DoctorOptions(steps=6, warmup=2, profile_steps=0, what_if=False))
    lines = sorted(int(f.to_dict(report.base)["where"].rsplit(":", 1)[1])
                   for f in report.findings if f.rule == "host-sync-in-loop")
    assert lines == [24], [f.to_dict(report.base) for f in report.findings if f.rule == "host-sync-in-loop"]
