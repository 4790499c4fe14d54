"""The one torch.compile what-if of the suite: a tiny model, compiled and timed against eager."""

from __future__ import annotations

import shutil
import sys

import torch

import pytest

from doctor_helpers import run_doctor


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
