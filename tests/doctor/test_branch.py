"""The ``if`` of a training loop that runs a piece of work, found from the line the work was measured at: the
branch a job what-if makes rarer (record/rarer_branch.py) and ``--fix`` gives a longer period."""

from __future__ import annotations

import textwrap

import pytest

from turbotrain.doctor.analysis.branch import branch_running
from turbotrain.doctor.analysis.source import load_sources
from turbotrain.doctor.sites import Site

SCRIPT = """\
EVAL_EVERY = 4


def evaluate():
    return sum(net(x) for x in held_out)  # the measured line


for step in range(steps):
    train(step)
    if {test}:
        print(evaluate())
"""


def _branch(tmp_path, test: str, function: str = "<genexpr>", text: str = SCRIPT):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(text).format(test=test))
    return branch_running(load_sources([str(script)]), Site(str(script), 5, function))


@pytest.mark.parametrize("test, period", [
    ("rank == 0 and step % EVAL_EVERY == 0", 4),
    ("step % 10 == 0", 10),
    ("dist.get_rank() == 0", None),
    ("master_process and step % args.eval_every == 0", None),
])
def test_the_if_that_calls_the_work_is_found_with_its_period(tmp_path, test, period):
    """A generator expression's site is found through the function around it, called in the loop's ``if``."""
    branch = _branch(tmp_path, test)
    assert branch is not None, test
    assert (branch.site.line, branch.call, branch.call_line, branch.period) == (10, "evaluate", 11, period)


def test_an_if_on_anything_but_a_period_or_the_rank_is_not_made_rarer(tmp_path):
    """``if val_loss < best:`` runs because of what the data did: fewer passes would drop work the script means."""
    assert _branch(tmp_path, "val_loss < best") is None


def test_work_called_from_two_ifs_has_no_one_branch(tmp_path):
    twice = SCRIPT + "    if step == steps - 1:\n        evaluate()\n"
    assert _branch(tmp_path, "step % 10 == 0", text=twice) is None


def test_the_innermost_if_holding_the_work_is_the_branch(tmp_path):
    nested = SCRIPT.replace("    if {test}:\n        print(evaluate())\n",
                            "    if rank == 0:\n        log(step)\n        if step % 8 == 0:\n            evaluate()\n")
    branch = _branch(tmp_path, "", text=nested)
    assert branch is not None and (branch.site.line, branch.period) == (12, 8), branch


def test_work_whose_line_is_in_the_if_itself(tmp_path):
    inline = "for step in range(9):\n    if step % 3 == 0:\n        torch.save(model, 'x')\n"
    script = tmp_path / "train.py"
    script.write_text(inline)
    branch = branch_running(load_sources([str(script)]), Site(str(script), 3, "<module>"))
    assert branch is not None and (branch.site.line, branch.call, branch.call_line, branch.period) == (2, None, 3, 3)


def test_the_rarer_branch_timed_becomes_the_edit_of_its_period_or_of_its_call(tmp_path):
    """The straggler's fix timed as its ``if`` on one pass in N: the patch sets ``EVAL_EVERY`` N times longer, or,
    under a rank test alone, puts the call under the loop counter's test."""
    pytest.importorskip("libcst")
    from turbotrain.doctor.findings import Finding, Fix
    from turbotrain.doctor.fixes.choose import plan_fixes
    from turbotrain.doctor.fixes.table import apply_edit
    from turbotrain.doctor.rank_change import RankChange
    from turbotrain.doctor.requests import JobRequest
    from turbotrain.doctor.rules.job.straggler import BranchEvidence, StragglerEvidence

    def patched(test: str) -> str:
        script = tmp_path / "train.py"
        script.write_text(SCRIPT.format(test=test))
        branch = branch_running(load_sources([str(script)]), Site(str(script), 5, "<genexpr>"))
        assert branch is not None
        said = BranchEvidence(at=branch.site.where(), file=str(script), period=branch.period, new_period=20,
                              call=branch.call, call_line=branch.call_line)
        evidence = StragglerEvidence(rank=0, host="h", cause="outside_step", cost_ms=1.0, compared_with=1,
                                     periodic=True, gap_ms={}, branch=said)
        finding = Finding("straggler", message="m", fix=Fix("f"), site=Site(str(script), 5, "<genexpr>"),
                          request=JobRequest(RankChange(branch_every=5, branch_at=f"{script}:10")),
                          evidence=evidence)
        (result,) = plan_fixes(None, [finding], str(tmp_path))
        assert result.request is not None, result.by_hand
        return apply_edit(script.read_text(), result.request, script.name)

    assert patched("rank == 0 and step % EVAL_EVERY == 0").startswith("EVAL_EVERY = 20\n")
    assert "    if rank == 0:\n        if (step + 1) % 5 == 0:\n            print(evaluate())" in patched("rank == 0")
