"""The report's axes, bins and colours: whole-number ticks for ranks and steps, powers of ten on log
axes, bin widths.

Why a module: every figure bins and labels the same way (a rank or a step has
no halves; 2 ms and 5 ms between the decades read wrong), and Plotly's labels
read markup, so every record string drawn goes through `plot_text`.
"""

from __future__ import annotations

import html
import math
from typing import Any

__all__ = [
    "bin_size",
    "heatmap_bins",
    "integer_axis",
    "log_axis",
    "value_axis",
    "plot_text",
    "NEUTRAL",
    "NEUTRAL_FILL",
    "FLAG",
]

#: Colours: one neutral colour for everything that is not a finding; red only for what summarize
#: names.
NEUTRAL = "#5b7083"
NEUTRAL_FILL = "rgba(91,112,131,0.25)"
FLAG = "#d62728"


def bin_size(count: int, limit: int) -> int:
    """The smallest bin width that puts `count` items into at most `limit` bins.

    Example:
        >>> bin_size(10_000, 200), bin_size(150, 200), bin_size(1024, 256)
        (50, 1, 4)
    """
    return max(1, math.ceil(count / max(1, limit)))


def heatmap_bins(ranks: int, steps: int, max_cells: int) -> tuple[int, int]:
    """(rank bin, step bin): steps are binned first (down to 200 columns), then ranks, until the
    cells fit.

    Example:
        >>> heatmap_bins(64, 300, 1000), heatmap_bins(1024, 10_000, 200_000)
        ((11, 2), (2, 50))
    """
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
    """An axis of whole numbers (ranks, steps) from `first`, `count` items of width `unit`: ticks
    only on integers.

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
    """A log axis over [`low`, `high`] (> 0) labelled at the powers of ten only, from the one at or
    below `low` to the one at or above `high`.

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
    """A linear axis for values in [`low`, `high`]; a constant series gets a range around its value,
    not Plotly's −1…1.

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


def plot_text(text: Any) -> str:
    """`text` for a Plotly label, shown as written: Plotly reads ``<br>``, ``<b>``, ``<a href>`` and
    entities in labels.

    Example:
        >>> plot_text("<b>fwd</b>")
        '&lt;b&gt;fwd&lt;/b&gt;'
    """
    return html.escape(str(text), quote=False)
