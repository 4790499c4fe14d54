"""A multi-process job's ranks in the report: the JSON keys (``ranks``, ``straggler``, ``communication``), the
terminal's per-rank table (80 columns up to 8 ranks; above that, the median and worst ranks and a summary) and the
HTML's table and picture of the ranks' lanes (their steps side by side on a common clock, the waits visible).
"""

from __future__ import annotations

import html
import statistics
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from ..analysis.rank_compile import RankCompile
from ..analysis.ranks import WAITED_ON, LaneStep, RankAnalysis, RankCategory, RankSummary
from ..findings import speedup_from_share
from .figures import png_uri
from .palette import CATEGORY_LABELS, COLORS

if TYPE_CHECKING:
    from .model import Report

__all__ = ["ranks_json", "print_ranks", "ranks_html", "lane_ranks", "TABLE_MAX_RANKS", "RANK_COLUMNS", "LANE_STEPS"]

TABLE_MAX_RANKS = 8
# The picture draws this many measured steps (every step is in the JSON): enough to see who waits, each step wide.
LANE_STEPS = 10
# A step's parts are stacked in this order (what ran before the all-reduce, the wait for it, the optimizer after),
# not the order the rank ran them in; the wait stands out in a colour and hatch no phase has.
LANE_ORDER: tuple[RankCategory, ...] = (
    "outside_step",
    "data_loading",
    "host_to_device",
    "compute",
    "host_sync",
    "communication",
    "optimizer",
)
WAIT_STYLE: dict[str, Any] = {"facecolor": "#f8bbd9", "edgecolor": "#c2185b", "hatch": "///"}
WAIT_LABEL = "waiting for the others (exposed communication)"
# The per-rank table's legend for its comm column, short enough for 80 columns.
_COMM_SHORT = {
    "ddp": "the all-reduce after its backward",
    "fsdp": "FSDP's all-gather/reduce-scatter",
    "collectives": "its blocking collectives",
}
# (category, column header): host-to-device copies and host syncs share a column to fit 80 columns.
RANK_COLUMNS = (
    ("data_loading", "data"),
    ("compute", "compute"),
    ("optimizer", "optim"),
    ("outside_step", "outside"),
    ("other", "other"),
    ("communication", "comm"),
)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def _shares(summary: RankSummary) -> dict[RankCategory, float]:
    total = sum(summary.mean_s.values())
    return {k: round(v / total, 4) if total > 0 else 0.0 for k, v in summary.mean_s.items()}


def _lane(steps: tuple[LaneStep, ...]) -> list[dict[str, Any]]:
    return [
        {
            "step": s.step,
            "start": _ms(s.start_s),
            "end": _ms(s.end_s),
            "parts": {k: _ms(v) for k, v in s.parts_s.items()},
        }
        for s in steps
    ]


# DDP's reducer and the doctor's clock agree when their all-reduce times per step are within this factor.
REDUCER_AGREES = 2.0


def _reducer_check(r: RankSummary) -> dict[str, Any] | None:
    check = r.reducer_check()
    if check is None:
        return None
    ddp, timed, ratio = check
    return {
        "ddp_backward_comm_ms": _ms(ddp),
        "timed_comm_ms": _ms(timed),
        "ratio": round(ratio, 3),
        "agrees": _agrees(ratio),
    }


def reducer_disagreement(job: RankAnalysis) -> str | None:
    """A sentence for the report when a rank's DDP reducer and the doctor's clock disagree on its all-reduces."""
    off = [(r.rank, c) for r in job.ranks if (c := r.reducer_check()) is not None and not _agrees(c[2])]
    if not off:
        return None
    parts = "; ".join(
        f"rank {rank}: DDP {ddp * 1e3:.1f} ms, timed {timed * 1e3:.1f} ms" for rank, (ddp, timed, _) in off
    )
    return (
        f"DDP's reducer and the doctor's clock disagree on the all-reduce time per step ({parts}). DDP averages "
        "the iterations its logger sampled (10, 20, 50, ...), the doctor the measured window: a job whose "
        "communication changes over the run (warm-up, bucket rebuilds) reads differently in each."
    )


def _compile(c: RankCompile | None, base: str | None) -> dict[str, Any] | None:
    """A rank's torch.compile work in its measured steps (None: it compiled nothing)."""
    if c is None:
        return None
    return {
        "window_ms": _ms(c.window_s),  # compile time that started in the measured steps, recompiles included
        "recompile_ms": _ms(c.recompile_s),
        "recompiles": c.recompiles,  # in the measured steps
        "run_recompiles": c.run_recompiles,  # over the whole run
        "eager_after_limit": c.eager_in_window,  # hit the recompile limit by the window's end: ran eagerly
        "guard": c.guard or None,  # the first failed guard in the window (or the limit's last)
        "where": c.site.where(base) if c.site else None,
    }


def _agrees(ratio: float) -> bool:
    return 1 / REDUCER_AGREES <= ratio <= REDUCER_AGREES


def ranks_json(job: RankAnalysis, base: str | None = None) -> dict[str, Any]:
    """``ranks``, ``straggler`` and ``communication`` (docs/doctor.md, Reports)."""
    ranks = [
        {
            "rank": r.rank,
            "host": r.host,
            "steps_measured": r.steps,
            "step_time_ms": {"median": _ms(r.step_s), "p90": _ms(r.step_p90_s)},
            "breakdown": _shares(r),
            "breakdown_ms": {k: _ms(v) for k, v in r.median_s.items()},
            "p90_ms": {k: _ms(v) for k, v in r.p90_s.items()},
            "exposed_communication_ms": _ms(r.exposed_s),
            "collectives_per_step": r.collectives,
            "own_work_ms": _ms(r.busy_s),
            "cpu_ms": _ms(r.cpu_s) if r.cpu_s is not None else None,
            "cpu_wait_ms": _ms(r.cpu_wait_s) if r.cpu_wait_s is not None else None,
            # DDP's own reducer averages over the iterations its logger sampled, beside the doctor's wall clock.
            "ddp_reducer_ms": {
                k.removeprefix("avg_").removesuffix("_time"): _ms(v)
                for k, v in r.reducer.items()
                if k.endswith("_time")
            }
            or None,
            "reducer_check": _reducer_check(r),
            "clock_offset_ms": _ms(job.offsets_s[r.rank]) if r.rank in job.offsets_s else None,
            # Its measured steps on the ranks' common clock (ms from the earliest step's start), ms per phase.
            "lane_ms": _lane(job.lanes.get(r.rank, ())),
            "compile": _compile(r.compile, base),
        }
        for r in job.ranks
    ]
    straggler = None
    s = job.straggler
    if s is not None:
        straggler = {
            "rank": s.rank,
            "host": s.host,
            "cause": s.cause,
            "cost": {
                "ms_per_step": _ms(s.cost_s),
                "share": round(s.cost_share, 4),
                "est_speedup": round(speedup_from_share(s.cost_share), 3),
            },
            "compared_with": s.compared_with,
            "gap_ms": {k: _ms(v) for k, v in s.gap_s.items()},
            "last_share": round(s.last_share, 3),
            "periodic": s.periodic,  # late only in the steps it does its extra work, the cost averaged
            "where": s.site.where(base) if s.site else None,
            "cpu_wait_gap_ms": _ms(s.contention_s) if s.contention_s is not None else None,
            "cpu_gap_ms": _ms(s.cpu_gap_s) if s.cpu_gap_s is not None else None,
        }
    u = job.imbalance
    imbalance = None
    if u is not None:
        imbalance = {
            "cost": {
                "ms_per_step": _ms(u.cost_s),
                "share": round(u.cost_share, 4),
                "est_speedup": round(speedup_from_share(u.cost_share), 3),
            },
            "first_wait_ms": _ms(u.first_wait_s),
            "last_shares": {str(k): round(v, 3) for k, v in u.last_shares.items()},
            "cause": u.cause,
            "cause_gap_ms": _ms(u.cause_gap_s),
            "cpu_gap_ms": _ms(u.cpu_gap_s) if u.cpu_gap_s is not None else None,
            "larger_input_share": round(u.larger_input_share, 3),
            "compile_gap_ms": _ms(u.compile_gap_s),  # the last rank's compile time minus the first's, per step
            "evidenced": u.evidenced,  # uneven work shown, not turns that noise explains as well
        }
    return {
        "ranks": ranks,
        "straggler": straggler,
        "imbalance": imbalance,
        "communication": {
            "exposed_share": round(job.exposed_share, 4),
            "shared_wait_ms": _ms(job.shared_wait_s),  # the least any rank waited, per step (median)
            "overlap": round(job.overlap, 4) if job.overlap is not None else None,
            "median_rank": job.median_rank,
            "worst_rank": job.worst_rank,
            "skew": round(job.skew, 4),
            "kind": job.sync_kind,  # what the ranks wait on: "ddp", "fsdp" or "collectives"
            "aligned_on": "the completion of each step's last collective",
            "steps": len(job.steps),
        },
    }


def bottleneck_wait(report: Report) -> str:
    """On a job whose bar is compute-bound: how much of that compute is the lead rank's wait for the others."""
    b, job = report.breakdown, report.ranks
    if b is None or job is None or b.bottleneck != "compute" or not job.ranks:
        return ""
    lead = min(job.ranks, key=lambda r: r.rank)  # the bar is the lowest recorded rank's
    wait = lead.median_s.get("communication", 0.0) / lead.step_s if lead.step_s > 0 else 0.0
    return f", {wait:.0%} of it waiting for {job.waited_on}" if wait >= 0.05 else ""


def _cells(r: RankSummary) -> list[str]:
    m = r.median_s
    values: dict[str, float] = dict(m.items())  # the categories, and "other": two of them in one column
    values["other"] = m.get("host_to_device", 0.0) + m.get("host_sync", 0.0)
    return [f"{values[key] * 1e3:.1f}" for key, _ in RANK_COLUMNS]


def print_ranks(console: Console, job: RankAnalysis, width: int) -> None:
    """The per-rank table (ms per step, medians) and the straggler and communication lines."""
    console.print()
    console.print(Text(f"Ranks ({len(job.ranks)}), ms per step (medians)", style="bold underline"))
    shown = job.ranks
    if len(job.ranks) > TABLE_MAX_RANKS:
        keep = {job.median_rank, job.worst_rank}
        shown = [r for r in job.ranks if r.rank in keep]
    header = ["rank", "host", "step", *(name for _, name in RANK_COLUMNS)]
    rows = [
        [
            f"{r.rank}{'*' if job.straggler and r.rank == job.straggler.rank else ''}",
            r.host,
            f"{r.step_s * 1e3:.1f}",
            *_cells(r),
        ]
        for r in shown
    ]
    numeric = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header) if i >= 2]
    rank_w = max(4, *(len(row[0]) for row in rows))
    host_w = max(4, min(max(len(row[1]) for row in rows), width - rank_w - sum(numeric) - 2 * (len(header) - 1)))
    for cells, style in [(header, "bold")] + [(row, "") for row in rows]:
        host = cells[1] if len(cells[1]) <= host_w else cells[1][: host_w - 1] + "…"
        line = "  ".join(
            [cells[0].ljust(rank_w), host.ljust(host_w), *(c.rjust(w) for c, w in zip(cells[2:], numeric))]
        )
        console.print(Text(line, style=style), no_wrap=True, overflow="ellipsis")
    if len(job.ranks) > TABLE_MAX_RANKS:
        exposed = [r.exposed_s * 1e3 for r in job.ranks]
        console.print(
            Text(
                f"(median rank {job.median_rank} and worst rank {job.worst_rank} of {len(job.ranks)}; "
                f"comm across ranks: min {min(exposed):.1f}, median {statistics.median(exposed):.1f}, "
                f"max {max(exposed):.1f} ms; every rank in the JSON report)",
                style="dim",
            )
        )
    console.print(Text(f"other: copies + host syncs; comm: waiting for {_COMM_SHORT[job.sync_kind]}", style="dim"))
    by_rank = {r.rank: r for r in job.ranks}
    worst, median = by_rank[job.worst_rank], by_rank[job.median_rank]
    console.print(
        Text(
            f"Worst rank {worst.rank} vs median rank {median.rank}: {worst.busy_s * 1e3:.1f} vs "
            f"{median.busy_s * 1e3:.1f} ms of its own work per step (skew {job.skew:.0%})"
        )
    )
    s = job.straggler
    if s is not None:
        console.print(
            Text.assemble(
                ("Straggler: ", "bold"),
                (f"rank {s.rank}", "bold red"),
                f"{f' ({s.host})' if s.host else ''}, cause {s.cause}: the others wait "
                f"{s.cost_s * 1e3:.1f} ms per step ({s.cost_share:.0%}) for it",
            )
        )
    else:
        console.print(Text("No straggler: no rank keeps the others waiting for 5% of the step or more."))
    if job.imbalance is not None:
        u = job.imbalance
        console.print(
            Text.assemble(
                ("Ranks late in turns: ", "bold"),
                f"the first to arrive waits {u.first_wait_s * 1e3:.1f} ms per step for the last, whose "
                f"{_longer(u.cause, u.cause_gap_s * 1e3, u.compile_gap_s * 1e3)}; even work saves "
                f"{u.cost_s * 1e3:.1f} ms ({u.cost_share:.0%})",
            )
        )
    console.print(Text(_communication_line(job.exposed_share, job.overlap, job.sync_kind)))


def _longer(cause: str, cause_gap_ms: float, compile_gap_ms: float) -> str:
    """What the last of the ranks late in turns spent longer on: its cause's phase, or its compiling."""
    if cause == "recompile":
        return f"compiling is {compile_gap_ms:.1f} ms longer"
    return f"{cause} is {cause_gap_ms:.1f} ms longer"


def _communication_line(share: float, overlap: float | None, kind: str) -> str:
    if kind == "ddp":
        said = f", {overlap:.0%} of the all-reduce time overlapped the backward" if overlap is not None else ""
        return f"Communication: {share:.0%} of the step waits on gradient synchronization{said}."
    return f"Communication: {share:.0%} of the step waits on {WAITED_ON[kind]}; the calls block, overlapping nothing."


def lane_ranks(data: dict[str, Any]) -> list[int]:
    """The ranks the picture draws: every rank up to 8; above that, the median rank, the worst and the straggler."""
    ranks = [r["rank"] for r in data.get("ranks", []) if r.get("lane_ms")]
    if len(ranks) <= TABLE_MAX_RANKS:
        return ranks
    c, s = data.get("communication") or {}, data.get("straggler") or {}
    keep = {c.get("median_rank"), c.get("worst_rank"), s.get("rank")}
    return [rank for rank in ranks if rank in keep]


def _lanes_png(data: dict[str, Any]) -> str | None:
    """The ranks' lanes as an embedded PNG (None without matplotlib or without lanes)."""
    shown = lane_ranks(data)
    if not shown:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    by_rank = {r["rank"]: r for r in data["ranks"]}
    straggler = (data.get("straggler") or {}).get("rank")
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.45 * len(shown)))
    drawn: set[str] = set()
    for y, rank in enumerate(shown):
        lane = by_rank[rank]["lane_ms"][:LANE_STEPS]
        for key in LANE_ORDER:
            spans = []
            for step in lane:
                left = step["start"] + sum(step["parts"].get(k, 0.0) for k in LANE_ORDER[: LANE_ORDER.index(key)])
                if step["parts"].get(key, 0.0) > 0:
                    spans.append((left, step["parts"][key]))
            if not spans:
                continue
            style: dict[str, Any] = WAIT_STYLE if key == "communication" else {"facecolor": COLORS[key]}
            label = WAIT_LABEL if key == "communication" else CATEGORY_LABELS[key]
            ax.broken_barh(spans, (y - 0.35, 0.7), linewidth=0, label=None if key in drawn else label, **style)
            drawn.add(key)
        # Step boundaries: a thin white line at each step's start.
        ax.vlines([s["start"] for s in lane], y - 0.35, y + 0.35, colors="white", linewidth=0.8)
    ax.set_yticks(range(len(shown)))
    # Above 8 ranks the lanes drawn are picked ones: say which is the median rank.
    median = (data.get("communication") or {}).get("median_rank") if len(shown) < len(data["ranks"]) else None
    roles = {straggler: "  straggler", median: "  median"}
    labels = ax.set_yticklabels([f"rank {rank}{roles.get(rank, '')}" for rank in shown], fontsize=8)
    for tick, rank in zip(labels, shown):
        if rank == straggler:
            tick.set_color("#c0392b")
            tick.set_fontweight("bold")
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.set_xlim(left=min(by_rank[rank]["lane_ms"][0]["start"] for rank in shown))
    ax.set_xlabel("ms, ranks lined up on each step's last collective")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, fontsize=7, frameon=False)
    uri = png_uri(fig)
    plt.close(fig)
    return uri


def ranks_html(data: dict[str, Any]) -> str:
    """The ranks' table (ms per step, medians, every rank) and the straggler and communication lines."""
    esc = html.escape
    keys = [k for k in data["ranks"][0]["breakdown_ms"]] if data.get("ranks") else []
    head = "".join(f"<th>{esc(k)}</th>" for k in ["rank", "host", "step ms", *keys])
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{esc(str(v))}</td>"
            for v in [r["rank"], r["host"], r["step_time_ms"]["median"], *(r["breakdown_ms"][k] for k in keys)]
        )
        + "</tr>"
        for r in data.get("ranks", [])
    )
    s, c = data.get("straggler"), data.get("communication") or {}
    lines = []
    if s:
        where = f" at {s['where']}" if s.get("where") else ""
        lines.append(
            f"Straggler: rank {s['rank']} ({s['host']}), cause {s['cause']}{where}: the others wait "
            f"{s['cost']['ms_per_step']:.1f} ms per step ({s['cost']['share']:.0%}) for it."
        )
    else:
        lines.append("No straggler: no rank keeps the others waiting for 5% of the step or more.")
    u = data.get("imbalance")
    if u:
        lines.append(
            f"Ranks late in turns: the first to arrive waits {u['first_wait_ms']:.1f} ms per step for the last, "
            f"whose {_longer(u['cause'], u['cause_gap_ms'], u.get('compile_gap_ms', 0.0))}; even work saves "
            f"{u['cost']['ms_per_step']:.1f} ms ({u['cost']['share']:.0%})."
        )
    if c:
        lines.append(_communication_line(c["exposed_share"], c.get("overlap"), c.get("kind", "ddp")))
    text = "".join(f"<p>{esc(line)}</p>" for line in lines)
    title = f"Ranks ({len(data.get('ranks', []))}), ms per step (medians)"
    out = f'<h2>{title}</h2><table id="ranks"><tr>{head}</tr>{rows}</table>{text}'
    uri = _lanes_png(data)
    if uri is not None:
        shown, steps = lane_ranks(data), min(LANE_STEPS, len(data["ranks"][0]["lane_ms"]))
        which = "every rank" if len(shown) == len(data["ranks"]) else "the median rank, the worst and the straggler"
        caption = (
            f"The ranks' lanes: {which}, the first {steps} measured steps, lined up on the completion of each "
            "step's last collective (the same instant on every rank), not on host clocks. Each step's phases "
            "are stacked in a fixed order, not the order they ran; the hatched pink part is the time the rank "
            f"waited for {WAITED_ON[c.get('kind', 'ddp')]}: the ranks that wait are waiting for the last to "
            "arrive (the straggler, in red, when one is named)."
        )
        out += f'<img id="rank-lanes" alt="Lanes of the ranks" src="{uri}"><p class="note">{esc(caption)}</p>'
    return out
