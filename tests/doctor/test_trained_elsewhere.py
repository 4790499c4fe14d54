"""A script that trains in processes it starts itself (Hogwild!'s `mp.Process(target=train)`) steps no optimizer in
the process the doctor records: the report says where the training went, instead of "the script never called
optimizer.step()". (Ranks from `torch.multiprocessing.spawn` are recorded: test_spawned_ranks.py.)"""

from __future__ import annotations

import io
import textwrap

import pytest

from turbotrain.doctor.diagnose import DoctorOptions, diagnose_script
from turbotrain.doctor.report.terminal import print_report

pytestmark = pytest.mark.reads_no_time  # it reads what the report says, never a time

SCRIPT = """
import torch
import torch.multiprocessing as mp


def train(rank, steps):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    {start}
"""

HOGWILD = """processes = [mp.get_context("fork").Process(target=train, args=(rank, 3)) for rank in range(2)]
    for p in processes:
        p.start()  # here
    for p in processes:
        p.join()"""


def test_a_script_whose_training_runs_in_processes_it_started_is_told_so(tmp_path):
    path = tmp_path / "hogwild.py"
    path.write_text(textwrap.dedent(SCRIPT).replace("{start}", HOGWILD))
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "# here" in text)
    report = diagnose_script(path, [], DoctorOptions(steps=3, warmup=1, profile_steps=0, what_if=False))
    assert report.status == "no-steps", report.messages
    said = report.messages[-1]
    assert f"2 running train() (hogwild.py:6), started at hogwild.py:{line}" in said, said
    assert "never called optimizer.step()" not in said and "no multiprocessing" in said
    printed = io.StringIO()
    print_report(report, file=printed, width=100)
    assert "2 running train()" in " ".join(printed.getvalue().split())
    assert not any(line.strip().endswith(":") for line in printed.getvalue().splitlines()[:2]), printed.getvalue()


def test_dataloader_workers_are_not_the_scripts_processes(tmp_path):
    path = tmp_path / "eval_only.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        model = torch.nn.Linear(4, 1)
        with torch.no_grad():
            for (x,) in DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8, num_workers=2):
                model(x)
    """))
    report = diagnose_script(path, [], DoctorOptions(steps=3, warmup=1, profile_steps=0, what_if=False))
    assert report.status == "no-steps" and "never called optimizer.step()" in report.messages[-1], report.messages
