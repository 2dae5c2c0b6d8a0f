"""`RunAnalysis`: one run, read once, asked one question per method.

Why a front object: the commands each answer one question, but a person in a
notebook (or a script deciding whether to requeue a job) asks several of the
same run: where did it stop, who is slow, how much did that cost. Reading a
1,024-rank run is the expensive part, so the model (`model.facts.RunSummary`:
per-process facts, steps, phases, clocks, the hang and straggler findings) is
built on the first question and every later question is answered from it, as
HTA's ``TraceAnalysis`` and Perfetto's ``TraceProcessor`` do. The questions
that need other data than the model (the trace, SQL) say so and read what
they need.

Example:
    >>> from otel_titan.analysis import RunAnalysis
    >>> run = RunAnalysis("outputs")
    >>> run.headline()["diagnosis"]      # what to look at first: nothing, in a healthy run
    []
    >>> run.hang() is None               # None unless the run stopped in a hang
    True
    >>> [(f.rank, f.cost_per_step_ms) for f in run.stragglers()]
    []
    >>> run.steps().source               # "rollups": the step table from the writer's rollups alone
    'rollups'
    >>> print(run.text())                # what `otel-titan summarize` prints
    Run outputs  (2 processes, logs in outputs/structured_logs)
    ...
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from functools import cached_property
from typing import Any

from otel_titan.analysis.export.checks import PERFETTO_MAX_TRACE_BYTES
from otel_titan.analysis.export.chrome_events import ExportStats
from otel_titan.analysis.export.chrome_trace import export_selected
from otel_titan.analysis.model.collect import read_model, tails_model
from otel_titan.analysis.model.facts import ProcessSummary, RunSummary, StragglerFinding
from otel_titan.analysis.model.hang import HangReport
from otel_titan.analysis.model.headline import headline_data
from otel_titan.analysis.model.step_grid import StepGrid
from otel_titan.analysis.model.step_table import StepTable, rows_from_collected, rows_from_rollups
from otel_titan.analysis.query.sql import RunDatabase, open_selected
from otel_titan.analysis.read.filters import StepRange
from otel_titan.analysis.read.rollups import scan_rollups
from otel_titan.analysis.read.runs import RunChoice
from otel_titan.analysis.read.selection import RunSelection
from otel_titan.analysis.report.data import require_plotly
from otel_titan.analysis.report.write import ReportResult, draw_report
from otel_titan.analysis.summarize.json_form import summary_json
from otel_titan.analysis.summarize.text import format_summary

__all__ = ["RunAnalysis", "RunSelection"]


class RunAnalysis:
    """A run folder (or its ``structured_logs/``) and the questions asked of it; the model is built
    once, on first use.

    `run` is the folder's path, or a `RunSelection` (what the CLI builds from
    its options: every command's answer comes through here). The other
    arguments select what is read, as the commands' options do, and narrow a
    given selection: `run_id` (``--run``; default: the latest run of the
    folder), `ranks`, `sources`, `align` (clock alignment across hosts),
    `jobs` / `scheduler` (``--jobs``, ``--scheduler``: where the per-file work
    runs), `cache` (False: ``--no-cache``; by default what the read learns is
    kept in the run's analysis cache and an earlier read's is used: a second
    `RunAnalysis` of an unchanged run does not read it again, of a grown one
    reads only what was appended; docs/analysis.md). And how the model is
    built: `tail` (``--tail``: only the ends of the files and the black boxes,
    for "where did each rank stop" in seconds on a huge run; step and phase
    questions are then unanswered), `steps` (``--steps A:B``: the stragglers
    judged on those steps only), `progress` (``progress(bytes_read,
    bytes_total)`` while the model is read). Raises ValueError for an option
    out of range (`RunSelection.of`).

    Example:
        >>> RunAnalysis("outputs", ranks=[0, 1]).hang() is None
        True
        >>> RunAnalysis(RunSelection.of("outputs"), ranks=[1]).selection.ranks
        (1,)
    """

    def __init__(
        self,
        run: str | os.PathLike[str] | RunSelection,
        *,
        run_id: str | None = None,
        ranks: Iterable[int] | None = None,
        sources: Iterable[str] | None = None,
        align: bool | None = None,
        jobs: int | None = None,
        scheduler: str | None = None,
        log_skipped: bool | None = None,
        cache: bool | None = None,
        tail: bool = False,
        steps: StepRange | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        given: dict[str, Any] = {
            name: value
            for name, value in (
                ("run_id", run_id),
                ("ranks", ranks),
                ("sources", sources),
                ("align", align),
                ("jobs", jobs),
                ("scheduler", scheduler),
                ("log_skipped", log_skipped),
                ("cache", cache),
            )
            if value is not None
        }
        self.selection = (
            run.with_(**given) if isinstance(run, RunSelection) else RunSelection.of(run, **given)
        )
        if tail and steps is not None:
            raise ValueError(
                "steps judges the stragglers, which tail does not read (it reads only the files' "
                "ends)"
            )
        self.tail = tail
        self.steps_window = steps
        self.progress = progress
        # The model's per (rank, step, phase) accumulators, kept when it is built: the step table
        # from the spans.
        self._collected: tuple[Any, Any, Any, Any] | None = None
        self._step_table: StepTable | None = None
        self._grid: StepGrid | None = None

    @property
    def path(self) -> str:
        """The run folder (or file) as given."""
        return self.selection.path

    @property
    def run_id(self) -> str | None:
        """The run asked for (None: the latest of the folder)."""
        return self.selection.run_id

    @cached_property
    def summary(self) -> RunSummary:
        """The model of the run (read on first use, then kept): what every other question is
        answered from."""
        if self.tail:
            return tails_model(self.selection)
        summary, self._grid = read_model(
            self.selection,
            progress=self.progress,
            on_collected=self._keep_steps,
            steps=self.steps_window,
        )
        return summary

    def choice(self) -> RunChoice:
        """Which run of the folder is read, and why (the latest, or the one asked for; the
        others): reads one line per process, not the model."""
        return self.selection.read(log_skipped=False)[1]

    def _keep_steps(self, collector: Any) -> None:
        self._collected = (
            collector.step_ms,
            collector.phase_step_ms,
            collector.phase_step_count,
            collector.closing,
        )

    def steps(self) -> StepTable:
        """Per (source, attempt, rank, step): the step time, each phase's count and total, the
        step-closing span's enter and exit (`model.step_table`).

        From the writer's rollups alone when every process's rollups hold
        everything its spans do (only their lines are parsed: a few percent of
        the bytes), else from the spans, through the model (read once, as for
        every other question); `StepTable.source` says which, `why_spans` why.
        The same table either way (docs/analysis.md, "The step table"). Times
        are each rank's own clock as written. With `tail` the spans are not
        read: a run whose rollups do not cover it raises ValueError. Read
        once, then kept, like the model.

        Example:
            >>> table = RunAnalysis("outputs").steps()
            >>> table.source, sorted({r.rank for r in table.rows if r.step == 2})   # the ranks of step 2, from the rollups
            ('rollups', [0, 1])
        """
        if self._step_table is None:
            self._step_table = self._read_steps()
        return self._step_table

    def _read_steps(self) -> StepTable:
        logs, _ = self.selection.read(log_skipped=False)
        ranked = [process for process in logs.processes if process.rank is not None]
        why: list[str] = []
        scans = []
        parsed = 0
        for process in ranked:
            scan = scan_rollups(process)
            parsed += scan.parsed_bytes
            if scan.why_not is not None:
                why.append(f"{process.label}: {scan.why_not}")
                break  # one process without is enough: the spans answer; the first one says why
            scans.append(scan)
        if ranked and not why:
            return StepTable(
                rows_from_rollups(scans),
                "rollups",
                parsed_bytes=parsed,
                total_bytes=logs.total_bytes,
            )
        if self.tail:
            raise ValueError(
                f"the step table needs the spans ({why[0] if why else 'no rank has rollups'}), "
                "and tail=True reads only the ends of the files"
            )
        self.summary  # noqa: B018 - builds the model, keeping its accumulators, unless it is built already
        rows = rows_from_collected(self._collected) if self._collected is not None else []
        return StepTable(
            rows,
            "spans",
            why_spans=why or ["no process has a rank"],
            parsed_bytes=logs.total_bytes,
            total_bytes=logs.total_bytes,
        )

    def headline(self) -> dict[str, Any]:
        """How many processes ended how, the groups they stopped in, and ``diagnosis``: what to look
        at first, most telling first."""
        return headline_data(self.summary)

    def hang(self) -> HangReport | None:
        """The Hang section as a `HangReport` (its `verdict`, `suspects` with their rule and line of
        code, process `groups`), or None when nothing is stuck now.

        ``run.hang().suspects[0]`` is the rank to look at first (a `Suspect`: its `label`, `rank`,
        `where`, `why`, `rule`); `groups` (`HangGroup`s) say where the others wait; `places`
        (`RankPlace`s) where each process is; `notes` say why when the `verdict` is "cannot tell".
        ``to_json()["hang"]`` is the same as a dict.
        """
        return self.summary.hang

    def stragglers(self, headline_only: bool = False) -> list[StragglerFinding]:
        """Every straggler finding with its verdict (``straggler``, ``difference``, ``cannot tell``)
        and cost, most costly first; `headline_only`: those that reach "Look first at"."""
        return self.summary.straggler_findings(headline_only=headline_only)

    def missing(self) -> list[dict[str, Any]]:
        """Ranks the records' ``world_size`` promises that have no file (per source and attempt)."""
        return list(self.summary.missing)

    def processes(self) -> list[ProcessSummary]:
        """Every process (rank file and its segments) with its state, last step, open spans and last
        record."""
        return list(self.summary.processes)

    def text(self, show_all: bool = False) -> str:
        """What ``otel-titan summarize`` prints (`show_all`: ``--all``, every group and process)."""
        return format_summary(self.summary, show_all=show_all)

    def to_json(self) -> dict[str, Any]:
        """What ``otel-titan summarize --json`` prints: the headline first, then the facts."""
        return summary_json(self.summary)

    def export(
        self,
        output: str | os.PathLike[str] | None = None,
        *,
        native: bool | None = None,
        steps: StepRange | str | None = None,
        progress: Callable[[int, int], None] | None = None,
        max_output_bytes: int | None = PERFETTO_MAX_TRACE_BYTES,
    ) -> ExportStats:
        """Write the run's trace for Perfetto (JSON, or native with `native`), as ``otel-titan
        export`` (`export.chrome_trace.export_trace`: the arguments, the default output and the
        errors); reads the spans again (a trace holds every span, not the model's facts)."""
        return export_selected(
            self.selection,
            output,
            steps=steps,
            progress=progress,
            max_output_bytes=max_output_bytes,
            native=native,
        )

    def report(
        self,
        output: str | os.PathLike[str] | None = None,
        *,
        max_cells: int = 200_000,
        progress: Callable[[str], None] | None = None,
    ) -> ReportResult:
        """Write the HTML report (default ``RUN_DIR/analysis/report.html``), as ``otel-titan
        report``, from the model this object holds (read now if it is not yet): its figures and
        verdicts are the other questions' answers. `max_cells` bounds each heatmap (larger runs
        are binned); `progress(text)` is told what is being done. Raises ValueError with `tail`
        (the figures need the steps), `MissingDependencyError` without Plotly.
        """
        if self.tail:
            raise ValueError(
                "the report draws every step, and tail=True reads only the files' ends"
            )
        require_plotly()  # before the read: a missing Plotly is said at once
        started = time.monotonic()
        say = progress or (lambda text: None)
        if "summary" not in self.__dict__:
            say("reading the run ...")
        summary = self.summary
        assert self._grid is not None  # read_model made it with the summary
        return draw_report(
            summary,
            self._grid,
            self.path,
            output,
            max_cells=max_cells,
            say=say,
            started=started,
        )

    def database(self, save: str | None = None) -> RunDatabase:
        """The run as a DuckDB database (`query.sql.RunDatabase`), as ``otel-titan sql``: its
        views are listed at once, `RunDatabase.load` reads the records (from the analysis cache
        when it holds them). `save`: a new ``.duckdb`` file to build it in (``--save``)."""
        return open_selected(self.selection, save)

    def __repr__(self) -> str:
        read = "read" if "summary" in self.__dict__ else "not read yet"
        return f"RunAnalysis({self.path!r}, run_id={self.run_id!r}, {read})"
