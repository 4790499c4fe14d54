"""A one-process torch.distributed job's process group outlives the script under the doctor, until the doctor has
stepped its copies (modded-nanogpt's Muon all-reduces its updates, and the script destroys its group as it ends)."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.distributed as dist

from turbotrain.doctor import DoctorOptions, diagnose_script
from turbotrain.doctor.record.process_group import process_group_kept

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane


def _init(tmp_path, name: str = "store") -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / name}", rank=0, world_size=1)


def test_the_scripts_destroy_of_a_one_rank_group_waits_for_the_exit(tmp_path):
    with process_group_kept():
        _init(tmp_path)
        dist.destroy_process_group()
        assert dist.is_initialized()
        flat = torch.ones(3)
        dist.all_reduce(flat)  # what a copy's optimizer step does after the script ended
        assert torch.equal(flat, torch.ones(3))
    assert not dist.is_initialized()
    assert dist.destroy_process_group is dist.distributed_c10d.destroy_process_group  # put back


def test_a_group_initialised_again_after_a_destroy_gets_the_real_destroy_first(tmp_path):
    with process_group_kept():
        _init(tmp_path, "first")
        dist.destroy_process_group()
        _init(tmp_path, "second")  # would raise "trying to initialize the default process group twice"
        assert dist.is_initialized()
        dist.destroy_process_group()
    assert not dist.is_initialized()


SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)


    class AllReduced(torch.optim.SGD):
        # modded-nanogpt's Muon in small: every update is all-reduced across the ranks
        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    dist.all_reduce(p.grad)
                    p.add_(p.grad, alpha=-group["lr"])


    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = AllReduced(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    for step in range(10):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
""")


def test_the_step_of_copies_is_measured_after_a_script_that_destroys_its_group(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    # More steps than the script runs: it reaches its destroy_process_group().
    options = DoctorOptions(steps=12, warmup=2, profile_steps=1, what_if_budget_s=0.0, watch_s=0.0)
    report = diagnose_script(str(script), [str(tmp_path / "store")], options)
    assert report.run.status == "finished", report.messages
    memory = report.to_dict()["memory"]
    assert memory["measured"], memory
    assert not dist.is_initialized()


def test_a_group_the_doctor_stopped_the_script_before_destroying_is_destroyed_at_its_end(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    options = DoctorOptions(steps=4, warmup=2, profile_steps=1, what_if=False, watch_s=0.0)
    report = diagnose_script(str(script), [str(tmp_path / "store")], options)
    assert report.run.status == "stopped"
    assert not dist.is_initialized()
