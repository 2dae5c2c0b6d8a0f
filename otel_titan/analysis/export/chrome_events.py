"""Records → Chrome Trace events: the trace layout, written as the records stream by.

One `ExportVisitor` per export sees every process's timeline (spans,
instants, scalars, logger records, steps; see `model.timeline.walk_process`) and
adds events to an `EventStream`, which encodes them in batches into an open
file. Layout (docs/analysis.md describes it in full):

* track "steps" (``tid`` `STEP_TID`, above every real thread id and never 0,
  which Perfetto would show as the main thread): one bar per step, the
  process's counters and the logger's own records (process-scoped instants);
* one track per OS thread, ``tid`` = the real thread id (`UNKNOWN_TID` when
  the records do not say);

Nesting: Perfetto puts a Chrome-JSON slice that begins at its parent's end
outside it, and of two slices with the same ``ts`` and ``dur`` it draws the
first written (the child: spans are written when they end) as the parent. So
a span whose child ends at or after its own end is widened by 1 µs: the
parent then strictly contains its children; so is a failed span of zero width,
whose ``ERROR:`` thread instant (a zero-width slice to Perfetto) is written
before it. (Clamping the child instead would
need the parent's end, unknown when the child is written; the native writer,
`export.perfetto`, writes begins in file order and needs neither.)
* asyncio tasks on slot tracks ``SLOT_TID_BASE + k``, "async slot k": a task
  takes the lowest free slot when its first span opens and frees it when its
  last span ends, so K slots suffice for a peak of K concurrent tasks.
"""

from __future__ import annotations

import heapq
import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

import orjson

from otel_titan.analysis.model.timeline import OpenSpan, TimelineVisitor, error_details
from otel_titan.analysis.read.filters import StepRange
from otel_titan.analysis.read.safe_text import json_bytes
from otel_titan.schema import MetaEvent

__all__ = [
    "ExportStats",
    "EventStream",
    "ExportVisitor",
    "ProcessTracks",
    "SLOT_TID_BASE",
    "STEP_TID",
    "UNKNOWN_TID",
    "ARG_FIELDS",
    "FAILED_COLOR",
    "INCOMPLETE_COLOR",
]

#: The logger's records that are no marker: `heartbeat` (it extends open spans) and `step_rollup`
#: (totals of spans drawn as bars).
_UNDRAWN = frozenset({MetaEvent.HEARTBEAT, MetaEvent.STEP_ROLLUP})

#: Track ids: threads on their real tid (< 2**22 on Linux), steps and unknown threads just below the
#: asyncio slots, which are above every possible tid (tid 0 would be shown as the process's main
#: thread).
SLOT_TID_BASE = 10_000_000
STEP_TID = SLOT_TID_BASE - 1
UNKNOWN_TID = SLOT_TID_BASE - 2
#: The per-process track of torch flight-recorder collectives, from `stall` records (docs/hangs.md).
COLLECTIVES_TID = SLOT_TID_BASE - 3
#: Record fields copied into a span's or instant's ``args`` when present.
ARG_FIELDS = (
    "step",
    "relative_step",
    "step_tags",
    "caller",
    "task_name",
    "description",
    "span_id",
    "parent_span_id",
    "trace_id",
    "epoch",
    "iteration",
    "tid",
)
#: Chrome's reserved colour names (catapult's colour scheme; Perfetto picks its own).
FAILED_COLOR = "terrible"
INCOMPLETE_COLOR = "yellow"
#: Events encoded per orjson call (a few MB of dicts at most).
_BATCH_EVENTS = 4096
#: A file modified later than this after its last record was touched or copied since: its time says
#: nothing about the process (the writer's last write follows its last record by a flush, ~50 ms).
ALIVE_EVIDENCE_US = 60_000_000


@dataclass
class ExportStats:
    """What `generate_gantt_trace` wrote and read.

    Example:
        >>> ExportStats(output_path="t.json").spans
        0
    """

    output_path: str
    processes: int = 0
    records: int = 0
    events: int = 0
    spans: int = 0
    incomplete_spans: int = 0
    failed_spans: int = 0
    instants: int = 0
    counters: int = 0
    steps: int = 0
    max_async_slots: int = 0
    skipped_lines: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    repaired_lines: int = 0
    replaced: bool = False
    input_bytes: int = 0
    output_bytes: int = 0
    seconds: float = 0.0
    #: How the hosts' clocks were aligned (`model.clocks.ClockAlignment.describe`).
    clock: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (for ``otherData`` and scripts)."""
        return asdict(self)


class EventStream:
    """Chrome trace events, comma-separated, appended to an open binary file; encoded in batches."""

    def __init__(self, handle: BinaryIO) -> None:
        self._file = handle
        self._batch: list[dict[str, Any]] = []
        self._first = True
        self.events = 0

    def add(self, event: dict[str, Any]) -> None:
        """Append one event (a dict orjson can encode)."""
        batch = self._batch
        batch.append(event)
        if len(batch) >= _BATCH_EVENTS:
            self.flush()

    def flush(self) -> None:
        """Encode and write the batched events."""
        batch = self._batch
        if not batch:
            return
        try:
            # One orjson call per batch: `[e1,e2,…]` without its brackets.
            data = orjson.dumps(batch)[1:-1]
        except orjson.JSONEncodeError:
            # A record read by the fallback parser can hold what orjson cannot write (an int beyond
            # 64 bits, nesting deeper than 255): only that event's odd values are made safe
            # (safe_text.json_safe).
            data = b",".join(map(json_bytes, batch))
        self._file.write(data if self._first else b",\n" + data)
        self._first = False
        self.events += len(batch)
        batch.clear()

    def add_encoded(self, path: str, events: int) -> None:
        """Append a file of already encoded, comma-separated events (a worker's part)."""
        self.flush()
        if os.path.getsize(path) == 0:
            return
        if not self._first:
            self._file.write(b",\n")
        with open(path, "rb") as part:
            shutil.copyfileobj(part, self._file, 4 << 20)
        self._first = False
        self.events += events

    @property
    def count(self) -> int:
        """Events added so far (written or batched)."""
        return self.events + len(self._batch)


def _plottable(value: Any) -> int | float | None:
    """A counter value for `value`, or None when it has none (NaN, ±∞, not a number)."""
    kind = type(value)
    if kind is int:
        return (
            value
            if -(1 << 53) <= value <= 1 << 53
            else (float(value) if abs(value) < 1e300 else None)
        )
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is bool:
        return int(value)
    return None


class ProcessTracks:
    """Per trace process: which thread tracks are named, and the asyncio slot pool."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.threads: set[Any] = set()
        self.free_slots: list[int] = []  # a heap: the lowest free slot is reused first
        self.slots = 0
        # (pg, seq, p2p seq) already drawn from a stall record
        self.collectives_seen: set[Any] = set()


class ExportVisitor(TimelineVisitor):
    """Turns one export's timelines into events on `out`, counting them in `stats` (`steps`: keep
    only those)."""

    def __init__(self, out: EventStream, stats: ExportStats, steps: StepRange | None) -> None:
        self.out = out
        self.stats = stats
        self.steps = steps
        self.add = out.add
        self.tracks: ProcessTracks
        self.pid = 0
        self.os_pid: Any = None
        self.alive_until_us: int | None = None

    # -- processes and tracks -------------------------------------------------------------------
    def begin_process(
        self, tracks: ProcessTracks, os_pid: Any, alive_until_us: int | None = None
    ) -> None:
        """The next records are one OS process's; it was alive at `alive_until_us` (its file's last
        write)."""
        self.tracks, self.pid, self.os_pid, self.alive_until_us = (
            tracks,
            tracks.pid,
            os_pid,
            alive_until_us,
        )

    def _name_thread(self, tid: Any, name: str, sort_index: int) -> None:
        pid = self.pid
        self.out.add(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
        )
        self.out.add(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": sort_index},
            }
        )

    def thread_track(self, tid: Any) -> int:
        track = tid if type(tid) is int and 0 < tid < UNKNOWN_TID else UNKNOWN_TID
        if track not in self.tracks.threads:
            self.tracks.threads.add(track)
            label = "main thread" if track == self.os_pid else "thread"
            self._name_thread(track, label, track)
        return track

    def lane_opened(self, lane: tuple) -> int:
        tid, task_name = lane
        if task_name is None:
            return self.thread_track(tid)
        tracks = self.tracks
        if tracks.free_slots:
            slot = heapq.heappop(tracks.free_slots)
        else:
            slot = tracks.slots
            tracks.slots += 1
            if tracks.slots > self.stats.max_async_slots:
                self.stats.max_async_slots = tracks.slots
            self._name_thread(SLOT_TID_BASE + slot, f"async slot {slot}", SLOT_TID_BASE + slot)
        return SLOT_TID_BASE + slot

    def lane_closed(self, lane: tuple, track: Any) -> None:
        if lane[1] is not None:
            heapq.heappush(self.tracks.free_slots, track - SLOT_TID_BASE)

    # -- events ---------------------------------------------------------------------------------
    def span(
        self,
        span: OpenSpan,
        end: dict[str, Any] | None,
        end_us: int,
        dur_us: float,
        incomplete: bool,
    ) -> None:
        first = span.start
        if first is not None and span.error is None and not incomplete:
            # The common case (`span_event`'s first return), inline: one per span.
            if self.steps is not None and first.get("step") not in self.steps:
                return
            self.stats.spans += 1
            dur = dur_us if type(dur_us) is int else round(dur_us, 3)
            if span.children_end >= end_us:
                dur += 1  # strictly contain the children (module docstring)
            self.add(
                {
                    "name": span.name,
                    "cat": "span",
                    "ph": "X",
                    "ts": span.start_us,
                    "dur": dur,
                    "pid": self.pid,
                    "tid": span.track,
                    "args": {key: first[key] for key in ARG_FIELDS if key in first},
                }
            )
            return
        event = self.span_event(span, end, end_us, dur_us, incomplete)
        if event is not None:
            # Strictly contain the children (module docstring), and a failed span its ``ERROR:``
            # instant: Perfetto draws a thread instant as a slice of zero width, so a failed span of
            # zero width (raised within its microsecond) and its error, written first, were a tie,
            # and the span was drawn inside its own error.
            if span.children_end >= end_us or (span.error is not None and event["dur"] == 0):
                event["dur"] += 1
            self.add(event)

    def span_event(
        self,
        span: OpenSpan,
        end: dict[str, Any] | None,
        end_us: int,
        dur_us: float,
        incomplete: bool,
    ) -> dict[str, Any] | None:
        """The span's complete (``X``) event, counted in the stats; None when the step filter drops
        it."""
        first = span.start
        if first is None:
            first = end
            if first is None:
                return None
        if self.steps is not None and first.get("step") not in self.steps:
            return None
        args = {key: first[key] for key in ARG_FIELDS if key in first}
        event: dict[str, Any] = {
            "name": span.name,
            "cat": "span",
            "ph": "X",
            "ts": span.start_us,
            "dur": dur_us if type(dur_us) is int else round(dur_us, 3),
            "pid": self.pid,
            "tid": span.track,
            "args": args,
        }
        stats = self.stats
        stats.spans += 1
        if span.error is None and not incomplete and span.start is not None:
            return event
        if incomplete:
            # Open until at least the process's last record (`end_us`), and it was still alive when
            # its file was last written: a span killed before any later record would otherwise be a
            # bar of zero width.
            alive = self.alive_until_us
            if alive is not None and end_us < alive <= end_us + ALIVE_EVIDENCE_US:
                event["dur"] = alive - span.start_us
        if span.start is None:
            args["start_missing"] = True
        if span.error is not None:
            error_type, error_message = error_details(span.error)
            args["status"] = "error"
            args["error_type"] = error_type
            args["error_message"] = error_message
            event["cname"] = FAILED_COLOR
            stats.failed_spans += 1
        if incomplete:
            args["incomplete"] = True
            event["cname"] = INCOMPLETE_COLOR if span.error is None else FAILED_COLOR
            stats.incomplete_spans += 1
        return event

    def step_arguments(self, step: int, first: dict[str, Any], args: dict[str, Any]) -> None:
        """Add to a step bar's `args` (the native trace puts the step's trace id there)."""

    def _lane_track(self, record: dict[str, Any], track: Any) -> Any:
        return track if track is not None else self.thread_track(record.get("tid"))

    def instant(self, record: dict[str, Any], track: Any) -> None:
        if self.steps is not None and record.get("step") not in self.steps:
            return
        args = {key: record[key] for key in ARG_FIELDS if key in record}
        self.out.add(
            {
                "name": record["log_type_name"] or "(unnamed)",
                "cat": "instant",
                "ph": "i",
                "s": "t",
                "ts": record["time_us"],
                "pid": self.pid,
                "tid": self._lane_track(record, track),
                "args": args,
            }
        )
        self.stats.instants += 1

    def scalar(self, record: dict[str, Any], track: Any) -> None:
        if self.steps is not None and record.get("step") not in self.steps:
            return
        name = record.get("event_name")
        name = name if isinstance(name, str) and name else "metric"
        value = record.get("value")
        plotted = _plottable(value)
        if plotted is not None:
            self.out.add(
                {
                    "name": name,
                    "ph": "C",
                    "ts": record["time_us"],
                    "pid": self.pid,
                    "tid": STEP_TID,
                    "args": {"value": plotted},
                }
            )
            self.stats.counters += 1
            return
        # NaN / Infinity (written as strings) and non-numbers cannot be plotted: show them as a
        # marker.
        args = {key: record[key] for key in ARG_FIELDS if key in record}
        args["value"] = value
        shown = str(value)
        self.out.add(
            {
                "name": f"{name}={shown if len(shown) <= 40 else shown[:39] + '…'}",
                "cat": "scalar",
                "ph": "i",
                "s": "t",
                "ts": record["time_us"],
                "pid": self.pid,
                "tid": self._lane_track(record, track),
                "args": args,
            }
        )
        self.stats.instants += 1

    def error(self, record: dict[str, Any], span: OpenSpan | None, track: Any) -> None:
        if self.steps is not None and record.get("step") not in self.steps:
            return
        error_type, error_message = error_details(record)
        args = {key: record[key] for key in ARG_FIELDS if key in record}
        args["error_type"], args["error_message"] = error_type, error_message
        name = record["log_type_name"][:-6] or "(unnamed)"
        self.out.add(
            {
                "name": f"ERROR: {name}",
                "cat": "error",
                "ph": "i",
                "s": "t",
                "ts": record["time_us"],
                "pid": self.pid,
                "tid": self._lane_track(record, track),
                "cname": FAILED_COLOR,
                "args": args,
            }
        )
        self.stats.instants += 1

    def meta(self, record: dict[str, Any]) -> None:
        if self.steps is not None and record.get("step") not in self.steps:
            return
        if record["log_type_name"] in _UNDRAWN:
            return  # a heartbeat only extends the process's last timestamp (and so its open spans); a rollup sums bars already drawn
        skip = (
            "log_type",
            "log_type_name",
            "event_name",
            "time",
            "time_ms",
            "time_us",
            "logger_name",
            "schema_version",
        )
        args = {key: value for key, value in record.items() if key not in skip}
        event: dict[str, Any] = {
            "name": record["log_type_name"],
            "cat": "logger",
            "ph": "i",
            "s": "p",
            "ts": record["time_us"],
            "pid": self.pid,
            "tid": STEP_TID,
            "args": args,
        }
        if (
            record["log_type_name"] != "structured_logger_opened"
            and record["log_type_name"] != "structured_logger_closed"
        ):
            event["cname"] = FAILED_COLOR  # records lost, or a signal: worth seeing
        self.out.add(event)
        self.stats.instants += 1
        recorder = record.get("flight_recorder")
        if record["log_type_name"] == "stall" and isinstance(recorder, dict):
            self._collectives(recorder.get("entries") or [], record["time_us"])

    def _collectives(self, entries: list[Any], stall_us: int) -> None:
        """Flight-recorder entries as slices on the process's collectives track (each (pg, seq)
        once)."""
        seen = self.tracks.collectives_seen
        for entry in entries:
            if not isinstance(entry, dict) or type(entry.get("time_created_ns")) is not int:
                continue
            key = (entry.get("pg_id"), entry.get("collective_seq_id"), entry.get("p2p_seq_id"))
            done = entry.get("time_completed_ns")
            if key in seen:
                continue
            if not seen:
                self._name_thread(COLLECTIVES_TID, "collectives (flight recorder)", COLLECTIVES_TID)
            seen.add(key)
            begin = entry["time_created_ns"] // 1000
            end = (
                done // 1000
                if type(done) is int and done
                else (begin if entry.get("retired") else stall_us)
            )
            self.out.add(
                {
                    "name": f"{entry.get('op')} #{entry.get('collective_seq_id')}",
                    "cat": "collective",
                    "ph": "X",
                    "ts": begin,
                    "dur": max(end - begin, 0),
                    "pid": self.pid,
                    "tid": COLLECTIVES_TID,
                    "args": {
                        k: entry.get(k)
                        for k in (
                            "pg_id",
                            "pg_name",
                            "collective_seq_id",
                            "op",
                            "state",
                            "retired",
                            "input_sizes",
                            "output_sizes",
                        )
                    },
                }
            )

    def step(self, step: int, begin_us: int, end_us: int, first: dict[str, Any]) -> None:
        if self.steps is not None and step not in self.steps:
            return
        args: dict[str, Any] = {"step": step}
        for key in ("relative_step", "step_tags", "epoch", "iteration"):
            if key in first:
                args[key] = first[key]
        self.step_arguments(step, first, args)
        tags = first.get("step_tags")
        name = f"step {step}" + (
            f" [{', '.join(map(str, tags))}]" if isinstance(tags, list) and tags else ""
        )
        self.out.add(
            {
                "name": name,
                "cat": "step",
                "ph": "X",
                "ts": begin_us,
                "dur": max(end_us - begin_us, 0),
                "pid": self.pid,
                "tid": STEP_TID,
                "args": args,
            }
        )
        self.stats.steps += 1
