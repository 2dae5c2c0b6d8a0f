"""`write_report`: read the run once (`model.collect.read_model`), draw every figure from that model
(plain dicts), write the page atomically."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from otel_titan.analysis.model.collect import read_model
from otel_titan.analysis.model.facts import RunSummary
from otel_titan.analysis.model.step_grid import StepGrid
from otel_titan.analysis.read.cache_folder import make_private_folders
from otel_titan.analysis.read.records import find_log_dir
from otel_titan.analysis.read.selection import RunSelection
from otel_titan.analysis.report.data import ReportData, require_plotly
from otel_titan.analysis.report.findings import clock_sections
from otel_titan.analysis.report.heatmap import heatmap_sections
from otel_titan.analysis.report.page import page_html
from otel_titan.analysis.report.phases import phase_sections
from otel_titan.analysis.report.scalars import scalar_sections

__all__ = ["ReportResult", "draw_report", "write_report", "run_dir"]


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
    jobs: int | None = None,
    scheduler: str | None = None,
    cache: bool = True,
) -> ReportResult:
    """Write the report of the run at `path` (default ``RUN_DIR/analysis/report.html``); returns
    what was written.

    The run is read once, as ``summarize`` reads it (`jobs`, `scheduler`:
    where the per-file work runs), and every figure and verdict comes from
    that one model. Raises as `summarize_run`, and `MissingDependencyError`
    without Plotly (before anything is read).
    `cache`: use and keep the analysis cache (docs/analysis.md), as ``summarize`` and ``sql`` do
    (False: ``--no-cache``). `RunAnalysis.report` draws the same page from a model it holds.
    """
    require_plotly()
    started = time.monotonic()
    say = progress or (lambda text: None)
    say("reading the run ...")
    selection = RunSelection.of(
        path,
        run_id=run_id,
        align=align,
        ranks=ranks,
        sources=sources,
        jobs=jobs,
        scheduler=scheduler,
        cache=cache,
    )
    summary, grid = read_model(selection)
    return draw_report(summary, grid, path, output, max_cells=max_cells, say=say, started=started)


def draw_report(
    summary: RunSummary,
    grid: StepGrid,
    path: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    max_cells: int = 200_000,
    say: Callable[[str], None] = lambda text: None,
    started: float | None = None,
) -> ReportResult:
    """Draw and write the report of a model already read (`read_model`'s summary and grid of the
    run at `path`); `started` (``time.monotonic()``) is when the reading began, for the seconds
    reported."""
    import numpy as np  # only when a report is written: the CLI starts without it

    require_plotly()
    started = time.monotonic() if started is None else started
    data = ReportData.of(summary, grid)
    say("drawing ...")
    # In the order a person needs them: step time, arrival, phases, scalars; the findings then the
    # clocks (page.py).
    heatmaps, binning = heatmap_sections(np, data, max_cells)
    figures = heatmaps + phase_sections(np, data) + scalar_sections(data) + clock_sections(summary)
    page = page_html(path, data, figures)
    out = (
        os.fspath(output)
        if output is not None
        else os.path.join(run_dir(path), "analysis", "report.html")
    )
    # 0700 where made: the page names the run's hosts
    make_private_folders(os.path.dirname(os.path.abspath(out)))
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(page)
    os.replace(tmp, out)
    return ReportResult(
        path=out,
        bytes=os.path.getsize(out),
        figures=len(figures),
        ranks=data.ranks,
        steps=data.steps,
        binning=binning,
        seconds=time.monotonic() - started,
    )


def run_dir(path: str | os.PathLike[str]) -> str:
    """The run directory of `path` (as ``export`` places ``analysis/``)."""
    return find_log_dir(path)[0]
