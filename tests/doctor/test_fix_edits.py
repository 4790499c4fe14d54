"""doctor --fix: each edit kind on small sources (no doctor run): the exact edit, comments and layout kept,
and "by hand" (never a guessed edit) where the value comes from a config or the call is built at run time."""

from __future__ import annotations

import re
import textwrap

import pytest

pytest.importorskip("libcst", reason="doctor --fix needs libcst: pip install -e '.[fix]'")

from turbotrain.doctor.fixes.model import ByHand, EditRequest
from turbotrain.doctor.fixes.table import apply_edit


def _computes_the_same(tmp_path, before: str, after: str, attention: str) -> None:
    """The attention class ``attention`` (built for 8 positions) of both sources, run on the same 5 queries, keys
    and values: the edit changed how it computes, not what."""
    import runpy

    import torch

    q, k, v = torch.randn(3, 2, 2, 5, 4).unbind(0)
    outputs = []
    for name, text in (("before.py", before), ("after.py", after)):
        (tmp_path / name).write_text(textwrap.dedent(text))
        outputs.append(runpy.run_path(str(tmp_path / name))[attention](8)(q, k, v))
    torch.testing.assert_close(outputs[1], outputs[0])


def edit(source: str, kind: str, marker: str = "# here", /, **params) -> str:
    """``source`` with ``kind`` applied at the line holding ``marker``."""
    source = textwrap.dedent(source)
    line = next(i for i, text in enumerate(source.splitlines(), 1) if marker in text)
    lines = tuple(i for i, text in enumerate(source.splitlines(), 1) if "# also" in text)
    request = EditRequest(rule="r", kind=kind, file="train.py", line=line, where=f"train.py:{line}", label="",
                          params=params, lines=lines)
    new = apply_edit(source, request, "train.py")
    compile(new, "train.py", "exec")
    return new


def changed(before: str, after: str) -> list[str]:
    old = set(textwrap.dedent(before).splitlines())
    return [line.strip() for line in after.splitlines() if line not in old]


LOADER = """
    from torch.utils.data import DataLoader
    loader = DataLoader(ds, batch_size=32, shuffle=True)  # here: keep this comment
"""


def test_loader_keywords_are_added_and_the_comment_kept():
    new = edit(LOADER, "loader", num_workers=4, persistent_workers=True)
    assert changed(LOADER, new) == ["loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=4, "
                                    "persistent_workers=True)  # here: keep this comment"]


def test_loader_literal_is_replaced_in_place_and_a_layout_one_per_line_kept():
    source = """
        loader = DataLoader(  # here
            ds,
            num_workers=0,
            batch_size=8,
        )
    """
    new = edit(source, "loader", num_workers=2, pin_memory=True)
    assert new.splitlines()[1:] == ["loader = DataLoader(  # here", "    ds,", "    num_workers=2,",
                                    "    batch_size=8,", "    pin_memory=True,", ")"]


@pytest.mark.parametrize("call, named", [
    ("DataLoader(ds, num_workers=cfg.workers)", "cfg.workers"),
    ("DataLoader(ds, **loader_kwargs)", "**kwargs"),
    ("DataLoader(ds, 32, True, None, None, args.workers)", "args.workers"),
])
def test_a_value_from_a_config_or_built_at_run_time_is_by_hand(call, named):
    with pytest.raises(ByHand, match=named.replace("*", r"\*")):
        edit(f"loader = {call}  # here\n", "loader", num_workers=4)


FORWARDED = """
    from torch.utils.data import DataLoader

    class InfiniteDataLoader:
        def __init__(self, dataset, **kwargs):
            self.train_loader = DataLoader(dataset, shuffle=True, **kwargs)  # here

    def make_loader(ds, **options):
        return DataLoader(ds, **options)  # there

    batches = InfiniteDataLoader(train, batch_size=32, pin_memory=True, num_workers={workers})
"""


def test_a_loader_keyword_passed_through_kwargs_is_set_where_its_class_is_built():
    """makemore's loader: the DataLoader takes its keywords from ``InfiniteDataLoader(...)``'s **kwargs; the fix
    goes on that one call, the keyword there replaced or added."""
    source = FORWARDED.format(workers=4)
    assert changed(source, edit(source, "loader", num_workers=0, persistent_workers=True)) == [
        "batches = InfiniteDataLoader(train, batch_size=32, pin_memory=True, num_workers=0, persistent_workers=True)"]
    # The same through a function; a value the outer call reads from a config is said to be by hand, at its line.
    called = FORWARDED.format(workers=4) + "    other = make_loader(val, num_workers=2)\n"
    assert changed(called, edit(called, "loader", "# there", num_workers=0)) == [
        "other = make_loader(val, num_workers=0)"]
    with pytest.raises(ByHand, match=r"train.py:11: num_workers=`args.workers` comes from a variable") as by_hand:
        edit(FORWARDED.format(workers="args.workers"), "loader", num_workers=0)
    assert "run the script" not in str(by_hand.value)  # no option of that name declared
    # An argparse option: named with its default and line (the run's own command line may set it).
    declared = FORWARDED.format(workers="args.workers") + (
        "    parser.add_argument('--workers', '-w', type=int, default=4, help='--- workers')\n"
        "    args = parser.parse_args()\n")
    with pytest.raises(ByHand, match=r"or run the script with --workers 0 \(its default is 4, at train.py:12\)"):
        edit(declared, "loader", num_workers=0)


@pytest.mark.parametrize("change", [
    ("def __init__(self, dataset, **kwargs):", "def __init__(self, dataset, num_workers=0, **kwargs):"),  # its own
    ("self.train_loader = DataLoader(", "kwargs.pop('num_workers', None)\n            self.train_loader = DataLoader("),
    ("DataLoader(dataset, shuffle=True, **kwargs)", "DataLoader(dataset, None, True, None, None, 4, **kwargs)"),
])
def test_a_keyword_the_function_takes_or_changes_or_is_given_by_position_stays_on_the_loader(change):
    """Set on the outer call, the keyword would be ignored, popped, or passed twice: by hand at the loader."""
    with pytest.raises(ByHand, match=r"\*\*kwargs"):
        edit(FORWARDED.format(workers=4).replace(*change), "loader", num_workers=0)


def test_a_config_attribute_is_not_taken_for_a_command_line_option():
    source = FORWARDED.format(workers="cfg.workers") + "    parser.add_argument('--workers', type=int, default=4)\n"
    with pytest.raises(ByHand) as by_hand:
        edit(source, "loader", num_workers=0)
    assert "run the script" not in str(by_hand.value)


@pytest.mark.parametrize("marker, callee", [("# here", "InfiniteDataLoader"), ("# there", "make_loader")])
def test_a_loader_whose_kwargs_come_from_several_calls_stays_by_hand(marker, callee):
    """Two calls of the function that forwards the keywords: which one built the loader that ran is not known."""
    source = FORWARDED.format(workers=4) + f"    one = {callee}(val, num_workers=4)\n    two = {callee}(test)\n"
    with pytest.raises(ByHand, match=r"\*\*kwargs"):
        edit(source, "loader", marker, num_workers=0)


def test_optimizer_foreach_false_gives_way_to_fused_in_place():
    source = "opt = torch.optim.AdamW(params, lr=1e-3, foreach=False)  # here\n"
    assert edit(source, "optimizer", **{"class": "AdamW", "switch": "fused"}) == \
        "opt = torch.optim.AdamW(params, lr=1e-3, fused=True)  # here\n"
    assert edit("opt = SGD(params, lr=0.1)  # here\n", "optimizer", **{"class": "SGD", "switch": "foreach"}) == \
        "opt = SGD(params, lr=0.1, foreach=True)  # here\n"


def test_an_optimizer_switch_set_from_a_variable_says_where_it_is_set():
    """llm.c: `use_fused = fused_available and device_type == 'cuda'` nine lines above `AdamW(..., fused=use_fused)`."""
    source = textwrap.dedent("""\
        def configure(params, device_type):
            fused_available = True
            use_fused = fused_available and device_type == 'cuda'
            return torch.optim.AdamW(params, lr=1e-3, fused=use_fused)  # here
    """)
    with pytest.raises(ByHand, match=r"fused=`use_fused` comes from a variable or a config; set it to True there; "
                                     r"use_fused is set at train.py:3: `use_fused = fused_available and "
                                     r"device_type == 'cuda'`"):
        edit(source, "optimizer", **{"class": "AdamW", "switch": "fused"})
    twice = source.replace("    fused_available = True\n", "    use_fused = False\n")
    with pytest.raises(ByHand) as by_hand:  # set twice: which one holds is the run's to say
        edit(twice, "optimizer", **{"class": "AdamW", "switch": "fused"})
    assert "is set at" not in str(by_hand.value)


@pytest.mark.parametrize("call", ["opt.zero_grad(set_to_none=False)", "opt.zero_grad(False)"])
def test_zero_grad_sets_to_none(call):
    new = edit(f"for b in data:\n    {call}  # here\n", "zero_grad")
    assert "zero_grad(set_to_none=True)" in new or "zero_grad(True)" in new
    assert "False" not in new


def test_conv_bias_is_dropped_on_every_line_the_finding_names():
    source = """
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)  # here
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, bias=True)  # also
    """
    new = edit(source, "conv_bias", classes=["Conv2d"])
    assert changed(source, new) == ["self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)  # here",
                                    "self.conv2 = nn.Conv2d(16, 32, 3, bias=False)  # also"]


def test_from_numpy_and_as_tensor_when_a_dtype_is_given():
    assert edit("import torch\nx = torch.tensor(a[i])  # here\n", "from_numpy").endswith(
        "x = torch.from_numpy(a[i])  # here\n")
    assert edit("import torch as th\nx = th.tensor(a, dtype=th.float16)  # here\n", "from_numpy").endswith(
        "x = th.as_tensor(a, dtype=th.float16)  # here\n")
    with pytest.raises(ByHand, match="requires_grad"):
        edit("import torch\nx = torch.tensor(a, requires_grad=True)  # here\n", "from_numpy")


VALIDATE = """
    import torch

    def validate(model, data):
        model.eval()
        total = 0.0
        # the whole validation set
        for x in data:
            total += model(x).sum()  # here
        model.train()
        return total
"""


def test_inference_mode_goes_around_the_validation_loop_with_its_comment_above():
    new = edit(VALIDATE, "inference_mode")
    assert "    # the whole validation set\n    with torch.inference_mode():\n        for x in data:\n" \
           "            total += model(x).sum()  # here\n    model.train()" in new


def test_inference_mode_in_a_training_loop_wraps_only_the_validation_line():
    source = """
        import torch
        for step in range(10):
            loss = model(x).sum()
            loss.backward()
            opt.step()
            val = model(v)  # here
    """
    assert changed(source, edit(source, "inference_mode")) == ["with torch.inference_mode():",
                                                               "val = model(v)  # here"]


def test_autocast_covers_the_forward_and_the_loss_not_the_backward():
    source = """
        import torch
        for x, y in data:
            out = model(x)  # here
            loss = criterion(out, y)
            loss.backward()
    """
    new = edit(source, "autocast", device="cpu", dtype="bfloat16")
    assert "    with torch.autocast('cpu', dtype=torch.bfloat16):\n        out = model(x)  # here\n" \
           "        loss = criterion(out, y)\n    loss.backward()" in new
    with pytest.raises(ByHand, match="one statement"):
        edit("import torch\nfor x in d:\n    loss_fn(model(x)).backward()  # here\n", "autocast", device="cpu",
             dtype="bfloat16")


def test_cudnn_benchmark_after_the_imports_or_flipped():
    source = '"""Doc."""\nimport torch\nfrom torch import nn  # here\n\nmodel = nn.Linear(2, 2)\n'
    assert edit(source, "cudnn_benchmark").startswith(
        '"""Doc."""\nimport torch\nfrom torch import nn  # here\ntorch.backends.cudnn.benchmark = True\n')
    flipped = edit("import torch\ntorch.backends.cudnn.benchmark = False  # here\n", "cudnn_benchmark")
    assert flipped == "import torch\ntorch.backends.cudnn.benchmark = True  # here\n"


def test_a_dynamo_flag_after_the_imports_or_its_own_assignment_changed():
    source = "import torch\nfrom torch import nn  # here\n\nmodel = torch.compile(nn.Linear(2, 2))\n"
    assert changed(source, edit(source, "dynamo_config", name="capture_scalar_outputs", value=True)) == [
        "torch._dynamo.config.capture_scalar_outputs = True"]
    assert edit(source, "dynamo_config", name="capture_scalar_outputs", value=True).index("capture") < \
        edit(source, "dynamo_config", name="capture_scalar_outputs", value=True).index("model =")
    own = "import torch as th\nth._dynamo.config.capture_scalar_outputs = False  # here\n"
    assert edit(own, "dynamo_config", name="capture_scalar_outputs", value=True) == \
        "import torch as th\nth._dynamo.config.capture_scalar_outputs = True  # here\n"
    with pytest.raises(ByHand, match="already set to True"):
        edit(own.replace("False", "True"), "dynamo_config", name="capture_scalar_outputs", value=True)


def test_compile_keywords_at_the_compile_call():
    source = "import torch\ncompiled = torch.compile(model, mode='max-autotune')  # here\n"
    assert changed(source, edit(source, "compile", keywords={"dynamic": True})) == [
        "compiled = torch.compile(model, mode='max-autotune', dynamic=True)  # here"]
    method = "model.compile()  # here\n"
    assert changed(method, edit(method, "compile", keywords={"dynamic": True})) == [
        "model.compile(dynamic=True)  # here"]
    with pytest.raises(ByHand, match="no torch.compile"):
        edit("model = build()  # here\n", "compile", keywords={"dynamic": True})
    # A function compiled by a decorator (airbench's and nanochat's Muon steps): bare, and called.
    bare = "import torch\n@torch.compile  # here\ndef step(G):\n    return G @ G.T\n"
    assert changed(bare, edit(bare, "compile", keywords={"dynamic": True})) == [
        "@torch.compile(dynamic=True)  # here"]
    called = "import torch\n@torch.compile(dynamic=False, fullgraph=True)  # here\ndef step(G):\n    return G\n"
    assert changed(called, edit(called, "compile", keywords={"dynamic": True})) == [
        "@torch.compile(dynamic=True, fullgraph=True)  # here"]


LOOP = """
    EVERY = 5
    for step in range(100):
        train()
        if (step + 1) % {divisor} == 0:
            validate()  # here
"""


def test_cadence_in_the_test_or_in_the_constant_it_names():
    params = dict(every=5, new_every=50, function="validate", kind="validation")
    assert "if (step + 1) % 50 == 0:" in edit(LOOP.format(divisor=5), "cadence", **params)
    assert "EVERY = 50\n" in edit(LOOP.format(divisor="EVERY"), "cadence", **params)
    with pytest.raises(ByHand, match="args.every"):
        edit(LOOP.format(divisor="args.every"), "cadence", **params)


def test_a_per_step_save_goes_under_the_loop_counter():
    source = """
        for i, batch in enumerate(loader):
            step(batch)
            torch.save(model.state_dict(), "last.pt")  # here
    """
    assert changed(source, edit(source, "save_every", every=25)) == [
        "if (i + 1) % 25 == 0:", 'torch.save(model.state_dict(), "last.pt")  # here']
    with pytest.raises(ByHand, match="counter"):
        edit("while True:\n    torch.save(m, 'p')  # here\n", "save_every", every=25)


def test_a_save_only_rank_0_does_keeps_its_rank_test_and_gets_the_cadence_inside():
    source = """
        for step in range(steps):
            train(step)
            if rank == 0:
                torch.save(model.state_dict(), "last.pt")  # here
    """
    new = edit(source, "save_every", every=13)
    assert "    if rank == 0:\n        if (step + 1) % 13 == 0:\n            torch.save(" in new, new
    assert "if (step + 1) % 13 == 0:" in edit(source.replace("rank == 0", "dist.get_rank() == 0"), "save_every",
                                              every=13)
    # A cadence under any other condition would drop saves the script means to make (the best model's).
    for condition in ("step % 10 == 0", "val_loss < best", "is_best"):
        with pytest.raises(ByHand, match="already under a condition"):
            edit(source.replace("rank == 0", condition), "save_every", every=13)


def test_work_only_rank_0_does_every_step_gets_a_cadence_around_its_call():
    """The straggler's evaluation, run every step under ``if rank == 0:``: the statement that calls it goes under
    the loop counter's test (the --fix of a job what-if that made that ``if`` rarer)."""
    source = """
        for step in range(steps):
            train(step)
            if rank == 0:
                print(step, float(evaluate()))  # here
    """
    assert changed(source, edit(source, "save_every", every=7, call="evaluate")) == [
        "if (step + 1) % 7 == 0:", "print(step, float(evaluate()))  # here"]
    with pytest.raises(ByHand, match=r"no validate\(...\) call"):
        edit(source, "save_every", every=7, call="validate")


def test_a_loop_without_a_step_counter_gets_no_cadence():
    """``for batch in loader:`` names a batch, not a number: ``(batch + 1) % N`` would break the script."""
    with pytest.raises(ByHand, match="counter"):
        edit("for batch in loader:\n    torch.save(m, 'p')  # here\n", "save_every", every=25)
    assert "if (step + 1) % 25 == 0:" in edit("for step in range(n):\n    torch.save(m, 'p')  # here\n",
                                              "save_every", every=25)
    # A counter's name over the script's own step generator still counts.
    assert "if (global_step + 1) % 25 == 0:" in edit(
        "for global_step in timed_steps(n):\n    torch.save(m, 'p')  # here\n", "save_every", every=25)


ATTENTION = """
    import math
    import torch

    def attend(q, k, v, mask):
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        weights = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)  # here
        {extra}return weights @ v
"""


def test_attention_with_a_mask_of_its_own_keeps_it():
    new = edit(ATTENTION.format(extra=""), "sdpa")
    assert "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, " \
           "attn_mask=mask.logical_not())\n" in new
    assert "softmax" not in new and "scores" not in new


@pytest.mark.parametrize("extra, why", [
    ("weights = dropout(weights)\n        ", "not a softmax's output"),
    ("log(weights)\n        ", "used elsewhere"),
])
def test_attention_that_cannot_be_rewritten_safely_is_by_hand(extra, why):
    with pytest.raises(ByHand, match=why):
        edit(ATTENTION.format(extra=extra), "sdpa")


MINGPT_ATTENTION = """
    import math
    import torch.nn as nn
    from torch.nn import functional as F

    class SelfAttention(nn.Module):
        def forward(self, q, k, v):
            T = q.size(-2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)  # here
            {dropout}
            y = att @ v
            return self.resid_dropout(self.proj(y))
"""


@pytest.mark.parametrize("dropout, argument", [
    ("att = self.attn_dropout(att)", "dropout_p=self.attn_dropout.p if self.attn_dropout.training else 0.0"),
    ("att = F.dropout(att, 0.1, self.training)", "dropout_p=0.1 if self.training else 0.0"),
    ("att = F.dropout(att, p=self.p)", "dropout_p=self.p"),
])
def test_dropout_on_the_weights_becomes_sdpas_dropout_p(dropout, argument):
    # minGPT's attention: a mask read off a buffer by comparison, and dropout on the weights (a module or F's).
    new = edit(MINGPT_ATTENTION.format(dropout=dropout), "sdpa")
    assert changed(MINGPT_ATTENTION.format(dropout=dropout), new) == [
        "y = F.scaled_dot_product_attention(q, k, v, attn_mask=(self.bias[:, :, :T, :T] == 0).logical_not(), "
        f"{argument}, scale=(1.0 / math.sqrt(k.size(-1))))"], new
    assert not [line for line in new.splitlines() if line.strip().startswith("att")], new  # the old lines gone


def test_the_comments_above_the_attention_s_lines_stay_above_the_call():
    source = """
    import math
    import torch

    def attend(q, k, v):
        q = q * 2

        # scaled dot-product attention, written out
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        # over the keys
        weights = scores.softmax(dim=-1)  # here
        out = weights @ v  # (B, T, C)
        return out
"""
    new = edit(source, "sdpa")
    assert "    q = q * 2\n\n    # scaled dot-product attention, written out\n    # over the keys\n" \
           "    out = torch.nn.functional.scaled_dot_product_attention(q, k, v)  # (B, T, C)\n" in new, new


CAUSAL_BUFFER = """
    import math
    import torch
    import torch.nn as nn
    from torch.nn import functional as F

    class SelfAttention(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.register_buffer("bias", {made})

        def forward(self, q, k, v):
            T = q.size(-2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill({mask}, float("-inf"))
            att = F.softmax(att, dim=-1)  # here
            return att @ v
"""


@pytest.mark.parametrize("made, mask", [
    ("torch.tril(torch.ones(n, n)).view(1, 1, n, n)", "self.bias[:, :, :T, :T] == 0"),  # nanoGPT, minGPT, makemore
    ("torch.ones(n, n).tril()", "self.bias[:T, :T] == 0"),
    ("torch.triu(torch.ones(n, n), diagonal=1)", "self.bias.bool()[:T, :T]"),  # LLMs-from-scratch's buffer
])
def test_a_causal_buffer_s_corner_becomes_is_causal(tmp_path, made, mask):
    """The lower-triangular buffer read off ``== 0`` (or the strictly upper one read as it is) hides each query's
    later keys: SDPA's is_causal=True, which lets a flash kernel run where an explicit mask does not."""
    source = CAUSAL_BUFFER.format(made=made, mask=mask)
    new = edit(source, "sdpa")
    assert changed(source, new) == [
        "return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=(1.0 / math.sqrt(k.size(-1))))"]
    # The same attention, run: 5 queries of a buffer made for 8.
    _computes_the_same(tmp_path, source, new, "SelfAttention")


@pytest.mark.parametrize("made, mask", [
    ("torch.tril(torch.ones(n, n)).view(1, 1, n, n)", "self.bias[:, :, :T, :S] == 0"),  # not the same length
    ("torch.tril(torch.ones(n, n)).view(1, 1, n, n)", "self.bias[:, :, 1:T, :T] == 0"),  # not from the corner
    ("torch.tril(torch.ones(n, n)).view(1, 1, n, n)", "self.bias[:, :, :T, :T] == 1"),  # the keys before, hidden
    ("torch.tril(torch.ones(n, n), -1)", "self.bias[:T, :T] == 0"),  # the diagonal hidden too
    ("torch.triu(torch.ones(n, n), diagonal=1)", "self.bias[:T, :T] == 0"),  # the lower triangle hidden
    ("torch.tril(torch.ones(n, m))", "self.bias[:T, :T] == 0"),  # not square
    ("mask", "self.bias[:T, :T] == 0"),  # made elsewhere
])
def test_any_other_buffer_mask_stays_a_mask(made, mask):
    source = CAUSAL_BUFFER.format(made=made, mask=mask)
    new = edit(source, "sdpa")
    assert "is_causal" not in new and ".logical_not()" in new, new


def test_another_class_s_attribute_of_the_same_name_is_another_attribute():
    """nanoGPT's LayerNorm sets ``self.bias = nn.Parameter(...)``; its attention's ``bias`` buffer is still causal."""
    source = CAUSAL_BUFFER.format(made="torch.tril(torch.ones(n, n))", mask="self.bias[:T, :T] == 0")
    source += "\n    class LayerNorm(nn.Module):\n        def __init__(self, n):\n"
    source += "            self.bias = nn.Parameter(torch.zeros(n))\n"
    assert "is_causal=True" in edit(source, "sdpa")


def test_a_buffer_name_made_two_ways_in_its_class_stays_a_mask():
    """The class sets ``self.bias`` elsewhere too (not causal): which one the forward reads is not known."""
    source = CAUSAL_BUFFER.format(made="torch.tril(torch.ones(n, n))", mask="self.bias[:T, :T] == 0")
    source = source.replace("        def forward(self, q, k, v):", "        def reset(self, n):\n"
                            "            self.bias = torch.ones(n, n)\n\n        def forward(self, q, k, v):")
    assert "is_causal" not in edit(source, "sdpa")


RASBT_ATTENTION = """
    import torch
    import torch.nn as nn

    class MultiHeadAttention(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.dropout = nn.Dropout(0.0)
            self.register_buffer("mask", torch.triu(torch.ones(n, n), diagonal=1))

        def forward(self, queries, keys, values):
            num_tokens = queries.shape[2]
            attn_scores = queries @ keys.transpose(2, 3)  # Dot product for each head
            mask_bool = self.mask.bool()[:num_tokens, :num_tokens]
            attn_scores.masked_fill_(mask_bool, -torch.inf)
            attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)  # here
            attn_weights = self.dropout(attn_weights)
            return (attn_weights @ values).transpose(1, 2)
"""


def test_scores_masked_in_place_over_4d_heads_become_one_call(tmp_path):
    """LLMs-from-scratch's attention: keys transposed as (2, 3), which the run saw 4-d, and the mask filled in place
    from its triu buffer's corner: one SDPA call, causal, its dropout and its scale kept, and the same outputs."""
    new = edit(RASBT_ATTENTION, "sdpa", ndim=4, dropout_modules=["dropout"])
    assert changed(RASBT_ATTENTION, new) == [
        "return torch.nn.functional.scaled_dot_product_attention(queries, keys, values, is_causal=True, "
        "dropout_p=self.dropout.p if self.dropout.training else 0.0, scale=1 / keys.shape[-1]**0.5)"
        ".transpose(1, 2)"], new
    assert "attn_scores" not in new and "mask_bool" not in new and "num_tokens = queries.shape[2]" in new
    _computes_the_same(tmp_path, RASBT_ATTENTION, new, "MultiHeadAttention")
    # Without the run's shapes, (2, 3) is not known to be the last two dimensions.
    with pytest.raises(ByHand, match=r"last two dimensions \(-2, -1\)"):
        edit(RASBT_ATTENTION, "sdpa", dropout_modules=["dropout"])


SCORES_FILL = "attn_scores.masked_fill_(mask_bool, -torch.inf)"


@pytest.mark.parametrize("changes, why", [
    ([(SCORES_FILL, "pass"), ("attn_weights = self.dropout(attn_weights)", SCORES_FILL.replace("scores", "weights"))],
     "filled in place after the softmax"),
    ([("mask_bool = self.mask", f"{SCORES_FILL}\n            mask_bool = self.mask")], "masked more than once"),
    ([("-torch.inf)", "0.0)")], "something else than -inf"),
])
def test_in_place_fills_the_edit_cannot_take_are_by_hand(changes, why):
    source = RASBT_ATTENTION
    for change in changes:
        source = source.replace(*change)
    with pytest.raises(ByHand, match=why):
        edit(source, "sdpa", ndim=4, dropout_modules=["dropout"])


def test_a_dropout_modules_kind_is_read_from_the_model_and_a_compound_p_stays_one_operand():
    source = MINGPT_ATTENTION.format(dropout="att = self.attn_dropout(att)")
    # The captured model's dropout modules, by attribute name: the call is taken for dropout by what it is.
    assert "dropout_p=self.attn_dropout.p if self.attn_dropout.training" in edit(
        source, "sdpa", dropout_modules=["attn_dropout", "resid_dropout"])
    with pytest.raises(ByHand, match="`attn_dropout` is not one of the model's nn.Dropout modules"):
        edit(source, "sdpa", dropout_modules=["resid_dropout"])  # named so, but some other module: its .p would fail
    either = MINGPT_ATTENTION.format(dropout="att = F.dropout(att, self.p or 0.1, self.training)")
    assert "dropout_p=(self.p or 0.1) if self.training else 0.0" in edit(either, "sdpa")
    # An argument over two lines stays valid inside the parentheses it gets.
    split = MINGPT_ATTENTION.format(dropout="att = F.dropout(att, 0.1, self.training and\n"
                                            "                                    not self.frozen)")
    assert "dropout_p=0.1 if (self.training and" in edit(split, "sdpa")


def test_the_attention_edit_names_the_captured_models_dropout_modules():
    from types import SimpleNamespace

    import torch.nn as nn

    from turbotrain.doctor.findings import Finding, Fix
    from turbotrain.doctor.rules.step.manual_attention import AttentionEvidence
    from turbotrain.doctor.rules.step.manual_attention import edit as attention_edit
    from turbotrain.doctor.sites import Site

    block = nn.Module()
    block.attn_dropout, block.drop_path, block.proj = nn.Dropout(0.1), nn.Identity(), nn.Linear(2, 2)
    model = nn.Sequential(block, nn.Dropout2d())
    finding = Finding("manual-attention", site=Site("/u/m.py", 9, "f"), message="", fix=Fix(""),
                      evidence=AttentionEvidence("forward", 1.0, dropout=True))
    spec = attention_edit(SimpleNamespace(capture=SimpleNamespace(module=model)), finding)
    assert spec.params == {"dropout_modules": ["1", "attn_dropout"]}
    assert attention_edit(SimpleNamespace(capture=None), finding).params == {}


def test_dropout_somewhere_else_is_not_taken_for_the_weights():
    # A dropout of the scores (before the softmax) is not SDPA's: by hand.
    softmax = "att = F.softmax(att, dim=-1)  # here"
    source = MINGPT_ATTENTION.format(dropout="").replace(softmax, f"att = self.drop(att)\n            {softmax}")
    with pytest.raises(ByHand, match="the scores are not q @ k"):
        edit(source, "sdpa")


def test_a_file_that_does_not_parse_is_by_hand():
    request = EditRequest(rule="r", kind="loader", file="t.py", line=1, where="t.py:1", label="")
    with pytest.raises(ByHand, match="does not parse"):
        apply_edit("loader = DataLoader(ds,\n", request, "t.py")


def test_fsdp_keyword_goes_into_every_fully_shard_call_that_leaves_it_to_fsdp():
    source = """
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)  # here
        fully_shard(model.head, reshard_after_forward=True)  # the script's own choice stays
        torch.distributed.fsdp.fully_shard(model, mesh=mesh)
    """
    new = edit(source, "fsdp", keywords={"reshard_after_forward": False})
    assert changed(source, new) == ["fully_shard(block, reshard_after_forward=False)  # here",
                                    "torch.distributed.fsdp.fully_shard(model, mesh=mesh, reshard_after_forward=False)"]
    with pytest.raises(ByHand, match="no fully_shard"):
        edit("x = 1  # here\n", "fsdp", keywords={"reshard_after_forward": False})
    # The older FSDP's equivalent needs an import: named, left to the user.
    with pytest.raises(ByHand, match="sharding_strategy=ShardingStrategy.SHARD_GRAD_OP"):
        edit("model = FSDP(net)  # here\n", "fsdp", keywords={"reshard_after_forward": False})


def test_ddp_keywords_reach_the_call_by_whatever_name_it_was_imported_as():
    """``static_graph`` timed with ``find_unused_parameters=False``: the literal True becomes False in place."""
    source = """
        from torch.nn.parallel import DistributedDataParallel as TorchDDP
        model = TorchDDP(net, find_unused_parameters=True)  # here
    """
    new = edit(source, "ddp", keywords={"static_graph": True, "find_unused_parameters": False})
    assert changed(source, new) == ["model = TorchDDP(net, find_unused_parameters=False, static_graph=True)  # here"]


@pytest.mark.parametrize("line, fixed", [
    ("losses.append(loss)  # here", "losses.append(loss.detach())  # here"),
    ("self.losses.append(loss)  # here", "self.losses.append(loss.detach())  # here"),
    ("losses.insert(0, loss * 2)  # here", "losses.insert(0, (loss * 2).detach())  # here"),
    ("losses += loss + aux  # here", "losses += (loss + aux).detach()  # here"),
])
def test_what_a_loop_keeps_is_detached_at_the_line_and_holder_it_grew(line, fixed):
    source = f"for x in batches:\n    loss = model(x).sum()\n    {line}\n    other.append(loss)\n"
    new = edit(source, "detach", holder="losses")
    assert changed(source, new) == [fixed]


@pytest.mark.parametrize("line, why", [
    ("losses.append(loss.item())  # here", "already keeps a value without a graph"),
    ("history.append(loss)  # here", "no losses.append(...)"),
    ("losses.extend([a, b])  # here", "no losses.append(...)"),
])
def test_a_kept_value_without_a_graph_or_another_holder_is_by_hand(line, why):
    with pytest.raises(ByHand, match=re.escape(why)):
        edit(f"for x in batches:\n    {line}\n", "detach", holder="losses")



BLOCKS = """
    import torch as T
    class Net(T.nn.Module):
        def forward(self, x):
            x = self.stem(x)
            x = self.wide(x, scale=2)
            for block in self.blocks:
                x = block(x)
            for layer in self.transformer.h:
                x = layer(x)
            x = self.transformer.h[1](x)
            return self.blocks[0](x)
"""


@pytest.mark.parametrize("blocks, line, fixed", [
    (["wide"], "self.wide(", "x = T.utils.checkpoint.checkpoint(self.wide, x, scale=2, use_reentrant=False)"),
    (["blocks.0", "blocks.1"], "block(x)", "x = T.utils.checkpoint.checkpoint(block, x, use_reentrant=False)"),
    (["blocks.0"], "return", "return T.utils.checkpoint.checkpoint(self.blocks[0], x, use_reentrant=False)"),
    # nanoGPT: the model's forward calls transformer.h's blocks (its ModuleDict never runs a forward of its own)
    ([f"transformer.h.{i}" for i in range(4)], "layer(x)",
     "x = T.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)"),
    (["transformer.h.1"], "h[1]", "x = T.utils.checkpoint.checkpoint(self.transformer.h[1], x, use_reentrant=False)"),
])
def test_a_block_is_recomputed_where_its_parent_calls_it(blocks, line, fixed):
    """The block's call, found by how the parent's forward names it (an attribute, the variable of a loop over a
    list, an index into it), wrapped in torch.utils.checkpoint under the file's own name for torch."""
    assert changed(BLOCKS, edit(BLOCKS, "checkpoint", line, blocks=blocks)) == [fixed]


@pytest.mark.parametrize("source, blocks, why", [
    ("from torch import nn\nclass N(nn.Module):\n    def forward(self, x):\n        return self.wide(x)  # here\n",
     ["wide"], "does not `import torch`"),
    (BLOCKS.replace("self.stem(x)", "self.stem(x)  # here"), ["blocks.0"], "no call of blocks.0 starts"),
    ("import torch\nclass N(torch.nn.Module):\n    def forward(self, *a):\n        return self.wide(*a)  # here\n",
     ["wide"], "arguments built at run time"),
])
def test_a_block_call_it_cannot_find_or_wrap_safely_is_by_hand(source, blocks, why):
    with pytest.raises(ByHand, match=re.escape(why)):
        edit(source, "checkpoint", blocks=blocks)


MICRO = """
    import torch
    for step, (x, y) in enumerate(loader):
        x = x.to(device)
        out = model(x)  # here
        loss = loss_fn(out, y) + 0 * self.x.sum()
        print(step)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_micro_batches_run_the_forward_through_the_backward_per_chunk_with_zero_grad_moved_before():
    new = edit(MICRO, "micro_batches", k=4)
    assert new.splitlines()[3:12] == [
        "    x = x.to(device)",
        "    opt.zero_grad()",
        "    # 4 micro-batches: their gradients add up to the whole batch's",
        "    for x_micro, y_micro in zip(x.chunk(4), y.chunk(4)):",
        "        out = model(x_micro)  # here",
        "        loss = loss_fn(out, y_micro) + 0 * self.x.sum()",  # an attribute named like the batch is kept
        "        print(step)",  # passed to a call, but neither to the forward nor to the loss: not chunked
        "        (loss / 4).backward()",
        "    opt.step()",
    ]
    # Sequence-first inputs are split along their batch dimension; `step` (not passed to a call) is not chunked.
    assert "for x_micro, y_micro in zip(x.chunk(2, dim=1), y.chunk(2, dim=1)):" in edit(MICRO, "micro_batches", k=2,
                                                                                        dim=1)


def test_micro_batches_give_the_whole_batchs_gradients():
    """The edited loop's gradients equal the original's for a mean loss (each backward of loss / k)."""
    import torch

    source = """
        import torch
        for step in range(1):
            x, y = batch
            loss = torch.nn.functional.mse_loss(model(x), y)  # here
            opt.zero_grad()
            loss.backward()
    """
    grads = []
    for code in (textwrap.dedent(source), edit(source, "micro_batches", k=4)):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 3)
        scope = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
                 "batch": (torch.randn(32, 8), torch.randn(32, 3))}
        exec(compile(code, "train.py", "exec"), scope)  # noqa: S102 - the edited loop, run
        grads.append([p.grad.clone() for p in model.parameters()])
    for whole, parts in zip(*grads):
        torch.testing.assert_close(parts, whole)


@pytest.mark.parametrize("source, why", [
    ("for x, y in d:\n    loss_fn(model(x), y).backward()  # here\n", "not a statement of its own"),
    ("for x, y in d:\n    loss = loss_fn(model(x), y)  # here\n    scaler.scale(loss).backward()\n",
     "not `loss.backward()` on a name"),
    ("def step(x, y):\n    loss = loss_fn(model(x), y)  # here\n    loss.backward()\n", "not directly inside"),
    ("for x, y in d:\n    x_micro = 1\n    loss = loss_fn(model(x), y)  # here\n    loss.backward()\n", "is taken"),
    ("for _ in d:\n    loss = loss_fn(model(X), Y)  # here\n    loss.backward()\n", "no batch made in the loop"),
])
def test_micro_batches_that_cannot_be_made_safely_are_by_hand(source, why):
    with pytest.raises(ByHand, match=re.escape(why)):
        edit(source, "micro_batches", k=2)


def test_a_loop_that_already_accumulates_is_told_to_take_more_micro_steps():
    # nanoGPT's loop: the forward under a `with ctx:` in `for micro_step in range(gradient_accumulation_steps)`, the
    # optimizer stepping after it.
    source = """
        while True:
            for micro_step in range(gradient_accumulation_steps):
                with ctx:
                    logits, loss = model(X, Y)  # here
                    loss = loss / gradient_accumulation_steps
                X, Y = get_batch("train")
                scaler.scale(loss).backward()
            scaler.step(optimizer)
    """
    with pytest.raises(ByHand, match=re.escape("range(gradient_accumulation_steps)`, train.py:3): give it 4 times the "
                                               "micro-steps (gradient_accumulation_steps x 4)")):
        edit(source, "micro_batches", k=4)
    stepping = source.replace("scaler.step(optimizer)", "pass").replace("scaler.scale(loss).backward()",
                                                                         "loss.backward(); optimizer.step()")
    with pytest.raises(ByHand, match="not directly inside"):  # a loop that steps each time is no accumulation
        edit(stepping, "micro_batches", k=4)
    # modded-nanogpt's: `for i in range(1, train_accumulation_steps+1):`, the forward under `with ctx:`.
    counted = source.replace("range(gradient_accumulation_steps)", "range(1, train_accumulation_steps+1)")
    with pytest.raises(ByHand, match=re.escape("range(1, train_accumulation_steps+1)`, train.py:3): give it 4 times "
                                               "the micro-steps of batches 4 times smaller")):
        edit(counted, "micro_batches", k=4)


COMPILED_LOSS = """
    import torch
    import torch.nn.functional as F
    compiled = torch.compile(model, backend="aot_eager")
    def step_loss(x, y):
        # the loss, eager, on the compiled model's output
        return F.cross_entropy(compiled(x), y, label_smoothing=0.1)  # here
    for x, y in batches:
        step_loss(x, y).backward()
"""


def test_a_loss_on_a_compiled_model_is_compiled_with_it_in_a_function_defined_before_its_statement():
    new = edit(COMPILED_LOSS, "compile_loss", loss="cross_entropy", compile='backend="aot_eager"')
    assert changed(COMPILED_LOSS, new) == [
        '@torch.compile(backend="aot_eager")',
        "def model_and_loss(compiled, x, y):",
        '"""cross_entropy compiled with the model it is computed on, as one graph (turbotrain doctor: '
        'compile-loss-eager)."""',
        "return F.cross_entropy(compiled(x), y, label_smoothing=0.1)",  # the names it reads are its parameters
        "return model_and_loss(compiled, x, y)  # here",
    ]
    lines = new.splitlines()
    assert lines.index("def step_loss(x, y):") > lines.index("def model_and_loss(compiled, x, y):")
    # A method's call reads ``self``: passed as it is; a name the file already has gets a number.
    method = "import torch\nmodel_and_loss = 1\nclass M:\n    def loss(self, x):\n" \
             "        return torch.nn.functional.mse_loss(self.net(x), self.target)  # here\n"
    assert "        return model_and_loss1(self, x)  # here" in edit(method, "compile_loss", loss="mse_loss")


@pytest.mark.parametrize("line, why", [
    ("return F.cross_entropy(compiled(*batch), y)  # here", "arguments built at run time"),
    ("return F.cross_entropy(compiled(x), y)  # here", "does not `import torch`"),
])
def test_a_loss_call_it_cannot_move_safely_is_by_hand(line, why):
    source = ("" if "import" in why else "import torch\n") + "import torch.nn.functional as F\n"
    with pytest.raises(ByHand, match=re.escape(why)):
        edit(source + f"def f(x, y, batch):\n    {line}\n", "compile_loss", loss="cross_entropy")


SPAWNED = """
    import torch as th
    import torch.multiprocessing as mp


    def train(rank, world):  # here
        {docstring}model = th.nn.Linear(4, 1)
        return model


    mp.spawn(train, args=(2,), nprocs=2)
"""


@pytest.mark.parametrize("docstring", ["", '"""One rank."""\n        '], ids=["plain", "docstring"])
def test_threads_go_first_in_the_function_spawned_ranks_run_where_the_script_sets_none(docstring):
    source = SPAWNED.replace("{docstring}", docstring)
    new = edit(source, "threads", threads=1)
    body = [line.strip() for line in new.splitlines() if line.startswith("    ")]
    assert body == [*(['"""One rank."""'] if docstring else []), "th.set_num_threads(1)", "model = th.nn.Linear(4, 1)",
                    "return model"], new


def test_threads_edit_the_scripts_own_call_where_it_has_one():
    source = """
        import torch
        torch.set_num_threads(4)  # here
    """
    assert changed(source, edit(source, "threads", threads=1)) == ["torch.set_num_threads(1)  # here"]


def test_keywords_added_to_a_call_laid_out_one_per_line_without_a_trailing_comma_keep_the_layout():
    source = """
        loader = DataLoader(  # here
            dataset,
            sampler=DistributedSampler(dataset)
        )
    """
    new = edit(source, "loader", num_workers=2, persistent_workers=True)
    assert new == textwrap.dedent("""
        loader = DataLoader(  # here
            dataset,
            sampler=DistributedSampler(dataset),
            num_workers=2,
            persistent_workers=True
        )
    """), new
