"""The scalars over steps (loss, learning rate, ...): per step the min, median and max across ranks.

From the model's `model.scalar_steps` (the first `SERIES_KEPT` names, every
rank's finite values per step); above `MAX_SCALAR_POINTS` steps a point
stands for a bin of steps (its min, median and max over the bin's values).
"""

from __future__ import annotations

import statistics
from typing import Any

from otel_titan.analysis.model.scalar_steps import SERIES_KEPT
from otel_titan.analysis.report.axes import (
    NEUTRAL,
    NEUTRAL_FILL,
    bin_size,
    integer_axis,
    plot_text,
    value_axis,
)
from otel_titan.analysis.report.data import ReportData

__all__ = ["scalar_sections", "MAX_SCALAR_POINTS", "MAX_SCALARS"]

#: Points per scalar line at most (steps are binned above it).
MAX_SCALAR_POINTS = 2000
#: Scalars drawn at most (the first by name): as many as the model keeps.
MAX_SCALARS = SERIES_KEPT


def scalar_series(
    steps: dict[int, Any], points: int = MAX_SCALAR_POINTS
) -> tuple[list[int], list[float], list[float], list[float], int]:
    """(first step of each point, min, median, max, steps per point) of one scalar: step → its
    values.

    Example:
        >>> scalar_series({1: [1.0, 3.0], 2: [2.0], 3: [5.0, 7.0, 6.0]}, points=2)
        ([1, 3], [1.0, 5.0], [2.0, 6.0], [3.0, 7.0], 2)
    """
    first, last = min(steps), max(steps)
    width = bin_size(last - first + 1, points)
    bins: dict[int, list[float]] = {}
    for step in sorted(steps):
        bins.setdefault(first + (step - first) // width * width, []).extend(steps[step])
    at = sorted(bins)
    return (
        at,
        [min(bins[s]) for s in at],
        [statistics.median(bins[s]) for s in at],
        [max(bins[s]) for s in at],
        width,
    )


def scalar_sections(data: ReportData) -> list[tuple[str, str, str, dict[str, Any]]]:
    """One figure per scalar (section ``scalar-N``), the first `MAX_SCALARS` by name."""
    out = []
    series = {name: steps for name, steps in data.grid.scalars.items() if steps}
    for index, name in enumerate(sorted(series)[:MAX_SCALARS]):
        at, lows, medians, highs, width = scalar_series(series[name])
        traces = [
            {
                "type": "scatter",
                "x": at,
                "y": highs,
                "mode": "lines",
                "line": {"width": 0},
                "name": "max",
                "showlegend": False,
                "hovertemplate": "max %{y:.4g}<extra></extra>",
            },
            {
                "type": "scatter",
                "x": at,
                "y": lows,
                "mode": "lines",
                "line": {"width": 0},
                "fill": "tonexty",
                "fillcolor": NEUTRAL_FILL,
                "name": "min..max across ranks",
                "hovertemplate": "min %{y:.4g}<extra></extra>",
            },
            {
                "type": "scatter",
                "x": at,
                "y": medians,
                "mode": "lines+markers" if len(at) <= 60 else "lines",
                "line": {"color": NEUTRAL},
                "marker": {"size": 4},
                "name": "median across ranks",
                "hovertemplate": "median %{y:.4g}<extra></extra>",
            },
        ]
        low, high = float(min(lows)), float(max(highs))
        constant = f" (constant: {low:.6g})" if low == high else ""
        first, last = min(series[name]), max(series[name])
        layout: dict[str, Any] = {
            "title": {
                "text": f"{plot_text(name)} over steps: median and min..max across ranks{constant}"
                + (f" ({width} steps per point)" if width > 1 else "")
            },
            "xaxis": {"title": {"text": "step"}, **integer_axis(int(first), int(last - first + 1))},
            "height": 360,
        }
        yaxis = value_axis(low, high)
        if yaxis:  # an empty axis is no setting (Plotly's own figures drop it)
            layout["yaxis"] = yaxis
        out.append(
            (f"scalar-{index}", "Scalars over steps", "", {"data": traces, "layout": layout})
        )
    return out
