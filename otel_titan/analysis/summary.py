"""A run's summary: where every process stopped, what is still open, phase timings, stragglers.

Computed in one streaming pass over each process (see `timeline.walk_process`).
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
* a rank is *repeatedly slowest* when it is the slowest rank in more than
  half of the (≥ 3) steps that two or more ranks completed, and its median
  excess over the other ranks' median is at least 5% of that median.
"""

from __future__ import annotations

import bisect
import os
import statistics
from array import array
from dataclasses import asdict
from typing import Any, Iterable, Iterator

from otel_titan.analysis.reader import META_EVENTS, NoRecordsError, ProcessLog, read_run
from otel_titan.analysis.summary_model import OpenSpanInfo, PhaseStats, ProcessSummary, RankSlowness, RunSummary, StepTimes, StopGroup, Stragglers, utc
from otel_titan.analysis.timeline import OpenSpan, TimelineVisitor, walk_process

__all__ = [
    "summarize_run",
    "compare_ranks",
    "percentile",
    "utc",
    "REPEATED_SHARE",
    "REPEATED_MIN_STEPS",
    "REPEATED_MIN_EXCESS",
]

#: A rank is "repeatedly slowest" when slowest in more than this share of the compared steps ...
REPEATED_SHARE = 0.5
#: ... of at least this many steps ...
REPEATED_MIN_STEPS = 3
#: ... and its median excess is at least this fraction of the other ranks' median.
REPEATED_MIN_EXCESS = 0.05
#: Open spans listed per process, the most recently started (all are counted).
OPEN_SPANS_LISTED = 20
_OTEL_TITAN_LOGGER = "otel_titan.structured_logger"


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
        # (source, rank) → step → ms; a restart's replayed steps replace the earlier attempt's.
        self.step_ms: dict[tuple[str, int], dict[int, float]] = {}
        self.phase_step_ms: dict[tuple[str, str], dict[int, dict[int, float]]] = {}
        # When a phase starts, in ms after its step began: orders the phase stragglers.
        self.phase_offsets: dict[tuple[str, str], array] = {}

    def begin(self, process: ProcessLog, summary: ProcessSummary) -> None:
        self.process, self.summary = process, summary
        self.open: list[tuple[OpenSpan, float]] = []
        self.steps_seen: list[tuple[int, float]] = []
        self.phase_sums: dict[str, dict[int, float]] = {}
        self.step_begins: dict[int, int] = {}

    def step_begun(self, step: int, begin_us: int) -> None:
        self.step_begins[step] = begin_us

    def span(self, span: OpenSpan, end: dict[str, Any] | None, end_us: int, dur_us: float, incomplete: bool) -> None:
        key = (self.process.source, span.name)
        acc = self.phases.get(key)
        if acc is None:
            acc = self.phases[key] = _PhaseAcc()
        if span.error is not None:
            acc.errors += 1
        if incomplete:
            acc.incomplete += 1
            self.open.append((span, dur_us))
            return
        ms = dur_us / 1000.0
        acc.durations.append(ms)
        first = span.start if span.start is not None else end
        step = first.get("step") if first is not None else None
        step = step if type(step) is int else None
        if ms > acc.max_ms:
            acc.max_ms = ms
            acc.max_at = (self.process.label, self.process.rank, self.process.attempt, step)
        if step is not None:
            sums = self.phase_sums.setdefault(span.name, {})
            sums[step] = sums.get(step, 0.0) + ms
            begin = self.step_begins.get(step)
            if begin is not None and span.start is not None:
                offsets = self.phase_offsets.get(key)
                if offsets is None:
                    offsets = self.phase_offsets[key] = array("d")
                offsets.append((span.start_us - begin) / 1000.0)

    def error(self, record: dict[str, Any], span: OpenSpan | None, track: Any) -> None:
        if span is None:
            name = record["log_type_name"][:-6]
            acc = self.phases.setdefault((self.process.source, name), _PhaseAcc())
            acc.errors += 1

    def meta(self, record: dict[str, Any]) -> None:
        summary = self.summary
        name = record["log_type_name"]
        if name == "signal_received":
            signal = record.get("signal")
            summary.signal = signal if isinstance(signal, str) else "signal"
        dropped, failed = record.get("dropped_records"), record.get("failed_records")
        if type(dropped) is int:
            summary.records_dropped = max(summary.records_dropped, dropped)
        if type(failed) is int:
            summary.records_failed = max(summary.records_failed, failed)

    def step(self, step: int, begin_us: int, end_us: int, first: dict[str, Any]) -> None:
        self.steps_seen.append((step, (end_us - begin_us) / 1000.0))

    def end(self, last_us: int | None) -> None:
        process, summary = self.process, self.summary
        if process.rank is not None:
            # The last step has no next step to end it: its time is unknown.
            step_ms = self.step_ms.setdefault((process.source, process.rank), {})
            for step, ms in self.steps_seen[:-1]:
                step_ms[step] = ms
            for phase, sums in self.phase_sums.items():
                per_rank = self.phase_step_ms.setdefault((process.source, phase), {})
                per_rank.setdefault(process.rank, {}).update(sums)
        summary.open_span_count = len(self.open)
        paths: dict[Any, list[str]] = {}
        listed = []
        for index, (span, dur_us) in enumerate(self.open):  # in start order, so a lane's outer spans come first
            path = paths.setdefault(span.lane, [])
            path.append(span.name)
            if index >= len(self.open) - OPEN_SPANS_LISTED:  # the most recent ones; each has its full path
                first = span.start or {}
                step = first.get("step")
                listed.append(
                    OpenSpanInfo(
                        name=span.name,
                        path=list(path),
                        step=step if type(step) is int else None,
                        start_us=span.start_us,
                        open_s=round(dur_us / 1e6, 6),
                        task_name=span.lane[1],
                        thread=span.lane[0] if type(span.lane[0]) is int else None,
                        failed=span.error is not None,
                    )
                )
        summary.open_spans = listed


def _observe(records: Iterable[dict[str, Any]], summary: ProcessSummary) -> Iterator[dict[str, Any]]:
    """Pass records through, noting last event, last step, sequence gaps and the closing record."""
    expected_seq: int | None = None
    last_name: str | None = None
    writer: Any = None
    for record in records:
        name = record["log_type_name"]
        last_name = name
        if writer is None:
            writer = record.get("logger_name", "")
        seq = record.get("seq_id")
        if type(seq) is int:
            if expected_seq is None:
                summary.first_seq_id = seq
            elif seq > expected_seq:
                summary.lost_lines += seq - expected_seq
            expected_seq = seq + 1
        if name not in META_EVENTS:
            summary.last_event, summary.last_event_us = name, record["time_us"]
            step = record.get("step")
            summary.last_event_step = step if type(step) is int else None
            if type(step) is int and (summary.last_step is None or step >= summary.last_step):
                summary.last_step = step
                relative = record.get("relative_step")
                summary.last_relative_step = relative if type(relative) is int else None
        yield record
    if last_name is not None:
        # Only otel-titan writes a closing record; for torchtitan's and pimm's files it is unknown.
        summary.closed_cleanly = True if last_name == "structured_logger_closed" else (False if writer == _OTEL_TITAN_LOGGER else None)


def summarize_run(path: str | os.PathLike[str], *, ranks: Iterable[int] | None = None, sources: Iterable[str] | None = None, log_skipped: bool = True) -> RunSummary:
    """Read a run (directory or its ``structured_logs/``) and summarize it.

    Raises `NotARunError` for a path that is not a run, `NoRecordsError` when
    no record could be read.

    Example:
        >>> # from otel_titan.analysis import summarize_run, format_summary
        >>> # summary = summarize_run("outputs")
        >>> # print(format_summary(summary))          # the tables
        >>> # [p.last_event for p in summary.processes]  # e.g. ['optimizer_end', 'data_fetch_start']
    """
    run = read_run(path, ranks=ranks, sources=sources, log_skipped=log_skipped)
    collector = _Collector()
    processes: list[ProcessSummary] = []
    for process in run.processes:
        summary = ProcessSummary(
            label=process.label,
            source=process.source,
            rank=process.rank,
            attempt=process.attempt,
            pid=process.pid,
            host_name=process.host_name,
            run_id=process.run_id,
            files=[os.path.basename(p) for p in process.segments],
        )
        skipped_before = run.skipped.count
        collector.begin(process, summary)
        extent = walk_process(_observe(process.records(run.skipped), summary), collector)
        collector.end(extent.last_us)
        summary.records, summary.first_us, summary.last_us = extent.records, extent.first_us, extent.last_us
        summary.skipped_lines = run.skipped.count - skipped_before
        processes.append(summary)
    records = sum(p.records for p in processes)
    if records == 0:
        raise NoRecordsError(f"{run.log_dir}: no readable records" + (f" ({run.skipped.count} unreadable lines skipped)" if run.skipped.count else ""))
    last_us = max(p.last_us for p in processes if p.last_us is not None)
    first_us = min(p.first_us for p in processes if p.first_us is not None)
    for summary in processes:
        if summary.last_us is not None:
            summary.behind_s = round((last_us - summary.last_us) / 1e6, 6)
    return RunSummary(
        run_dir=run.run_dir,
        log_dir=run.log_dir,
        run_ids=sorted({p.run_id for p in processes if p.run_id}),
        first_us=first_us,
        last_us=last_us,
        records=records,
        skipped_lines=run.skipped.count,
        skipped_examples=run.skipped.examples[:20],
        processes=processes,
        stopped_at=_stop_groups([p for p in processes if p.records]),
        phases=_phase_stats(collector.phases),
        stragglers=_stragglers(collector),
    )


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
    return round(sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low), 9)


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
    return [StopGroup(event=event, count=len(labels), processes=labels, odd_one_out=majority and len(groups) > 1 and len(labels) < largest) for event, labels in ordered]


def compare_ranks(per_rank: dict[int, dict[int, float]]) -> tuple[list[StepTimes], list[RankSlowness]]:
    """Per step: the slowest rank and its excess over the others' median; per rank: how often slowest.

    Example:
        >>> steps, ranks = compare_ranks({0: {1: 10.0, 2: 10.0, 3: 11.0}, 1: {1: 30.0, 2: 31.0, 3: 29.0}})
        >>> [s.slowest_rank for s in steps], ranks[0].rank, ranks[0].repeated, ranks[0].median_excess_ms
        ([1, 1, 1], 1, True, 20.0)
    """
    steps: dict[int, dict[int, float]] = {}
    for rank, by_step in per_rank.items():
        for step, ms in by_step.items():
            steps.setdefault(step, {})[rank] = ms
    rows: list[StepTimes] = []
    slowest_count: dict[int, int] = {}
    excess: dict[int, list[float]] = {}
    own: dict[int, list[float]] = {}
    others: dict[int, list[float]] = {}
    for step in sorted(steps):
        times = steps[step]
        if len(times) < 2:
            continue
        ordered = sorted(times.values())
        slowest = max(times, key=lambda r: (times[r], -r))
        for rank, ms in times.items():
            rest = _median_without(ordered, ms)
            excess.setdefault(rank, []).append(ms - rest)
            own.setdefault(rank, []).append(ms)
            others.setdefault(rank, []).append(rest)
        slowest_count[slowest] = slowest_count.get(slowest, 0) + 1
        rest = _median_without(ordered, times[slowest])
        rows.append(StepTimes(step=step, ms=dict(sorted(times.items())), slowest_rank=slowest, excess_ms=round(times[slowest] - rest, 6)))
    ranks = []
    for rank in excess:
        compared = len(excess[rank])
        count = slowest_count.get(rank, 0)
        median_excess = statistics.median(excess[rank])
        others_median = statistics.median(others[rank])
        pct = 100.0 * median_excess / others_median if others_median > 0 else 0.0
        repeated = compared >= REPEATED_MIN_STEPS and count > REPEATED_SHARE * compared and median_excess > 0 and median_excess >= REPEATED_MIN_EXCESS * others_median
        ranks.append(
            RankSlowness(
                rank=rank,
                slowest_steps=count,
                compared_steps=compared,
                median_ms=round(statistics.median(own[rank]), 6),
                others_median_ms=round(others_median, 6),
                median_excess_ms=round(median_excess, 6),
                median_excess_pct=round(pct, 2),
                repeated=repeated,
            )
        )
    ranks.sort(key=lambda r: (-r.slowest_steps, -r.median_excess_ms, r.rank))
    return rows, ranks


def _median_without(ordered: list[float], value: float) -> float:
    """Median of sorted `ordered` with one occurrence of `value` left out (O(log n), not O(n))."""
    skip = bisect.bisect_left(ordered, value)
    n = len(ordered) - 1

    def at(i: int) -> float:
        return ordered[i if i < skip else i + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _stragglers(collector: _Collector) -> list[Stragglers]:
    by_source: dict[str, dict[int, dict[int, float]]] = {}
    for (source, rank), by_step in collector.step_ms.items():
        by_source.setdefault(source, {})[rank] = by_step
    out = []
    for source in sorted(by_source):
        per_rank = by_source[source]
        if len(per_rank) < 2:
            continue
        steps, ranks = compare_ranks(per_rank)
        phase_rows = []
        for (phase_source, phase), phase_ranks in sorted(collector.phase_step_ms.items()):
            if phase_source != source or len(phase_ranks) < 2:
                continue
            _, phase_slowness = compare_ranks(phase_ranks)
            if phase_slowness and phase_slowness[0].repeated:
                top = phase_slowness[0]
                offsets = collector.phase_offsets.get((source, phase))
                offset = statistics.median(offsets) if offsets else None
                phase_rows.append({"phase": phase, "median_start_in_step_ms": None if offset is None else round(offset, 6), **asdict(top)})
        # In the order the phases run within a step: a delay shows up as waiting in the phases after it.
        phase_rows.sort(key=lambda row: (row["median_start_in_step_ms"] is None, row["median_start_in_step_ms"] or 0.0, row["phase"]))
        out.append(Stragglers(source=source, ranks=sorted(per_rank), steps=steps, ranks_by_slowness=ranks, phase_stragglers=phase_rows))
    return out
