"""A script's run under the recorder ends its DataLoader workers cleanly, persistent ones included: left to the
interpreter's exit, torch terminates them, and each terminated worker leaves a ``pymp-*`` folder in the temporary
root (a --verify run of the num-workers fix, which sets persistent_workers=True, left two per run)."""

from __future__ import annotations

import multiprocessing
import tempfile
import textwrap

import pytest

from turbotrain.doctor.record.recorder import Recorder
from turbotrain.doctor.record.runner import run_script

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

SCRIPT = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn({rows}, 8), torch.randn({rows}, 1))
    loader = DataLoader(data, batch_size=32, num_workers=2, persistent_workers={persistent})
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range({epochs}):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
"""


# A script that ends by itself (two batches) or that the recorder stops, its workers persistent or not.
@pytest.mark.parametrize("persistent, rows, status", [(True, 64, "finished"), (True, 4096, "stopped"),
                                                     (False, 4096, "stopped")])
def test_the_scripts_loader_workers_exit_and_remove_their_folders(tmp_path, worker_tmp, monkeypatch, persistent, rows,
                                                                  status):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(persistent=persistent, rows=rows, epochs=2)))
    scratch = worker_tmp
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # forked workers inherit it: their folders land here
    run = run_script(script, [], Recorder(measure=3, warmup=2, profile=0, capture=False))
    assert run.status == status, run
    assert multiprocessing.active_children() == []
    assert sorted(p.name for p in scratch.glob("pymp-*")) == []
