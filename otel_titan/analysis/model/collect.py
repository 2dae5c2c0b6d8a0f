"""A run's summary: where every process stopped, what is still open, phase timings, stragglers.

Computed in one streaming pass over each process (see `model.timeline.walk_process`).
What is kept: per process a few fields and its open spans; per phase a
compact array of durations (8 bytes per span, for exact percentiles) and
per (phase, rank) the total per step; per rank its step times. Nothing per
record.

Definitions (docs/analysis.md explains them at length):

* *step time* of rank r, step N: from the first record of step N on r to the
  first record of the next step on r. A process's last step has no next step
  and is left out.
* *phase time* of rank r, step N: the total duration of r's completed spans of
  that phase that started in step N.
* stragglers: the rules are in `model.stragglers` (peers by mesh
  coordinates, the statistic, wait or work on each rank's own clock, arrival
  at the step-closing collective, the cost and whether it held in both halves
  of the run); this module collects what they need in its one pass.
* a *hang suspect* is a process whose file holds no record since it was
  created (empty, or only the logger's own ``structured_logger_opened``) and
  that did not close cleanly: it hung (or died) before its first record.

One run at a time (`read.runs.select_run`): the latest in the folder unless
``run_id`` names another; restart attempts of a run are compared separately.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import statistics
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from functools import lru_cache
from typing import Any

from otel_titan.analysis.model import job_speed
from otel_titan.analysis.model import parallel as summary_parallel
from otel_titan.analysis.model.cache import ProcessCache, ReadPlan, plan_reads, segment_keys
from otel_titan.analysis.model.clocks import ClockAlignment, ClosingSpans, estimate_offsets
from otel_titan.analysis.model.config_drift import RUN_CONFIG, ConfigDrift, DriftFinding
from otel_titan.analysis.model.ending import (
    UNCAUGHT,
    End,
    crash_of,
    is_interrupt,
    kill_evidence,
    killed_crash,
    programs_differ,
)
from otel_titan.analysis.model.facts import (
    JobSlowdown,
    OpenSpanInfo,
    PhaseStats,
    ProcessSummary,
    RankSlowness,
    RunSummary,
    StepTimes,
    StopGroup,
    StragglerFinding,
    Stragglers,
    utc,
)
from otel_titan.analysis.model.flight_recorder import find_torch_dumps
from otel_titan.analysis.model.hang import bases_of, build_hang, stall_history
from otel_titan.analysis.model.hang_facts import HangTracker
from otel_titan.analysis.model.headline import compress
from otel_titan.analysis.model.rules import attempt_step as _attempt_step
from otel_titan.analysis.model.rules import logger_scalar
from otel_titan.analysis.model.scalar_steps import ScalarSteps
from otel_titan.analysis.model.step_figures import StepFigures
from otel_titan.analysis.model.step_grid import StepGrid
from otel_titan.analysis.model.stragglers import (
    MIN_EFFECT,
    MIN_LATENESS_SHARE,
    MIN_STEP_SHARE,
    MIN_STEPS,
    MIN_Z,
    STRAGGLER_RULE,
    compare_ranks,
    finding,
    judge_arrival,
    judge_phase,
    peer_groups,
    windowed,
)
from otel_titan.analysis.model.timeline import (
    OpenSpan,
    TimelineVisitor,
    WalkState,
    error_details,
    finish_walk,
    walk_process,
)
from otel_titan.analysis.model.wording import plural
from otel_titan.analysis.read import plain_data
from otel_titan.analysis.read.content import RangeReader
from otel_titan.analysis.read.filters import StepRange
from otel_titan.analysis.read.lines import WARNINGS_PER_FILE, SkippedLines, file_records
from otel_titan.analysis.read.plain_data import PlainCodec, PlainDataError
from otel_titan.analysis.read.processes_here import alive_here
from otel_titan.analysis.read.records import (
    META_EVENTS,
    NoRecordsError,
    ProcessLog,
    read_mesh,
)
from otel_titan.analysis.read.selection import RunSelection
from otel_titan.analysis.read.tails import ends_torn, tail_records
from otel_titan.analysis.workers import merge_skipped, skipped_result
from otel_titan.schema import LOGGER_NAME as _OTEL_TITAN_LOGGER
from otel_titan.schema import MetaEvent, StepCloser

__all__ = [
    "summarize_run",
    "read_model",
    "summarize_tails",
    "tails_model",
    "compare_ranks",
    "percentile",
    "utc",
    "MIN_STEPS",
    "MIN_EFFECT",
    "MIN_Z",
    "MIN_STEP_SHARE",
    "MIN_LATENESS_SHARE",
    "STRAGGLER_RULE",
]

#: Open spans listed per process, the most recently started (all are counted).
OPEN_SPANS_LISTED = 20
#: Uncaught exceptions of threads other than the main one kept per process (the program went on
#: after them).
THREAD_EXCEPTIONS_KEPT = 4


def _interrupted(error: dict[str, Any]) -> bool:
    """Whether an ``_error`` record is Ctrl-C's (``KeyboardInterrupt``): the span ended because the
    process was interrupted."""
    return is_interrupt({"type": error_details(error)[0]})


_OPENED = MetaEvent.OPENED
_ROLLUP = MetaEvent.STEP_ROLLUP
_MESH_FOUND = MetaEvent.MESH_FOUND


# -- collection -----------------------------------------------------------------------------------
class _PhaseAcc:
    __slots__ = ("durations", "errors", "incomplete", "max_ms", "max_at")

    def __init__(self) -> None:
        self.durations = array("d")
        self.errors = 0
        self.incomplete = 0
        self.max_ms = -1.0
        self.max_at: tuple[str, int | None, int | None, int | None] = ("", None, None, None)


class _Collector(TimelineVisitor):
    """Run-wide accumulators, fed one process at a time."""

    def __init__(self) -> None:
        self.phases: dict[tuple[str, str], _PhaseAcc] = {}
        # (source, attempt) → rank → step → ms. Keyed by attempt: restarts are kept apart, never
        # merged.
        self.step_ms: dict[tuple[str, int | None], dict[int, dict[int, float]]] = {}
        self.phase_step_ms: dict[tuple[str, int | None, str], dict[int, dict[int, float]]] = {}
        # The same keys → rank → step → how many of its spans were summed there (the step table's
        # counts, `model.step_table`).
        self.phase_step_count: dict[tuple[str, int | None, str], dict[int, dict[int, int]]] = {}
        # The same keys → rank → step → when the rank's last span of the phase in that step ended
        # (µs, its host's clock).
        self.phase_step_end: dict[tuple[str, int | None, str], dict[int, dict[int, int]]] = {}
        # (source, attempt, rank) → host (whose clock offset applies to its ends).
        self.rank_hosts: dict[tuple[str, int | None, int], str] = {}
        # (source, attempt, rank) → its mesh coordinates, when the job declared a mesh (its peers
        # share all but dp).
        self.rank_meshes: dict[tuple[str, int | None, int], dict[str, int] | None] = {}
        # When a phase starts, in ms after its step began: orders the phase stragglers.
        self.phase_offsets: dict[tuple[str, str], array] = {}
        # label → what the Hang section needs: its live black box, past stalls, spans entered in its
        # last step
        self.hang = HangTracker()
        # Bound straight to the tracker (one call per record, not two): a span begun is progress.
        self.span_begun = self.hang.span_begun  # type: ignore[method-assign]  # bound once (above)
        # Per process, the last top-level span of each step: the step-closing collective
        # (`model.clocks` aligns the hosts on it).
        self.closing: list[tuple[ProcessLog, ClosingSpans]] = []
        # The memory/host figures that explain slow steps (step_figures.py).
        self.figures = StepFigures()
        # Every rank's `run_config` hashes: the ranks whose configuration differs (config_drift.py).
        self.config_drift = ConfigDrift()
        # For the report's figures (step_grid.py): (source, attempt) → rank → step → when it began
        # (µs, own clock) ...
        self.step_starts: dict[tuple[str, int | None], dict[int, dict[int, int]]] = {}
        # ... and the scalars over steps (scalar_steps.py).
        self.scalar_steps = ScalarSteps()

    def state(self) -> dict[str, Any]:
        """What a worker sends back (`model.parallel`): the run-wide accumulators."""
        return {
            "phases": self.phases,
            "step_ms": self.step_ms,
            "phase_step_ms": self.phase_step_ms,
            "phase_step_count": self.phase_step_count,
            "phase_step_end": self.phase_step_end,
            "rank_hosts": self.rank_hosts,
            "rank_meshes": self.rank_meshes,
            "phase_offsets": self.phase_offsets,
            "closing": self.closing,
            "hang_facts": self.hang.facts,
            "figures": self.figures.state(),
            "config_drift": self.config_drift,
            "step_starts": self.step_starts,
            "scalar_steps": self.scalar_steps,
        }

    def merge(self, state: dict[str, Any]) -> None:
        """Add a worker's accumulators (disjoint processes) to these."""
        for key, acc in state["phases"].items():
            mine = self.phases.get(key)
            if mine is None:
                self.phases[key] = acc
                continue
            mine.durations.extend(acc.durations)
            mine.errors += acc.errors
            mine.incomplete += acc.incomplete
            if acc.max_ms > mine.max_ms:
                mine.max_ms, mine.max_at = acc.max_ms, acc.max_at
        for name in (
            "step_ms",
            "phase_step_ms",
            "phase_step_count",
            "phase_step_end",
            "step_starts",
        ):
            target = getattr(self, name)
            for key, per_rank in state.get(name, {}).items():
                ranks = target.setdefault(key, {})
                for rank, steps in per_rank.items():
                    ranks.setdefault(rank, {}).update(steps)
        self.rank_hosts.update(state.get("rank_hosts", {}))
        self.rank_meshes.update(state.get("rank_meshes", {}))
        for key, offsets in state["phase_offsets"].items():
            self.phase_offsets.setdefault(key, array("d")).extend(offsets)
        self.closing.extend(state["closing"])
        self.hang.facts.update(state.get("hang_facts", {}))
        self.figures.merge(state.get("figures", {}))
        if "config_drift" in state:
            self.config_drift.merge(state["config_drift"])
        if "scalar_steps" in state:
            self.scalar_steps.merge(state["scalar_steps"])

    def begin(self, process: ProcessLog, summary: ProcessSummary, whole: bool = True) -> None:
        self.process, self.summary = process, summary
        self.hang.begin(process.label, partial=not whole, world_size=process.world_size)
        self.open: list[tuple[OpenSpan, float]] = []
        #: Span name → its (source, name) accumulator in `phases`, for this process (one lookup per
        #: span, no key built).
        self.process_phases: dict[str, _PhaseAcc] = {}
        self.phase_counts_before: dict[str, int] = {}
        self.steps_seen: list[tuple[int, float]] = []
        self.phase_sums: dict[str, dict[int, float]] = {}
        self.phase_counts: dict[str, dict[int, int]] = {}
        self.phase_ends: dict[str, dict[int, int]] = {}
        self.step_begins: dict[int, int] = {}
        # The step-closing span of each step: the one rule the writer's rollups use too
        # (schema.StepCloser).
        self.closer = StepCloser()
        self.closing_spans = ClosingSpans(
            host=process.host_name or process.label, key=process.label
        )
        self.closing.append((process, self.closing_spans))
        # The innermost span the latest exception failed: (name, step, start µs, error type). An
        # exception unwinding nested spans writes the innermost's _error first; an outer one started
        # earlier, a new exception's later.
        self.failed: tuple[str, int | None, int, str] | None = None
        # Spans that ended only because Ctrl-C interrupted them, in the process's last records:
        # where it was.
        self.interrupted: list[tuple[OpenSpan, float]] = []

    def step_begun(self, step: int, begin_us: int) -> None:
        self.step_begins[step] = begin_us
        self.hang.step_begun(step, begin_us)

    def span(
        self,
        span: OpenSpan,
        end: dict[str, Any] | None,
        end_us: int,
        dur_us: float,
        incomplete: bool,
    ) -> None:
        name = span.name
        acc = self.process_phases.get(name)
        if acc is None:
            acc = self._phase(name)
        if span.error is not None:
            acc.errors += 1
            if not incomplete and _interrupted(span.error):
                # Ended by Ctrl-C: the span is where the process was, as if still open (unless the
                # program goes on after).
                acc.incomplete += 1
                self.interrupted.append((span, dur_us))
                self.hang.interrupted = True
                self.hang.entered_span(name, (span.start or {}).get("step"))
                return
        if incomplete:
            acc.incomplete += 1
            self.open.append((span, dur_us))
            self.hang.entered_span(name, (span.start or {}).get("step"))
            return
        hang = self.hang
        if end_us > hang.progress_us:
            hang.progress_us = end_us
        if hang.box is not None or hang.stalled or hang.quiet or hang.interrupted:
            hang.progress()
        ms = dur_us / 1000.0
        acc.durations.append(ms)
        start = span.start
        first = start if start is not None else end
        step = first.get("step") if first is not None else None
        if type(step) is not int:
            step = None
        if ms > acc.max_ms:
            acc.max_ms = ms
            acc.max_at = (self.process.label, self.process.rank, self.process.attempt, step)
        if step is not None:
            if step == hang.step and name not in hang.entered_set:  # (inline: once per span)
                hang.entered_span(name, step)
            if first.get("parent_span_id") is None:  # type: ignore[union-attr]  # the step-closing span's rule (schema.StepCloser)
                self.closer.span_ended(step, name, span.start_us, end_us, True)
            sums = self.phase_sums.get(name)
            if sums is None:
                sums = self.phase_sums[name] = {}
            sums[step] = sums.get(step, 0.0) + ms
            counts = self.phase_counts.get(name)
            if counts is None:
                counts = self.phase_counts[name] = {}
            counts[step] = counts.get(step, 0) + 1
            ends = self.phase_ends.get(name)
            if ends is None:
                ends = self.phase_ends[name] = {}
            if end_us > ends.get(step, end_us - 1):
                ends[step] = end_us
            if start is not None:
                begin = self.step_begins.get(step)
                if begin is not None:
                    offsets = self.phase_offsets.get((self.process.source, name))
                    if offsets is None:
                        offsets = self.phase_offsets[(self.process.source, name)] = array("d")
                    offsets.append((span.start_us - begin) / 1000.0)

    def _phase(self, name: str) -> _PhaseAcc:
        """The run-wide accumulator of this process's source and phase `name`, remembered for the
        process."""
        key = (self.process.source, name)
        acc = self.phases.get(key)
        if acc is None:
            acc = self.phases[key] = _PhaseAcc()
        self.process_phases[name] = acc
        # what the run's others had finished before this process: `end`'s seen is its own
        self.phase_counts_before[name] = len(acc.durations)
        return acc

    def instant(self, record: dict[str, Any], track: Any) -> None:
        self.hang.progress_at()  # an instant after a black box is progress
        if record["log_type_name"] == RUN_CONFIG:
            self.config_drift.observe(record, self.process.rank)

    def scalar(self, record: dict[str, Any], track: Any) -> None:
        if not logger_scalar(record):  # the logger's own figures are no progress of the program
            self.hang.progress_at()  # a scalar after a black box is progress too
        process = self.process
        self.figures.observe(
            record, process.source, process.attempt, process.rank, process.host_name
        )
        self.scalar_steps.observe(record)

    def error(self, record: dict[str, Any], span: OpenSpan | None, track: Any) -> None:
        error_type = error_details(record)[0]
        if not _interrupted(record):
            self.hang.progress()
            self.hang.progress_us = max(self.hang.progress_us, record["time_us"])
        start = span.start_us if span is not None else record["time_us"]
        if self.failed is None or start >= self.failed[2]:
            step = (
                (span.start or {}).get("step")
                if span is not None and span.start is not None
                else record.get("step")
            )
            self.failed = (
                record["log_type_name"][:-6],
                step if type(step) is int else None,
                start,
                error_type,
            )
        if span is None:
            name = record["log_type_name"][:-6]
            acc = self.phases.setdefault((self.process.source, name), _PhaseAcc())
            acc.errors += 1

    def meta(self, record: dict[str, Any]) -> None:
        summary = self.summary
        name = record["log_type_name"]
        if name == "stall":
            self.hang.stall(record)
        elif name == "heartbeat":
            self.hang.heartbeat()
        elif name == _OPENED:
            self.hang.opened(record)
        if name == _MESH_FOUND:
            # A DeviceMesh found after init (its process groups, at the first steps): the opening
            # record's `mesh`, late.
            mesh = read_mesh(record.get("mesh"))
            if mesh is not None and self.process.mesh is None:
                self.process.mesh = mesh
        if name == "signal_received":
            signal = record.get("signal")
            summary.signal = signal if isinstance(signal, str) else "signal"
            summary.signal_us = record["time_us"]
        elif name == UNCAUGHT:
            self._uncaught(record)
        dropped, failed = record.get("dropped_records"), record.get("failed_records")
        if type(dropped) is int:
            summary.records_dropped = max(summary.records_dropped, dropped)
        if type(failed) is int:
            summary.records_failed = max(summary.records_failed, failed)

    def _uncaught(self, record: dict[str, Any]) -> None:
        """An ``uncaught_exception`` record: the main thread's ends the program (a crash); another
        thread's is kept as a note."""
        crash = crash_of(record)
        failed = self.failed
        if failed is not None and failed[3] == crash["type"] and failed[1] == crash["step"]:
            crash["span"] = failed[0]  # the innermost span it unwound
        summary = self.summary
        if crash["fatal"]:
            summary.crash = crash
        elif len(summary.thread_exceptions) < THREAD_EXCEPTIONS_KEPT:
            summary.thread_exceptions.append(crash)

    def step(self, step: int, begin_us: int, end_us: int, first: dict[str, Any]) -> None:
        self.steps_seen.append((step, (end_us - begin_us) / 1000.0))
        # The step-closing span (`schema.StepCloser`; SQL's alignment applies it too,
        # `rules.CLOSING_SPAN_SQL`).
        top = self.closer.closing(step)
        if top is not None:
            # Steps of a restart replay the first attempt's numbers: the attempt keeps them apart.
            self.closing_spans.add(_attempt_step(self.process.attempt, step), *top)

    def end(self, last_us: int | None) -> None:
        process, summary = self.process, self.summary
        if process.rank is not None:
            # The last step has no next step to end it: its time is unknown.
            step_ms = self.step_ms.setdefault((process.source, process.attempt), {}).setdefault(
                process.rank, {}
            )
            for step, ms in self.steps_seen[:-1]:
                step_ms[step] = ms
            for phase, sums in self.phase_sums.items():
                per_rank = self.phase_step_ms.setdefault(
                    (process.source, process.attempt, phase), {}
                )
                per_rank.setdefault(process.rank, {}).update(sums)
            for phase, counts in self.phase_counts.items():
                per_rank_count = self.phase_step_count.setdefault(
                    (process.source, process.attempt, phase), {}
                )
                per_rank_count.setdefault(process.rank, {}).update(counts)
            for phase, ends in self.phase_ends.items():
                per_rank_end = self.phase_step_end.setdefault(
                    (process.source, process.attempt, phase), {}
                )
                per_rank_end.setdefault(process.rank, {}).update(ends)
            self.rank_hosts[(process.source, process.attempt, process.rank)] = (
                process.host_name or process.label
            )
            self.step_starts.setdefault((process.source, process.attempt), {}).setdefault(
                process.rank, {}
            ).update(self.step_begins)
            key = (process.source, process.attempt, process.rank)
            # A mesh found in an earlier read of this process (a cached read resumed past its
            # `mesh_found` record) stays.
            self.rank_meshes[key] = process.mesh or self.rank_meshes.get(key)
        # nothing of the program came after Ctrl-C ended them: where the process was
        if self.hang.interrupted:
            self.open.extend(self.interrupted)
        self.hang.alive_after(last_us, bool(self.open), summary.signal_us)
        before = self.phase_counts_before
        self.hang.end(
            seen=[
                name
                for name, acc in self.process_phases.items()
                if len(acc.durations) > before[name]
            ]
        )
        summary.open_span_count = len(self.open)
        open_now = {id(span) for span, _ in self.open}
        parents = {id(span.parent) for span, _ in self.open if span.parent is not None}
        listed = []
        # in file order, so a span's parents come before it
        for index, (span, dur_us) in enumerate(self.open):
            # the most recent ones; each has its full path
            if index >= len(self.open) - OPEN_SPANS_LISTED:
                path, outer = [span.name], span.parent
                while outer is not None and id(outer) in open_now and len(path) < 64:
                    path.append(outer.name)
                    outer = outer.parent
                first = span.start or {}
                span_step = first.get("step")
                listed.append(
                    OpenSpanInfo(
                        name=span.name,
                        path=path[::-1],
                        step=span_step if type(span_step) is int else None,
                        start_us=span.start_us,
                        open_s=round(dur_us / 1e6, 6),
                        task_name=span.lane[1],
                        thread=span.lane[0] if type(span.lane[0]) is int else None,
                        failed=span.error is not None,
                        innermost=id(span) not in parents,
                    )
                )
        summary.open_spans = listed


class _Observed:
    """Where `_observe` stands between two records (picklable: the cache resumes a process where its
    cached read ended)."""

    __slots__ = (
        "expected_seq",
        "last_name",
        "writer",
        "last_program",
        "last_step",
        "last_step_record",
    )

    def __init__(self) -> None:
        self.expected_seq: int | None = None
        self.last_name: str | None = None
        self.writer: Any = None
        # The last program record, and the last one with the highest step so far: their fields are
        # read once, at the end of a pass, instead of being copied into the summary for every
        # record.
        self.last_program: dict[str, Any] | None = None
        self.last_step: int | None = None
        self.last_step_record: dict[str, Any] | None = None

    def __getstate__(self) -> tuple[Any, ...]:
        return (
            self.expected_seq,
            self.last_name,
            self.writer,
            self.last_program,
            self.last_step,
            self.last_step_record,
        )

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        (
            self.expected_seq,
            self.last_name,
            self.writer,
            self.last_program,
            self.last_step,
            self.last_step_record,
        ) = state


def _observe(
    records: Iterable[dict[str, Any]],
    summary: ProcessSummary,
    whole: bool = True,
    state: _Observed | None = None,
) -> Iterator[dict[str, Any]]:
    """Pass records through, noting last event, last step, sequence gaps and the closing record.

    `whole` False: `records` are a file's tail (`read.tails`), so the first one is not where the
    file began. `state`: go on from an earlier pass over the same process (updated in place;
    `_observed_end` then says whether it closed).
    """
    state = _Observed() if state is None else state
    expected_seq, last_name, writer = state.expected_seq, state.last_name, state.writer
    last_program, last_step, last_step_record = (
        state.last_program,
        state.last_step,
        state.last_step_record,
    )
    meta_events = META_EVENTS
    try:
        for record in records:
            name = record["log_type_name"]
            last_name = name
            # a rollup carries a short identity, no logger name (a tail may begin with one)
            if writer is None and name != _ROLLUP:
                writer = record.get("logger_name", "")
                # the first line of an otel-titan file: when the file was created
                if name == _OPENED:
                    summary.created_us = record["time_us"]
            seq = record.get("seq_id")
            if type(seq) is int and whole:
                if expected_seq is None:
                    summary.first_seq_id = seq
                elif seq > expected_seq:
                    summary.lost_lines += seq - expected_seq
                expected_seq = seq + 1
            if name not in meta_events and not (name == "metric_value" and logger_scalar(record)):
                last_program = record
                step = record.get("step")
                if type(step) is int and (last_step is None or step >= last_step):
                    last_step, last_step_record = step, record
            yield record
    finally:
        state.expected_seq, state.last_name, state.writer = expected_seq, last_name, writer
        state.last_program, state.last_step, state.last_step_record = (
            last_program,
            last_step,
            last_step_record,
        )
        if last_program is not None:
            step = last_program.get("step")
            summary.last_event, summary.last_event_us, summary.last_event_step = (
                last_program["log_type_name"],
                last_program["time_us"],
                step if type(step) is int else None,
            )
        if last_step_record is not None:
            summary.last_step = last_step
            relative = last_step_record.get("relative_step")
            summary.last_relative_step = relative if type(relative) is int else None
    _observed_end(state, summary)


def _observed_end(state: _Observed, summary: ProcessSummary) -> None:
    if state.last_name is not None:
        # Only otel-titan writes a closing record; for torchtitan's and pimm's files it is unknown.
        summary.closed_cleanly = (
            True
            if state.last_name == "structured_logger_closed"
            else (False if state.writer == _OTEL_TITAN_LOGGER else None)
        )


def summarize_run(
    path: str | os.PathLike[str],
    *,
    ranks: Iterable[int] | None = None,
    sources: Iterable[str] | None = None,
    run_id: str | None = None,
    log_skipped: bool = True,
    align: bool = True,
    progress: Callable[[int, int], None] | None = None,
    jobs: int | None = None,
    scheduler: str | None = None,
    cache: bool = True,
    on_collected: Callable[[Any], None] | None = None,
    steps: StepRange | None = None,
) -> RunSummary:
    """Read a run (directory or its ``structured_logs/``) and summarize it.

    A folder can hold several runs (a re-launch into the same ``output_dir``):
    one is summarized, the latest unless `run_id` names another;
    `RunSummary.runs` lists them all. Hosts' clocks are aligned on the
    step-closing collective (`model.clocks`) unless `align` is False.
    `progress(bytes_read, bytes_total)` is called as the input is read.
    `jobs`: worker processes (default 1, this process: on 2 busy cores two
    workers were no faster and held twice the memory; on more cores try more).
    `scheduler`: the address of a Dask scheduler (``tcp://host:8786``) whose
    workers read the files instead (`workers.executors`; `jobs` is then ignored):
    the same summary.
    `cache`: keep what each process's read learned, and use what an earlier
    read kept, in the analysis cache (`model.cache`: beside the run, or in the
    user's cache folder): an unchanged run is not read again, a grown one only
    from where it was; False reads every byte and keeps nothing (``--no-cache``).
    `on_collected(collector)` is called once the run is read, with the
    accumulators the summary is made from (per rank, step and phase): what a
    caller keeps beyond the summary (`RunAnalysis.steps`, `model.step_table`).
    `steps` (a `read.filters.StepRange`, ``summarize --steps A:B``): the
    stragglers are judged on those steps only (a slowdown's window, to narrow
    it); everything else is of the whole run.
    The read options (all but `progress`, `on_collected` and `steps`) are a
    `read.selection.RunSelection`'s; `read_model` takes one whole.
    Raises `NotARunError` for a path that is
    not a run, `NoRecordsError` when no record could be read (or `run_id`
    names no run here: `read.runs.UnknownRunError`), ValueError for `jobs` under 1.

    Example:
        >>> from otel_titan.analysis import summarize_run, format_summary
        >>> summary = summarize_run("outputs")
        >>> print(format_summary(summary))          # the tables
        Run outputs  (2 processes, logs in outputs/structured_logs)
        ...
        >>> [(p.label, p.last_step, p.closed_cleanly) for p in summary.processes]
        [('training rank 0', 3, True), ('training rank 1', 3, True)]
    """
    selection = RunSelection.of(
        path,
        run_id=run_id,
        ranks=ranks,
        sources=sources,
        align=align,
        jobs=jobs,
        scheduler=scheduler,
        cache=cache,
        log_skipped=log_skipped,
    )
    return read_model(selection, progress=progress, on_collected=on_collected, steps=steps)[0]


def read_model(
    selection: RunSelection,
    *,
    progress: Callable[[int, int], None] | None = None,
    on_collected: Callable[[Any], None] | None = None,
    steps: StepRange | None = None,
) -> tuple[RunSummary, StepGrid]:
    """`summarize_run`'s summary and the grid of ranks × steps it was drawn from
    (`model.step_grid`), from one read of the run `selection` names.

    What ``report`` draws: the same read, the same rules, so the page and
    ``summarize`` agree. `progress`, `on_collected`, `steps` and the errors as
    `summarize_run`.

    Example:
        >>> summary, grid = read_model(RunSelection.of("outputs"))
        >>> grid.source_steps("training"), len(summary.processes)
        ((1, 3), 2)
    """
    logs, choice = selection.read()
    jobs, scheduler, cache = selection.jobs, selection.scheduler, selection.cache
    log_skipped, align = selection.log_skipped, selection.align

    on_bytes = _byte_counter(logs.total_bytes, progress)
    facts_entry: list[Any] = []
    collector, processes = collect_run(
        logs.processes,
        logs.run_dir,
        logs.log_dir,
        logs.skipped,
        jobs=jobs,
        scheduler=scheduler,
        cache=cache,
        on_bytes=on_bytes,
        log_skipped=log_skipped,
        facts_entry=facts_entry,
    )
    if on_collected is not None:
        on_collected(collector)
    records = sum(p.records for p in processes)
    if records == 0 and logs.skipped.count:
        raise NoRecordsError(
            f"{logs.log_dir}: no readable records "
            f"({plural(logs.skipped.count, 'unreadable line')} skipped)"
        )
    alignment = _kept_alignment(facts_entry, collector)
    if not align and alignment.applied:
        # The times stay as written; evidence measured on each rank's own clock (`model.stragglers`)
        # still stands.
        alignment = dataclasses.replace(
            alignment,
            applied=False,
            reason="turned off (--no-align)",
            offsets_us={},
            windows=[],
            drift_us={},
        )
    _apply_offsets(processes, alignment)
    stragglers = _kept_stragglers(facts_entry, collector, alignment, steps, align)
    summary = _run_summary(
        logs,
        choice,
        processes,
        alignment,
        phases=_phase_stats(collector.phases),
        stragglers=stragglers,
        records=records,
        hang_facts=collector.hang.facts,
        rank_filter=selection.ranks,
    )
    summary.slow_steps = collector.figures.notes(collector.step_ms)
    summary.config_drift = [finding.message for finding in collector.config_drift.findings()]
    return summary, _step_grid(collector, alignment, logs.total_bytes)


# -- one process's read, resumable (the analysis cache, `model.cache`) ----------------------------
class ProcessRead:
    """One process read up to a point: everything needed to go on reading it where it stopped, or to
    finish it.

    Its own collector (begun on the process: its run-wide accumulators hold
    this process only, merged as `model.parallel`'s workers' are), its
    summary so far, where the timeline walk and `_observe` stand, the lines
    it skipped; the segment paths it read (`rebind` maps them to the paths of
    a copied or rotated run) and the lines read of each. Plain data for the
    cache (`dump_cached`: its classes are `_cached_classes`); picklable for the
    workers, which send it back to their own parent.
    """

    def __init__(self, process: ProcessLog, log_skipped: bool) -> None:
        self.collector = _Collector()
        self.summary = _new_summary(process)
        self.collector.begin(process, self.summary)
        self.walk = WalkState()
        self.observed = _Observed()
        self.skipped = SkippedLines(log=log_skipped)
        self.paths = list(process.segments)
        self.lines: list[int] = [0] * len(process.segments)
        #: False when a file could not be read to the end of its key: kept out of the cache.
        self.complete = True

    def rebind(self, process: ProcessLog, log_skipped: bool) -> None:
        """Make a read of another copy of the files (a copied run, rotated segments) this
        `process`'s: its paths and labels."""
        collector = self.collector
        collector.process = process
        collector.closing = [(process, spans) for _, spans in collector.closing]
        self.summary.files = [os.path.basename(path) for path in process.segments]
        renamed = {old: new for old, new in zip(self.paths, process.segments) if old != new}
        if renamed:
            _rename_paths(self.skipped, renamed)
        self.paths = list(process.segments)
        self.lines += [0] * (len(process.segments) - len(self.lines))
        self.skipped.log = log_skipped

    def read(
        self,
        process: ProcessLog,
        segment: int,
        start: int,
        stop: int | None,
        first_line: int,
        on_bytes: Callable[[int], None] | None,
    ) -> None:
        """Go on with bytes `start` .. `stop` (None: to its end) of segment `segment`, whose first
        `first_line` lines came before."""
        path = process.segments[segment]
        try:
            handle = open(path, "rb")
        except OSError:
            self.complete = False
            # counts it as "cannot open", as a read of the whole run would
            records = file_records(path, self.skipped, on_bytes)
            walk_process(
                _observe(records, self.summary, state=self.observed),
                self.collector,
                state=self.walk,
                finish=False,
            )
            return
        reader = RangeReader(handle, start, stop)
        # On the aligned clock, as `ProcessLog.records` gives them (a shifted read is never cached:
        # `plan_reads`).
        records = file_records(
            path,
            self.skipped,
            on_bytes,
            source=reader,  # type: ignore[arg-type]  # a RangeReader reads as a file does
            first_line=first_line,
            offset_us=process.clock_offset_us,
            trimmed=True,
        )
        walk_process(
            _observe(records, self.summary, state=self.observed),
            self.collector,
            state=self.walk,
            finish=False,
        )
        self.lines[segment] = first_line + reader.newlines
        if stop is not None and reader.left:
            self.complete = False  # shorter than its key said: truncated meanwhile

    def finish(self, process: ProcessLog) -> tuple[_Collector, ProcessSummary, SkippedLines]:
        """The records have ended: close what is open; (its collector, its summary, its skipped
        lines)."""
        extent = finish_walk(self.walk, self.collector)
        self.collector.end(extent.last_us)
        _observed_end(self.observed, self.summary)
        summary = self.summary
        summary.records, summary.first_us, summary.last_us = (
            extent.records,
            extent.first_us,
            extent.last_us,
        )
        summary.skipped_lines = self.skipped.count
        _finish_process(summary, process)
        return self.collector, summary, self.skipped


#: What a cache entry may hold besides plain data (`read.plain_data`): the classes of a
#: `ProcessRead` and of the merged facts, rebuilt from their attributes alone. A class added to the
#: read that is not here is refused on writing (TypeError: the entry is not kept), never pickled.
def _cached_classes() -> list[type]:
    # the kept verdicts (`_kept_stragglers`, `_kept_alignment`)
    return [
        ProcessRead,
        _Collector,
        _PhaseAcc,
        _Observed,
        HangTracker,
        ProcessLog,
        ClosingSpans,
        StepFigures,
        ConfigDrift,
        DriftFinding,
        ScalarSteps,
        ProcessSummary,
        OpenSpanInfo,
        StepCloser,
        WalkState,
        OpenSpan,
        SkippedLines,
        Stragglers,
        StepTimes,
        RankSlowness,
        StragglerFinding,
        ClockAlignment,
    ]


@lru_cache(maxsize=1)
def _codec() -> PlainCodec | None:
    return PlainCodec(_cached_classes()) if plain_data.available else None


def dump_cached(value: Any) -> bytes | None:
    """`value` (a `ProcessRead`, or the merged facts) as a cache entry's plain data; None when it
    cannot be (no msgspec, a foreign object)."""
    codec = _codec()
    if codec is None:
        return None
    try:
        return codec.encode(value)
    except TypeError as error:
        _LOG.debug("not cached: %s", error)
        return None


def load_cached(data: bytes) -> Any:
    """What `dump_cached` wrote, or None for anything else (torn, another layout, not plain data): a
    miss. Runs nothing of `data`."""
    codec = _codec()
    if codec is None:
        return None
    try:
        return codec.decode(data)
    except PlainDataError:
        return None


def load_cached_read(data: bytes | None) -> ProcessRead | None:
    """A cached `ProcessRead`, or None when `data` is not one."""
    state = load_cached(data) if data is not None else None
    return state if type(state) is ProcessRead else None


def _rename_paths(skipped: SkippedLines, renamed: dict[str, str]) -> None:
    """The skipped lines of a read of other paths (a copied run, a segment rotated to a new name),
    named by the paths now."""
    for counter in (skipped.by_file, skipped.repaired_by_file):
        for old, new in renamed.items():
            if old in counter:
                counter[new] += counter.pop(old)
    examples = []
    for example in skipped.examples:
        for old, new in renamed.items():
            if example.startswith(old + ":"):
                example = new + example[len(old) :]
                break
        examples.append(example)
    skipped.examples = examples
    warnings = []
    for warning in skipped.warnings:
        for old, new in renamed.items():
            if warning.startswith(old + ":"):
                warning = new + warning[len(old) :]
                break
        warnings.append(warning)
    skipped.warnings = warnings


def read_process(
    process: ProcessLog, plan: ReadPlan, log_skipped: bool, on_bytes: Callable[[int], None] | None
) -> ProcessRead:
    """Read what `plan` says of `process`: from its cached read (or the start) up to the end of the
    written content of segment ``plan.stop``.

    What follows (a partial last line, NULs not written yet, later segments
    after a partial one) is left to `finish_read`: it is never cached.
    """
    state = load_cached_read(plan.resume) if plan.resume is not None else None
    # no cached read, or not one of ours (`plan_reads` made it a resume after checking its key)
    if state is None:
        plan = (
            dataclasses.replace(
                plan, resume=None, start_segment=0, start_offset=0, start_line=0, hit=False
            )
            if plan.resume is not None
            else plan
        )
        state = ProcessRead(process, log_skipped)
    if plan.resume is not None:
        state.rebind(process, log_skipped)
        if log_skipped:
            _replay_warnings(state.skipped)
    if plan.keys is None:
        return state  # a segment cannot be read now: all of it is read by `finish_read`, nothing cached
    for segment in range(plan.start_segment, plan.stop + 1):
        resumed = plan.resume is not None and segment == plan.start_segment
        start, first_line = (plan.start_offset, plan.start_line) if resumed else (0, 0)
        state.read(process, segment, start, plan.keys[segment].length, first_line, on_bytes)
    return state


def read_share(
    processes: list[ProcessLog],
    plans: list[ReadPlan],
    log_skipped: bool,
    on_bytes: Callable[[int], None],
) -> list[bytes]:
    """One worker's share (`model.parallel.read_in_workers`): each of `processes` read as its plan
    says (`read_process`), pickled.

    What the cache keeps and the parent finishes. Here, beside `read_process`, and handed to the
    dispatcher as an argument: `parallel` imports nothing of this module, which imports it (no
    cycle), and the worker imports this function by the name of the object it was given, never by a
    string written out.
    """
    return [
        pickle.dumps(
            read_process(process, plan, log_skipped, on_bytes), protocol=pickle.HIGHEST_PROTOCOL
        )
        for process, plan in zip(processes, plans, strict=True)
    ]


def finish_read(
    state: ProcessRead, process: ProcessLog, plan: ReadPlan, on_bytes: Callable[[int], None] | None
) -> tuple[_Collector, ProcessSummary, SkippedLines]:
    """Read what is never cached (the bytes after the last complete line of segment ``plan.stop``,
    the segments after it), then finish the process."""
    if plan.keys is None:
        for segment in range(len(process.segments)):
            state.read(process, segment, 0, None, 0, on_bytes)
    else:
        stop_key = plan.keys[plan.stop] if plan.stop >= 0 else None
        if stop_key is not None and stop_key.size > stop_key.length:
            state.read(process, plan.stop, stop_key.length, None, state.lines[plan.stop], on_bytes)
        for segment in range(plan.stop + 1, len(process.segments)):
            state.read(process, segment, 0, None, 0, on_bytes)
    return state.finish(process)


def _replay_warnings(skipped: SkippedLines) -> None:
    """The warnings a cached read logged when it read its lines: logged again, as a read of the
    files would."""
    for message in _warnings_of(skipped):
        _LOG.warning("%s", message)


def _warnings_of(skipped: SkippedLines) -> list[str]:
    """The warnings a read logs about the lines it skipped or repaired (the first few of each file,
    then that it only counts), in their order.

    A read cached by an older version kept no `SkippedLines.warnings`: its skipped lines' warnings
    are made again.
    """
    if skipped.warnings or not (skipped.examples or skipped.repaired):
        return list(skipped.warnings)
    return [
        *skipped.examples,
        *(
            f"{path}: more unreadable lines; only counting them from now on"
            for path, count in skipped.by_file.items()
            if count > WARNINGS_PER_FILE
        ),
    ]


_LOG = logging.getLogger("otel_titan.analysis")


def collect_run(
    processes: list[ProcessLog],
    run_dir: str,
    log_dir: str,
    skipped: SkippedLines,
    *,
    jobs: int | None = None,
    scheduler: str | None = None,
    cache: bool = True,
    on_bytes: Callable[[int], None] | None = None,
    log_skipped: bool = True,
    facts_entry: list[Any] | None = None,
) -> tuple[_Collector, list[ProcessSummary]]:
    """Every process read into one collector (merged process by process, in order), and their
    summaries; `skipped` gets their skipped lines.

    `facts_entry`: a list that gets ``(cache, processes, keys)`` when the
    merged facts of exactly these files are in the cache (found, or just
    kept): what the verdicts drawn from them can be kept beside (`_kept_stragglers`).

    With `cache`, a process whose files hold what an earlier read cached is
    not read again, one that grew is read from where that read stopped
    (`model.cache`), and every read is kept for the next command. The reads
    run here, in `jobs` local workers or on the Dask cluster at `scheduler`
    (`model.parallel`); which, and what was cached, never changes the result.
    """
    store = ProcessCache(run_dir, log_dir) if cache else None
    keys = [segment_keys(process) for process in processes]
    count = on_bytes or (lambda _: None)
    if store is not None:
        merged = _merged_from_cache(store, processes, keys, skipped, log_skipped)
        if merged is not None:
            count(sum(key.length for segment in keys for key in segment or []))
            if facts_entry is not None:
                facts_entry.append((store, processes, keys))
            return merged
    plans = plan_reads(processes, store, keys)
    for plan in plans:
        if plan.cached_bytes:
            count(plan.cached_bytes)
    wanted = [index for index, plan in enumerate(plans) if not plan.hit]
    reads = _read_in_workers(processes, plans, wanted, jobs, scheduler, count, log_skipped)
    collector, summaries, read = _merged_reads(
        processes, plans, reads, set(wanted) - set(reads), store, skipped, log_skipped, on_bytes
    )
    if store is not None:
        _keep_facts(store, processes, keys, collector, summaries, read, facts_entry)
    return collector, summaries


def _merged_reads(
    processes: list[ProcessLog],
    plans: list[ReadPlan],
    reads: dict[int, bytes],
    here: set[int],
    store: ProcessCache | None,
    skipped: SkippedLines,
    log_skipped: bool,
    on_bytes: Callable[[int], None] | None,
) -> tuple[_Collector, list[ProcessSummary], tuple[SkippedLines, list[str], bool]]:
    """Every process's read (the workers' `reads`, those read `here`, the cached ones) finished and
    merged into one collector, in order; each read made now kept in `store`.

    (the collector, the summaries, (`skipped`, the warnings the reads logged, whether every read was
    complete)).
    """
    collector = _Collector()
    summaries: list[ProcessSummary] = []
    replayed: list[str] = []
    complete = True
    for index, (process, plan) in enumerate(zip(processes, plans)):
        # Read here in turn, merged and let go: one process's read in memory at a time, as without
        # the cache.
        state, plan, fresh = _read_of(
            process, plan, reads.pop(index, None), index in here, log_skipped, on_bytes
        )
        if log_skipped and plan.hit:
            # a resumed read replayed its cached part's as it went on
            _replay_warnings(state.skipped)
        if store is not None and fresh:
            _keep_read(store, process, plan, state)
        complete = complete and state.complete
        own, summary, own_skipped = finish_read(state, process, plan, on_bytes)
        replayed += _warnings_of(own_skipped)
        collector.merge(own.state())
        merge_skipped(skipped, skipped_result(own_skipped))
        summaries.append(summary)
    return collector, summaries, (skipped, replayed, complete)


def _read_in_workers(
    processes: list[ProcessLog],
    plans: list[ReadPlan],
    wanted: list[int],
    jobs: int | None,
    scheduler: str | None,
    count: Callable[[int], None],
    log_skipped: bool,
) -> dict[int, bytes]:
    """The reads of the processes `wanted` made by workers, pickled, by index: in `jobs` local ones
    or on the Dask cluster at `scheduler` (`model.parallel`); none with one job and no scheduler
    (all are read here)."""
    jobs = 1 if jobs is None else max(1, min(jobs, len(wanted)))
    if not wanted or (jobs <= 1 and scheduler is None):
        return {}
    blobs = summary_parallel.read_in_workers(
        read_share,
        [processes[i] for i in wanted],
        [plans[i] for i in wanted],
        jobs,
        count,
        log_skipped,
        scheduler,
    )
    return dict(zip(wanted, blobs))


def _read_of(
    process: ProcessLog,
    plan: ReadPlan,
    worker_read: bytes | None,
    read_here: bool,
    log_skipped: bool,
    on_bytes: Callable[[int], None] | None,
) -> tuple[ProcessRead, ReadPlan, bool]:
    """(the read of `process`, the plan it was made by, whether it was made now): a worker's, one
    made here (`read_here`), or the cached read itself (a hit)."""
    hit = load_cached_read(plan.resume) if plan.hit else None
    # a cached read that does not load (another layout): read the process after all
    if plan.hit and hit is None:
        plan = dataclasses.replace(
            plan, resume=None, start_segment=0, start_offset=0, start_line=0, hit=False
        )
        read_here = True
    fresh: ProcessRead | bytes | None = (
        read_process(process, plan, log_skipped, on_bytes) if read_here else worker_read
    )
    if isinstance(fresh, bytes):
        # a worker's result, from our own worker (`model.parallel`): never a cache entry
        state: ProcessRead = pickle.loads(fresh)
        state.rebind(process, log_skipped)
    elif fresh is not None:
        state = fresh
    else:  # a hit: the cached read is the read
        state = hit  # type: ignore[assignment]  # no fresh read is a hit, whose cached read loaded
        state.rebind(process, log_skipped)
    return state, plan, fresh is not None


def _keep_read(
    store: ProcessCache, process: ProcessLog, plan: ReadPlan, state: ProcessRead
) -> None:
    """Keep a read made now for the next command (before it is finished: what follows its last
    complete line is never cached), when it read every byte its keys cover."""
    if plan.keys is not None and state.complete:
        blob = dump_cached(state)
        if blob is not None:
            store.save(
                process, plan.keys[: plan.stop + 1], tuple(state.lines[: plan.stop + 1]), blob
            )


def _keep_facts(
    store: ProcessCache,
    processes: list[ProcessLog],
    keys: list[Any],
    collector: _Collector,
    summaries: list[ProcessSummary],
    read: tuple[SkippedLines, list[str], bool],
    facts_entry: list[Any] | None,
) -> None:
    """Write the reads kept, then the merged facts (with the skipped lines and the warnings `read`
    logged, and whether every read was complete), when every process has records."""
    skipped, replayed, complete = read
    if not any(summary.records for summary in summaries):
        return  # not one record (a folder that is not a run): nothing worth keeping, and nothing written into it
    store.flush()
    # (Not with an empty file: its creation time is its mtime, which no content key covers.)
    if complete and all(summary.records for summary in summaries):
        # Kept now, before any verdict shifts a time: the facts on the clocks as written.
        kept = collector.state()
        kept["closing"] = [spans for _, spans in kept["closing"]]
        facts = dump_cached((kept, summaries, skipped_result(skipped), replayed))
        if facts is not None and store.save_run(processes, keys, facts) and facts_entry is not None:
            facts_entry.append((store, processes, keys))


def _merged_from_cache(
    store: ProcessCache,
    processes: list[ProcessLog],
    keys: list[Any],
    skipped: SkippedLines,
    log_skipped: bool,
) -> tuple[_Collector, list[ProcessSummary]] | None:
    """What `collect_run` returns, from the merged facts kept for exactly these files (None: not
    kept, or torn)."""
    payload = store.lookup_run(processes, keys)
    if payload is None:
        return None
    facts = load_cached(payload)
    if not (isinstance(facts, tuple) and len(facts) == 4):
        return None
    state, summaries, skipped_lines, replayed = facts
    if (
        not isinstance(state, dict)
        or len(state.get("closing", ())) != len(processes)
        or len(summaries) != len(processes)
    ):
        return None
    state["closing"] = list(zip(processes, state["closing"]))
    collector = _Collector()
    collector.merge(state)
    merge_skipped(skipped, skipped_lines)
    if log_skipped:
        for message in replayed:
            _LOG.warning("%s", message)
    return collector, summaries


def summarize_tails(
    path: str | os.PathLike[str],
    *,
    ranks: Iterable[int] | None = None,
    sources: Iterable[str] | None = None,
    run_id: str | None = None,
    log_skipped: bool = True,
) -> RunSummary:
    """`tails_model` of the run at `path` (``summarize --tail``); the options as `summarize_run`'s.

    Example (both ranks of the run stopped after their last step's scalar):
        >>> summary = summarize_tails("outputs")
        >>> summary.tail_only, [g.event for g in summary.stopped_at]
        (True, ['metric_value'])
    """
    return tails_model(
        RunSelection.of(path, ranks=ranks, sources=sources, run_id=run_id, log_skipped=log_skipped)
    )


def tails_model(selection: RunSelection) -> RunSummary:
    """Where every process of the run `selection` names stopped, from the ends of its files only
    (`read.tails`): seconds for thousands of ranks.

    The same `RunSummary` as `summarize_run` with what the tails hold: last
    event, last step, open spans (those that started within the tail), closing
    record, signal, torn last line, hang suspects (their files are read whole:
    they are tiny). No phases, stragglers or clock alignment (`tail_only` is True).

    Example (both ranks of the run stopped after their last step's scalar):
        >>> summary = tails_model(RunSelection.of("outputs"))
        >>> summary.tail_only, [g.event for g in summary.stopped_at]
        (True, ['metric_value'])
    """

    logs, choice = selection.read()
    collector = _Collector()
    processes: list[ProcessSummary] = []
    for process in logs.processes:
        summary = _new_summary(process)
        skipped_before = logs.skipped.count
        records, whole = tail_records(process, logs.skipped, trimmed=True)
        collector.begin(process, summary, whole=whole)
        extent = walk_process(_observe(records, summary, whole=whole), collector)
        collector.end(extent.last_us)
        summary.records, summary.first_us, summary.last_us = (
            extent.records,
            extent.first_us,
            extent.last_us,
        )
        summary.skipped_lines = logs.skipped.count - skipped_before
        _finish_process(summary, process)
        processes.append(summary)
    alignment = ClockAlignment(False, "not estimated from file tails")
    run = _run_summary(
        logs,
        choice,
        processes,
        alignment,
        phases=[],
        stragglers=[],
        records=sum(p.records for p in processes),
        hang_facts=collector.hang.facts,
        rank_filter=selection.ranks,
    )
    run.tail_only = True
    return run


def _byte_counter(
    total: int, progress: Callable[[int, int], None] | None
) -> Callable[[int], None] | None:
    if progress is None:
        return None
    done = 0

    def on_bytes(count: int) -> None:
        nonlocal done
        done += count
        progress(done, total)

    return on_bytes


def _new_summary(process: ProcessLog) -> ProcessSummary:
    return ProcessSummary(
        label=process.label,
        source=process.source,
        rank=process.rank,
        attempt=process.attempt,
        pid=process.pid,
        host_name=process.host_name,
        run_id=process.run_id,
        files=[os.path.basename(p) for p in process.segments],
    )


def _finish_process(summary: ProcessSummary, process: ProcessLog) -> None:

    if summary.last_event is None and summary.closed_cleanly is not True:
        # Nothing but the logger's own records since the file was created: it hung (or died) before
        # its first record.
        summary.hang_suspect = True
        if summary.created_us is None and summary.records == 0:
            summary.created_us = _modified_us(process.segments)
    if summary.closed_cleanly is not True:
        summary.torn_last_line = ends_torn(process)


def _apply_offsets(processes: list[ProcessSummary], alignment: ClockAlignment) -> None:
    """Every time shown on the aligned clock: the host's offset at that moment subtracted (it moves
    when the clocks drift)."""
    if not alignment.applied:
        return
    for p in processes:
        host = p.host_name or p.label
        p.clock_offset_ms = round(alignment.offset(host) / 1000.0, 3)
        for name in ("first_us", "last_us", "last_event_us", "created_us"):
            value = getattr(p, name)
            if value is not None:
                setattr(p, name, value - int(round(alignment.offset_at(host, value))))
        for span in p.open_spans:
            span.start_us -= int(round(alignment.offset_at(host, span.start_us)))
        if p.signal_us is not None:
            p.signal_us -= int(round(alignment.offset_at(host, p.signal_us)))
        # a copy: the cached read keeps the times as written
        if p.crash is not None and type(p.crash.get("time_us")) is int:
            p.crash = {
                **p.crash,
                "time_us": p.crash["time_us"]
                - int(round(alignment.offset_at(host, p.crash["time_us"]))),
            }


def _alive_here(summary: ProcessSummary) -> bool | None:
    """Whether the process of `summary` is alive on this host (`read.processes_here`), for one
    that did not close cleanly; None where that cannot be told."""
    opened = summary.created_us if summary.created_us is not None else summary.first_us
    if summary.closed_cleanly is True or opened is None:
        return None
    # its own clock: the offset shown was subtracted from every time (`_apply_offsets`)
    written = opened + int(round((summary.clock_offset_ms or 0.0) * 1000.0))
    return alive_here(summary.host_name, summary.pid, written)


def _run_summary(
    logs: Any,
    choice: Any,
    processes: list[ProcessSummary],
    alignment: ClockAlignment,
    *,
    phases: list[PhaseStats],
    stragglers: list[Stragglers],
    records: int,
    hang_facts: dict[str, dict[str, Any]] | None = None,
    rank_filter: Iterable[int] | None = None,
) -> RunSummary:
    # Every file empty: each process hung (or died) before its first record; that is the summary.
    last_us = max((p.last_us for p in processes if p.last_us is not None), default=None)
    first_us = min((p.first_us for p in processes if p.first_us is not None), default=None)
    _find_killed(processes, hang_facts or {})
    for summary in processes:
        summary.alive_here = _alive_here(summary)
        summary.stalled_now = bool((hang_facts or {}).get(summary.label, {}).get("stalled"))
        seen = summary.last_us if summary.last_us is not None else summary.created_us
        if last_us is not None and seen is not None:
            summary.behind_s = round(max(last_us - seen, 0) / 1e6, 6)
    return RunSummary(
        run_dir=logs.run_dir,
        log_dir=logs.log_dir,
        run_ids=sorted({p.run_id for p in processes if p.run_id}),
        first_us=first_us,
        last_us=last_us,
        records=records,
        skipped_lines=logs.skipped.count,
        skipped_examples=logs.skipped.examples[:20],
        repaired_lines=logs.skipped.repaired,
        processes=processes,
        stopped_at=_stop_groups(processes),
        phases=phases,
        stragglers=stragglers,
        run_id=choice.run_id,
        run_selection=choice.how,
        runs=choice.runs,
        hang_suspects=[p.label for p in processes if p.hang_suspect],
        straggler_rule=dict(STRAGGLER_RULE),
        clock=alignment,
        missing=(missing := missing_ranks(logs.processes, rank_filter)),
        hang=build_hang(
            processes,
            hang_facts or {},
            bases_of(logs.processes),
            missing,
            _torch_dumps(logs, processes, first_us),
            clock_error_us={host: alignment.error_us(host) for host in alignment.written_error_us},
        ),
        stalls_ended=stall_history(processes, hang_facts or {}),
    )


def _find_killed(processes: list[ProcessSummary], hang_facts: dict[str, dict[str, Any]]) -> None:
    """Mark the processes killed without a word (`model.ending.killed_silently`), judged against the
    others of their source and attempt."""
    by_run: dict[tuple[str, int | None], list[tuple[ProcessSummary, End]]] = {}
    labels = Counter(p.label for p in processes)
    for p in processes:
        # The facts are kept by label, which repeats across restart attempts: an earlier attempt's
        # are then its open spans.
        fact: dict[str, Any] = (
            (hang_facts.get(p.label) or {})
            if labels[p.label] == 1
            else {"step": p.last_step, "entered": [s.name for s in p.open_spans]}
        )
        end = End(
            p.label,
            closed=bool(p.closed_cleanly),
            last_us=p.last_us,
            step=fact.get("step"),
            entered=fact.get("entered") or (),
            crash=p.crash,
            signal_us=p.signal_us if p.signal else None,
            wrote=p.last_event is not None,
        )
        by_run.setdefault((p.source, p.attempt), []).append((p, end))
    for members in by_run.values():
        ends = [end for _, end in members]
        differ = programs_differ(end.entered for end in ends)  # once per run: 1,000 ranks
        for p, end in members:
            evidence = kill_evidence(end, ends, differ)
            if evidence is not None:
                p.crash = killed_crash(end, evidence, p.last_phase, torn=p.torn_last_line)


def missing_ranks(
    processes: Iterable[ProcessLog], rank_filter: Iterable[int] | None = None
) -> list[dict[str, Any]]:
    """Per (source, attempt) whose records say ``world_size`` N: the ranks below N with no file
    (never reached init).

    Example:
        >>> missing_ranks([ProcessLog("a", [], "training", 0, world_size=3, attempt=0), ProcessLog("b", [], "training", 1, world_size=3, attempt=0)])
        [{'source': 'training', 'attempt': 0, 'world_size': 3, 'ranks': [2]}]
    """
    wanted = None if rank_filter is None else set(rank_filter)
    present: dict[tuple[str, Any], set[int]] = {}
    sizes: dict[tuple[str, Any], int] = {}
    for process in processes:
        key = (process.source, process.attempt)
        if process.rank is not None:
            present.setdefault(key, set()).add(process.rank)
        if type(process.world_size) is int and 0 < process.world_size <= 1 << 20:
            sizes[key] = max(sizes.get(key, 0), process.world_size)
    out = []
    for (source, attempt), size in sorted(
        sizes.items(), key=lambda item: (item[0][0], -1 if item[0][1] is None else item[0][1])
    ):
        absent = [
            r
            for r in range(size)
            if r not in present.get((source, attempt), set()) and (wanted is None or r in wanted)
        ]
        if absent:
            out.append({"source": source, "attempt": attempt, "world_size": size, "ranks": absent})
    return out


def _torch_dumps(
    logs: Any, processes: list[ProcessSummary], first_us: int | None
) -> dict[int, tuple[str, dict[str, Any]]]:
    """torch's own flight-recorder dumps of this run (beside the logs, or at
    ``TORCH_FR_DUMP_TEMP_FILE``), only when a process did not close."""
    if all(p.closed_cleanly for p in processes):
        return {}
    folders = [logs.log_dir, logs.run_dir, os.path.join(logs.run_dir, "flight_recorder")]
    found = find_torch_dumps(folders, os.environ.get("TORCH_FR_DUMP_TEMP_FILE"))
    # A dump of an earlier job in the same folder is not this run's: its collectives began before
    # this run did.
    out = {}
    for rank, (path, dump) in found.items():
        created: list[int] = [
            e["time_created_ns"]
            for e in dump["entries"]
            if isinstance(e, dict) and type(e.get("time_created_ns")) is int
        ]
        if first_us is None or (created and max(created) / 1000 >= first_us):
            out[rank] = (path, dump)
    return out


def _modified_us(segments: list[str]) -> int | None:
    """An empty file's modification time: when it was created (nothing was written since)."""
    for path in segments:
        try:
            return int(os.stat(path).st_mtime * 1e6)
        except OSError:
            continue
    return None


# -- figures --------------------------------------------------------------------------------------
def percentile(sorted_values: list[float], fraction: float) -> float:
    """Linear-interpolated percentile of sorted values (numpy's default method).

    Example:
        >>> percentile([1.0, 2.0, 3.0, 4.0], 0.5), percentile([1.0, 2.0, 3.0, 4.0], 0.95)
        (2.5, 3.85)
    """
    if not sorted_values:
        return 0.0
    position = (len(sorted_values) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return round(
        sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low), 9
    )


def _phase_stats(phases: dict[tuple[str, str], _PhaseAcc]) -> list[PhaseStats]:
    out = []
    for (source, name), acc in sorted(phases.items()):
        values = sorted(acc.durations)
        label, rank, attempt, step = acc.max_at
        out.append(
            PhaseStats(
                source=source,
                name=name,
                count=len(values),
                errors=acc.errors,
                incomplete=acc.incomplete,
                total_ms=round(sum(values), 6),
                p50_ms=percentile(values, 0.5),
                p95_ms=percentile(values, 0.95),
                max_ms=values[-1] if values else 0.0,
                slowest=label,
                slowest_rank=rank,
                slowest_attempt=attempt,
                slowest_step=step,
            )
        )
    return out


def _stop_groups(processes: list[ProcessSummary]) -> list[StopGroup]:
    groups: dict[str, list[str]] = {}
    for process in processes:
        groups.setdefault(process.stop_key, []).append(process.label)
    largest = max((len(v) for v in groups.values()), default=0)
    majority = sum(1 for v in groups.values() if len(v) == largest) == 1
    ordered = sorted(groups.items(), key=lambda item: (len(item[1]), item[0]))
    return [
        StopGroup(
            event=event,
            count=len(labels),
            processes=labels,
            odd_one_out=majority and len(groups) > 1 and len(labels) < largest,
        )
        for event, labels in ordered
    ]


def _anchor_spans(
    collector: _Collector, source: str, attempt: int | None, anchor: str
) -> dict[int, dict[int, tuple[int, int]]]:
    """rank → step → (start, end) µs of its step-closing collective `anchor`, on its own clock."""
    out: dict[int, dict[int, tuple[int, int]]] = {}
    for process, spans in collector.closing:
        if process.source != source or process.attempt != attempt or process.rank is None:
            continue
        base = _attempt_step(process.attempt, 0)
        own = out.setdefault(process.rank, {})
        for step, name, start_us, end_us in zip(spans.steps, spans.names, spans.starts, spans.ends):
            if name == anchor:
                own[step - base] = (start_us, end_us)
    return {rank: by_step for rank, by_step in out.items() if by_step}


def _stragglers(
    collector: _Collector, alignment: ClockAlignment, step_range: StepRange | None = None
) -> list[Stragglers]:
    """Per source and attempt: every rank compared with its peers (`model.stragglers`), with the
    findings and what was withheld; `step_range`: on those steps alone."""
    out = []
    for (source, attempt), per_rank in sorted(
        collector.step_ms.items(),
        key=lambda item: (item[0][0], -1 if item[0][1] is None else item[0][1]),
    ):
        per_rank = _in_steps(per_rank, step_range)
        if len(per_rank) < 2:
            continue
        out.append(
            _judged(
                collector,
                alignment,
                _evidence(collector, alignment, step_range, source, attempt, per_rank),
            )
        )
    return out


@dataclasses.dataclass
class _Evidence:
    """What one source and attempt's verdicts are drawn from, on the steps judged (`_stragglers`):
    one read of the collector for every peer group."""

    source: str
    attempt: int | None
    #: rank → step → ms of the step.
    per_rank: dict[int, dict[int, float]]
    #: The median step time of every rank (the bar a phase's difference is measured against).
    step_ms: float | None
    last_step: int
    #: rank → its host (whose clock it writes on).
    hosts: dict[int, str | None]
    #: Ranks that should do the same work (`model.stragglers.peer_groups`).
    groups: dict[tuple[tuple[str, int], ...], list[int]]
    one_clock: bool
    #: The step-closing collective every rank leaves at one instant, and rank → step → (start, end)
    #: µs of it, own clock ({}: none).
    anchor: str | None
    anchors: dict[int, dict[int, tuple[int, int]]]
    #: rank → step → when it left that collective (None without one).
    exits: dict[int, dict[int, int]] | None
    #: phase → rank → step → ms; phase → rank → step → when its last span of the phase ended (µs,
    #: own clock).
    phases: dict[str, dict[int, dict[int, float]]]
    phase_ends: dict[str, dict[int, dict[int, int]]]
    #: The steps compared (``--steps A:B``: ``"A:B"``); None: every step.
    steps_compared: str | None


def _evidence(
    collector: _Collector,
    alignment: ClockAlignment,
    step_range: StepRange | None,
    source: str,
    attempt: int | None,
    per_rank: dict[int, dict[int, float]],
) -> _Evidence:
    """The collector's facts of one source and attempt that the verdicts need, within
    `step_range`."""
    all_steps = [ms for by_step in per_rank.values() for ms in by_step.values()]
    hosts = {rank: collector.rank_hosts.get((source, attempt, rank)) for rank in per_rank}
    # The step-closing collective that every rank leaves at one instant: its end is each rank's
    # own-clock reference.
    anchors = (
        _in_steps(_anchor_spans(collector, source, attempt, alignment.anchor), step_range)
        if alignment.anchor is not None and alignment.simultaneous
        else {}
    )
    phases = {
        phase: _in_steps(ranks, step_range)
        for (ph_source, ph_attempt, phase), ranks in collector.phase_step_ms.items()
        if (ph_source, ph_attempt) == (source, attempt)
    }
    return _Evidence(
        source=source,
        attempt=attempt,
        per_rank=per_rank,
        step_ms=statistics.median(all_steps) if all_steps else None,
        last_step=max((step for by_step in per_rank.values() for step in by_step), default=0),
        hosts=hosts,
        groups=peer_groups(
            {rank: collector.rank_meshes.get((source, attempt, rank)) for rank in per_rank}
        ),
        one_clock=len(set(hosts.values())) == 1,
        anchor=alignment.anchor,
        anchors=anchors,
        exits={
            rank: {step: end for step, (_, end) in by_step.items()}
            for rank, by_step in anchors.items()
        }
        if anchors
        else None,
        phases=phases,
        phase_ends={
            phase: _in_steps(collector.phase_step_end.get((source, attempt, phase), {}), step_range)
            for phase in phases
        },
        steps_compared=None if step_range is None else str(step_range),
    )


def _judged(collector: _Collector, alignment: ClockAlignment, facts: _Evidence) -> Stragglers:
    """One source and attempt's verdicts: the table of steps, every peer group judged in turn, who
    arrived last most often, what was withheld."""
    # the table of steps, every rank; the verdicts below compare peers only
    steps, everyone = compare_ranks(facts.per_rank)
    result = Stragglers(
        source=facts.source,
        attempt=facts.attempt,
        ranks=sorted(facts.per_rank),
        median_step_ms=None if facts.step_ms is None else round(facts.step_ms, 6),
        steps=steps,
        ranks_by_slowness=[],
        straggler_ranks=[],
        phase_stragglers=[],
    )
    result.peer_groups = [
        {"group": dict(key), "ranks": members} for key, members in facts.groups.items()
    ]
    result.steps_compared = facts.steps_compared
    cannot_tell = 0
    last: dict[int, int] = {}
    for key, members in facts.groups.items():
        cannot_tell += _judge_group(result, facts, key, members, everyone, last)
    if facts.anchors and result.arrival_steps:
        result.arrival_collective = alignment.anchor
        result.last_arrivals = [
            {"rank": rank, "steps": count}
            for rank, count in sorted(last.items(), key=lambda item: (-item[1], item[0]))[:10]
        ]
    result.ranks_by_slowness.sort(
        key=lambda r: (not r.straggler, not r.differs, -r.median_excess_ms, r.rank)
    )
    result.withheld = _withheld(
        alignment,
        facts.hosts,
        all(_one_clock(facts, members) for members in facts.groups.values()),
        bool(facts.anchors),
        cannot_tell,
    ) + _not_compared(facts.groups)
    _legacy_lists(result, collector, facts.source)
    result.job_slowdown = _job_slowdown(collector, facts, result)
    return result


def _job_slowdown(
    collector: _Collector, facts: _Evidence, result: Stragglers
) -> JobSlowdown | None:
    """The job slower than its own past at the run's end (`model.job_speed`, `watch`'s ``job_slow``
    rule), judged after the stragglers: not while one is named.

    Per token where the program logs a token count (`job_speed.TOKEN_SCALARS`)
    and the run has one source and attempt: the scalars kept per step are not
    told apart by source.
    """
    one = len(collector.step_ms) == 1
    tokens = {
        step: list(values)
        for name in (job_speed.TOKEN_SCALARS if one else ())
        for step, values in collector.scalar_steps.series.get(name, {}).items()
    }
    by_step: dict[int, list[float]] = {}
    for times in facts.per_rank.values():
        for step, ms in times.items():
            by_step.setdefault(step, []).append(ms)
    values = {step: job_speed.step_value(ms, tokens.get(step, ())) for step, ms in by_step.items()}
    steps = sorted(values)
    # After the fact the slower steps may have begun long before the end: judged against the steps
    # before the change (`watch` holds the split it raised with, to the same effect).
    split = (
        steps[job_speed.change_split([values[k] for k in steps])]
        if len(steps) >= job_speed.MIN_STEPS
        else None
    )
    return job_speed.judge(
        values,
        facts.per_rank,
        facts.phases,
        facts.anchor,
        split=split,
        per_token=any(step in tokens for step in values),
        straggler=any(f.headline and f.verdict == "straggler" for f in result.findings),
    )


def _judge_group(
    result: Stragglers,
    facts: _Evidence,
    key: tuple[tuple[str, int], ...],
    members: list[int],
    everyone: list[RankSlowness],
    last: dict[int, int],
) -> int:
    """One peer group's verdicts added to `result` (step time, each phase, arrival; `last` counts
    who arrived last per step); how many are "cannot tell"."""
    common: dict[str, Any] = dict(
        source=facts.source, attempt=facts.attempt, step_ms=facts.step_ms, peers=members, group=key
    )
    mine = {rank: facts.per_rank[rank] for rank in members if rank in facts.per_rank}
    if len(mine) < 2:
        return 0
    # One group of every rank (no mesh, or one stage): its verdicts are the table's.
    slowness = everyone if len(mine) == len(facts.per_rank) else compare_ranks(mine, table=False)[1]
    result.ranks_by_slowness += slowness
    result.findings += [
        finding(slow, kind="step", what="step time", per_rank=mine, **common)
        for slow in slowness
        if slow.differs
    ]
    result.findings += [
        finding(
            slow,
            kind="step",
            what="step time",
            per_rank=times,
            window=window,
            window_to_end=window[1] >= facts.last_step,
            **common,
        )
        for slow, times, window in windowed(mine, slowness, None)
    ]
    cannot_tell = 0
    for phase, phase_ranks in sorted(facts.phases.items()):
        peers_times = {rank: phase_ranks[rank] for rank in members if rank in phase_ranks}
        ends = {
            rank: by_step
            for rank, by_step in facts.phase_ends[phase].items()
            if rank in peers_times
        }
        found, unknown, _ = judge_phase(
            phase,
            peers_times,
            ends,
            facts.exits,
            # peers on one host share its clock, whatever the other groups' hosts (`watch` judges
            # a peer group so too)
            one_clock=_one_clock(facts, members),
            last_step=facts.last_step,
            **common,
        )
        result.findings += found
        cannot_tell += unknown
    if facts.anchors and facts.anchor is not None:
        result.findings += _arrival_findings(
            result,
            facts.anchor,
            {rank: facts.anchors[rank] for rank in members if rank in facts.anchors},
            last,
            common,
        )
    return cannot_tell


def _one_clock(facts: _Evidence, members: list[int]) -> bool:
    """Whether the ranks `members` all write on one host's clock."""
    return facts.one_clock or len({facts.hosts.get(rank) for rank in members}) == 1


def _arrival_findings(
    result: Stragglers,
    anchor: str,
    anchors: dict[int, dict[int, tuple[int, int]]],
    last: dict[int, int],
    common: dict[str, Any],
) -> list[StragglerFinding]:
    """One peer group's verdicts on arrival at the step-closing collective; `result` counts the
    steps compared, `last` who arrived last in each."""
    found, arrival_steps = judge_arrival(anchor, anchors, **common)
    result.arrival_steps = max(result.arrival_steps, len(arrival_steps))
    for row in arrival_steps:
        if row.slowest_rank is not None:
            last[row.slowest_rank] = last.get(row.slowest_rank, 0) + 1
    return found


def _not_compared(groups: dict[tuple[tuple[str, int], ...], list[int]]) -> list[str]:
    """The ranks alone in their peer group: a declared mesh with no other rank at the same
    coordinates but dp, nothing to compare them with."""
    alone = [members[0] for members in groups.values() if len(members) == 1]
    if not alone:
        return []
    return [
        f"rank{'s' if len(alone) > 1 else ''} {compress(alone)}: not compared: no other rank has "
        "the same mesh coordinates but data-parallel ones"
    ]


#: The question of the kept clock alignment (`_kept_alignment`): it depends on the facts alone
#: (``--no-align`` is applied after).
CLOCKS_QUESTION = "clocks"


def _kept_alignment(facts_entry: list[Any], collector: _Collector) -> ClockAlignment:
    """`clocks.estimate_offsets` of the step-closing spans, kept beside the merged facts as the
    stragglers are (`_kept_stragglers`)."""
    if not facts_entry:
        return estimate_offsets(spans for _, spans in collector.closing)
    store, processes, keys = facts_entry[0]
    payload = store.lookup_verdicts(processes, keys, CLOCKS_QUESTION)
    kept = load_cached(payload) if payload is not None else None
    if type(kept) is ClockAlignment:
        return kept
    found = estimate_offsets(spans for _, spans in collector.closing)
    blob = dump_cached(found)
    if blob is not None:
        store.save_verdicts(processes, keys, CLOCKS_QUESTION, blob)
    return found


def stragglers_question(step_range: StepRange | None, align: bool) -> str:
    """What shapes the straggler verdicts besides the facts: the name of their cache entry's
    question (`ProcessCache.lookup_verdicts`); its version moves when the verdicts gain a part
    (2: the job's own slowdown), so an older entry is judged again."""
    return f"stragglers2|steps={step_range}|align={align}"


def _kept_stragglers(
    facts_entry: list[Any],
    collector: _Collector,
    alignment: ClockAlignment,
    step_range: StepRange | None,
    align: bool,
) -> list[Stragglers]:
    """`_stragglers`, kept in the cache beside the merged facts they are drawn from (`facts_entry`),
    per question (``--steps``, ``--no-align``).

    The verdicts are a function of the facts and of the rules' code, which
    the entry's key covers (content keys and `cache_version`): what is read
    back is what `_stragglers` would return (tests/analysis/model/test_cache.py).
    """
    if not facts_entry:
        return _stragglers(collector, alignment, step_range)
    store, processes, keys = facts_entry[0]
    question = stragglers_question(step_range, align)
    payload = store.lookup_verdicts(processes, keys, question)
    kept = load_cached(payload) if payload is not None else None
    if type(kept) is list and all(type(item) is Stragglers for item in kept):
        return kept
    found = _stragglers(collector, alignment, step_range)
    blob = dump_cached(found)  # now, before anything downstream adds to them
    if blob is not None:
        store.save_verdicts(processes, keys, question, blob)
    return found


def _in_steps(
    per_rank: dict[int, dict[int, Any]], steps: StepRange | None
) -> dict[int, dict[int, Any]]:
    """rank → step → value, with only the steps in `steps` (all of them without); ranks left with
    none dropped."""
    if steps is None:
        return per_rank
    out = {
        rank: {step: value for step, value in by_step.items() if step in steps}
        for rank, by_step in per_rank.items()
    }
    return {rank: by_step for rank, by_step in out.items() if by_step}


def _step_grid(collector: _Collector, alignment: ClockAlignment, bytes_read: int) -> StepGrid:
    """The collector's per-rank, per-step facts as the report draws them (`model.step_grid`);
    arrivals at the anchor, when there is one."""
    arrival: dict[tuple[str, int | None], dict[int, dict[int, float]]] = {}
    if alignment.anchor is not None:
        for key, per_rank in collector.step_starts.items():
            for rank, by_step in _anchor_spans(collector, key[0], key[1], alignment.anchor).items():
                starts = per_rank.get(rank, {})
                arrived = {
                    step: (start_us - starts[step]) / 1000.0
                    for step, (start_us, _) in by_step.items()
                    if step in starts
                }
                if arrived:
                    arrival.setdefault(key, {})[rank] = arrived
    return StepGrid(
        step_ms=collector.step_ms,
        step_starts=collector.step_starts,
        phase_step_ms=collector.phase_step_ms,
        arrival_ms=arrival,
        anchor=alignment.anchor,
        scalars=collector.scalar_steps.series,
        bytes_read=bytes_read,
    )


def _withheld(
    alignment: ClockAlignment,
    hosts: dict[int, str | None],
    one_clock: bool,
    anchored: bool,
    cannot_tell: int,
) -> list[str]:
    """What was not concluded, and why (shown in the Stragglers section and ``--json``)."""
    out = []
    if not anchored:
        why = (
            ""
            if one_clock or alignment.reason.startswith("turned off")
            else f" ({alignment.reason})"
        )
        out.append(
            "arrival at the step-closing collective: not judged: the last span of each step does "
            f"not end at one moment on every rank (it is no collective they leave together){why}"
        )
    if not one_clock and not anchored:
        out.append(
            f"wait or work in each phase: not judged: {len(set(hosts.values()))} hosts whose "
            "clocks cannot be compared, and no collective every rank leaves at one moment "
            "to measure each rank on its own clock; a phase longer on one rank may be time spent "
            "waiting inside a collective"
            + (
                f" ({cannot_tell} such phase{'s' if cannot_tell != 1 else ''} listed as 'cannot "
                "tell'; nobody named)"
                if cannot_tell
                else ""
            )
        )
    return out


def _legacy_lists(result: Stragglers, collector: _Collector, source: str) -> None:
    """The per-kind lists kept from before the findings (``straggler_ranks``, ``phase_stragglers``,
    ``arrival_stragglers``): stragglers only."""
    for item in result.findings:
        if item.verdict != "straggler":
            continue
        if item.kind == "step":
            result.straggler_ranks.append(item.rank)
        elif item.kind == "arrival":
            result.arrival_stragglers.append(_row(item))
        else:
            offsets = collector.phase_offsets.get((source, item.what))
            offset = statistics.median(offsets) if offsets else None
            result.phase_stragglers.append(
                {
                    "phase": item.what,
                    "median_start_in_step_ms": None if offset is None else round(offset, 6),
                    **_row(item),
                    "median_end_lateness_ms": item.lateness_ms,
                }
            )
    # In the order the phases run within a step: a delay shows up as waiting in the phases after it.
    result.phase_stragglers.sort(
        key=lambda row: (
            row["median_start_in_step_ms"] is None,
            row["median_start_in_step_ms"] or 0.0,
            row["phase"],
            -row["median_excess_ms"],
        )
    )
    result.straggler_ranks.sort(
        key=lambda rank: (
            -next(f.excess_ms for f in result.findings if f.kind == "step" and f.rank == rank)
        )
    )


def _row(item: StragglerFinding) -> dict[str, Any]:
    """A finding in the shape of a `RankSlowness` row (the legacy lists' rows)."""
    return {
        "rank": item.rank,
        "compared_steps": item.compared_steps,
        "slowest_steps": item.slowest_steps,
        "median_ms": item.median_ms,
        "others_median_ms": item.others_median_ms,
        "median_excess_ms": item.excess_ms,
        "median_excess_pct": item.excess_pct,
        "noise_ms": item.noise_ms,
        "robust_z": item.robust_z,
        "straggler": True,
        "cost_per_step_ms": item.cost_per_step_ms,
        "share_of_step": item.share_of_step,
        "persistent": item.persistent,
    }
