"""`periodic-work`: validation or checkpoints every N steps cost over 5% of training time, amortised over their period;
N beyond the window found by watching the step clock after it. Also work the script runs now and then before a
forward (a plot when an episode ends), at the line the gap sampler caught in it
(:mod:`~turbotrain.doctor.analysis.gap_work`): what it costs each time and of training, from the run itself.

Reads: run.
Edit: the `N` of the `if step % N == 0:` that runs the validation or checkpoint (or of the one top-level `N = 20` it
names), set to the cadence that keeps it under 5%; by hand for work the loop runs when it decides (no `% N`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...analysis.periodic import PERIODIC_TARGET_SHARE, SUGGESTED_SHARE, PeriodicRow, suggested_every
from ...edits import ByHand, EditSpec
from ...findings import Evidence, Finding, Fix
from ..common import ms
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class PeriodicEvidence(Evidence):
    every: int | None
    cost_ms: float  # each occurrence, over an ordinary step
    share: float | None  # of training time, amortised over its period
    steps: tuple[int, ...]  # the steps it ran in


def periodic_work(ctx: Context) -> Iterator[Finding]:
    for row in ctx.periodic_rows:
        share = row.share
        if share is None or share < PERIODIC_TARGET_SHARE or not row.every or row.every < 2:
            continue  # seen once (its period unknown), cheap enough, or every step's own cost: not periodic
        kind, every, better = row.kind, row.every, row.suggested_every
        if kind == "work between steps" and row.site is None:
            yield _unexplained_slow_steps(row)
            continue
        f = Finding(
            "periodic-work",
            site=row.site,
            category="outside_step",
            message=(
                f"{kind.capitalize()} every {every} steps costs {ms(row.cost_ms / 1e3)} each time: "
                f"{share:.0%} of training time."
            ),
            fix=Fix(
                f"run the {kind} every {better} steps (under {PERIODIC_TARGET_SHARE:.0%} of training time)"
                + (", and under torch.inference_mode()" if kind == "validation" else ""),
                lightning=f"Trainer(val_check_interval={better})" if kind == "validation" else None,
                hf_trainer=(
                    f"TrainingArguments(eval_strategy='steps', eval_steps={better})"
                    if kind == "validation"
                    else f"TrainingArguments(save_steps={better})"
                    if kind == "checkpoint"
                    else None
                ),
            ),
            evidence=_evidence(row),
        )
        # Moving to the suggested cadence saves all but its own (under 5%) share.
        saved = share * (1 - every / better) if better else 0.0
        f.set_gain(max(0.0, saved), measured=True)
        f.note = f"Measured over {len(row.steps)} occurrence(s); the numbers above spread it over its period."
        if row.note:  # found beyond the window: how; compiling left out of its cost (analysis/periodic.py)
            f.note = f"{f.note} {row.note}"
        yield f


def occasional(ctx: Context) -> Iterator[Finding]:
    """Work the script ran before the forward in a few measured steps only (analysis/gap_work.py)."""
    work = ctx.occasional_work
    if work is None or work.share < PERIODIC_TARGET_SHARE:
        return  # none, or cheap enough
    once = len(work.steps) == 1
    # How many times fewer it must run to cost under the target: its steps apart at that share, over now's.
    fewer = -(-suggested_every(work.cost_s, work.base_step_s, 1, SUGGESTED_SHARE) // max(1, round(work.every)))
    where = f" in {work.site.function}()" if work.site.function not in ("", "<module>") else ""
    how_often = (
        f"ran once in the {work.measured} measured steps (step {work.steps[0]}), {ms(work.cost_s)} over an ordinary "
        f"step: {work.share:.0%} of the measured time; how often the loop runs it, the window did not show"
        if once
        else f"ran in {len(work.steps)} of the {work.measured} measured steps (steps "
        f"{', '.join(str(i) for i in work.steps[:6])}), about once every {work.every:.0f} steps when the loop "
        f"decides, {ms(work.cost_s)} each time: {work.share:.0%} of training time"
    )
    f = Finding(
        "periodic-work",
        site=work.site,
        category="data_loading",
        message=(
            f"Work between steps at this line{where} {how_often}. It runs before the next forward, so the "
            "breakdown shows it as data loading; it builds no batch."
        ),
        fix=Fix(
            f"run it {fewer}x less often (once in {fewer} of the times the loop comes to it, e.g. plot every "
            f"{fewer} episodes), or once after training"
        ),
        evidence=PeriodicEvidence(
            every=round(work.every), cost_ms=round(work.cost_s * 1e3, 3), share=round(work.share, 4), steps=work.steps
        ),
    )
    if once:  # one occurrence is no rate: named, not priced
        f.set_gain(None, measured=False)
        f.cap("low", "Seen once in the window: what it costs over a run depends on how often the loop runs it.")
    else:
        f.set_gain(work.share * (1 - 1 / fewer), measured=True)
        f.note = (
            f"Measured over {len(work.steps)} occurrences in the measured steps (on a busy machine, less the time "
            "other processes held the CPU); the gain is the share it leaves when run that much less often."
        )
    yield f


def _evidence(row: PeriodicRow) -> PeriodicEvidence:
    """What the finding shows of the row."""
    return PeriodicEvidence(every=row.every, cost_ms=row.cost_ms, share=row.share, steps=tuple(row.steps))


def _unexplained_slow_steps(row: PeriodicRow) -> Finding:
    """Slow steps at a period with nothing of the script's own seen in them (no line, no validation, no save): on
    a shared machine, the scheduler's doing as often as the script's. Said, never rated above low, never timed."""
    f = Finding(
        "periodic-work",
        site=None,
        category="outside_step",
        message=(
            f"Steps {', '.join(str(i) for i in row.steps[:6])} ran {ms(row.cost_ms / 1e3)} over the ordinary "
            "step with no work of the script's own seen in them (no line, validation or checkpoint): other "
            "processes taking the CPU look the same."
        ),
        fix=Fix("nothing to change in the script unless it does work every few steps the doctor did not see"),
        evidence=_evidence(row),
    )
    f.set_gain(None, measured=False)
    f.cap("low", "No evidence of work: counted as noise, not as a cost of the script.")
    return f


def edit(ctx: Context, f: Finding) -> EditSpec:
    assert f.site is not None  # fixes.choose plans only findings with a site
    # The finding's own row: another recurring row can name the same line (its steps fell on the work's).
    own = f.evidence.every if isinstance(f.evidence, PeriodicEvidence) else None
    row = next((r for r in ctx.periodic_rows if r.site == f.site and r.every and own in (None, r.every)), None)
    if f.category == "data_loading":
        raise ByHand("the work runs when the loop decides (no `% N` to change): run it less often by hand")
    if row is None or not row.suggested_every:
        raise ByHand("the period of the recurring work is not known")
    every, better, kind = row.every, row.suggested_every, row.kind
    return EditSpec(
        "cadence",
        f"{kind} every {better} steps (was {every})",
        params={"every": every, "new_every": better, "kind": kind, "function": f.site.function},
    )


RULE = register(
    Rule("periodic-work", detect=(Detect("runtime", periodic_work), Detect("runtime", occasional)), edit=edit)
)
