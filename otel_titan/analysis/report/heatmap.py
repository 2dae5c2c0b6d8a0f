"""The heatmaps of ranks × steps: step time, and the time each rank took to reach the step-closing
collective.

Why two: in synchronous training every rank's step time is the same (all wait
for the last), so a slow host shows as a band and a periodic stall as a
column in the first, but a straggler shows as a row only in the second.
Big runs are binned (steps first, then ranks, until `max_cells` fit); a bin
shows its *slowest* value, so one slow rank or step is never averaged away.
Each figure is a plain dict, as Plotly.js takes it (`page` draws it).
"""

from __future__ import annotations

from typing import Any

from otel_titan.analysis.report.axes import heatmap_bins, integer_axis, plot_text
from otel_titan.analysis.report.data import ReportData

__all__ = ["heatmap_sections"]

#: Plotly's "Viridis" colour scale as its figures spell it out
#: (``plotly.colors.sequential.Viridis``, evenly spaced); Plotly.js's own differs.
VIRIDIS = [
    [0.0, "#440154"],
    [0.1111111111111111, "#482878"],
    [0.2222222222222222, "#3e4989"],
    [0.3333333333333333, "#31688e"],
    [0.4444444444444444, "#26828e"],
    [0.5555555555555556, "#1f9e89"],
    [0.6666666666666666, "#35b779"],
    [0.7777777777777778, "#6ece58"],
    [0.8888888888888888, "#b5de2b"],
    [1.0, "#fde725"],
]


def heatmap_sections(
    np: Any, data: ReportData, max_cells: int
) -> tuple[list[tuple[str, str, str, dict[str, Any]]], str]:
    """The step-time heatmap and, with a step-closing collective, the arrival heatmap (section,
    heading, explanation, figure); and the binning in words."""
    if data.first_step is None or data.source is None:
        return [], "no binning"
    grid, source = data.grid, data.source
    shown = plot_text(source)
    max_rank = grid.source_ranks(source) or 0
    rank_bin, step_bin = heatmap_bins(max_rank + 1, data.steps, max_cells)
    binning = (
        f"heatmap bins: {step_bin} steps x {rank_bin} ranks per cell"
        if rank_bin * step_bin > 1
        else "heatmap: one cell per rank and step"
    )
    shape = (max_rank // rank_bin + 1, (data.steps - 1) // step_bin + 1)
    bins = f" ({binning}; each cell the slowest of its bin)" if rank_bin * step_bin > 1 else ""
    out = [
        (
            "heatmap",
            "Step time by rank",
            "Each row a rank, each column a step: a slow host is a band, a periodic stall a "
            "column. "
            "Step time: the step's first record to the next step's first (as summarize); colours "
            "clipped at the 99.5th percentile.",
            _heatmap(
                np,
                _binned(
                    np, grid.rows(grid.step_ms, source), shape, data.first_step, rank_bin, step_bin
                ),
                data.first_step,
                rank_bin,
                step_bin,
                f"Step time by rank ({shown}){bins}",
            ),
        )
    ]
    anchor = grid.anchor
    arrivals = grid.rows(grid.arrival_ms, source) if anchor else []
    if arrivals:
        out.append(
            (
                "arrival",
                "Arrival at the step-closing collective",
                f"Time from the step's start to the rank's arrival at {anchor} (the step-closing "
                "collective, each rank on its own clock): "
                "a straggler is a bright row; a rank that arrives early waits for the others.",
                _heatmap(
                    np,
                    _binned(np, arrivals, shape, data.first_step, rank_bin, step_bin),
                    data.first_step,
                    rank_bin,
                    step_bin,
                    f"Time to reach {plot_text(anchor)} by rank ({shown}){bins}",
                ),
            )
        )
    return out, binning


def _binned(
    np: Any,
    rows: list[tuple[int, dict[int, float]]],
    shape: tuple[int, int],
    first_step: int,
    rank_bin: int,
    step_bin: int,
) -> Any:
    """The ranks × steps grid of `rows` ((rank, step → ms)): each bin the largest value in it,
    rounded to 0.1 ms (the file stays small); NaN where none."""
    grid = np.full(shape, -np.inf)
    for rank, steps in rows:  # a row at a time: no copy of the whole grid as Python objects
        row = rank // rank_bin
        if not 0 <= row < shape[0]:
            continue
        columns = (
            np.fromiter(steps.keys(), dtype=np.int64, count=len(steps)) - first_step
        ) // step_bin
        values = np.fromiter(steps.values(), dtype=np.float64, count=len(steps))
        inside = (columns >= 0) & (columns < shape[1])
        np.maximum.at(grid[row], columns[inside], values[inside])
    grid = grid.astype(np.float32)
    grid[np.isneginf(grid)] = np.nan
    return np.round(grid, 1)


def _heatmap(
    np: Any, grid: Any, first_step: int, rank_bin: int, step_bin: int, title: str
) -> dict[str, Any]:
    """A ranks × steps heatmap of a binned grid, its colours clipped at the 0.5th and 99.5th
    percentiles (NaN: no value, drawn as a gap)."""
    shape = grid.shape
    finite = grid[np.isfinite(grid)]
    trace: dict[str, Any] = {
        "type": "heatmap",
        "z": _typed_array(grid),
        "x": (first_step + np.arange(shape[1]) * step_bin).tolist(),
        "y": (np.arange(shape[0]) * rank_bin).tolist(),
        "colorscale": VIRIDIS,
        "colorbar": {"title": {"text": "ms"}},
        "hovertemplate": (
            "step %{x}"
            + (f" (+{step_bin - 1})" if step_bin > 1 else "")
            + "<br>rank %{y}"
            + (f" (+{rank_bin - 1})" if rank_bin > 1 else "")
            + "<br>%{z:.1f} ms<extra></extra>"
        ),
    }
    if finite.size:
        trace["zmin"], trace["zmax"] = (
            float(np.percentile(finite, 0.5)),
            float(np.percentile(finite, 99.5)),
        )
    layout = {
        "title": {"text": title},
        "xaxis": {
            "title": {"text": "step"},
            **integer_axis(first_step, shape[1] * step_bin, step_bin, ticks=15),
        },
        "yaxis": {
            "title": {"text": "rank"},
            "autorange": "reversed",
            **integer_axis(0, shape[0] * rank_bin, rank_bin),
        },
        "height": max(420, min(900, 120 + shape[0] * 3)),
    }
    return {"data": [trace], "layout": layout}


def _typed_array(grid: Any) -> dict[str, str]:
    """A float32 grid as Plotly.js's typed array (its bytes in base64, with dtype and shape), as
    Plotly.py wrote it.

    A cell as text is a long decimal (``114.5999984741211``): on 1,024 ranks × 50 steps the page
    grew by a fifth, and its JSON took forty times longer to write. NaN (no value) stays NaN in the
    bytes.
    """
    import base64

    return {
        "dtype": "f4",
        "bdata": base64.b64encode(grid.astype("<f4").tobytes()).decode("ascii"),
        "shape": f"{grid.shape[0]},{grid.shape[1]}",
    }
