"""The quality-cost page of `semantic-router select-eval --html`: one self-contained HTML file (inline
SVG, no script) with the selector's curve, the oracle's, each single model, the random mixes between
models of neighbouring price, and the configured policy's operating point; then the figures."""

from __future__ import annotations

import html

W, H, PAD = 640, 400, 56


def _scale(values: list[float], lo_px: float, hi_px: float):
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return lambda v: lo_px + (v - lo) / span * (hi_px - lo_px)


def render(report: dict, models: list[str], title: str) -> str:
    curve, oracle = report["curve"], report["oracle_curve"]
    prices, means = report["mean_cost_per_model"], report["mean_score_per_model"]
    policy = report["policy"]
    costs = [c for c, _ in curve + oracle] + prices + [policy["cost"]]
    scores = [s for _, s in curve + oracle] + means + [policy["score"]]
    x, y = _scale(costs, PAD, W - 16), _scale(scores, H - PAD, 16)

    def line(points, cls):
        return f'<polyline class="{cls}" points="{" ".join(f"{x(c):.1f},{y(s):.1f}" for c, s in points)}"/>'

    singles = sorted(zip(prices, means, models))
    parts = [line(oracle, "oracle"), line([(c, s) for c, s, _ in singles], "mix"), line(curve, "router")]
    for c, s, m in singles:
        parts.append(f'<circle class="model" cx="{x(c):.1f}" cy="{y(s):.1f}" r="4"/>'
                     f'<text x="{x(c) + 6:.1f}" y="{y(s) - 6:.1f}">{html.escape(m)}</text>')
    parts.append(f'<rect class="policy" x="{x(policy["cost"]) - 5:.1f}" y="{y(policy["score"]) - 5:.1f}" '
                 f'width="10" height="10"/>')
    axes = (f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 16}" y2="{H - PAD}" class="axis"/>'
            f'<line x1="{PAD}" y1="16" x2="{PAD}" y2="{H - PAD}" class="axis"/>'
            f'<text x="{W / 2:.0f}" y="{H - 16}" class="label">mean cost per request</text>'
            f'<text x="14" y="{H / 2:.0f}" class="label" transform="rotate(-90 14 {H / 2:.0f})">mean score</text>'
            f'<text x="{PAD}" y="{H - PAD + 16}">{min(costs):g}</text>'
            f'<text x="{W - 60}" y="{H - PAD + 16}">{max(costs):g}</text>'
            f'<text x="{PAD - 40}" y="{H - PAD}">{min(scores):.2f}</text>'
            f'<text x="{PAD - 40}" y="24">{max(scores):.2f}</text>')
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(report[k]))}</td></tr>" for k in (
        "cost_at_95pct", "oracle_cost_at_95pct", "apgr", "apgr_of_oracle", "floor_violations", "floor_unmet",
        "beats_best_single", "beats_random_mix"))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
svg text {{ font-size: 11px; }} .label {{ font-size: 12px; }}
.axis {{ stroke: #444; }} polyline {{ fill: none; stroke-width: 2; }}
.router {{ stroke: #1f77b4; }} .oracle {{ stroke: #999; stroke-dasharray: 4 3; }} .mix {{ stroke: #d62728; }}
.model {{ fill: #d62728; }} .policy {{ fill: #2ca02c; }}
td {{ padding: 2px 12px 2px 0; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p><span style="color:#1f77b4">selector</span> (the quality model's predictions, utility over a sweep of
&lambda;), <span style="color:#999">oracle</span> (knows every score), <span style="color:#d62728">single
models and random mixes of neighbouring ones</span>, <span style="color:#2ca02c">the configured policy
({html.escape(policy["strategy"])}: cost {policy["cost"]:g}, score {policy["score"]:.3f})</span>.</p>
<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" aria-label="quality against cost">
{axes}{"".join(parts)}</svg>
<table>{rows}</table>
</body></html>
"""
