"""The doctor never breaks a script that runs without it: TorchScript under the recorder's patches (issue 45).

Libraries script functions at import (``torch.distributed.optim``, which ``import ignite`` pulls in;
torcheval's metrics, which call ``torch.tensor`` inside ``@torch.jit.script``): the recorder's wrappers
must keep TorchScript's view of the caller's frame and of the builtins it knows.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
import torch.nn.functional as F

from turbotrain.doctor.record import instrument
from turbotrain.doctor.record.patcher import Patcher

@pytest.fixture
def recorder_patches():
    patcher = Patcher()
    instrument.install(patcher)
    try:
        yield
    finally:
        patcher.restore()


def test_a_scripted_class_resolves_names_from_its_callers_frame(recorder_patches):
    """``torch.jit.script`` on a class reads the names its methods use from the frame that called it, as
    torch.distributed.optim's functional optimizers call a module-level function."""

    def doubled(x: torch.Tensor) -> torch.Tensor:  # visible only in this frame, as a module's globals are
        return x * 2

    class Shift:
        def __init__(self, by: float):
            self.by = by

        def apply(self, x: torch.Tensor) -> torch.Tensor:
            return doubled(x) + self.by

    scripted = torch.jit.script(Shift)
    assert torch.equal(scripted(1.0).apply(torch.ones(2)), torch.full((2,), 3.0))


def test_builtins_and_functional_calls_the_recorder_wraps_still_script(recorder_patches):
    assert hasattr(torch.tensor, "__wrapped__")  # the recorder's wrapper is in place

    @torch.jit.script
    def counts(target: torch.Tensor) -> torch.Tensor:  # torcheval's update: torch.tensor inside a script
        return torch.tensor(target.shape[0], device=target.device) + F.softmax(target, dim=0).sum()

    assert counts(torch.zeros(5)).item() == pytest.approx(6.0)


def test_a_library_that_scripts_at_import_imports_under_the_recorder(recorder_patches):
    for name in [m for m in sys.modules if m.startswith("torch.distributed.optim")]:
        del sys.modules[name]  # imported afresh, as a script's first import of ignite would
    importlib.import_module("torch.distributed.optim")


def test_the_builtin_entries_go_with_the_patches():
    from torch.jit._builtins import _get_builtin_table

    before = dict(_get_builtin_table())
    patcher = Patcher()
    instrument.install(patcher)
    assert len(_get_builtin_table()) > len(before)  # the wrappers, entered under their builtins' ops
    patcher.restore()
    assert _get_builtin_table() == before
