"""The HTML page: the headline and Hang section, the figures in order, the findings; every script
allowed by its hash.

Why a policy: element ids are made here, never from the data, and the page's
Content-Security-Policy allows only the scripts written here, by their
SHA-256, so even a missed escape could not run an injected script. Plotly's
JavaScript is embedded once; nothing is fetched (no CDN, no fonts, no MathJax).
The figures are plain dicts given to ``Plotly.newPlot`` as they are, with
Plotly's "plotly_white" template as it ships it (`data.plotly_template`).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import time
from typing import Any

from otel_titan.analysis.model.hang import format_hang
from otel_titan.analysis.model.headline import headline_data, headline_lines
from otel_titan.analysis.report.data import ReportData, plotly_js, plotly_template
from otel_titan.analysis.report.findings import findings_html
from otel_titan.analysis.report.markup import named_rank, script_json

__all__ = ["page_html"]


def page_html(
    path: Any, data: ReportData, figures: list[tuple[str, str, str, dict[str, Any]]]
) -> str:
    """The HTML page of the run at `path`: escaped text, figures drawn by scripts this page lists by
    hash in its Content-Security-Policy."""
    summary, named = data.summary, data.named
    scripts = [plotly_js()]
    run_label = summary.run_id or os.fspath(path)
    body = ["<h1>otel-titan report</h1>"]
    steps = "no steps" if data.first_step is None else f"steps {data.first_step}–{data.last_step}"
    processes = len(summary.processes)
    # torchtitan's files name none
    run_id = f"run {html.escape(str(summary.run_id))}" if summary.run_id else "no run id"
    body.append(
        f"<p class=meta>{html.escape(os.path.abspath(os.fspath(path)))} · {run_id} · "
        f"{data.ranks:,} rank{'s' if data.ranks != 1 else ''} · {steps} · {processes:,} "
        f"process{'es' if processes != 1 else ''} · "
        f"{data.grid.bytes_read / 1e6:,.1f} MB of JSONL · written "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</p>"
    )
    body.append("<h2 id=headline>Headline</h2>")
    if named:
        reasons: dict[tuple[str, int], list[str]] = {}
        for n in named:  # one entry per rank, its reasons together, in summarize's order
            reasons.setdefault((n.source, n.rank), []).append(n.why)
        who = ", ".join(
            f"{named_rank(source, rank).text} ({html.escape(source)}: "
            f"{html.escape('; '.join(why))})"
            for (source, rank), why in list(reasons.items())[:20]
        )
        more = f" … {len(reasons) - 20} more" if len(reasons) > 20 else ""
        body.append(f"<p class=warn>summarize names: {who}{more}</p>")
    text = format_hang(summary.hang) + headline_lines(summary, headline_data(summary))
    body.append(f"<pre>{html.escape(chr(10).join(text))}</pre>")
    if not figures:
        body.append(
            "<p>Nothing to draw: the run has no steps, no spans with ids and no scalars (see the "
            "headline).</p>"
        )
    findings_done = False
    heading_done: set[str] = set()
    for section, heading, explanation, fig in figures:
        if section == "clocks" and not findings_done:
            body.append(findings_html(summary))
            findings_done = True
        if heading not in heading_done:
            anchor = "scalars" if section.startswith("scalar-") else section
            body.append(f"<h2 id={anchor}>{html.escape(heading)}</h2>")
            heading_done.add(heading)
        if explanation:
            body.append(f"<p>{html.escape(explanation)}</p>")
        div_id = f"fig-{section}"  # made here, never from the records
        height = int(fig["layout"].get("height") or 450)
        body.append(
            f'<div id="{div_id}" class="plotly-graph-div" style="height:{height}px; width:100%;"></div>'
        )
        scripts.append(_figure_script(fig, div_id))
    if not findings_done:
        body.append(findings_html(summary))
    # Each script follows the body it draws into; the policy names each by its hash, so nothing else
    # runs.
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(s.encode('utf-8')).digest()).decode()}'"
        for s in scripts
    )
    head = _HEAD.format(title=html.escape(f"otel-titan report: {run_label}"), hashes=hashes)
    tail = "\n".join(f'<script type="text/javascript">{s}</script>' for s in scripts)
    return head + "\n" + "\n".join(body) + "\n" + tail + "\n</body></html>\n"


def _figure_script(figure: dict[str, Any], div_id: str) -> str:
    """The script that draws `figure` (``{"data": [...], "layout": {...}}``) into `div_id`, in
    Plotly's "plotly_white" look, with the width of the page."""
    layout = {
        **figure["layout"],
        "margin": {"t": 60, "r": 30},
        "autosize": True,
        "template": plotly_template("plotly_white"),
    }
    # NaN (a heatmap cell without a value) is written as JavaScript's NaN: the payload is a script's
    # literal, never parsed as JSON.
    payload = script_json(
        json.dumps({"data": figure["data"], "layout": layout}, separators=(",", ":"))
    )
    config = '{"displaylogo": false, "responsive": true}'
    return f'(function () {{ var f = {payload}; Plotly.newPlot("{div_id}", f.data, f.layout, {config}); }})();'


_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src {hashes} 'unsafe-eval'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; max-width: 1500px; overflow-wrap: anywhere; }}
h1 {{ margin-bottom: 0.2em; }} h2 {{ margin-top: 1.6em; border-bottom: 1px solid #ddd; }}
.meta {{ color: #666; }} .warn {{ color: #b00; font-weight: bold; }}
.named-rank {{ color: #b00; font-weight: bold; white-space: nowrap; }}
pre {{ background: #f6f6f6; padding: 0.8em; white-space: pre-wrap; }}
table {{ border-collapse: collapse; margin: 0.5em 0; max-width: 100%; }}
td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: right; vertical-align: top; }}
th {{ background: #f6f6f6; font-weight: 600; }} td:first-child, th:first-child {{ text-align: left; }}
</style></head><body>"""
