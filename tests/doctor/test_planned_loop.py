"""The stepping loop's length, read from its frame where it is a ``for`` over ``range()``: what compile-pays-back
weighs compiling against when the doctor stops the run before it ends."""

from __future__ import annotations

import runpy
import sys
import textwrap
from types import SimpleNamespace

import pytest

from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.record.cadence import PlannedLoop, planned_loop
from turbotrain.doctor.sites import Site
from turbotrain.hardware import detect

pytestmark = pytest.mark.reads_no_time

LOOP = """
import argparse
args = argparse.Namespace(num_iterations=10, accum=2)
seen = []

def step():
    seen.append(planned_loop(sys._getframe(0)))

for it in {iterable}:
    {body}
"""


def _read(tmp_path, iterable: str, body: str = "step()") -> list:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(LOOP.format(iterable=iterable, body=body)))
    return runpy.run_path(str(script), init_globals={"planned_loop": planned_loop, "sys": sys})["seen"]


def test_a_range_with_bounds_from_argparse_is_read_with_its_counter(tmp_path):
    # llm.c: `for step in range(args.num_iterations + 1):`
    seen = _read(tmp_path, "range(args.num_iterations + 1)")
    assert len(seen) == 11 and all(s.iterations == 11 for s in seen)
    assert seen[0].code == "range(args.num_iterations + 1)" and seen[0].site.line == 9
    assert [s.counter for s in seen[:3]] == [0, 1, 2]
    stepped = _read(tmp_path, "range(2, 20, 3)")
    assert stepped[0].iterations == len(stepped) == len(range(2, 20, 3))
    # its counter moves 3 an iteration, one iteration a step
    assert _context([(1, stepped[0]), (4, stepped[3])]).planned_steps[0] == len(stepped)


def test_epochs_of_ranged_steps_multiply_and_a_loop_further_up_makes_it_unknown(tmp_path):
    nested = _read(tmp_path, "range(3)", "for i in range(args.num_iterations):\n        step()")
    assert len(nested) == 30 and nested[0].iterations == 30
    assert nested[0].code == "range(3) x range(args.num_iterations)"
    assert [s.counter for s in nested[9:12]] == [9, 0, 1]  # the innermost's: a window across epochs reads no rate
    # The stepping loop in a function called from a loop: it runs again each time, its length is not the run's.
    looped = _read(tmp_path, "range(2)", "def epoch():\n        for i in range(5):\n            step()\n    epoch()")
    assert looped and set(looped) == {None}


@pytest.mark.parametrize("iterable", ["[1, 2, 3]", "range(len([1, 2]))", "range(int(\"3\"))"])
def test_a_loop_whose_length_cannot_be_read_without_running_code_is_none(tmp_path, iterable):
    assert set(_read(tmp_path, iterable)) == {None}


def _context(readings) -> Context:
    return Context(script="train.py", base="/home/me", hw=detect("cpu"), device="cpu",
                   breakdown=compute_breakdown([], 1), measured_steps=[],
                   recording=SimpleNamespace(planned_loop=tuple(readings)))  # type: ignore[arg-type]  # a stand-in


def _at(counter: int) -> PlannedLoop:
    return PlannedLoop(Site("/home/me/train.py", 796, "<module>"), "range(args.num_iterations + 1)", 5001, counter)


def test_the_loops_steps_are_its_iterations_over_how_far_its_counter_moves_a_step():
    assert _context([(3, _at(3)), (23, _at(23))]).planned_steps[0] == 5001
    # `if (it + 1) % 2 == 0: opt.step()` in the loop: two iterations a step.
    assert _context([(3, _at(6)), (23, _at(46))]).planned_steps[0] == 2500
    assert _context([(3, _at(3))]).planned_steps is None  # read once: a step's iterations unknown
    assert _context([(3, _at(3)), (23, _at(33))]).planned_steps is None  # 1.5 a step: not a loop of steps


WHILE = """
import argparse
cfg = argparse.Namespace(max_iters=12)
iter_num = 3  # resumed from a checkpoint: the run is the iterations left
eval_only = False
seen = []

def step():
    seen.append(planned_loop(sys._getframe(0)))

{loop}
"""

NANOGPT = """
while True:
    if iter_num == 3 and eval_only:
        break
    for micro_step in range(2):
        pass
    step()
    iter_num += 1
    if iter_num > cfg.max_iters:
        break
"""


def _read_while(tmp_path, loop: str) -> list:
    script = tmp_path / "train.py"
    script.write_text(WHILE.format(loop=loop.strip()))
    return runpy.run_path(str(script), init_globals={"planned_loop": planned_loop, "sys": sys})["seen"]


@pytest.mark.parametrize("loop", [
    NANOGPT,
    NANOGPT.replace("iter_num > cfg.max_iters", "cfg.max_iters < iter_num"),
    "while iter_num <= cfg.max_iters:\n    step()\n    iter_num += 1",
    "while iter_num < cfg.max_iters + 1:\n    iter_num += 1\n    step()",
    NANOGPT.replace("iter_num += 1", "iter_num += 2"),
    NANOGPT.replace("iter_num == 3 and eval_only", "iter_num == 2"),  # a value the counter has passed
])
def test_a_while_its_counter_ends_runs_the_steps_its_readings_say(tmp_path, loop):
    """nanoGPT: ``while True:`` ... ``iter_num += 1`` ... ``if iter_num > max_iters: break``. The window reads the
    loop twice; the steps the run makes in all are read from either reading, whichever steps they came at."""
    seen = _read_while(tmp_path, loop)
    assert all(s is not None and s.left for s in seen), seen
    for start, end in [(1, 2), (2, 5), (1, len(seen))]:
        readings = [(start, seen[start - 1]), (end, seen[end - 1])]
        assert _context(readings).planned_steps[0] == len(seen), (loop, readings)
    assert seen[0].code in {"if iter_num > cfg.max_iters: break", "if cfg.max_iters < iter_num: break",
                            "while iter_num <= cfg.max_iters", "while iter_num < cfg.max_iters + 1"}


@pytest.mark.parametrize("loop", [
    NANOGPT.replace("eval_only:", "eval_only:\n        break\n    if iter_num == 7:"),  # two ways out
    NANOGPT.replace("== 3 and eval_only", "== 7 and not eval_only"),  # a flag that is on: it ends there
    NANOGPT.replace("    step()", "    step()\n    iter_num = iter_num"),  # set otherwise too
    NANOGPT.replace("iter_num += 1", "iter_num += len('a')"),  # a call: not read
    NANOGPT.replace("while True", "for epoch in range(1):\n  while True"),  # run again by a loop around it
])
def test_a_while_whose_end_is_not_its_counters_alone_has_no_length(tmp_path, loop):
    seen = _read_while(tmp_path, loop)
    assert seen and all(s is None for s in seen), seen


def test_a_break_inside_an_inner_loop_is_not_the_whiles_end(tmp_path):
    inner = ("while True:\n    step()\n    iter_num += 1\n    for i in range(2):\n"
             "        if iter_num > cfg.max_iters:\n            break\n    if iter_num > 20:\n        break")
    seen = _read_while(tmp_path, inner)
    assert len(seen) == 18 and seen[0].code == "if iter_num > 20: break"
    assert _context([(1, seen[0]), (2, seen[1])]).planned_steps[0] == 18


def test_a_while_whose_bound_moves_between_the_readings_has_no_length():
    moved = PlannedLoop(Site("/home/me/train.py", 333, "<module>"), "if iter_num > max_iters: break", 90, 10, left=True)
    first = PlannedLoop(Site("/home/me/train.py", 333, "<module>"), "if iter_num > max_iters: break", 100, 3, left=True)
    assert _context([(3, first), (10, moved)]).planned_steps is None
    assert _context([(3, first), (10, PlannedLoop(first.site, first.code, 93, 10, left=True))]).planned_steps[0] == 102


def test_a_hugging_face_trainers_run_is_its_max_steps_at_the_line_that_called_train(tmp_path):
    """The Trainer's loop is transformers' code; its ``state`` holds the run's length (``max_steps``) and the steps
    done (``global_step``). Read at each optimizer step, as the recorder reads it."""
    pytest.importorskip("transformers", reason="transformers is in the test extra: pip install -e '.[test]'")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            ids = torch.arange(8) % 16
            return {"input_ids": ids, "labels": ids}

    model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=4, report_to=[],
                             save_strategy="no", use_cpu=True, disable_tqdm=True, logging_strategy="no")
    seen = []
    from torch.optim.optimizer import register_optimizer_step_post_hook

    hook = register_optimizer_step_post_hook(
        lambda *_: seen.append(planned_loop(sys._getframe(0))))
    try:
        called_at = sys._getframe(0).f_lineno + 1  # the next line
        Trainer(model=model, args=args, train_dataset=Tokens()).train()
    finally:
        hook.remove()
    assert len(seen) == 6 and seen[0].code == "Trainer.state.max_steps"
    assert seen[0].site.line == called_at and seen[0].site.file == __file__
    for start, end in [(1, 2), (2, 6)]:
        assert _context([(start, seen[start - 1]), (end, seen[end - 1])]).planned_steps[0] == 6


@pytest.mark.parametrize("limits, steps", [(dict(max_epochs=2), 6), (dict(max_epochs=3, max_steps=4), 4)])
def test_a_lightning_trainers_run_is_its_epochs_of_stepping_batches_or_its_max_steps(tmp_path, limits, steps):
    """Five batches an epoch, accumulated two by two: three optimizer steps an epoch (the last on one batch)."""
    pytest.importorskip("lightning", reason="lightning is in the test extra: pip install -e '.[test]'")
    import lightning.pytorch as pl
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = pl.Trainer(accelerator="cpu", devices=1, accumulate_grad_batches=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path), **limits)
    seen = []
    hook = register_optimizer_step_post_hook(lambda *_: seen.append(planned_loop(sys._getframe(0))))
    try:
        called_at = sys._getframe(0).f_lineno + 1  # the next line
        trainer.fit(Module(), torch.utils.data.DataLoader(torch.randn(10, 4), batch_size=2))
    finally:
        hook.remove()
    assert len(seen) == steps and seen[0] is not None and seen[0].site.line == called_at
    assert seen[0].code == ("Trainer(max_steps=4)" if "max_steps" in limits else "Trainer(max_epochs=2)")
    for start, end in [(1, 2), (2, steps)]:
        assert _context([(start, seen[start - 1]), (end, seen[end - 1])]).planned_steps[0] == steps
