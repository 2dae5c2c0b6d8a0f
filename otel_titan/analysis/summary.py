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
  `MIN_STEP_SHARE` of the median step time.
* a *hang suspect* is a process whose file holds no record since it was
  created (empty, or only the logger's own ``structured_logger_opened``) and
  that did not close cleanly: it hung (or died) before its first record.

One run at a time (`runs.select_run`): the latest in the folder unless
``run_id`` names another; restart attempts of a run are compared separately.
"""

from __future__ import annotations

import bisect
import math
import os
import statistics
from array import array
from dataclasses import asdict
from typing import Any, Iterable, Iterator

from otel_titan.analysis.hang import bases_of, build_hang, digest_black_box
from otel_titan.analysis.reader import META_EVENTS, NoRecordsError, ProcessLog, read_run
from otel_titan.analysis.runs import select_run
from otel_titan.analysis.summary_model import OpenSpanInfo, PhaseStats, ProcessSummary, RankSlowness, RunSummary, StepTimes, StopGroup, Stragglers, utc
from otel_titan.analysis.timeline import OpenSpan, TimelineVisitor, walk_process
from otel_titan.schema import LOGGER_NAME as _OTEL_TITAN_LOGGER
from otel_titan.schema import MetaEvent

__all__ = [
    "summarize_run",
    "compare_ranks",
    "percentile",
    "utc",
    "MIN_STEPS",
    "MIN_EFFECT",
    "MIN_Z",
    "MIN_STEP_SHARE",
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
#: The rule as data (in ``--json``), so that a reader knows what "straggler" meant.
STRAGGLER_RULE = {"min_steps": MIN_STEPS, "min_effect_pct": MIN_EFFECT * 100, "min_robust_z": MIN_Z, "phase_min_share_of_step_pct": MIN_STEP_SHARE * 100}
#: MAD × this estimates a standard deviation (normal data); × 1.2533 / √n more: the standard error of a median.
_MAD_TO_SD = 1.4826
_MEDIAN_SE = 1.2533
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
        # When a phase starts, in ms after its step began: orders the phase stragglers.
        self.phase_offsets: dict[tuple[str, str], array] = {}
        # label → digest of its latest `stall` record (analysis/hang.py)
        self.black_boxes: dict[str, dict[str, Any]] = {}

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
            if name == _OPENED:  # the first line of an otel-titan file: when the file was created
                summary.created_us = record["time_us"]
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


def summarize_run(
    path: str | os.PathLike[str],
    *,
    ranks: Iterable[int] | None = None,
    sources: Iterable[str] | None = None,
    run_id: str | None = None,
    log_skipped: bool = True,
) -> RunSummary:
    """Read a run (directory or its ``structured_logs/``) and summarize it.

    A folder can hold several runs (a re-launch into the same ``output_dir``):
    one is summarized, the latest unless `run_id` names another;
    `RunSummary.runs` lists them all. Raises `NotARunError` for a path that is
    not a run, `NoRecordsError` when no record could be read (or `run_id`
    names no run here: `runs.UnknownRunError`).

    Example:
        >>> # from otel_titan.analysis import summarize_run, format_summary
        >>> # summary = summarize_run("outputs")
        >>> # print(format_summary(summary))          # the tables
        >>> # [p.last_event for p in summary.processes]  # e.g. ['optimizer_end', 'data_fetch_start']
    """
    logs, choice = select_run(read_run(path, ranks=ranks, sources=sources, log_skipped=log_skipped), run_id)
    collector = _Collector()
    processes: list[ProcessSummary] = []
    for process in logs.processes:
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
        skipped_before = logs.skipped.count
        collector.begin(process, summary)
        extent = walk_process(_observe(process.records(logs.skipped), summary), collector)
        collector.end(extent.last_us)
        summary.records, summary.first_us, summary.last_us = extent.records, extent.first_us, extent.last_us
        summary.skipped_lines = logs.skipped.count - skipped_before
        if summary.last_event is None and summary.closed_cleanly is not True:
            # Nothing but the logger's own records since the file was created: it hung (or died) before its first record.
            summary.hang_suspect = True
            if summary.created_us is None and summary.records == 0:
                summary.created_us = _modified_us(process.segments)
        processes.append(summary)
    records = sum(p.records for p in processes)
    if records == 0 and logs.skipped.count:
        raise NoRecordsError(f"{logs.log_dir}: no readable records ({logs.skipped.count} unreadable lines skipped)")
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
        phases=_phase_stats(collector.phases),
        stragglers=_stragglers(collector),
        run_id=choice.run_id,
        run_selection=choice.how,
        runs=choice.runs,
        hang_suspects=[p.label for p in processes if p.hang_suspect],
        straggler_rule=dict(STRAGGLER_RULE),
        hang=build_hang(processes, collector.black_boxes, bases_of(logs.processes)),
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


def compare_ranks(per_rank: dict[int, dict[int, float]], *, step_ms: float | None = None) -> tuple[list[StepTimes], list[RankSlowness]]:
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
    ranks = []
    for rank, values in own.items():
        others = [median for other, median in medians.items() if other != rank]
        others_median = statistics.median(others)
        excess = medians[rank] - others_median
        pct = 100.0 * excess / others_median if others_median > 0 else None
        spread = _MAD_TO_SD * _mad(others) if len(others) > 1 else 0.0
        standard_error = _MEDIAN_SE * _MAD_TO_SD * _mad(differences[rank]) / math.sqrt(len(values))
        noise = max(spread, standard_error)
        z = excess / noise if noise > 0 else None
        straggler = (
            len(values) >= MIN_STEPS
            and excess > 0
            and (pct is None or pct >= 100.0 * MIN_EFFECT)
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


def _stragglers(collector: _Collector) -> list[Stragglers]:
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
            for slow in phase_slowness:
                if slow.straggler:
                    phase_rows.append({"phase": phase, "median_start_in_step_ms": None if offset is None else round(offset, 6), **asdict(slow)})
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
