"""`otel-titan report`: one self-contained HTML file with the pictures of a run.

Why: people would rather look than read. A heatmap of step time by rank
shows a straggler (a row), a slow host (a band of 8 rows), a periodic stall
(columns) at a glance, where a table needs study. The file is for a laptop
on a train: Plotly's JavaScript is embedded once, nothing is fetched (no CDN,
no fonts, no MathJax), and big runs are binned so it stays small and opens
quickly: at most `max_cells` heatmap cells (steps, then ranks, grouped into
bins; a bin shows its *slowest* step time, so one slow rank or step is never
averaged away).

The data come from the SQL views (`sql.open_run`: spans, steps, scalars) and
every verdict from ``summarize`` (`model.collect.summarize_run`: the headline, the
Hang section, the stragglers, the clock offsets). The report runs no rule of
its own: a rank is marked or named only where summarize names it, so the
page and the terminal never disagree about who is slow (a second rule over
64 ranks × 6 phases would name somebody on every clean run).

The report is made to be shared, and every string in it (span, scalar and
source names, tags, file names, host names) comes from files anyone with
write access to the run could have written. So: HTML text and attributes
are escaped (`html.escape`); text Plotly draws is escaped too (Plotly reads
``<b>``, ``<a href>`` and entities in its labels); the figures' JSON sits in
inline scripts with ``<``, ``>``, ``&`` and the JavaScript line separators
written as ``\\uXXXX`` escapes (`_script_json`), so no string can close the
script; element ids are made here, never from the data; and the page's
Content-Security-Policy allows only the scripts written here, by their
SHA-256, so even a missed escape could not run an injected script.

Contents, in the order a person needs them: the headline and Hang section
(summarize's text); step time as a heatmap of ranks × steps; arrival at the
step-closing collective; per-phase time by rank (one point per rank, the
ranks summarize names marked and named); the scalars over steps (min,
median and max across ranks); the straggler and clock-offset findings.
"""

from __future__ import annotations

import base64
import hashlib
import html
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from otel_titan.analysis.model.hang import format_hang
from otel_titan.analysis.model.headline import headline_data, headline_lines
from otel_titan.analysis.read.records import find_log_dir
from otel_titan.analysis.query.sql import INSTALL_HINT, MissingDependencyError, open_run
from otel_titan.analysis.model.collect import summarize_run
from otel_titan.analysis.model.wording import plural

__all__ = ["ReportResult", "NamedRank", "named_ranks", "write_report", "bin_size"]

#: Points per scalar line at most (steps are binned above it).
MAX_SCALAR_POINTS = 2000
#: Scalars drawn at most (the first by name).
MAX_SCALARS = 12
#: Colours: one neutral colour for everything that is not a finding; red only for what summarize names.
NEUTRAL = "#5b7083"
NEUTRAL_FILL = "rgba(91,112,131,0.25)"
FLAG = "#d62728"


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


@dataclass(frozen=True)
class NamedRank:
    """One rank that summarize names, and why: the only ranks the report marks or names.

    `phase` is the span name the finding is about (a phase straggler, or the
    step-closing collective for the last to arrive at it), None for slower
    steps and hangs.
    """

    source: str
    attempt: int | None
    rank: int
    phase: str | None
    why: str


def named_ranks(summary: Any) -> list[NamedRank]:
    """The ranks summarize names (stragglers: steps, phases, arrival; hang suspects), in its order.

    Example:
        >>> # [n.rank for n in named_ranks(summarize_run("outputs"))]
    """
    named: list[NamedRank] = []
    for group in summary.stragglers:
        for rank in group.straggler_ranks:
            named.append(NamedRank(group.source, group.attempt, rank, None, "slower steps"))
        for row in group.phase_stragglers:
            if row.get("straggler", True) and row.get("rank") is not None:
                named.append(NamedRank(group.source, group.attempt, row["rank"], row.get("phase"), f"slower {row.get('phase')}"))
        for row in group.arrival_stragglers:
            if row.get("straggler", True) and row.get("rank") is not None:
                named.append(NamedRank(group.source, group.attempt, row["rank"], group.arrival_collective, f"last to arrive at {group.arrival_collective}"))
    hang = getattr(summary, "hang", None)
    for suspect in getattr(hang, "suspects", None) or []:
        if suspect.rank is not None:
            named.append(NamedRank(suspect.source, None, suspect.rank, None, "hang suspect"))
    return named


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


def _nice(step: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at or above `step`.

    Example:
        >>> _nice(0.3), _nice(3), _nice(7), _nice(11)
        (1, 5, 10, 20)
    """
    base = 1
    while True:
        for factor in (1, 2, 5):
            if base * factor >= step:
                return base * factor
        base *= 10


def integer_axis(first: int, count: int, unit: int = 1, ticks: int = 12) -> dict[str, Any]:
    """An axis of whole numbers (ranks, steps) from `first`, `count` items of width `unit`: ticks only on integers.

    Plotly's automatic ticks put 2 ranks at −0.5, 0, 0.5, 1, 1.5; a rank or a
    step has no halves.

    Example:
        >>> integer_axis(0, 2)
        {'tickmode': 'linear', 'tick0': 0, 'dtick': 1, 'tickformat': 'd'}
    """
    dtick = unit * _nice(max(1, count) * 1.0 / ticks)
    tick0 = first if dtick == unit else 0
    return {"tickmode": "linear", "tick0": tick0, "dtick": dtick, "tickformat": "d"}


def log_axis(low: float, high: float) -> dict[str, Any]:
    """A log axis over [`low`, `high`] (> 0) labelled at the powers of ten only, from the one at or below `low` to the one at or above `high`.

    Plotly's own log ticks label 2 and 5 between the decades in small type, which
    reads as 2 ms and 5 ms where 20 and 50 are meant.

    Example:
        >>> log_axis(2.5, 40)["tickvals"], log_axis(2.5, 40)["ticktext"]
        ([1, 10, 100], ['1', '10', '100'])
    """
    lo = math.floor(math.log10(low))
    hi = math.ceil(math.log10(high))
    if hi == lo:
        hi += 1
    values = [10.0**k for k in range(lo, hi + 1)]
    return {
        "type": "log",
        "range": [lo - 0.05, hi + 0.05],
        "tickvals": [int(v) if v >= 1 else v for v in values],
        "ticktext": [f"{v:,.0f}" if v >= 1 else f"{v:g}" for v in values],
    }


def value_axis(low: float, high: float) -> dict[str, Any]:
    """A linear axis for values in [`low`, `high`]; a constant series gets a range around its value, not Plotly's −1…1.

    Example:
        >>> value_axis(0.001, 0.001)["range"]
        [0.0005, 0.0015]
        >>> value_axis(1, 2)
        {}
    """
    if not (math.isfinite(low) and math.isfinite(high)) or high > low:
        return {}
    half = abs(low) * 0.5 if low != 0 else 1.0
    return {"range": [low - half, low + half]}


def _plot_text(text: Any) -> str:
    """`text` for a Plotly label, shown as written: Plotly reads ``<br>``, ``<b>``, ``<a href>`` and entities in labels."""
    return html.escape(str(text), quote=False)


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
    cache: bool = True,
) -> ReportResult:
    """Write the report of the run at `path` (default ``RUN_DIR/analysis/report.html``); returns what was written.

    `cache`: use and keep the analysis cache (docs/analysis.md), as ``summarize`` and ``sql`` do (False: ``--no-cache``).
    """
    import numpy as np  # noqa: PLC0415 - only when a report is written: the CLI starts without it

    go = _require_plotly()

    started = time.monotonic()
    say = progress or (lambda text: None)
    say("reading the run (SQL) ...")
    db = open_run(path, run_id=run_id, align=align, ranks=ranks, sources=sources, cache=cache)
    db.load()
    say("summarizing ...")
    summary = summarize_run(path, ranks=ranks, sources=sources, run_id=db.choice.run_id if db.choice else run_id, align=align, cache=cache)
    named = named_ranks(summary)
    con = db.con
    say("drawing ...")
    # The source drawn: the one with most processes (training, usually).
    source_row = con.execute("SELECT source, count(*) FROM process_info GROUP BY source ORDER BY 2 DESC, 1 LIMIT 1").fetchone()
    source = source_row[0] if source_row else None
    n_ranks = con.execute("SELECT count(DISTINCT rank) FROM process_info WHERE source = ?", [source]).fetchone()[0]
    first_step, last_step = con.execute("SELECT min(step), max(step) FROM steps WHERE source = ? AND rank IS NOT NULL", [source]).fetchone()
    figures: list[tuple[str, str, str, Any]] = []  # (section, heading, explanation, figure)
    binning = "no binning"
    shown_source = _plot_text(source)

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
        figures.append(("heatmap", "Step time by rank", "Each row a rank, each column a step: a slow host is a band, a periodic stall a column. "
                        "Step time: first record of step N to the first of step N+1 (as summarize); colours clipped at the 99.5th percentile.",
                        _heatmap(go, np, cells, shape, first_step, rank_bin, step_bin, f"Step time by rank ({shown_source}){bins}")))
        if anchor:
            arrival = con.execute(
                """WITH a AS (SELECT rank, step, min(start_us) AS arrive FROM spans
                              WHERE source = $source AND name = $anchor AND parent_span_id IS NULL AND step IS NOT NULL AND rank IS NOT NULL GROUP BY ALL)
                   SELECT a.rank // $rb AS rb, (a.step - $first) // $sb AS sb, max((a.arrive - s.start_us) / 1000.0) AS ms
                   FROM a JOIN steps s ON s.source = $source AND s.rank = a.rank AND s.step = a.step GROUP BY ALL""",
                {**params, "anchor": anchor}).fetchnumpy()
            if len(arrival["ms"]):
                figures.append(("arrival", "Arrival at the step-closing collective",
                                f"Time from the step's start to the rank's arrival at {anchor} (the step-closing collective, aligned clocks): "
                                "a straggler is a bright row; a rank that arrives early waits for the others.",
                                _heatmap(go, np, arrival, shape, first_step, rank_bin, step_bin, f"Time to reach {_plot_text(anchor)} by rank ({shown_source}){bins}")))

    # 2. Per-phase time by rank: one point per rank (its median), the ranks summarize names marked.
    per_rank = con.execute(
        "SELECT name, rank, median(duration_ms) AS ms FROM spans WHERE source = ? AND NOT incomplete AND rank IS NOT NULL GROUP BY ALL ORDER BY name, rank",
        [source]).fetchall()
    phases: dict[str, tuple[list[int], list[float]]] = {}
    for name, rank, ms in per_rank:
        entry = phases.setdefault(name, ([], []))
        entry[0].append(rank)
        entry[1].append(ms)
    if phases:
        figures.append(("phases", "Per-phase time by rank", "One point per rank and phase (its median span time); the box spans the ranks' quartiles. "
                        "Only the ranks summarize names as stragglers are marked (red) and named; the report applies no rule of its own.",
                        _phase_figure(go, np, phases, [n for n in named if n.source == source and n.phase is not None], shown_source)))

    # 3. Scalars over steps: min / median / max across ranks (steps binned above MAX_SCALAR_POINTS).
    names = [r[0] for r in con.execute("SELECT DISTINCT name FROM scalars WHERE name IS NOT NULL ORDER BY 1").fetchall()]
    for index, name in enumerate(names[:MAX_SCALARS]):
        lo, hi = con.execute("SELECT min(step), max(step) FROM scalars WHERE name = ? AND step IS NOT NULL", [name]).fetchone()
        if lo is None:
            continue
        sb = bin_size(hi - lo + 1, MAX_SCALAR_POINTS)
        data = con.execute(
            """SELECT $lo + (step - $lo) // $sb * $sb AS s, min(value) AS lo, median(value) AS med, max(value) AS hi
               FROM scalars WHERE name = $name AND step IS NOT NULL AND isfinite(value) GROUP BY 1 ORDER BY 1""",
            {"lo": lo, "sb": sb, "name": name}).fetchnumpy()
        if not len(data["s"]):
            continue
        fig = go.Figure([
            go.Scatter(x=data["s"], y=data["hi"], mode="lines", line={"width": 0}, name="max", showlegend=False, hovertemplate="max %{y:.4g}<extra></extra>"),
            go.Scatter(x=data["s"], y=data["lo"], mode="lines", line={"width": 0}, fill="tonexty", fillcolor=NEUTRAL_FILL, name="min..max across ranks",
                       hovertemplate="min %{y:.4g}<extra></extra>"),
            go.Scatter(x=data["s"], y=data["med"], mode="lines+markers" if len(data["s"]) <= 60 else "lines", line={"color": NEUTRAL}, marker={"size": 4},
                       name="median across ranks", hovertemplate="median %{y:.4g}<extra></extra>"),
        ])
        low, high = float(np.min(data["lo"])), float(np.max(data["hi"]))
        constant = f" (constant: {low:.6g})" if low == high else ""
        fig.update_layout(title=f"{_plot_text(name)} over steps: median and min..max across ranks{constant}" + (f" ({sb} steps per point)" if sb > 1 else ""),
                          xaxis={"title": {"text": "step"}, **integer_axis(int(lo), int(hi - lo + 1))}, yaxis=value_axis(low, high), height=360)
        figures.append((f"scalar-{index}", "Scalars over steps", "", fig))

    # 4. Clock offsets per host (summarize's alignment).
    clock = summary.clock
    if clock is not None and clock.applied and clock.offsets_us:
        hosts = sorted(clock.offsets_us)
        bar = go.Figure(go.Bar(x=[_plot_text(h) for h in hosts], y=[round(clock.offsets_us[h] / 1000, 3) for h in hosts], marker={"color": NEUTRAL},
                               hovertemplate="%{x}: %{y:.3f} ms<extra></extra>"))
        bar.update_layout(title="Clock offset per host (subtracted from its times to align them)", yaxis_title="ms", height=360)
        figures.append(("clocks", "Clock offsets", clock.describe(), bar))

    page = _page(path, db, summary, named, figures, n_ranks, first_step, last_step)
    out = os.fspath(output) if output is not None else os.path.join(db_run_dir(path), "analysis", "report.html")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(page)
    os.replace(tmp, out)
    db.con.close()
    steps_seen = 0 if first_step is None else last_step - first_step + 1
    return ReportResult(path=out, bytes=os.path.getsize(out), figures=len(figures), ranks=n_ranks or 0, steps=steps_seen, binning=binning,
                        seconds=time.monotonic() - started)


def _phase_figure(go: Any, np: Any, phases: dict[str, tuple[list[int], list[float]]], named: list[NamedRank], source: str) -> Any:
    """Each phase a box of the ranks' medians with every rank drawn as a point; the ranks summarize names in red, named."""
    fig = go.Figure()
    positive = [v for _, values in phases.values() for v in values if v and v > 0]
    floor = min(positive) if positive else 1e-3
    marks: dict[tuple[str, int], list[str]] = {}
    for n in named:
        marks.setdefault((n.phase, n.rank), []).append(n.why)
    flagged_x: list[str] = []
    flagged_y: list[float] = []
    flagged_text: list[str] = []
    for name, (rank_list, values) in phases.items():
        arr = np.maximum(np.asarray(values, dtype=float), floor)  # a 0 ms median has no place on a log axis: drawn at the floor
        label = _plot_text(name)
        fig.add_trace(go.Box(
            y=np.round(arr, 4), x=[label] * len(arr), name=label, boxpoints="all", jitter=0.5, pointpos=0, text=[f"rank {r}" for r in rank_list],
            marker={"color": NEUTRAL, "size": 4, "opacity": 0.7}, line={"color": NEUTRAL, "width": 1.5}, fillcolor="rgba(0,0,0,0)",
            hovertemplate="%{text}: %{y:.3f} ms<extra></extra>", showlegend=False))
        for rank, value in zip(rank_list, arr):
            if (name, rank) in marks:
                flagged_x.append(label)
                flagged_y.append(round(float(value), 4))
                flagged_text.append(f"rank {rank}")
    if flagged_x:
        fig.add_trace(go.Scatter(
            x=flagged_x, y=flagged_y, mode="markers+text", name="named by summarize", text=flagged_text, textposition="middle right",
            textfont={"color": FLAG}, marker={"color": FLAG, "size": 11, "symbol": "diamond-open", "line": {"width": 2, "color": FLAG}},
            hovertemplate="%{text}: %{y:.3f} ms<extra>named by summarize</extra>"))
    every = [v for _, values in phases.values() for v in values]
    axis = log_axis(floor, max(max(every), floor))
    axis["title"] = {"text": "ms (log scale)"}
    red = "; red: the ranks summarize names" if flagged_x else "; summarize names no rank here"
    fig.update_layout(title=f"Per-phase time by rank ({source}): each rank's median{red}", yaxis=axis, height=520, showlegend=bool(flagged_x))
    return fig


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
    fig.update_layout(title=title, xaxis={"title": {"text": "step"}, **integer_axis(first_step, shape[1] * step_bin, step_bin, ticks=15)},
                      yaxis={"title": {"text": "rank"}, "autorange": "reversed", **integer_axis(0, shape[0] * rank_bin, rank_bin)},
                      height=max(420, min(900, 120 + shape[0] * 3)))
    return fig


def db_run_dir(path: str | os.PathLike[str]) -> str:
    """The run directory of `path` (as ``export`` places ``analysis/``)."""
    return find_log_dir(path)[0]


def _script_json(text: str) -> str:
    """JSON text made safe inside an inline ``<script>``: ``<``, ``>``, ``&`` and U+2028/9 as ``\\uXXXX`` escapes.

    These characters are only ever inside JSON strings, where the escapes
    mean the same characters, so the data are unchanged; but no string can
    now close the script (``</script>``) or open a comment (``<!--``).

    Example:
        >>> _script_json('{"name": "</script><script>x()</script>"}')
        '{"name": "\\\\u003c/script\\\\u003e\\\\u003cscript\\\\u003ex()\\\\u003c/script\\\\u003e"}'
    """
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text


def _figure_script(figure: Any, div_id: str) -> str:
    import plotly.io as pio  # noqa: PLC0415 - optional, checked by _require_plotly

    figure.update_layout(template="plotly_white", margin={"t": 60, "r": 30}, autosize=True)
    payload = _script_json(pio.to_json(figure, validate=False))
    config = '{"displaylogo": false, "responsive": true}'
    return f'(function () {{ var f = {payload}; Plotly.newPlot("{div_id}", f.data, f.layout, {config}); }})();'


def _table(headers: list[str], rows: list[list[Any]], classes: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table class='{classes}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    """A table cell's HTML: raw HTML only from `_Html` (made here), everything else escaped."""
    if isinstance(value, _Html):
        return value.text
    if isinstance(value, float):
        return html.escape(f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}")
    return "" if value is None else html.escape(str(value))


class _Html:
    """HTML made by the report itself (never from the records), kept as is in a table cell."""

    def __init__(self, text: str) -> None:
        self.text = text


def _rank(source: str, rank: int) -> _Html:
    """A rank named as a finding: marked up so that a reader (and a test) can find every rank the page names."""
    return _Html(f"<span class=named-rank data-source='{html.escape(source)}' data-rank='{int(rank)}'>rank {int(rank)}</span>")


def _ms(value: Any) -> str:
    return "" if value is None else f"{value:,.2f}"


def _findings(summary: Any) -> str:
    """summarize's straggler findings (`StragglerFinding`: step time, phases, arrival), each with its verdict and cost.

    Only a ``straggler`` verdict names (marks) its rank: a ``difference`` (fewer than three peers) or a ``cannot
    tell`` is shown as summarize shows it, blaming no one, and what summarize withheld is said with its reason.
    """
    parts = ["<h2 id=findings>Stragglers and clocks (summarize)</h2>"]
    kinds = {"step": "step time", "phase": "phase", "arrival": "arrival at"}
    for group in summary.stragglers:
        label = f"{group.source}" + (f", attempt {group.attempt}" if group.attempt else "")
        parts.append(f"<h3>{html.escape(label)}</h3>")
        step = f"median step time {group.median_step_ms:,.1f} ms over {plural(len(group.ranks), 'rank')}. " if group.median_step_ms is not None else ""
        findings = list(group.findings)
        named = [f for f in findings if f.verdict == "straggler"]
        parts.append(f"<p>{html.escape(step)}" + (f"summarize names {plural(len(named), 'straggler finding')}." if named else "summarize names no straggler in this group.") + "</p>")
        if findings:
            rows = []
            for f in findings[:40]:
                who: Any = _rank(group.source, f.rank) if f.verdict == "straggler" else f"rank {int(f.rank)}"
                pct = f" ({f.excess_pct:+.0f}%)" if f.excess_pct is not None else ""
                share = f"{100 * f.share_of_step:.1f}% of the step" if f.share_of_step is not None else ""
                look = "yes" if f.headline else (f.why_not_headline or "no")
                rows.append([f.verdict, f"{kinds.get(f.kind, f.kind)} {f.what}".strip(), who, _ms(f.median_ms), _ms(f.others_median_ms),
                             f"{f.excess_ms:+,.2f} ms{pct}", f"{f.cost_per_step_ms:,.2f} ms", f"{f.cost_run_ms / 1000:,.2f} s", share, look])
            parts.append(_table(["verdict", "what", "rank", "its median (ms)", "peers' median (ms)", "difference", "cost per step",
                                 "cost over the run", "share", "in Look first at"], rows))
        for reason in group.withheld:
            parts.append(f"<p>Withheld: {html.escape(str(reason))}</p>")
    if getattr(summary, "slow_steps", None):  # slow steps next to a memory peak or a busy host (step_figures.py)
        parts.append("<h3>Slow steps and the machine</h3><ul>" + "".join(f"<li>{html.escape(note)}</li>" for note in summary.slow_steps) + "</ul>")
    if getattr(summary, "config_drift", None):  # ranks whose logged configuration differs (config_drift.py)
        parts.append("<h3>Configuration drift</h3><ul>" + "".join(f"<li>{html.escape(note)}</li>" for note in summary.config_drift) + "</ul>")
    if summary.clock is not None:
        parts.append(f"<p>Clocks: {html.escape(summary.clock.describe())}</p>")
    return "\n".join(parts)


def _page(path: Any, db: Any, summary: Any, named: list[NamedRank], figures: list[tuple[str, str, str, Any]], n_ranks: int, first_step: Any, last_step: Any) -> str:
    """The HTML page: escaped text, figures drawn by scripts this page lists by hash in its Content-Security-Policy."""
    from plotly.offline import get_plotlyjs  # noqa: PLC0415 - optional, checked by _require_plotly

    scripts = [get_plotlyjs()]
    run_label = db.choice.run_id if db.choice and db.choice.run_id else os.fspath(path)
    body = ["<h1>otel-titan report</h1>"]
    steps = "no steps" if first_step is None else f"steps {first_step}–{last_step}"
    body.append(f"<p class=meta>{html.escape(os.path.abspath(os.fspath(path)))} · run {html.escape(str(db.choice.run_id if db.choice else ''))} · "
                f"{n_ranks:,} rank{'s' if n_ranks != 1 else ''} · {steps} · {db.processes:,} process{'es' if db.processes != 1 else ''} · "
                f"{db.total_bytes / 1e6:,.1f} MB of JSONL · written {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</p>")
    body.append("<h2 id=headline>Headline</h2>")
    if named:
        reasons: dict[tuple[str, int], list[str]] = {}
        for n in named:  # one entry per rank, its reasons together, in summarize's order
            reasons.setdefault((n.source, n.rank), []).append(n.why)
        who = ", ".join(f"{_rank(source, rank).text} ({html.escape(source)}: {html.escape('; '.join(why))})" for (source, rank), why in list(reasons.items())[:20])
        more = f" … {len(reasons) - 20} more" if len(reasons) > 20 else ""
        body.append(f"<p class=warn>summarize names: {who}{more}</p>")
    text = format_hang(summary.hang) + headline_lines(summary, headline_data(summary))
    body.append(f"<pre>{html.escape(chr(10).join(text))}</pre>")
    if not figures:
        body.append("<p>Nothing to draw: the run has no steps, no spans with ids and no scalars (see the headline).</p>")
    findings_done = False
    heading_done: set[str] = set()
    for index, (section, heading, explanation, fig) in enumerate(figures):
        if section == "clocks" and not findings_done:
            body.append(_findings(summary))
            findings_done = True
        if heading not in heading_done:
            anchor = "scalars" if section.startswith("scalar-") else section
            body.append(f"<h2 id={anchor}>{html.escape(heading)}</h2>")
            heading_done.add(heading)
        if explanation:
            body.append(f"<p>{html.escape(explanation)}</p>")
        div_id = f"fig-{section}"  # made here, never from the records
        height = int(fig.layout.height or 450)
        body.append(f'<div id="{div_id}" class="plotly-graph-div" style="height:{height}px; width:100%;"></div>')
        scripts.append(_figure_script(fig, div_id))
    if not findings_done:
        body.append(_findings(summary))
    # Each script follows the body it draws into; the policy names each by its hash, so nothing else runs.
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(s.encode('utf-8')).digest()).decode()}'" for s in scripts)
    head = _HEAD.format(title=html.escape(f"otel-titan report: {run_label}"), hashes=hashes)
    tail = "\n".join(f'<script type="text/javascript">{s}</script>' for s in scripts)
    return head + "\n" + "\n".join(body) + "\n" + tail + "\n</body></html>\n"


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
