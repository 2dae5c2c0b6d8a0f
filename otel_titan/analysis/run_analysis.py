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
from collections.abc import Iterable
from functools import cached_property
from typing import Any

from otel_titan.analysis.export.chrome_events import ExportStats
from otel_titan.analysis.export.chrome_trace import generate_gantt_trace
from otel_titan.analysis.model.collect import summarize_run, summarize_tails
from otel_titan.analysis.model.facts import ProcessSummary, RunSummary, StragglerFinding
from otel_titan.analysis.model.hang import HangReport
from otel_titan.analysis.model.headline import headline_data
from otel_titan.analysis.model.step_table import StepTable, rows_from_collected, rows_from_rollups
from otel_titan.analysis.read.records import read_run
from otel_titan.analysis.read.rollups import scan_rollups
from otel_titan.analysis.read.runs import select_run
from otel_titan.analysis.summarize.json_form import summary_json
from otel_titan.analysis.summarize.text import format_summary

__all__ = ["RunAnalysis"]


class RunAnalysis:
    """A run folder (or its ``structured_logs/``) and the questions asked of it; the model is built
    once, on first use.

    Arguments select what is read, as the commands' options do: `run_id`
    (``--run``; default: the latest run of the folder), `ranks`, `sources`,
    `align` (clock alignment across hosts), `jobs` / `scheduler` (``--jobs``,
    ``--scheduler``: where the per-file work runs), `tail` (``--tail``: only
    the ends of the files and the black boxes, for "where did each rank stop"
    in seconds on a huge run; step and phase questions are then unanswered),
    `cache` (False: ``--no-cache``; by default what the read learns is kept in
    the run's analysis cache and an earlier read's is used: a second
    `RunAnalysis` of an unchanged run does not read it again, of a grown one
    reads only what was appended; docs/analysis.md).

    Example:
        >>> RunAnalysis("outputs", ranks=[0, 1]).hang() is None
        True
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        run_id: str | None = None,
        ranks: Iterable[int] | None = None,
        sources: Iterable[str] | None = None,
        align: bool = True,
        jobs: int | None = None,
        scheduler: str | None = None,
        tail: bool = False,
        log_skipped: bool = True,
        cache: bool = True,
    ) -> None:
        self.path = os.fspath(path)
        self.run_id = run_id
        self.ranks = None if ranks is None else sorted(set(ranks))
        self.sources = None if sources is None else sorted(set(sources))
        self.align = align
        self.jobs = jobs
        self.scheduler = scheduler
        self.tail = tail
        self.log_skipped = log_skipped
        self.cache = cache
        # The model's per (rank, step, phase) accumulators, kept when it is built: the step table
        # from the spans.
        self._collected: tuple[Any, Any, Any, Any] | None = None
        self._step_table: StepTable | None = None

    @cached_property
    def summary(self) -> RunSummary:
        """The model of the run (read on first use, then kept): what every other question is
        answered from."""
        if self.tail:
            return summarize_tails(
                self.path,
                ranks=self.ranks,
                sources=self.sources,
                run_id=self.run_id,
                log_skipped=self.log_skipped,
            )
        return summarize_run(
            self.path,
            ranks=self.ranks,
            sources=self.sources,
            run_id=self.run_id,
            log_skipped=self.log_skipped,
            align=self.align,
            jobs=self.jobs,
            scheduler=self.scheduler,
            cache=self.cache,
            on_collected=self._keep_steps,
        )

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
        logs, _ = select_run(
            read_run(self.path, ranks=self.ranks, sources=self.sources, log_skipped=False),
            self.run_id,
        )
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
        steps: str | None = None,
    ) -> ExportStats:
        """Write the run's trace for Perfetto (JSON, or native with `native`), as ``otel-titan
        export``; reads the spans again (a trace holds every span, not the model's facts)."""
        return generate_gantt_trace(
            self.path,
            output,
            steps=steps,
            ranks=self.ranks,
            sources=self.sources,
            jobs=self.jobs,
            run_id=self.run_id,
            log_skipped=self.log_skipped,
            align=self.align,
            native=native,
            scheduler=self.scheduler,
        )

    def __repr__(self) -> str:
        read = "read" if "summary" in self.__dict__ else "not read yet"
        return f"RunAnalysis({self.path!r}, run_id={self.run_id!r}, {read})"
