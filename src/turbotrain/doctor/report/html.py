"""A self-contained HTML report: plots embedded as base64 PNG (matplotlib), no external files or scripts."""

from __future__ import annotations

import html
import os
from typing import Any

from ..record.measurements import CATEGORIES
from .figures import png_uri
from .model import Report
from .palette import CATEGORY_LABELS, COLORS
from .terminal import gain_text, machine_items, noise_text, periodic_text, steps_text

__all__ = ["render_html", "write_html"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
.meta{color:#666} .machine{color:#555;font-size:.9em}
.noise{background:#fdecea;border-left:4px solid #c0392b;padding:.4em .8em;margin:.6em 0}
.noise ul{margin:.2em 0} .msg{background:#fff4e0;border-left:4px solid #f3a712;padding:.4em .8em;margin:.4em 0}
.bar{display:flex;height:28px;border-radius:4px;overflow:hidden;margin:.6em 0}
.bar div{height:100%} .legend span{display:inline-block;margin-right:1.2em;font-size:.9em}
.legend i{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:middle}
.finding{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;margin:.8em 0}
.sev{font-weight:bold;text-transform:uppercase;font-size:.8em;padding:.1em .5em;border-radius:3px;color:#fff}
.sev.high{background:#c0392b} .sev.medium{background:#d68910} .sev.low{background:#95a5a6}
.rule{font-family:monospace;font-weight:bold;margin:0 .5em} .where{font-family:monospace;color:#555}
.buys{float:right;font-weight:bold} pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:.85em}
pre.fix{background:#eef8ee} .note{color:#666;font-size:.9em}
table{border-collapse:collapse;font-size:.85em} td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}
.code .hl{background:#fff3b0;display:inline-block;width:100%} img{max-width:100%}
dl.whatif{font-size:.85em;color:#555;margin:.3em 0} dl.whatif dt{display:inline;font-weight:bold}
dl.whatif dd{display:inline;margin:0 1em 0 .3em}
pre.diff .add{color:#1a7f37} pre.diff .del{color:#cf222e} pre.diff .hunk{color:#0969da} pre.diff .file{color:#666}
"""


def _plots(report: Report) -> list[tuple[str, str]]:
    """(title, data URI) of the breakdown and the per-step timeline; none without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    b = report.breakdown
    assert b is not None  # drawn only for a report with a breakdown
    out = []
    fig, ax = plt.subplots(figsize=(9, 1.6))
    left = 0.0
    for key in CATEGORIES:
        ms = b.seconds[key] * 1e3
        if ms <= 0:
            continue
        ax.barh([0], [ms], left=left, color=COLORS[key], label=f"{CATEGORY_LABELS[key]} {b.shares[key]:.0%}")
        left += ms
    ax.set_yticks([])
    ax.set_xlabel(f"ms per step (mean; delimited by {report.step_delimiter})")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.55), ncol=4, fontsize=8, frameon=False)
    out.append(("Where a step's time goes", png_uri(fig)))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 3.2))
    steps = [row["step"] for row in b.timeline]
    bottom = [0.0] * len(steps)
    for key in CATEGORIES:
        values = [row[key] for row in b.timeline]
        if not any(values):
            continue
        ax.bar(steps, values, bottom=bottom, color=COLORS[key], label=CATEGORY_LABELS[key], width=0.8)
        bottom = [a + v for a, v in zip(bottom, values)]
    lost = [row.get("interference", 0.0) for row in b.timeline]
    if any(lost):
        ax.bar(
            steps,
            lost,
            bottom=bottom,
            color="white",
            edgecolor="#bbbbbb",
            hatch="///",
            width=0.8,
            label="other processes (not the script)",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.legend(fontsize=7, ncol=4, frameon=False)
    out.append(("Per-step timeline", png_uri(fig)))
    plt.close(fig)
    return out


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _finding(f: dict[str, Any]) -> str:
    buys = gain_text(f["est_speedup"], f["measured"])
    parts = [
        f'<div class="finding" data-rule="{html.escape(f["rule"])}">',
        f'<span class="sev {f["severity"]}">{f["severity"]}</span>'
        f'<span class="rule">{html.escape(f["rule"])}</span>'
        f'<span class="where">{html.escape(f["where"] or "")}</span><span class="buys">{buys}</span>',
        f"<p>{html.escape(f['message'])}</p>",
    ]
    if f.get("code"):
        line = int(f["where"].rsplit(":", 1)[1]) if f["where"] and f["where"].rsplit(":", 1)[-1].isdigit() else -1
        code = "".join(
            f'<span class="{"hl" if c["line"] == line else ""}">{c["line"]:>5}  {html.escape(c["text"])}</span>\n'
            for c in f["code"]
        )
        parts.append(f'<pre class="code">{code}</pre>')
    parts.append(f'<pre class="fix">{html.escape(f["fix"])}</pre>')
    if f.get("note"):
        parts.append(f'<p class="note">{html.escape(f["note"])}</p>')
    if f.get("folded"):  # findings.FOLDS: the terminal counts it in one line instead
        parts.append('<p class="note">Folded in the terminal report: it cannot matter on this machine and model.</p>')
    if f.get("what_if"):
        items = "".join(
            f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(str(v))}</dd>" for k, v in f["what_if"].items()
        )
        parts.append(f'<dl class="whatif"><dt>measured what-if</dt><dd></dd>{items}</dl>')
    parts.append("</div>")
    return "".join(parts)


def render_html(report: Report) -> str:
    data = report.to_dict()
    b = report.breakdown
    esc = html.escape
    body = [
        f"<h1>turbotrain doctor: {esc(str(data['script']))}</h1>",
        f'<p class="meta">{esc(" ".join(data["argv"]))} &middot; {esc(data["device"])}: {esc(data["hardware"])} '
        f"&middot; torch {esc(data['torch'])} &middot; status <b>{esc(data['status'])}</b></p>",
    ]
    if report.noise:
        head, reasons = noise_text(report.noise)
        items = "".join(f"<li>{esc(r)}</li>" for r in reasons)
        body.append(f'<div class="noise" id="noise"><b>{esc(head)}</b>{f"<ul>{items}</ul>" if items else ""}</div>')
    if report.machine is not None:
        machine = " &middot; ".join(esc(i) for i in machine_items(report.machine))
        body.append(f'<p class="machine" id="machine">{machine}</p>')
    body += [f'<div class="msg">{esc(m)}</div>' for m in data["messages"]]
    if b is not None and b.steps:
        before, median, after = steps_text(report)
        from .ranks import bottleneck_wait

        body.append(
            f"<p>{esc(before)}<b>{esc(median)}</b>{esc(after)}. Bottleneck: "
            f'<b id="bottleneck">{esc(CATEGORY_LABELS[b.bottleneck])}</b> '
            f"({b.shares[b.bottleneck]:.0%} of step time{esc(bottleneck_wait(report))}).</p>"
        )
        segments = "".join(
            f'<div title="{esc(CATEGORY_LABELS[k])}" style="width:{b.shares[k] * 100:.2f}%;'
            f'background:{COLORS[k]}"></div>'
            for k in CATEGORIES
            if b.shares[k] > 0
        )
        legend = "".join(
            f'<span><i style="background:{COLORS[k]}"></i>{esc(CATEGORY_LABELS[k])} '
            f"{b.shares[k]:.1%} ({b.seconds[k] * 1e3:.2f} ms)</span>"
            for k in CATEGORIES
        )
        body.append(f'<div class="bar" id="breakdown">{segments}</div><div class="legend">{legend}</div>')
        if report.periodic:
            items = "".join(f"<li>{esc(periodic_text(e))}</li>" for e in report.periodic)
            body.append(f'<h2>Recurring work</h2><ul id="periodic">{items}</ul>')
        if report.ranks is not None:
            from .ranks import ranks_html

            body.append(ranks_html(data))
        for title, uri in _plots(report):
            body.append(f'<h2>{esc(title)}</h2><img alt="{esc(title)}" src="{uri}">')
    body.append(f"<h2>Findings ({len(data['findings'])})</h2>")
    body += [_finding(f) for f in data["findings"]] or ["<p>No findings.</p>"]
    if report.fixes is not None:
        from .fix_section import fixes_html

        body.append(fixes_html(report.fixes))
    if data["syncs"]:
        body.append(
            "<h2>Host syncs per step</h2>" + _table(data["syncs"], ["where", "kind", "per_step", "ms_per_step", "code"])
        )
    if data["copies"]:
        body.append(
            "<h2>Host-to-device copies per step</h2>"
            + _table(
                data["copies"], ["where", "per_step", "mib_per_step", "ms_per_step", "non_blocking", "pinned", "code"]
            )
        )
    if data["top_ops"]:
        body.append(
            "<h2>Top ops (profiler window, per step)</h2>"
            + _table(data["top_ops"], ["op", "calls_per_step", "self_cpu_ms_per_step", "self_device_ms_per_step"])
        )
    if data.get("error"):
        body.append(
            f"<h2>Error</h2><p>{esc(str(data['error']['message']))} at "
            f"{esc(str(data['error']['where']))}</p><pre>{esc(data['error']['traceback'] or '')}</pre>"
        )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>turbotrain doctor: {esc(str(data['script']))}</title><style>{_CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>"
    )


def write_html(report: Report, path: str | os.PathLike) -> None:
    from .files import write_text

    write_text(path, render_html(report))
