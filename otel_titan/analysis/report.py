"""`otel-titan report`: one self-contained HTML file with the pictures of a run.

Why: people would rather look than read. A heatmap of step time by rank
shows a straggler (a row), a slow host (a band of 8 rows), a periodic stall
(columns) at a glance, where a table needs study. The file is for a laptop
on a train: Plotly's JavaScript is embedded once (``include_plotlyjs=True``
in the first figure only), nothing is fetched (no CDN, no fonts, no MathJax),
and big runs are binned so it stays small and opens quickly: at most
`max_cells` heatmap cells (steps, then ranks, grouped into bins; a bin shows
its *slowest* step time, so one slow rank or step is never averaged away).

The data come from the SQL views (`sql.open_run`: spans, steps, scalars) and
the findings from ``summarize`` (`summary.summarize_run`: the headline, hang
suspects, stragglers, clock offsets), so the report says what they say.

Contents, in the order a person needs them: the headline; step time as a
heatmap of ranks × steps; per-phase time by rank (each rank's median, the
ranks that stand out marked and named); the scalars over steps (min, median
and max across ranks); the straggler and clock-offset findings.
"""

from __future__ import annotations

import html
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from otel_titan.analysis.headline import headline_data, headline_lines
from otel_titan.analysis.reader import find_log_dir
from otel_titan.analysis.sql import INSTALL_HINT, MissingDependencyError, open_run
from otel_titan.analysis.summary import summarize_run

__all__ = ["ReportResult", "write_report", "bin_size"]

#: A rank stands out in a phase when its median is this many robust z (MAD) from the others'.
STANDOUT_Z = 3.5
#: Points per scalar line at most (steps are binned above it).
MAX_SCALAR_POINTS = 2000


@dataclass
class ReportResult:
    """What was written."""

    path: str
    bytes: int
    figures: int
    ranks: int
    steps: int
    binning: str
    seconds: float


def bin_size(count: int, limit: int) -> int:
    """The smallest bin width that puts `count` items into at most `limit` bins.

    Example:
        >>> bin_size(10_000, 200), bin_size(150, 200), bin_size(1024, 256)
        (50, 1, 4)
    """
    return max(1, math.ceil(count / max(1, limit)))


def _heatmap_bins(ranks: int, steps: int, max_cells: int) -> tuple[int, int]:
    """(rank bin, step bin): steps are binned first (down to 200 columns), then ranks, until the cells fit."""
    step_bin = bin_size(steps, max(200, max_cells // max(1, ranks)))
    columns = math.ceil(steps / step_bin)
    rank_bin = bin_size(ranks, max(1, max_cells // max(1, columns)))
    return rank_bin, step_bin


def _require_plotly() -> Any:
    try:
        import plotly.graph_objects as go  # noqa: PLC0415 - optional
    except ImportError as error:
        raise MissingDependencyError(f"`otel-titan report` needs Plotly, which is not installed: {INSTALL_HINT} (or pip install plotly)") from error
    return go


def write_report(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    run_id: str | None = None,
    align: bool = True,
    ranks: list[int] | None = None,
    sources: list[str] | None = None,
    max_cells: int = 200_000,
    progress: Callable[[str], None] | None = None,
) -> ReportResult:
    """Write the report of the run at `path` (default ``RUN_DIR/analysis/report.html``); returns what was written."""
    import numpy as np  # noqa: PLC0415 - only when a report is written: the CLI starts without it

    go = _require_plotly()

    started = time.monotonic()
    say = progress or (lambda text: None)
    say("reading the run (SQL) ...")
    db = open_run(path, run_id=run_id, align=align, ranks=ranks, sources=sources)
    db.load()
    say("summarizing ...")
    summary = summarize_run(path, ranks=ranks, sources=sources, run_id=db.choice.run_id if db.choice else run_id, align=align)
    con = db.con
    say("drawing ...")
    # The source drawn: the one with most processes (training, usually).
    source_row = con.execute("SELECT source, count(*) FROM process_info GROUP BY source ORDER BY 2 DESC, 1 LIMIT 1").fetchone()
    source = source_row[0] if source_row else None
    n_ranks = con.execute("SELECT count(DISTINCT rank) FROM process_info WHERE source = ?", [source]).fetchone()[0]
    first_step, last_step = con.execute("SELECT min(step), max(step) FROM steps WHERE source = ? AND rank IS NOT NULL", [source]).fetchone()
    figures: list[tuple[str, str, Any]] = []  # (section id, explanation, figure)
    binning = "no binning"

    # 1. Step time heatmap, ranks × steps (binned: each cell the slowest step time in its bin); then the time
    #    each rank took to reach the step-closing collective: in synchronous training every rank's step
    #    time is the same (all wait for the last), so a straggler shows as a row only in the second.
    anchor = summary.clock.anchor if summary.clock is not None else None
    if first_step is not None:
        max_rank = con.execute("SELECT max(rank) FROM steps WHERE source = ?", [source]).fetchone()[0] or 0
        steps_count = last_step - first_step + 1
        rank_bin, step_bin = _heatmap_bins(max_rank + 1, steps_count, max_cells)
        binning = (f"heatmap bins: {step_bin} steps x {rank_bin} ranks per cell" if rank_bin * step_bin > 1 else "heatmap: one cell per rank and step")
        params = {"rb": rank_bin, "sb": step_bin, "first": first_step, "source": source}
        cells = con.execute(
            """SELECT rank // $rb AS rb, (step - $first) // $sb AS sb, max(duration_ms) AS ms
               FROM steps WHERE source = $source AND duration_ms IS NOT NULL AND rank IS NOT NULL GROUP BY ALL""", params).fetchnumpy()
        shape = (max_rank // rank_bin + 1, (steps_count - 1) // step_bin + 1)
        bins = f" ({binning}; each cell the slowest of its bin)" if rank_bin * step_bin > 1 else ""
        figures.append(("heatmap", "Each row a rank, each column a step: a slow host is a band, a periodic stall a column. "
                        "Step time: first record of step N to the first of step N+1 (as summarize); colours clipped at the 99.5th percentile.",
                        _heatmap(go, np, cells, shape, first_step, rank_bin, step_bin, f"Step time by rank ({source}){bins}")))
        if anchor:
            arrival = con.execute(
                """WITH a AS (SELECT rank, step, min(start_us) AS arrive FROM spans
                              WHERE source = $source AND name = $anchor AND parent_span_id IS NULL AND step IS NOT NULL AND rank IS NOT NULL GROUP BY ALL)
                   SELECT a.rank // $rb AS rb, (a.step - $first) // $sb AS sb, max((a.arrive - s.start_us) / 1000.0) AS ms
                   FROM a JOIN steps s ON s.source = $source AND s.rank = a.rank AND s.step = a.step GROUP BY ALL""",
                {**params, "anchor": anchor}).fetchnumpy()
            if len(arrival["ms"]):
                figures.append(("arrival", f"Time from the step's start to the rank's arrival at {anchor} (the step-closing collective, aligned clocks): "
                                "a straggler is a bright row; a rank that arrives early waits for the others.",
                                _heatmap(go, np, arrival, shape, first_step, rank_bin, step_bin, f"Time to reach {anchor} by rank ({source}){bins}")))

    # 2. Per-phase time by rank: each rank's median per phase; standout ranks (robust z) marked.
    per_rank = con.execute(
        "SELECT name, rank, median(duration_ms) AS ms FROM spans WHERE source = ? AND NOT incomplete AND rank IS NOT NULL GROUP BY ALL ORDER BY name, rank",
        [source]).fetchall()
    phases: dict[str, tuple[list[int], list[float]]] = {}
    for name, rank, ms in per_rank:
        entry = phases.setdefault(name, ([], []))
        entry[0].append(rank)
        entry[1].append(ms)
    standouts: list[tuple[str, int, float, float]] = []
    if phases:
        box = go.Figure()
        for name, (rank_list, values) in phases.items():
            arr = np.asarray(values)
            med = float(np.median(arr))
            mad = float(np.median(np.abs(arr - med))) * 1.4826
            z = (arr - med) / mad if mad > 0 else np.zeros_like(arr)
            marked = np.flatnonzero(np.abs(z) >= STANDOUT_Z)
            for i in marked[np.argsort(-np.abs(z[marked]))][:10]:
                standouts.append((name, rank_list[i], float(arr[i]), float(z[i])))
            box.add_trace(go.Box(y=np.round(arr, 3), x=[name] * len(arr), name=name, boxpoints="outliers", text=[f"rank {r}" for r in rank_list],
                                 hovertemplate="%{text}: %{y:.2f} ms<extra>" + html.escape(name) + "</extra>", showlegend=False))
        mark = [s for s in standouts]
        if mark:
            box.add_trace(go.Scatter(x=[s[0] for s in mark], y=[round(s[2], 3) for s in mark], mode="markers+text", name="stands out",
                                     text=[f"rank {s[1]}" for s in mark], textposition="middle right",
                                     marker={"color": "red", "size": 11, "symbol": "diamond-open", "line": {"width": 2}},
                                     hovertemplate="%{text}: %{y:.2f} ms<extra>stands out</extra>"))
        box.update_layout(title=f"Per-phase time by rank ({source}): each rank's median; red: ranks {STANDOUT_Z:g}+ robust z from the others",
                          yaxis_title="ms (log)", yaxis_type="log", height=520)
        figures.append(("phases", "One point per rank and phase (its median span time); the box spans the ranks' quartiles. "
                        "Ranks that stand out are marked in red and named.", box))

    # 3. Scalars over steps: min / median / max across ranks (steps binned above MAX_SCALAR_POINTS).
    names = [r[0] for r in con.execute("SELECT DISTINCT name FROM scalars WHERE name IS NOT NULL ORDER BY 1").fetchall()]
    for name in names[:12]:
        lo, hi = con.execute("SELECT min(step), max(step) FROM scalars WHERE name = ? AND step IS NOT NULL", [name]).fetchone()
        if lo is None:
            continue
        sb = bin_size(hi - lo + 1, MAX_SCALAR_POINTS)
        data = con.execute(
            """SELECT $lo + (step - $lo) // $sb * $sb AS s, min(value) AS lo, median(value) AS med, max(value) AS hi
               FROM scalars WHERE name = $name AND step IS NOT NULL AND isfinite(value) GROUP BY 1 ORDER BY 1""",
            {"lo": lo, "sb": sb, "name": name}).fetchnumpy()
        fig = go.Figure([
            go.Scatter(x=data["s"], y=data["hi"], mode="lines", line={"width": 0}, name="max", showlegend=False, hovertemplate="max %{y:.4g}<extra></extra>"),
            go.Scatter(x=data["s"], y=data["lo"], mode="lines", line={"width": 0}, fill="tonexty", fillcolor="rgba(31,119,180,0.25)", name="min..max across ranks",
                       hovertemplate="min %{y:.4g}<extra></extra>"),
            go.Scatter(x=data["s"], y=data["med"], mode="lines", line={"color": "rgb(31,119,180)"}, name="median across ranks", hovertemplate="median %{y:.4g}<extra></extra>"),
        ])
        fig.update_layout(title=f"{name} over steps: median and min..max across ranks" + (f" ({sb} steps per point)" if sb > 1 else ""),
                          xaxis_title="step", height=360)
        figures.append((f"scalar-{name}", "", fig))

    # 4. Clock offsets per host (summarize's alignment).
    clock = summary.clock
    if clock is not None and clock.applied and clock.offsets_us:
        hosts = sorted(clock.offsets_us)
        bar = go.Figure(go.Bar(x=hosts, y=[round(clock.offsets_us[h] / 1000, 3) for h in hosts], hovertemplate="%{x}: %{y:.3f} ms<extra></extra>"))
        bar.update_layout(title="Clock offset per host (subtracted from its times to align them)", yaxis_title="ms", height=360)
        figures.append(("clocks", clock.describe(), bar))

    # The page.
    data = headline_data(summary)
    headline = "\n".join(headline_lines(summary, data))
    steps_seen = 0 if first_step is None else last_step - first_step + 1
    parts = [_HEAD.format(title=html.escape(f"otel-titan report: {db.choice.run_id if db.choice and db.choice.run_id else os.fspath(path)}"))]
    parts.append("<h1>otel-titan report</h1>")
    parts.append(f"<p class=meta>{html.escape(os.path.abspath(os.fspath(path)))} · run {html.escape(str(db.choice.run_id if db.choice else ''))} · "
                 f"{n_ranks:,} ranks · steps {first_step}–{last_step} · {db.processes:,} processes · {db.total_bytes / 1e6:,.1f} MB of JSONL · "
                 f"written {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</p>")
    parts.append("<h2 id=headline>Headline</h2>")
    if summary.hang_suspects:
        parts.append(f"<p class=warn>Hang suspects: {html.escape(', '.join(summary.hang_suspects[:20]))}"
                     + (f" … {len(summary.hang_suspects) - 20} more" if len(summary.hang_suspects) > 20 else "") + "</p>")
    parts.append(f"<pre>{html.escape(headline)}</pre>")
    if not figures:
        parts.append("<p>Nothing to draw: the run has no steps, no spans with ids and no scalars (see the headline).</p>")
    first = True
    titles = {"heatmap": "Step time by rank", "arrival": "Arrival at the step-closing collective", "phases": "Per-phase time by rank", "clocks": "Clock offsets"}
    findings_done = False
    for section, text, fig in figures:
        if section == "clocks" and not findings_done:
            parts.append(_findings(summary, standouts))
            findings_done = True
        if section.startswith("scalar-"):
            if section == next(s for s, _, _ in figures if s.startswith("scalar-")):
                parts.append("<h2 id=scalars>Scalars over steps</h2>")
        else:
            parts.append(f"<h2 id={section}>{titles[section]}</h2>")
        if text:
            parts.append(f"<p>{html.escape(text)}</p>")
        parts.append(fig.to_html(full_html=False, include_plotlyjs=first, include_mathjax=False,
                                 config={"displaylogo": False, "responsive": True}, div_id=f"fig-{section}"))
        first = False
    if not findings_done:
        parts.append(_findings(summary, standouts))
    parts.append("</body></html>\n")
    out = os.fspath(output) if output is not None else os.path.join(db_run_dir(path), "analysis", "report.html")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    text_out = "\n".join(parts)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text_out)
    os.replace(tmp, out)
    db.con.close()
    return ReportResult(path=out, bytes=os.path.getsize(out), figures=len(figures), ranks=n_ranks or 0, steps=steps_seen, binning=binning,
                        seconds=time.monotonic() - started)


def _heatmap(go: Any, np: Any, cells: dict[str, Any], shape: tuple[int, int], first_step: int, rank_bin: int, step_bin: int, title: str) -> Any:
    """A ranks × steps heatmap from binned cells (rb, sb, ms), values rounded to 0.1 ms (the file stays small)."""
    grid = np.full(shape, np.nan, dtype=np.float32)
    grid[cells["rb"].astype(np.int64), cells["sb"].astype(np.int64)] = np.round(cells["ms"].astype(np.float32), 1)
    finite = grid[np.isfinite(grid)]
    low, high = (float(np.percentile(finite, 0.5)), float(np.percentile(finite, 99.5))) if finite.size else (None, None)
    fig = go.Figure(go.Heatmap(
        z=grid, x=first_step + np.arange(shape[1]) * step_bin, y=np.arange(shape[0]) * rank_bin, colorscale="Viridis", zmin=low, zmax=high,
        colorbar={"title": {"text": "ms"}},
        hovertemplate=("step %{x}" + (f" (+{step_bin - 1})" if step_bin > 1 else "") + "<br>rank %{y}" + (f" (+{rank_bin - 1})" if rank_bin > 1 else "")
                       + "<br>%{z:.1f} ms<extra></extra>"),
    ))
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="rank", yaxis_autorange="reversed", height=max(420, min(900, 120 + shape[0] * 3)))
    return fig


def db_run_dir(path: str | os.PathLike[str]) -> str:
    """The run directory of `path` (as ``export`` places ``analysis/``)."""
    return find_log_dir(path)[0]


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return "" if value is None else str(value)


def _findings(summary: Any, standouts: list[tuple[str, int, float, float]]) -> str:
    """The straggler findings of summarize (step time, phases, arrival at the collective) and the phase standouts, as tables."""
    parts = ["<h2 id=findings>Stragglers and clocks (summarize)</h2>"]
    for group in summary.stragglers:
        label = f"{group.source}" + (f", attempt {group.attempt}" if group.attempt else "")
        ranks = ", ".join(map(str, group.straggler_ranks)) or "none on evidence"
        parts.append(f"<h3>{html.escape(label)}: straggler ranks: {html.escape(ranks)}</h3>")
        if group.median_step_ms is not None:
            parts.append(f"<p>median step time {group.median_step_ms:,.1f} ms over {len(group.ranks):,} ranks</p>")
        slow = [r for r in group.ranks_by_slowness[:8]]
        if slow:
            parts.append(_table(["rank", "median ms", "others' median ms", "excess %", "robust z", "straggler"],
                                [[r.rank, r.median_ms, r.others_median_ms, r.median_excess_pct, r.robust_z, "yes" if r.straggler else ""] for r in slow]))
        if group.phase_stragglers:
            keys = list(group.phase_stragglers[0])
            parts.append("<p>Phase stragglers:</p>" + _table(keys, [[d.get(k) for k in keys] for d in group.phase_stragglers[:10]]))
        if group.arrival_collective:
            parts.append(f"<p>Arrival at {html.escape(group.arrival_collective)} over {group.arrival_steps:,} steps (aligned clocks)"
                         + (": last most often: " + html.escape(", ".join(f"rank {d['rank']} ({d['steps']} steps)" for d in group.last_arrivals[:5])) if group.last_arrivals else "") + "</p>")
        if group.arrival_stragglers:
            keys = list(group.arrival_stragglers[0])
            parts.append(_table(keys, [[d.get(k) for k in keys] for d in group.arrival_stragglers[:10]]))
    if getattr(summary, "slow_steps", None):  # slow steps next to a memory peak or a busy host (step_figures.py)
        parts.append("<h3>Slow steps and the machine</h3><ul>" + "".join(f"<li>{html.escape(note)}</li>" for note in summary.slow_steps) + "</ul>")
    if standouts:
        parts.append("<p>Ranks that stand out per phase (this report's rule: robust z of the rank's median ≥ "
                     f"{STANDOUT_Z:g}):</p>" + _table(["phase", "rank", "median ms", "robust z"], [list(s) for s in standouts[:20]]))
    if summary.clock is not None:
        parts.append(f"<p>Clocks: {html.escape(summary.clock.describe())}</p>")
    return "\n".join(parts)


_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; max-width: 1500px; }}
h1 {{ margin-bottom: 0.2em; }} h2 {{ margin-top: 1.6em; border-bottom: 1px solid #ddd; }}
.meta {{ color: #666; }} .warn {{ color: #b00; font-weight: bold; }}
pre {{ background: #f6f6f6; padding: 0.8em; overflow-x: auto; }}
table {{ border-collapse: collapse; margin: 0.5em 0; }} td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: right; }}
</style></head><body>"""
