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
    >>> # run = RunAnalysis("outputs")
    >>> # run.headline()["diagnosis"]      # what to look at first
    >>> # run.hang()                       # None unless the run stopped in a hang
    >>> # [(f.rank, f.cost_per_step_ms) for f in run.stragglers()]
    >>> # print(run.text())                # what `otel-titan summarize` prints
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import Any, Iterable

from otel_titan.analysis.export.chrome_events import ExportStats
from otel_titan.analysis.export.chrome_trace import generate_gantt_trace
from otel_titan.analysis.model.collect import summarize_run, summarize_tails
from otel_titan.analysis.model.facts import ProcessSummary, RunSummary, StragglerFinding
from otel_titan.analysis.model.headline import headline_data
from otel_titan.analysis.summarize.json_form import summary_json
from otel_titan.analysis.summarize.text import format_summary

__all__ = ["RunAnalysis"]


class RunAnalysis:
    """A run folder (or its ``structured_logs/``) and the questions asked of it; the model is built once, on first use.

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
        >>> # RunAnalysis("outputs", ranks=[0, 1, 2, 3]).hang()
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

    @cached_property
    def summary(self) -> RunSummary:
        """The model of the run (read on first use, then kept): what every other question is answered from."""
        if self.tail:
            return summarize_tails(self.path, ranks=self.ranks, sources=self.sources, run_id=self.run_id, log_skipped=self.log_skipped)
        return summarize_run(self.path, ranks=self.ranks, sources=self.sources, run_id=self.run_id, log_skipped=self.log_skipped, align=self.align, jobs=self.jobs, scheduler=self.scheduler, cache=self.cache)

    def headline(self) -> dict[str, Any]:
        """How many processes ended how, the groups they stopped in, and ``diagnosis``: what to look at first, most telling first."""
        return headline_data(self.summary)

    def hang(self) -> dict[str, Any] | None:
        """The Hang section as data (culprits, victims, the culprit's line of code, process groups), or None when nothing is stuck now."""
        return self.summary.hang

    def stragglers(self, headline_only: bool = False) -> list[StragglerFinding]:
        """Every straggler finding with its verdict (``straggler``, ``difference``, ``cannot tell``) and cost, most costly first; `headline_only`: those that reach "Look first at"."""
        return self.summary.straggler_findings(headline_only=headline_only)

    def missing(self) -> list[dict[str, Any]]:
        """Ranks the records' ``world_size`` promises that have no file (per source and attempt)."""
        return list(self.summary.missing)

    def processes(self) -> list[ProcessSummary]:
        """Every process (rank file and its segments) with its state, last step, open spans and last record."""
        return list(self.summary.processes)

    def text(self, show_all: bool = False) -> str:
        """What ``otel-titan summarize`` prints (`show_all`: ``--all``, every group and process)."""
        return format_summary(self.summary, show_all=show_all)

    def to_json(self) -> dict[str, Any]:
        """What ``otel-titan summarize --json`` prints: the headline first, then the facts."""
        return summary_json(self.summary)

    def export(self, output: str | os.PathLike[str] | None = None, *, native: bool | None = None, steps: str | None = None) -> ExportStats:
        """Write the run's trace for Perfetto (JSON, or native with `native`), as ``otel-titan export``; reads the spans again (a trace holds every span, not the model's facts)."""
        return generate_gantt_trace(self.path, output, steps=steps, ranks=self.ranks, sources=self.sources, jobs=self.jobs, run_id=self.run_id, log_skipped=self.log_skipped, align=self.align, native=native, scheduler=self.scheduler)

    def __repr__(self) -> str:
        read = "read" if "summary" in self.__dict__ else "not read yet"
        return f"RunAnalysis({self.path!r}, run_id={self.run_id!r}, {read})"
