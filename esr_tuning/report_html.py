"""An evaluation as one self-contained HTML page: headline figures, the confusion matrix as a heat map,
and each route's score distribution against its threshold (inline SVG, no scripts, no network)."""

from __future__ import annotations

import html
from typing import Sequence

import numpy as np

_BINS = 40
_W, _H = 360, 110  # one histogram's plot area, in pixels


def render(report: dict, title: str, scores: np.ndarray | None = None, labels: Sequence[str] = (),
           routes: Sequence[str] = (), thresholds: Sequence[float] = ()) -> str:
    """`scores` (n, routes): each example's score for each route, in `routes` order, with their
    thresholds: what the histograms show. Without it the page has the figures and the matrix only."""
    parts = [f"<h1>{_e(title)}</h1>", _figures(report), "<h2>Confusion matrix</h2>",
             "<p>Rows: the label; columns: the route chosen. Shade: share of the row.</p>", _matrix(report["confusion"])]
    if report.get("confidence"):
        c = report["confidence"]
        parts += ["<h2>Reliability of x-semantic-route-confidence</h2>",
                  f"<p>Per confidence bin (15): how often the route was right (bars) against the confidence itself "
                  f"(the diagonal); the number is the bin's count. ECE {c['ece']}, AUROC right vs wrong {c['auroc']}.</p>",
                  _reliability(c["bins"])]
    if scores is not None and len(routes):
        parts += ["<h2>Score distributions</h2>",
                  "<p>Per route: its score on the examples labelled with it (blue) and on all others (orange), "
                  "each as a share of its own count; the line is the route's threshold. Overlap left of the "
                  "line is missed traffic, orange right of it is traffic taken from elsewhere.</p>",
                  '<div class="grid">' + "".join(
                      _histogram(name, scores[:, i], np.asarray(labels) == name, float(thresholds[i]))
                      for i, name in enumerate(routes)) + "</div>"]
    return _PAGE.format(title=_e(title), body="\n".join(parts))


def _e(text) -> str:
    return html.escape(str(text))


def _figures(report: dict) -> str:
    rows = [("examples", report["examples"]), ("accuracy", report["accuracy"]),
            ("in-scope accuracy", report.get("in_scope_accuracy")), ("default-route recall", report.get("default_recall"))]
    if report.get("shifted") is not None:
        rows.append((f"accuracy with {report['shifted']['default_share']:.0%} default-route traffic",
                     report["shifted"]["accuracy"]))
    for key, value in (report.get("conversation") or {}).items():
        rows.append((key.replace("_", " "), value))
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{'-' if v is None else _e(v)}</td></tr>" for k, v in rows)
    return f'<table class="figures">{cells}</table>'


def _matrix(confusion: dict[str, dict[str, int]]) -> str:
    names = list(confusion)
    head = "<tr><th></th>" + "".join(f'<th class="col">{_e(n)}</th>' for n in names) + "</tr>"
    body = []
    for truth in names:
        total = sum(confusion[truth].values()) or 1
        cells = []
        for pred in names:
            n = confusion[truth][pred]
            share = n / total
            hue = 210 if pred == truth else 20  # blue on the diagonal, orange off it
            style = f"background: hsl({hue} 80% {100 - 55 * share:.0f}%)" if n else ""
            cells.append(f'<td style="{style}" title="{_e(truth)} → {_e(pred)}: {n}">{n or ""}</td>')
        body.append(f"<tr><th>{_e(truth)}</th>{''.join(cells)}</tr>")
    return f'<table class="matrix">{head}{"".join(body)}</table>'


def _histogram(name: str, scores: np.ndarray, own: np.ndarray, threshold: float) -> str:
    lo, hi = float(min(scores.min(), threshold)), float(max(scores.max(), threshold))
    hi = hi if hi > lo else lo + 1.0
    edges = np.linspace(lo, hi, _BINS + 1)
    bars = []
    for mask, colour, offset in ((own, "#3b7dd8", 0.0), (~own, "#e8833a", 0.5)):
        if not mask.any():
            continue
        counts, _ = np.histogram(scores[mask], bins=edges)
        shares = counts / counts.sum()
        top = max(shares.max(), 1e-9)
        step = _W / _BINS
        for b, share in enumerate(shares):
            if share > 0:
                h = _H * share / top
                bars.append(f'<rect x="{b * step + offset * step / 2:.1f}" y="{_H - h:.1f}" width="{step / 2:.1f}" '
                            f'height="{h:.1f}" fill="{colour}" opacity="0.85"/>')
    x = _W * (threshold - lo) / (hi - lo)
    svg = (f'<svg width="{_W}" height="{_H + 18}" role="img" aria-label="{_e(name)} scores">'
           f'{"".join(bars)}<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{_H}" stroke="#222" stroke-dasharray="3 2"/>'
           f'<text x="0" y="{_H + 14}">{lo:.2f}</text><text x="{_W}" y="{_H + 14}" text-anchor="end">{hi:.2f}</text>'
           f'<text x="{x:.1f}" y="{_H + 14}" text-anchor="middle">{threshold:.2f}</text></svg>')
    return f"<figure><figcaption>{_e(name)} ({int(own.sum())} labelled)</figcaption>{svg}</figure>"


def _reliability(bins: list[dict]) -> str:
    size = _H * 2
    bars = []
    for b in bins:
        x, w = b["low"] * size, (b["high"] - b["low"]) * size
        h = b["accuracy"] * size
        bars.append(f'<rect x="{x:.1f}" y="{size - h:.1f}" width="{w - 1:.1f}" height="{h:.1f}" fill="#3b7dd8" '
                    f'opacity="0.85"><title>confidence {b["confidence"]}, right {b["accuracy"]}, {b["count"]} '
                    f'requests</title></rect><text x="{x + w / 2:.1f}" y="{size + 12}" text-anchor="middle">'
                    f'{b["count"]}</text>')
    return (f'<svg width="{size}" height="{size + 30}" role="img" aria-label="reliability diagram">{"".join(bars)}'
            f'<line x1="0" y1="{size}" x2="{size}" y2="0" stroke="#222" stroke-dasharray="3 2"/>'
            f'<text x="0" y="{size + 26}">0</text><text x="{size}" y="{size + 26}" text-anchor="end">1</text></svg>')


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }}
.figures th {{ text-align: left; padding-right: 2em; font-weight: normal; color: #555; }}
.matrix td, .matrix th {{ border: 1px solid #ddd; padding: 2px 6px; text-align: right; font-size: 12px; }}
.matrix th.col {{ writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }}
.grid {{ display: flex; flex-wrap: wrap; gap: 1.5em; }}
figure {{ margin: 0; }} figcaption {{ font-weight: 600; margin-bottom: 4px; }}
svg text {{ font-size: 10px; fill: #555; }}
</style></head><body>
{body}
</body></html>
"""
