"""Static rules on source snippets: the pattern is found at its line, and only where it runs per step."""

from __future__ import annotations

import textwrap

import pytest

from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.rules import evaluate
from turbotrain.doctor.rules.job.nccl_env import check_nccl_env
from turbotrain.doctor.analysis.source import load_sources
from turbotrain.hardware import detect


def context_for(tmp_path, source: str, **changes) -> Context:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(source))
    ctx = Context(script=str(path), base=str(tmp_path), hw=detect("cpu"), device="cpu",
                  breakdown=compute_breakdown([], 1), measured_steps=[], sources=load_sources([str(path)]))
    return ctx.replace(**changes)


def found(ctx, rule):
    return [(f.site.line, f.severity) for f in evaluate(ctx, only=[rule]) if f.site]


def line_of(ctx, text):
    return next(n for n, t in enumerate(open(ctx.script).read().splitlines(), 1) if text in t)


SOURCE = """
import os
import torch

os.environ["NCCL_BUFF_SIZE"] = "8388608"
torch.backends.cudnn.benchmark = False

@torch.jit.script
def fused(x):
    return x * torch.sigmoid(x)

def validate(model, data):
    model.eval()
    return [model(x) for x in data]

def attention(q, k, v):
    w = (q @ k.transpose(-2, -1)).softmax(-1)
    return w @ v

def train(model, opt, loader, device):
    model = torch.compile(torch.nn.SyncBatchNorm.convert_sync_batchnorm(model))
    for x, y in loader:
        x = x.to(device)
        noise = torch.zeros(x.shape).cuda()
        loss = model(x + noise).sum()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        torch.cuda.empty_cache()
        torch.save(model.state_dict(), "ckpt.pt")
        t = torch.tensor(some_numpy_array)
    torch.save(model.state_dict(), "final.pt")
    torch.cuda.empty_cache()
"""


@pytest.mark.parametrize("rule,text", [
    ("jit-script", "@torch.jit.script"),
    ("grad-in-validation", "model.eval()"),
    ("manual-attention", "softmax(-1)"),
    ("syncbn-with-compile", "torch.compile("),
    ("non-blocking", "x = x.to(device)"),
    ("tensor-created-off-device", "torch.zeros(x.shape).cuda()"),
    ("zero-grad-not-none", "zero_grad(set_to_none=False)"),
    ("empty-cache-in-loop", "        torch.cuda.empty_cache()"),
    ("save-in-loop", 'torch.save(model.state_dict(), "ckpt.pt")'),
    ("tensor-from-numpy-copy", "torch.tensor(some_numpy_array)"),
    ("nccl-env", "NCCL_BUFF_SIZE"),
    ("cudnn-benchmark-off", "cudnn.benchmark = False"),
])
def test_static_rule_points_at_the_line(tmp_path, rule, text):
    ctx = context_for(tmp_path, SOURCE)
    lines = [line for line, _ in found(ctx, rule)]
    assert line_of(ctx, text) in lines, (rule, lines)


EPOCHS = """
import torch
for epoch in range(10):
    for i, (x, y) in enumerate(loader):
        loss = model(x).sum()
        loss.backward()
        opt.step()
    torch.save(model.state_dict(), "epoch.pt")
"""


def test_a_save_in_the_epoch_loop_around_the_step_loop_is_once_per_epoch(tmp_path):
    """pytorch/examples' DCGAN saves once per epoch, after its batch loop: already the fix, never the finding."""
    assert found(context_for(tmp_path, EPOCHS), "save-in-loop") == []
    per_step = EPOCHS.replace('    torch.save(model.state_dict(), "epoch.pt")', '        torch.save(model, "x.pt")')
    ctx = context_for(tmp_path, per_step)
    assert [line for line, _ in found(ctx, "save-in-loop")] == [line_of(ctx, '"x.pt"')]


def test_calls_outside_the_loop_are_not_per_step(tmp_path):
    ctx = context_for(tmp_path, SOURCE)
    assert line_of(ctx, '"final.pt"') not in [line for line, _ in found(ctx, "save-in-loop")]
    once = [n for n, t in enumerate(open(ctx.script).read().splitlines(), 1) if t == "    torch.cuda.empty_cache()"]
    per_step = {line for line, _ in found(ctx, "empty-cache-in-loop")}
    assert len(once) == 1 and per_step and once[0] not in per_step


def test_validation_under_no_grad_is_fine(tmp_path):
    ctx = context_for(tmp_path, """
        import torch

        @torch.no_grad()
        def validate(model, data):
            model.eval()
            return [model(x) for x in data]

        def test(model, data):
            model.eval()
            with torch.inference_mode():
                return [model(x) for x in data]
    """)
    assert found(ctx, "grad-in-validation") == []


def test_a_call_by_the_name_it_was_imported_as_is_found_by_its_own_name(tmp_path):
    """nanoGPT's ``from torch.nn.parallel import DistributedDataParallel as DDP``: the rules that point at the
    DistributedDataParallel call (and --fix, which edits it) find ``DDP(...)``."""
    from turbotrain.doctor.rules.common import call_site

    ctx = context_for(tmp_path, """
        import torch
        from torch.nn import DataParallel as DP
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = torch.nn.Linear(4, 4)
        wrapped = DP(model)
        ddp = DDP(model, device_ids=None)
    """)
    assert call_site(ctx, "DistributedDataParallel").line == line_of(ctx, "ddp = DDP(")
    assert call_site(ctx, "DistributedDataParallel", "device_ids").line == line_of(ctx, "ddp = DDP(")
    assert [line for line, _ in found(ctx, "data-parallel")] == [line_of(ctx, "wrapped = DP(")]


def test_static_findings_are_low_on_their_own(tmp_path):
    ctx = context_for(tmp_path, SOURCE)
    assert {f.severity for f in evaluate(ctx)} == {"low"}


def test_nccl_typo_names_the_real_variable():
    problems = {name: (kind, message) for name, kind, message, _ in check_nccl_env(
        {"NCCL_BUFF_SIZE": "8388608", "NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0",
         "NCCL_ASYNC_ERROR_HANDLING": "1", "PATH": "/bin", "NCCL_VERSION": "2.27.7-1"})}
    assert problems["NCCL_BUFF_SIZE"][0] == "typo" and "NCCL_BUFFSIZE" in problems["NCCL_BUFF_SIZE"][1]
    assert problems["NCCL_DEBUG"][0] == "debug"
    assert problems["NCCL_P2P_DISABLE"][0] == "disabled"
    assert problems["NCCL_ASYNC_ERROR_HANDLING"][0] == "renamed"
    assert "NCCL_SOCKET_IFNAME" not in problems and "PATH" not in problems
    assert "NCCL_VERSION" not in problems  # NVIDIA's CUDA images set it to label their NCCL: not a setting


def test_nccl_env_from_the_environment_matters_on_gpus(tmp_path):
    from dataclasses import replace

    ctx = context_for(tmp_path, "print('hi')\n", env={"NCCL_BUFF_SIZE": "8388608"})
    cpu = evaluate(ctx, only=["nccl-env"])
    assert [(f.where, f.severity) for f in cpu] == [("env NCCL_BUFF_SIZE", "low")]
    gpu = evaluate(ctx.replace(hw=replace(ctx.hw, device_type="cuda"), device="cuda"), only=["nccl-env"])
    assert gpu[0].severity == "medium" and "NCCL_BUFFSIZE" in gpu[0].fix.text()


@pytest.mark.parametrize("dropout, numerics", [
    ("w = self.attn_dropout(w)", "resampled"),  # dropout on the weights: SDPA draws its own masks
    ("w = F.dropout(w, 0.1)", "resampled"),
    ("q = self.drop(q)", "precision"),  # dropout elsewhere stays the script's own, drawn as before
])
def test_attention_dropout_on_the_weights_means_the_losses_are_not_compared(tmp_path, dropout, numerics):
    from turbotrain.doctor.rules.step.manual_attention import edit

    ctx = context_for(tmp_path, f"""
        def attention(self, q, k, v):
            w = (q @ k.transpose(-2, -1)).softmax(-1)
            {dropout}
            return w @ v
    """)
    [f] = evaluate(ctx, only=["manual-attention"])
    assert edit(ctx, f).numerics == numerics


@pytest.mark.parametrize("made, causal", [
    ("torch.tril(torch.ones(n, n)).view(1, 1, n, n)", True),  # nanoGPT's buffer: timed with a causal mask
    ("torch.zeros(n)", False),
])
def test_attention_that_reads_a_triangular_buffer_is_timed_causal(tmp_path, made, causal):
    ctx = context_for(tmp_path, f"""
        class Attention:
            def __init__(self, n):
                self.register_buffer("bias", {made})

            def forward(self, q, k, v):
                T = q.size(-2)
                w = (q @ k.transpose(-2, -1)).masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                return w.softmax(-1) @ v
    """)
    [f] = evaluate(ctx, only=["manual-attention"])
    assert f.request.causal is causal


def test_the_attention_edit_is_told_the_operands_dimensions_the_run_saw(tmp_path):
    """4-d operands at every matmul of the function: ``transpose(2, 3)`` is the last two dimensions there."""
    from turbotrain.doctor.rules.step.manual_attention import edit
    from turbotrain.doctor.sites import Site

    ctx = context_for(tmp_path, """
        def attention(q, k, v):
            w = (q @ k.transpose(2, 3)).softmax(-1)
            return w @ v
    """)
    [f] = evaluate(ctx, only=["manual-attention"])
    four = {Site(ctx.script, 3): ((2, 4, 5, 8), (2, 4, 8, 5)), Site(ctx.script, 4): ((2, 4, 5, 5), (2, 4, 5, 8))}
    assert edit(ctx.replace(matmul_shapes=four), f).params.get("ndim") == 4
    mixed = {**four, Site(ctx.script, 4): ((20, 5), (5, 8))}  # two kinds of operands: nothing said
    assert "ndim" not in edit(ctx.replace(matmul_shapes=mixed), f).params
    assert "ndim" not in edit(ctx, f).params  # none seen


LLMC_ATTENTION = """
    import torch.nn.functional as F
    FLASH = 0

    def attention(q, k, v):
        if FLASH:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)).softmax(-1)
            y = att @ v
        return y
"""


@pytest.mark.parametrize("softmax_ran", [True, False])
def test_attention_by_hand_beside_a_fused_branch_is_found_when_its_softmax_ran(tmp_path, softmax_ran):
    """llm.c's train_gpt2.py keeps F.scaled_dot_product_attention behind `if FLASH:` (0 unless --flash 1): the
    function calls it, so it was never reported; its softmax recorded in the steps says which branch ran."""
    from turbotrain.doctor.record.measurements import EventCounts
    from turbotrain.doctor.sites import Site

    ctx = context_for(tmp_path, LLMC_ATTENTION)
    at = Site(ctx.script, line_of(ctx, ".softmax(-1)"), "attention")
    if softmax_ran:
        cells = tuple((step, 12, 0.001, 0) for step in range(3))
        ctx = ctx.replace(tallies={("softmax", at): EventCounts("softmax", at, cells)}, measured_steps=[0, 1, 2])
    found_here = evaluate(ctx, only=["manual-attention"])
    if not softmax_ran:
        assert found_here == []  # the fused branch may be what ran
        return
    [f] = found_here
    assert f.site.line == at.line and f.severity == "medium"
    assert f"scaled_dot_product_attention (line {line_of(ctx, 'F.scaled_dot_product_attention')}) runs only where " \
           "`FLASH` is true; this run took the hand-written branch" in f.message
    assert f.fix.pytorch.endswith("or take the script's own branch that calls it (make `FLASH` true)")


MODE_SETTER = """
import torch

def build_model(phase):
    model = torch.nn.Linear(4, 4)
    if phase == "eval":
        model.eval()
    else:
        model.train()
    model.to("cpu")
    return model

def validate(model, loader):
    model.eval()
    return evaluate(model, loader)
"""


def test_a_function_that_only_sets_the_mode_evaluates_nothing(tmp_path):
    """nanochat's checkpoint_manager.build_model switches the loaded model to eval and returns it: `--fix` wrapped
    that if/else in inference_mode, which changes nothing. A function that hands the model on to an evaluation is
    still named."""
    ctx = context_for(tmp_path, MODE_SETTER)
    evals = [n for n, t in enumerate(open(ctx.script).read().splitlines(), 1) if "model.eval()" in t]
    assert [line for line, _ in found(ctx, "grad-in-validation")] == evals[1:]  # validate's, not build_model's
