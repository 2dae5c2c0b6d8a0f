"""Per-phase time by rank: one point per rank and phase, the ranks summarize names marked in red and
named.

Each rank's point is its median time per step in the phase (the total of its
completed spans of the phase that started in the step): the very figure the
straggler rule compares (`model.stragglers`), so a marked point is the one
summarize judged, never one the report judged on its own.
"""

from __future__ import annotations

import statistics
from typing import Any

from otel_titan.analysis.report.axes import FLAG, NEUTRAL, log_axis, plot_text
from otel_titan.analysis.report.data import NamedRank, ReportData

__all__ = ["phase_sections"]


def phase_sections(np: Any, data: ReportData) -> list[tuple[str, str, str, dict[str, Any]]]:
    """The per-phase figure (section, heading, explanation, figure), or none when no phase has a
    step."""
    if data.source is None:
        return []
    phases = {
        phase: (list(by_rank), [statistics.median(times) for times in by_rank.values()])
        for phase, by_rank in data.grid.phases_by_rank(data.source).items()
        if by_rank
    }
    if not phases:
        return []
    named = [n for n in data.named if n.source == data.source and n.phase is not None]
    return [
        (
            "phases",
            "Per-phase time by rank",
            "One point per rank and phase (its median time per step in the phase, as summarize "
            "compares them); "
            "the box spans the ranks' quartiles. Only the ranks summarize names as stragglers are "
            "marked (red) and named; the report applies no rule of its own.",
            _phase_figure(np, phases, named, plot_text(data.source)),
        )
    ]


def _phase_figure(
    np: Any, phases: dict[str, tuple[list[int], list[float]]], named: list[NamedRank], source: str
) -> dict[str, Any]:
    """Each phase a box of the ranks' medians with every rank drawn as a point; the ranks summarize
    names in red, named."""
    traces: list[dict[str, Any]] = []
    positive = [v for _, values in phases.values() for v in values if v and v > 0]
    floor = min(positive) if positive else 1e-3
    marks: dict[tuple[str | None, int], list[str]] = {}
    for n in named:
        marks.setdefault((n.phase, n.rank), []).append(n.why)
    flagged_x: list[str] = []
    flagged_y: list[float] = []
    flagged_text: list[str] = []
    for name, (rank_list, values) in phases.items():
        # a 0 ms median has no place on a log axis: drawn at the floor
        arr = np.maximum(np.asarray(values, dtype=float), floor)
        label = plot_text(name)
        traces.append(
            {
                "type": "box",
                "y": np.round(arr, 4).tolist(),
                "x": [label] * len(arr),
                "name": label,
                "boxpoints": "all",
                "jitter": 0.5,
                "pointpos": 0,
                "text": [f"rank {r}" for r in rank_list],
                "marker": {"color": NEUTRAL, "size": 4, "opacity": 0.7},
                "line": {"color": NEUTRAL, "width": 1.5},
                "fillcolor": "rgba(0,0,0,0)",
                "hovertemplate": "%{text}: %{y:.3f} ms<extra></extra>",
                "showlegend": False,
            }
        )
        for rank, value in zip(rank_list, arr):
            if (name, rank) in marks:
                flagged_x.append(label)
                flagged_y.append(round(float(value), 4))
                flagged_text.append(f"rank {rank}")
    if flagged_x:
        traces.append(
            {
                "type": "scatter",
                "x": flagged_x,
                "y": flagged_y,
                "mode": "markers+text",
                "name": "named by summarize",
                "text": flagged_text,
                "textposition": "middle right",
                "textfont": {"color": FLAG},
                "marker": {
                    "color": FLAG,
                    "size": 11,
                    "symbol": "diamond-open",
                    "line": {"width": 2, "color": FLAG},
                },
                "hovertemplate": "%{text}: %{y:.3f} ms<extra>named by summarize</extra>",
            }
        )
    every = [v for _, values in phases.values() for v in values]
    axis = log_axis(floor, max(max(every), floor))
    axis["title"] = {"text": "ms (log scale)"}
    red = "; red: the ranks summarize names" if flagged_x else "; summarize names no rank here"
    layout = {
        "title": {"text": f"Per-phase time by rank ({source}): each rank's median per step{red}"},
        "yaxis": axis,
        "height": 520,
        "showlegend": bool(flagged_x),
    }
    return {"data": traces, "layout": layout}
