"""What the report draws, from the model built by one read (`model.collect.read_model`): the
summary, the grid, the ranks it names.

Why: the report runs no rule of its own. Its numbers are the model's
(`model.step_grid`: step times, arrivals, phase times per rank and step, the
scalars), its verdicts summarize's (`named_ranks`): a rank is marked or
named only where summarize names it, so the page and the terminal never
disagree about who is slow (a second rule over 64 ranks × 6 phases once named
somebody on every clean run).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from otel_titan.analysis.model.facts import RunSummary
from otel_titan.analysis.model.step_grid import StepGrid
from otel_titan.analysis.query.sql import INSTALL_HINT, MissingDependencyError

if TYPE_CHECKING:
    from importlib.abc import Traversable  # importlib.resources.abc from Python 3.11 on

__all__ = [
    "NamedRank",
    "ReportData",
    "named_ranks",
    "require_plotly",
    "plotly_js",
    "plotly_template",
]


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

    Example (a healthy run: no rank is named):
        >>> from otel_titan.analysis import summarize_run
        >>> [n.rank for n in named_ranks(summarize_run("outputs"))]
        []
    """
    named: list[NamedRank] = []
    for group in summary.stragglers:
        for rank in group.straggler_ranks:
            named.append(NamedRank(group.source, group.attempt, rank, None, "slower steps"))
        for row in group.phase_stragglers:
            if row.get("straggler", True) and row.get("rank") is not None:
                named.append(
                    NamedRank(
                        group.source,
                        group.attempt,
                        row["rank"],
                        row.get("phase"),
                        f"slower {row.get('phase')}",
                    )
                )
        for row in group.arrival_stragglers:
            if row.get("straggler", True) and row.get("rank") is not None:
                named.append(
                    NamedRank(
                        group.source,
                        group.attempt,
                        row["rank"],
                        group.arrival_collective,
                        f"last to arrive at {group.arrival_collective}",
                    )
                )
    hang = getattr(summary, "hang", None)
    for suspect in getattr(hang, "suspects", None) or []:
        if suspect.rank is not None:
            named.append(NamedRank(suspect.source, None, suspect.rank, None, "hang suspect"))
    return named


@dataclass
class ReportData:
    """The run as the report shows it: `source` (the one with most processes: training, usually),
    its ranks and steps, the named ranks."""

    summary: RunSummary
    grid: StepGrid
    named: list[NamedRank]
    source: str | None
    ranks: int
    first_step: int | None
    last_step: int | None

    @classmethod
    def of(cls, summary: RunSummary, grid: StepGrid) -> ReportData:
        """The report's data from a model (`model.collect.read_model`'s summary and grid)."""
        counts: dict[str, int] = {}
        for process in summary.processes:
            counts[process.source] = counts.get(process.source, 0) + 1
        source = min(counts, key=lambda s: (-counts[s], s)) if counts else None
        ranks = len(
            {p.rank for p in summary.processes if p.source == source and p.rank is not None}
        )
        first, last = grid.source_steps(source) if source is not None else (None, None)
        return cls(
            summary=summary,
            grid=grid,
            named=named_ranks(summary),
            source=source,
            ranks=ranks,
            first_step=first,
            last_step=last,
        )

    @property
    def steps(self) -> int:
        """How many steps the source spans (0 without steps)."""
        return (
            0
            if self.first_step is None or self.last_step is None
            else self.last_step - self.first_step + 1
        )


def require_plotly() -> Traversable:
    """Plotly's package data (``plotly/package_data``: its JavaScript and templates), or
    `MissingDependencyError` naming the extra to install.

    These files are all the report takes from Plotly: its figures are plain
    dicts (``{"data": [...], "layout": {...}}``, what Plotly.js takes), so
    neither ``plotly.graph_objects`` nor ``plotly.io`` is imported (on a
    second report of a 1,024-rank run they were ~0.2 s of imports and ~0.28 s
    of validation and copies).
    """
    try:
        # imports only plotly's own (lazy) __init__
        files = importlib.resources.files("plotly") / "package_data"
    except ImportError as error:
        raise MissingDependencyError(
            f"`otel-titan report` needs Plotly, which is not installed: {INSTALL_HINT} (or pip "
            "install plotly)"
        ) from error
    if not (files / "plotly.min.js").is_file():
        raise MissingDependencyError(
            "`otel-titan report` needs Plotly's JavaScript, which its installation lacks: "
            f"{INSTALL_HINT} (or pip install plotly)"
        )
    return files


def plotly_js() -> str:
    """Plotly.js as Plotly ships it: ``package_data/plotly.min.js``, the text
    `plotly.offline.get_plotlyjs` reads (read again for each page)."""
    return (require_plotly() / "plotly.min.js").read_bytes().decode("utf-8")


@functools.cache
def plotly_template(name: str = "plotly_white") -> dict[str, Any]:
    """One of Plotly's templates as it ships it (``package_data/templates/<name>.json``), read once
    per process: shared, never to be changed.

    It is what ``update_layout(template="plotly_white")`` put in a figure's
    layout (the same values; only the keys' order differs).
    """
    template: dict[str, Any] = json.loads(
        (require_plotly() / "templates" / f"{name}.json").read_bytes()
    )
    return template
