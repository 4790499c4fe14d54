"""doctor --fix against the calibration corpus: the edit made on each slow script is its hand-written fixed twin.

benchmarks/calibration holds pairs that differ only by one rule's fix, written by hand; the edit the
doctor makes on ``<pair>_slow.py`` at the line the twins differ must give ``<pair>_fixed.py`` (two
pairs use an equivalent spelling, normalised below).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

pytest.importorskip("libcst", reason="doctor --fix needs libcst: pip install -e '.[fix]'")

from turbotrain.doctor.fixes.model import EditRequest
from turbotrain.doctor.fixes.table import apply_edit

CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "calibration"

# pair -> (edit kind, its values, the text of the line the finding names when not the first that differs)
PAIRS = {
    "amsgrad_foreach": ("optimizer", {"class": "AdamW", "switch": "fused"}, None),
    "wide_mlp_foreach": ("optimizer", {"class": "Adam", "switch": "fused"}, None),
    "attention": ("sdpa", {}, ".softmax("),
    "bf16_autocast": ("autocast", {"device": "cpu", "dtype": "bfloat16"}, None),
    "conv_bias_bn": ("conv_bias", {"classes": ["Conv2d"]}, None),
    "save_every_step": ("save_every", {"every": 50}, None),
    "loader_workers": ("loader", {"num_workers": 4, "persistent_workers": True}, None),
    "validate_often": ("cadence", {"every": 5, "new_every": 50, "function": "", "kind": "validation"}, "val_loss ="),
    "zero_grad": ("zero_grad", {}, None),
    "eval_grad": ("inference_mode", {}, None),
}
# Two twins spell the fix another, equivalent way.
SAME = {"eval_grad": ("torch.no_grad()", "torch.inference_mode()"),
        "zero_grad": ("opt.zero_grad()", "opt.zero_grad(set_to_none=True)")}


def _code(text: str) -> list[str]:
    """The lines that are code (the docstring's 'slow: ...; fixed: ...' line says which twin it is)."""
    return [line for line in text.splitlines() if not line.startswith("slow:")]


def _line(slow: list[str], fixed: list[str], marker: str | None) -> int:
    if marker is not None:
        return next(i for i, text in enumerate(slow, 1) if marker in text and "def " not in text)
    ops = difflib.SequenceMatcher(None, slow, fixed).get_opcodes()
    return next(i1 for tag, i1, i2, *_ in ops
                if tag != "equal" and not all(text.startswith("slow:") for text in slow[i1:i2])) + 1


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_the_edit_on_the_slow_twin_is_the_fixed_twin(pair):
    kind, params, marker = PAIRS[pair]
    slow_text = (CORPUS / f"{pair}_slow.py").read_text()
    fixed = _code((CORPUS / f"{pair}_fixed.py").read_text())
    line = _line(slow_text.splitlines(), (CORPUS / f"{pair}_fixed.py").read_text().splitlines(), marker)
    request = EditRequest(rule="r", kind=kind, file=str(CORPUS / f"{pair}_slow.py"), line=line,
                          where=f"{pair}_slow.py:{line}", label="", params=params)
    made = _code(apply_edit(slow_text, request, f"{pair}_slow.py"))
    if pair in SAME:
        spelled, ours = SAME[pair]
        fixed = [text.replace(spelled, ours) for text in fixed]
    assert made == fixed, "\n".join(difflib.unified_diff(fixed, made, "fixed twin", "edit", lineterm=""))
