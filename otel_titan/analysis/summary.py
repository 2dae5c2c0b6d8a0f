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
* a rank is a *straggler* (`compare_ranks`) only on evidence: at least
  `MIN_STEPS` compared steps, a median at least `MIN_EFFECT` above the other
  ranks' median (the difference of the two medians: the figure shown), and
  that difference at least `MIN_Z` times the noise (a robust z: the noise is
  the larger of the spread of the other ranks' medians, 1.4826 × MAD, and the
  standard error of the rank's own median per-step difference). Ties are
  nobody's: a step where the slowest time is shared has no slowest rank.
* a phase straggler must also matter to the step: its difference is at least
  `MIN_STEP_SHARE` of the median step time; and it must finish the phase
  later than the others (on aligned clocks): its median *lateness* (per step,
  its end of the phase minus the median end of the other ranks') at least
  `MIN_LATENESS_SHARE` of its difference (unless its clocks cannot be
  compared: several unaligned hosts, or ranks more than a step apart). A
  longer phase that ends with the others' is a wait (the rank that reaches a collective first waits inside
  it), not slowness.
* a *hang suspect* is a process whose file holds no record since it was
  created (empty, or only the logger's own ``structured_logger_opened``) and
  that did not close cleanly: it hung (or died) before its first record.

One run at a time (`runs.select_run`): the latest in the folder unless
``run_id`` names another; restart attempts of a run are compared separately.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
import statistics
from array import array
from dataclasses import asdict
from typing import Any, Callable, Iterable, Iterator

from otel_titan.analysis.clock_align import ClockAlignment, ClosingSpans, estimate_offsets
from otel_titan.analysis.hang import bases_of, build_hang, digest_black_box
from otel_titan.analysis.reader import META_EVENTS, NoRecordsError, ProcessLog, read_run
from otel_titan.analysis import summary_parallel
from otel_titan.analysis.runs import select_run
from otel_titan.analysis.tails import ends_torn, tail_records
from otel_titan.analysis.summary_model import OpenSpanInfo, PhaseStats, ProcessSummary, RankSlowness, RunSummary, StepTimes, StopGroup, Stragglers, utc
from otel_titan.analysis.timeline import OpenSpan, TimelineVisitor, walk_process
from otel_titan.analysis.wording import plural
from otel_titan.schema import LOGGER_NAME as _OTEL_TITAN_LOGGER
from otel_titan.schema import MetaEvent

__all__ = [
    "summarize_run",
    "summarize_tails",
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

#: A rank is a straggler only with at least this many steps compared with other ranks ...
MIN_STEPS = 6
#: ... a median at least this fraction above the other ranks' median ...
MIN_EFFECT = 0.10
#: ... and that difference at least this many times the noise (robust z; 3.5 is the usual outlier bar).
MIN_Z = 3.5
#: A phase straggler's difference must also be at least this fraction of the median step time.
MIN_STEP_SHARE = 0.01
#: ... and a phase straggler finishes the phase late by at least this share of its difference (else it waited).
MIN_LATENESS_SHARE = 0.5
#: A late arrival at the step-closing collective delays every rank: a smaller share of the others' arrival time counts.
MIN_ARRIVAL_EFFECT = 0.10
#: The rule as data (in ``--json``), so that a reader knows what "straggler" meant.
STRAGGLER_RULE = {"min_steps": MIN_STEPS, "min_effect_pct": MIN_EFFECT * 100, "min_robust_z": MIN_Z, "phase_min_share_of_step_pct": MIN_STEP_SHARE * 100, "arrival_min_effect_pct": MIN_ARRIVAL_EFFECT * 100}
#: MAD × this estimates a standard deviation (normal data); × 1.2533 / √n more: the standard error of a median.
_MAD_TO_SD = 1.4826
_MEDIAN_SE = 1.2533
#: Up to this many ranks, the spread of "the other ranks" leaves each rank out exactly.
_EXACT_SPREAD_UP_TO = 64
#: Open spans listed per process, the most recently started (all are counted).
OPEN_SPANS_LISTED = 20
_OPENED = MetaEvent.OPENED

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
        # (source, attempt) → rank → step → ms. Keyed by attempt: restarts are kept apart, never merged.
        self.step_ms: dict[tuple[str, int | None], dict[int, dict[int, float]]] = {}
        self.phase_step_ms: dict[tuple[str, int | None, str], dict[int, dict[int, float]]] = {}
        # The same keys → rank → step → when the rank's last span of the phase in that step ended (µs, its host's clock).
        self.phase_step_end: dict[tuple[str, int | None, str], dict[int, dict[int, int]]] = {}
        # (source, attempt, rank) → host (whose clock offset applies to its ends).
        self.rank_hosts: dict[tuple[str, int | None, int], str] = {}
        # When a phase starts, in ms after its step began: orders the phase stragglers.
        self.phase_offsets: dict[tuple[str, str], array] = {}
        # label → digest of its latest `stall` record (analysis/hang.py)
        self.black_boxes: dict[str, dict[str, Any]] = {}
        # Per process, the last top-level span of each step: the step-closing collective (clock_align).
        self.closing: list[tuple[ProcessLog, ClosingSpans]] = []

    def state(self) -> dict[str, Any]:
        """What a worker sends back (`summary_parallel`): the run-wide accumulators."""
        return {"phases": self.phases, "step_ms": self.step_ms, "phase_step_ms": self.phase_step_ms, "phase_step_end": self.phase_step_end, "rank_hosts": self.rank_hosts, "phase_offsets": self.phase_offsets, "closing": self.closing, "black_boxes": self.black_boxes}

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
        for name in ("step_ms", "phase_step_ms", "phase_step_end"):
            target = getattr(self, name)
            for key, per_rank in state.get(name, {}).items():
                ranks = target.setdefault(key, {})
                for rank, steps in per_rank.items():
                    ranks.setdefault(rank, {}).update(steps)
        self.rank_hosts.update(state.get("rank_hosts", {}))
        for key, offsets in state["phase_offsets"].items():
            self.phase_offsets.setdefault(key, array("d")).extend(offsets)
        self.closing.extend(state["closing"])
        self.black_boxes.update(state.get("black_boxes", {}))

    def begin(self, process: ProcessLog, summary: ProcessSummary) -> None:
        self.process, self.summary = process, summary
        self.open: list[tuple[OpenSpan, float]] = []
        self.steps_seen: list[tuple[int, float]] = []
        self.phase_sums: dict[str, dict[int, float]] = {}
        self.phase_ends: dict[str, dict[int, int]] = {}
        self.step_begins: dict[int, int] = {}
        self.last_top: tuple[int, str, int, int] | None = None
        self.closing_spans = ClosingSpans(host=process.host_name or process.label, key=process.label)
        self.closing.append((process, self.closing_spans))

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
            if first.get("parent_span_id") is None:  # type: ignore[union-attr]
                self.last_top = (step, span.name, span.start_us, end_us)
            sums = self.phase_sums.setdefault(span.name, {})
            sums[step] = sums.get(step, 0.0) + ms
            ends = self.phase_ends.setdefault(span.name, {})
            if end_us > ends.get(step, end_us - 1):
                ends[step] = end_us
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
        if name == "stall":
            self.black_boxes[self.process.label] = digest_black_box(record)
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
        top = self.last_top
        if top is not None and top[0] == step:
            # Steps of a restart replay the first attempt's numbers: the attempt keeps them apart.
            self.closing_spans.add(_attempt_step(self.process.attempt, step), top[1], top[2], top[3])

    def end(self, last_us: int | None) -> None:
        process, summary = self.process, self.summary
        if process.rank is not None:
            # The last step has no next step to end it: its time is unknown.
            step_ms = self.step_ms.setdefault((process.source, process.attempt), {}).setdefault(process.rank, {})
            for step, ms in self.steps_seen[:-1]:
                step_ms[step] = ms
            for phase, sums in self.phase_sums.items():
                per_rank = self.phase_step_ms.setdefault((process.source, process.attempt, phase), {})
                per_rank.setdefault(process.rank, {}).update(sums)
            for phase, ends in self.phase_ends.items():
                per_rank_end = self.phase_step_end.setdefault((process.source, process.attempt, phase), {})
                per_rank_end.setdefault(process.rank, {}).update(ends)
            self.rank_hosts[(process.source, process.attempt, process.rank)] = process.host_name or process.label
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


def _attempt_step(attempt: int | None, step: int) -> int:
    """One number per (attempt, step), so that a restart's step N is not the first attempt's."""
    return (attempt or 0) * _ATTEMPT_STRIDE + step


_ATTEMPT_STRIDE = 1 << 40


def _observe(records: Iterable[dict[str, Any]], summary: ProcessSummary, whole: bool = True) -> Iterator[dict[str, Any]]:
    """Pass records through, noting last event, last step, sequence gaps and the closing record.

    `whole` False: `records` are a file's tail (`tails`), so the first one is not where the file began.
    """
    expected_seq: int | None = None
    last_name: str | None = None
    writer: Any = None
    for record in records:
        name = record["log_type_name"]
        last_name = name
        if writer is None:
            writer = record.get("logger_name", "")
            if name == _OPENED:  # the first line of an otel-titan file: when the file was created
                summary.created_us = record["time_us"]
        seq = record.get("seq_id")
        if type(seq) is int and whole:
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
) -> RunSummary:
    """Read a run (directory or its ``structured_logs/``) and summarize it.

    A folder can hold several runs (a re-launch into the same ``output_dir``):
    one is summarized, the latest unless `run_id` names another;
    `RunSummary.runs` lists them all. Hosts' clocks are aligned on the
    step-closing collective (`clock_align`) unless `align` is False.
    `progress(bytes_read, bytes_total)` is called as the input is read.
    `jobs`: worker processes (default 1, this process: on 2 busy cores two
    workers were no faster and held twice the memory; on more cores try more).
    `scheduler`: the address of a Dask scheduler (``tcp://host:8786``) whose
    workers read the files instead (`executors`; `jobs` is then ignored):
    the same summary.
    Raises `NotARunError` for a path that is
    not a run, `NoRecordsError` when no record could be read (or `run_id`
    names no run here: `runs.UnknownRunError`).

    Example:
        >>> # from otel_titan.analysis import summarize_run, format_summary
        >>> # summary = summarize_run("outputs")
        >>> # print(format_summary(summary))          # the tables
        >>> # [p.last_event for p in summary.processes]  # e.g. ['optimizer_end', 'data_fetch_start']
    """
    logs, choice = select_run(read_run(path, ranks=ranks, sources=sources, log_skipped=log_skipped), run_id)

    on_bytes = _byte_counter(logs.total_bytes, progress)
    jobs = 1 if jobs is None else max(1, min(jobs, len(logs.processes)))
    if jobs > 1 or scheduler is not None:
        collector, processes = summary_parallel.collect_in_workers(_Collector(), logs.processes, jobs, logs.skipped, on_bytes or (lambda count: None), log_skipped, scheduler)
    else:
        collector = _Collector()
        processes = collect_processes(logs.processes, collector, logs.skipped, on_bytes)
    records = sum(p.records for p in processes)
    if records == 0 and logs.skipped.count:
        raise NoRecordsError(f"{logs.log_dir}: no readable records ({plural(logs.skipped.count, 'unreadable line')} skipped)")
    alignment = estimate_offsets(spans for _, spans in collector.closing)
    if not align and alignment.applied:
        alignment = dataclasses.replace(alignment, applied=False, reason="turned off (--no-align)", offsets_us={})
    _apply_offsets(processes, alignment)
    stragglers = _stragglers(collector, alignment)
    _arrivals(stragglers, collector.closing, alignment)
    return _run_summary(logs, choice, processes, alignment, phases=_phase_stats(collector.phases), stragglers=stragglers, records=records, black_boxes=collector.black_boxes)


def collect_processes(processes: list[ProcessLog], collector: _Collector, skipped: Any, on_bytes: Callable[[int], None] | None) -> list[ProcessSummary]:
    """One streaming pass over each process into `collector`; their summaries (what each worker of `summary_parallel` runs)."""
    out: list[ProcessSummary] = []
    for process in processes:
        summary = _new_summary(process)
        skipped_before = skipped.count
        collector.begin(process, summary)
        extent = walk_process(_observe(process.records(skipped, on_bytes), summary), collector)
        collector.end(extent.last_us)
        summary.records, summary.first_us, summary.last_us = extent.records, extent.first_us, extent.last_us
        summary.skipped_lines = skipped.count - skipped_before
        _finish_process(summary, process)
        out.append(summary)
    return out


def summarize_tails(
    path: str | os.PathLike[str],
    *,
    ranks: Iterable[int] | None = None,
    sources: Iterable[str] | None = None,
    run_id: str | None = None,
    log_skipped: bool = True,
) -> RunSummary:
    """Where every process stopped, from the ends of its files only (`tails`): seconds for thousands of ranks.

    The same `RunSummary` as `summarize_run` with what the tails hold: last
    event, last step, open spans (those that started within the tail), closing
    record, signal, torn last line, hang suspects (their files are read whole:
    they are tiny). No phases, stragglers or clock alignment (`tail_only` is True).

    Example:
        >>> # summary = summarize_tails("outputs"); [g.event for g in summary.stopped_at]
    """

    logs, choice = select_run(read_run(path, ranks=ranks, sources=sources, log_skipped=log_skipped), run_id)
    collector = _Collector()
    processes: list[ProcessSummary] = []
    for process in logs.processes:
        summary = _new_summary(process)
        skipped_before = logs.skipped.count
        records, whole = tail_records(process, logs.skipped)
        collector.begin(process, summary)
        extent = walk_process(_observe(records, summary, whole=whole), collector)
        collector.end(extent.last_us)
        summary.records, summary.first_us, summary.last_us = extent.records, extent.first_us, extent.last_us
        summary.skipped_lines = logs.skipped.count - skipped_before
        _finish_process(summary, process)
        processes.append(summary)
    alignment = ClockAlignment(False, "not estimated from file tails")
    summary = _run_summary(logs, choice, processes, alignment, phases=[], stragglers=[], records=sum(p.records for p in processes))
    summary.tail_only = True
    return summary


def _byte_counter(total: int, progress: Callable[[int, int], None] | None) -> Callable[[int], None] | None:
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
        # Nothing but the logger's own records since the file was created: it hung (or died) before its first record.
        summary.hang_suspect = True
        if summary.created_us is None and summary.records == 0:
            summary.created_us = _modified_us(process.segments)
    if summary.closed_cleanly is not True:
        summary.torn_last_line = ends_torn(process)


def _apply_offsets(processes: list[ProcessSummary], alignment: ClockAlignment) -> None:
    """Every time shown on the aligned clock: the host's offset subtracted."""
    if not alignment.applied:
        return
    for p in processes:
        offset = int(round(alignment.offset(p.host_name or p.label)))
        p.clock_offset_ms = round(offset / 1000.0, 3)
        if not offset:
            continue
        for name in ("first_us", "last_us", "last_event_us", "created_us"):
            value = getattr(p, name)
            if value is not None:
                setattr(p, name, value - offset)
        for span in p.open_spans:
            span.start_us -= offset


def _run_summary(logs: Any, choice: Any, processes: list[ProcessSummary], alignment: ClockAlignment, *, phases: list[PhaseStats], stragglers: list[Stragglers], records: int, black_boxes: dict[str, dict[str, Any]] | None = None) -> RunSummary:
    # Every file empty: each process hung (or died) before its first record; that is the summary.
    last_us = max((p.last_us for p in processes if p.last_us is not None), default=None)
    first_us = min((p.first_us for p in processes if p.first_us is not None), default=None)
    for summary in processes:
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
        hang=build_hang(processes, black_boxes or {}, bases_of(logs.processes)),
    )


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


def compare_ranks(per_rank: dict[int, dict[int, float]], *, step_ms: float | None = None, min_effect: float = MIN_EFFECT) -> tuple[list[StepTimes], list[RankSlowness]]:
    """Per step: each rank's time and the slowest rank (None on a tie); per rank: is it a straggler, by how much.

    A rank's *excess* is its median minus the median of the other ranks'
    medians (over the steps it shares with another rank). It is a straggler
    when it has `MIN_STEPS` such steps, its excess is at least `MIN_EFFECT` of
    the others' median, at least `MIN_Z` times the noise, and (with `step_ms`,
    for a phase) at least `MIN_STEP_SHARE` of the step. The noise is the
    larger of the spread of the other ranks' medians (1.4826 × MAD) and the
    standard error of the rank's median per-step difference from the others
    (1.2533 × 1.4826 × MAD / √n); `robust_z` is None when both are 0.
    Ranks come out stragglers first, then by excess.

    Example:
        >>> steps, ranks = compare_ranks({0: {s: 10.0 for s in range(1, 9)}, 1: {s: 15.0 + s % 2 for s in range(1, 9)}, 2: {s: 10.5 for s in range(1, 9)}})
        >>> [(r.rank, r.median_ms, r.others_median_ms, r.median_excess_ms, r.straggler) for r in ranks]
        [(1, 15.5, 10.25, 5.25, True), (2, 10.5, 12.75, -2.25, False), (0, 10.0, 13.0, -3.0, False)]
        >>> compare_ranks({0: {1: 10.0, 2: 10.0}, 1: {1: 10.0, 2: 10.0}})[0][0].slowest_rank is None  # a tie is nobody's
        True
    """
    steps: dict[int, dict[int, float]] = {}
    for rank, by_step in per_rank.items():
        for step, ms in by_step.items():
            steps.setdefault(step, {})[rank] = ms
    rows: list[StepTimes] = []
    slowest_count: dict[int, int] = {}
    own: dict[int, list[float]] = {}
    differences: dict[int, list[float]] = {}
    for step in sorted(steps):
        times = steps[step]
        if len(times) < 2:
            continue
        ordered = sorted(times.values())
        slowest: int | None = None
        excess = 0.0
        if ordered[-2] < ordered[-1]:  # a shared slowest time is nobody's
            slowest = max(times, key=times.__getitem__)
            slowest_count[slowest] = slowest_count.get(slowest, 0) + 1
            excess = ordered[-1] - _median_without(ordered, ordered[-1])
        for rank, ms in times.items():
            own.setdefault(rank, []).append(ms)
            differences.setdefault(rank, []).append(ms - _median_without(ordered, ms))
        rows.append(StepTimes(step=step, ms=dict(sorted(times.items())), slowest_rank=slowest, excess_ms=round(excess, 6)))
    medians = {rank: statistics.median(values) for rank, values in own.items()}
    ordered_medians = sorted(medians.values())
    # Beyond this many ranks, leaving one rank out moves the spread by at most one order statistic: the
    # spread of all ranks stands for "the others'" (O(R log R) instead of O(R² log R) at 1,000 ranks).
    shared_spread = _MAD_TO_SD * _mad(ordered_medians) if len(ordered_medians) > _EXACT_SPREAD_UP_TO else None
    ranks = []
    for rank, values in own.items():
        others_median = _median_without(ordered_medians, medians[rank])
        excess = medians[rank] - others_median
        pct = 100.0 * excess / others_median if others_median > 0 else None
        if shared_spread is not None:
            spread = shared_spread
        else:
            others = [median for other, median in medians.items() if other != rank]
            spread = _MAD_TO_SD * _mad(others) if len(others) > 1 else 0.0
        standard_error = _MEDIAN_SE * _MAD_TO_SD * _mad(differences[rank]) / math.sqrt(len(values))
        noise = max(spread, standard_error)
        z = excess / noise if noise > 0 else None
        straggler = (
            len(values) >= MIN_STEPS
            and excess > 0
            and (pct is None or pct >= 100.0 * min_effect)
            and (z is None or z >= MIN_Z)
            and (step_ms is None or excess >= MIN_STEP_SHARE * step_ms)
        )
        ranks.append(
            RankSlowness(
                rank=rank,
                compared_steps=len(values),
                slowest_steps=slowest_count.get(rank, 0),
                median_ms=round(medians[rank], 6),
                others_median_ms=round(others_median, 6),
                median_excess_ms=round(excess, 6),
                median_excess_pct=None if pct is None else round(pct, 2),
                noise_ms=round(noise, 6),
                robust_z=None if z is None else round(z, 2),
                straggler=straggler,
            )
        )
    ranks.sort(key=lambda r: (not r.straggler, -r.median_excess_ms, r.rank))
    return rows, ranks


def _mad(values: list[float]) -> float:
    """Median absolute deviation from the median."""
    center = statistics.median(values)
    return statistics.median([abs(v - center) for v in values])


def _median_without(ordered: list[float], value: float) -> float:
    """Median of sorted `ordered` with one occurrence of `value` left out (O(log n), not O(n))."""
    skip = bisect.bisect_left(ordered, value)
    n = len(ordered) - 1

    def at(i: int) -> float:
        return ordered[i if i < skip else i + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _lateness_ms(rank: int, per_rank_end: dict[int, dict[int, int]], offsets: dict[int, float]) -> float | None:
    """Median over steps of `rank`'s end of a phase minus the median end of the other ranks' (aligned; ms); None without a shared step."""
    own = per_rank_end.get(rank, {})
    late = []
    for step, end_us in own.items():
        others = sorted(ends[step] - offsets.get(other, 0.0) for other, ends in per_rank_end.items() if other != rank and step in ends)
        if others:
            late.append((end_us - offsets.get(rank, 0.0) - statistics.median(others)) / 1000.0)
    return statistics.median(late) if late else None


def _stragglers(collector: _Collector, alignment: ClockAlignment | None = None) -> list[Stragglers]:
    out = []
    for (source, attempt), per_rank in sorted(collector.step_ms.items(), key=lambda item: (item[0][0], -1 if item[0][1] is None else item[0][1])):
        if len(per_rank) < 2:
            continue
        steps, ranks = compare_ranks(per_rank)
        all_steps = [ms for by_step in per_rank.values() for ms in by_step.values()]
        step_ms = statistics.median(all_steps) if all_steps else None
        phase_rows = []
        for (phase_source, phase_attempt, phase), phase_ranks in sorted(collector.phase_step_ms.items(), key=lambda item: item[0][2]):
            if (phase_source, phase_attempt) != (source, attempt) or len(phase_ranks) < 2:
                continue
            _, phase_slowness = compare_ranks(phase_ranks, step_ms=step_ms)
            offsets = collector.phase_offsets.get((source, phase))
            offset = statistics.median(offsets) if offsets else None
            ends = collector.phase_step_end.get((source, attempt, phase), {})
            hosts = {rank: collector.rank_hosts.get((source, attempt, rank)) for rank in phase_ranks}
            # Ends compare across ranks on one clock, or on hosts' clocks once aligned; else the durations decide alone.
            comparable = len(set(hosts.values())) == 1 or (alignment is not None and alignment.applied)
            clock = {rank: alignment.offset(host) if alignment is not None else 0.0 for rank, host in hosts.items()}
            for slow in phase_slowness:
                if not slow.straggler:
                    continue
                lateness = _lateness_ms(slow.rank, ends, clock) if comparable else None
                if lateness is not None and step_ms is not None and abs(lateness) > step_ms:
                    lateness = None  # more than a step apart: these ranks did not run in lockstep on these clocks; no evidence either way
                if lateness is not None and lateness < MIN_LATENESS_SHARE * slow.median_excess_ms:
                    continue  # longer, but it ends with the others: it waited (e.g. inside a collective), it was not slow
                row = {"phase": phase, "median_start_in_step_ms": None if offset is None else round(offset, 6), **asdict(slow)}
                row["median_end_lateness_ms"] = None if lateness is None else round(lateness, 6)
                phase_rows.append(row)
        # In the order the phases run within a step: a delay shows up as waiting in the phases after it.
        phase_rows.sort(key=lambda row: (row["median_start_in_step_ms"] is None, row["median_start_in_step_ms"] or 0.0, row["phase"], -row["median_excess_ms"]))
        out.append(
            Stragglers(
                source=source,
                attempt=attempt,
                ranks=sorted(per_rank),
                median_step_ms=None if step_ms is None else round(step_ms, 6),
                steps=steps,
                ranks_by_slowness=ranks,
                straggler_ranks=[r.rank for r in ranks if r.straggler],
                phase_stragglers=phase_rows,
            )
        )
    return out


def _arrivals(groups: list[Stragglers], closing: list[tuple[ProcessLog, ClosingSpans]], alignment: ClockAlignment) -> None:
    """Who arrives last at the step-closing collective, on aligned clocks; a straggler by the rule of `compare_ranks`.

    A rank's *arrival* in step N = when it enters the collective (its span's
    start, aligned) − when every rank left the previous one (the median of the
    aligned ends of step N−1: one moment). In synchronous training every rank's
    step takes as long as the slowest's, but the slowest arrives last: this is
    where a straggler shows whatever phase it is slow in.
    """
    anchor = alignment.anchor
    if anchor is None:
        return
    for group in groups:
        starts: dict[int, dict[int, float]] = {}
        ends: dict[int, list[float]] = {}
        for process, spans in closing:
            if process.source != group.source or process.attempt != group.attempt or process.rank is None:
                continue
            offset = alignment.offset(spans.host)
            base = _attempt_step(process.attempt, 0)
            own = starts.setdefault(process.rank, {})
            for step, name, start_us, end_us in zip(spans.steps, spans.names, spans.starts, spans.ends):
                if name == anchor:
                    own[step - base] = start_us - offset
                    ends.setdefault(step - base, []).append(end_us - offset)
        boundary = {step: statistics.median(values) for step, values in ends.items() if len(values) >= 2}
        per_rank = {rank: {step: (start - boundary[step - 1]) / 1000.0 for step, start in by_step.items() if step - 1 in boundary} for rank, by_step in starts.items()}
        per_rank = {rank: by_step for rank, by_step in per_rank.items() if by_step}
        if len(per_rank) < 2:
            continue
        steps, ranks = compare_ranks(per_rank, step_ms=group.median_step_ms, min_effect=MIN_ARRIVAL_EFFECT)
        last: dict[int, int] = {}
        for row in steps:
            if row.slowest_rank is not None:
                last[row.slowest_rank] = last.get(row.slowest_rank, 0) + 1
        group.arrival_collective = anchor
        group.arrival_steps = len(steps)
        group.arrival_stragglers = [asdict(r) for r in ranks if r.straggler]
        group.last_arrivals = [{"rank": rank, "steps": count} for rank, count in sorted(last.items(), key=lambda item: (-item[1], item[0]))[:10]]
