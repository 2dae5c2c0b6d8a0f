"""The writer's ``step_rollup`` records → per process and step totals, found without parsing the
spans around them.

A rollup (docs/schema.md, "Step rollups") is one line per rank and step: the
step's time, each phase's count and total, its step-closing span. A
step-level question (step times, phase totals per rank, arrival at the
collective) can be answered from these lines alone, a few percent of the
file: `process_rollups` finds them by their name in the raw bytes and parses
only those lines. Files without rollups (torchtitan's, pimm's, otel-titan's
before rollups or with ``step_rollups=False``) give none: the spans are then
the only source, and the rest of the analysis reads them as it always has.

Which rollup counts: the last one written for a step (after SIGTERM a
process that lived on writes its step again, complete). A rollup of a newer
``rollup_version`` than this reader knows, or of the wrong shape, is not
used (a field may have changed meaning); torn lines are left to the full
reader, which reports them.

Times are the writer's host clock, less the process's `clock_offset_us`
(the aligned clock, as `ProcessLog.records` gives ``time_us``).

Whether a process's rollups hold everything its spans do (`ProcessRollups.why_not`):
only when the file says so itself, read from the same scan: it begins with
the logger's opened record (no segment rotated away), ends with its closing
record (a process that crashed, hung or is still running has steps whose
rollup was never written), lost no record (``dropped_records``,
``failed_records``), and its last rollup is the one the writer's shutdown
writes (``ended_by`` ``close``: the rollups did not stop early), of a version
that counts ``late_spans``, none late. What it cannot see: a line in the
middle of a file that the full reader cannot parse (nothing our writer makes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from otel_titan.analysis.read.lines import BLOCK_BYTES, MAX_LINE_BYTES, loads_line
from otel_titan.analysis.read.records import ProcessLog, RunLogs
from otel_titan.schema import ROLLUP_VERSION, Field, MetaEvent, RollupField

__all__ = [
    "ProcessRollups",
    "StepRollup",
    "parse_rollup",
    "process_rollups",
    "read_rollups",
    "scan_rollups",
]

#: The first rollup version whose writer counts ``late_spans`` (schema.ROLLUP_VERSION's note).
LATE_SPANS_VERSION = 2

#: A line holding this may be a rollup (parsed, then checked): spacing-blind, so a file rewritten by
#: another JSON tool still counts.
_MARKER = b'"' + MetaEvent.STEP_ROLLUP.encode() + b'"'


@dataclass(slots=True)
class StepRollup:
    """One process's totals for one step, as its writer summed them.

    `phases`: span name → (count, total µs) over the step's spans that
    ended; `closing`: (name, start µs, end µs) of the step-closing span
    (`schema.StepCloser`), None when no top-level span ended in the step;
    `complete`: the next step began (`end_us` is its begin), else the step
    was still under way at shutdown or SIGTERM (`ended_by`).
    """

    step: int
    complete: bool
    ended_by: str
    begin_us: int
    end_us: int
    duration_ms: float
    phases: dict[str, tuple[int, int]]
    closing: tuple[str, int, int] | None
    open_spans: int = 0
    step_tags: tuple[str, ...] = ()
    #: Spans of the file so far that ended after their step's rollup was out
    #: (`schema.RollupField.LATE_SPANS`).
    late_spans: int = 0
    version: int = 1


def _int(value: Any) -> bool:
    return type(value) is int


def parse_rollup(record: Any, offset_us: int = 0) -> StepRollup | None:
    """`record` as a `StepRollup`, or None when it is no rollup this reader can use.

    Example:
        >>> line = {"log_type_name": "step_rollup", "rollup_version": 1, "step": 5, "complete": True, "ended_by": "next_step",
        ...         "begin_us": 1000, "end_us": 3500, "duration_ms": 2.5, "phases": {"fwd": [2, 1800]},
        ...         "closing": {"name": "all_reduce", "start_us": 3000, "end_us": 3400}}
        >>> rollup = parse_rollup(line)
        >>> rollup.phases, rollup.closing, parse_rollup({**line, "rollup_version": 99})
        ({'fwd': (2, 1800)}, ('all_reduce', 3000, 3400), None)
    """
    if type(record) is not dict or record.get(Field.LOG_TYPE_NAME) != MetaEvent.STEP_ROLLUP:
        return None
    version, step, begin, end = (
        record.get(RollupField.VERSION),
        record.get(Field.STEP),
        record.get(RollupField.BEGIN_US),
        record.get(RollupField.END_US),
    )
    # `type(x) is int` inline, not a helper: one rollup per rank and step, the whole cost of a step
    # table from rollups.
    if not (
        type(version) is int
        and 1 <= version <= ROLLUP_VERSION
        and type(step) is int
        and type(begin) is int
        and type(end) is int
    ):
        return None
    raw_phases = record.get(RollupField.PHASES)
    if type(raw_phases) is not dict:
        return None
    phases: dict[str, tuple[int, int]] = {}
    for name, pair in raw_phases.items():
        if (
            type(pair) is not list
            or len(pair) != 2
            or type(pair[0]) is not int
            or type(pair[1]) is not int
        ):
            return None
        phases[name] = (pair[0], pair[1])
    closing = record.get(RollupField.CLOSING)
    closed_by: tuple[str, int, int] | None = None
    if (
        isinstance(closing, dict)
        and isinstance(closing.get("name"), str)
        and _int(closing.get("start_us"))
        and _int(closing.get("end_us"))
    ):
        closed_by = (
            closing["name"],
            closing["start_us"] - offset_us,
            closing["end_us"] - offset_us,
        )
    duration = record.get(RollupField.DURATION_MS)
    open_spans = record.get(RollupField.OPEN_SPANS, 0)
    late = record.get(RollupField.LATE_SPANS, 0)
    tags = record.get(Field.STEP_TAGS)
    return StepRollup(
        step=step,
        complete=record.get(RollupField.COMPLETE) is True,
        ended_by=str(record.get(RollupField.ENDED_BY, "")),
        begin_us=begin - offset_us,
        end_us=end - offset_us,
        duration_ms=float(duration) if type(duration) in (int, float) else (end - begin) / 1000.0,  # type: ignore[arg-type]  # an int or float: its type() was checked
        phases=phases,
        closing=closed_by,
        open_spans=open_spans if _int(open_spans) else 0,
        step_tags=tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else (),
        late_spans=late if _int(late) else 0,
        version=version,
    )


class _Edges:
    """What a scan of one file saw besides its rollups: its first and last complete lines, whether
    bytes follow the last, if it could be read."""

    __slots__ = ("first", "last", "torn", "readable")

    def __init__(self) -> None:
        self.first: bytes | None = None
        self.last: bytes | None = None
        self.torn = False
        self.readable = True


def _rollup_lines(path: str, edges: _Edges | None = None) -> Iterable[bytes]:
    """The lines of `path` that name themselves a rollup (complete lines only), read block by block;
    `edges` gets the file's ends."""
    edges = _Edges() if edges is None else edges
    try:
        handle = open(path, "rb")
    except OSError:
        edges.readable = False
        return  # rotated away or unreadable: the full reader reports it
    with handle:
        carry = b""
        # Inside a line longer than MAX_LINE_BYTES: its bytes are not kept (a 2 GB line costs a
        # block of memory, not 2 GB), and it is no rollup: the full reader skips it too.
        overlong = False
        while True:
            try:
                block = handle.read(BLOCK_BYTES)
            except OSError:
                edges.readable = False
                return
            if not block:
                edges.torn = overlong or bool(carry.strip(b"\x00 \t\r\n"))
                return
            if overlong:
                newline = block.find(b"\n")
                if newline < 0:
                    continue
                overlong = False
                edges.first = b"" if edges.first is None else edges.first
                edges.last = b""  # a line, but not a record (so not the logger's closed one)
                block = block[newline + 1 :]
            data = carry + block if carry else block
            last_newline = data.rfind(b"\n")
            if last_newline < 0:
                if len(data) > MAX_LINE_BYTES:
                    carry, overlong = b"", True
                else:
                    carry = data
                continue
            if edges.first is None:
                edges.first = data[: data.find(b"\n")]
            edges.last = data[data.rfind(b"\n", 0, last_newline) + 1 : last_newline]
            at = data.find(_MARKER, 0, last_newline)
            while at >= 0:
                start = data.rfind(b"\n", 0, at) + 1
                stop = data.find(b"\n", at)
                yield data[start:stop]
                at = data.find(_MARKER, stop, last_newline)
            carry = data[last_newline + 1 :]


@dataclass
class ProcessRollups:
    """One process's rollups (step → the one that counts) and whether they hold every span of its
    files.

    `why_not`: None when they do (a step table from them equals one from the
    spans), else why not, in words; `parsed_bytes`: the bytes of the lines
    parsed (its rollups and the two edge lines), the rest only searched.
    """

    process: ProcessLog
    steps: dict[int, StepRollup]
    why_not: str | None
    parsed_bytes: int


def _record(line: bytes | None) -> dict[str, Any] | None:
    record = loads_line(line) if line else None
    return record if type(record) is dict else None


def scan_rollups(process: ProcessLog) -> ProcessRollups:
    """Every rollup of `process` and whether they hold everything its spans do (module docstring),
    from one scan of its files.

    Example:
        >>> from otel_titan.analysis import read_run
        >>> scan = scan_rollups(read_run("outputs").processes[0])
        >>> scan.why_not is None            # closed cleanly, nothing late: its rollups vouch for every step
        True
    """
    steps: dict[int, StepRollup] = {}
    last: StepRollup | None = None
    parsed = 0
    unusable = 0
    first_edges: _Edges | None = None
    edges = _Edges()
    for index, path in enumerate(process.segments):
        edges = _Edges()
        for line in _rollup_lines(path, edges):
            parsed += len(line) + 1
            rollup = parse_rollup(loads_line(line), process.clock_offset_us)
            if rollup is not None:
                steps[rollup.step] = last = rollup
            else:
                unusable += 1  # torn, of a newer version, or a user's text that names one: its step is not known from rollups
        if index == 0:
            first_edges = edges
    parsed += sum(
        len(line) + 1 for line in ((first_edges.first if first_edges else None), edges.last) if line
    )
    return ProcessRollups(
        process, steps, _why_not(steps, last, first_edges, edges, unusable), parsed
    )


def _why_not(
    steps: dict[int, StepRollup],
    last: StepRollup | None,
    first_edges: _Edges | None,
    last_edges: _Edges,
    unusable: int,
) -> str | None:
    if not steps or last is None:
        return "no step_rollup records (torchtitan's, pimm's or an older otel-titan's files, or step_rollups off)"
    if unusable:
        return f"{unusable} line{'s' if unusable != 1 else ''} naming step_rollup could not be used (torn, of a newer version, or not a rollup)"
    opened = _record(first_edges.first if first_edges is not None else None)
    if (
        opened is None
        or opened.get(Field.LOG_TYPE_NAME) != MetaEvent.OPENED
        or opened.get(Field.SEQ_ID) != 1
    ):
        return "its files do not begin with the logger's opened record (a segment rotated away, or not read)"
    closed = _record(last_edges.last)
    if (
        not last_edges.readable
        or last_edges.torn
        or closed is None
        or closed.get(Field.LOG_TYPE_NAME) != MetaEvent.CLOSED
    ):
        return "it did not close cleanly (crashed, killed, hung or still running): its last steps may have no rollup"
    lost = [closed.get(name) for name in ("dropped_records", "failed_records")]
    if any(type(count) is not int or count != 0 for count in lost):
        return "it lost records (a full queue or a failed write: dropped_records, failed_records), so its spans and rollups may differ"
    if last.version < LATE_SPANS_VERSION:
        return f"its rollups are of version {last.version}, which does not count spans left out (late_spans)"
    if last.ended_by != "close":
        return "its rollups stop before its end (the writer turned them off)"
    if last.late_spans:
        return f"{last.late_spans} of its spans ended after their step's rollup was written (in no rollup)"
    return None


def process_rollups(process: ProcessLog) -> dict[int, StepRollup]:
    """step → the rollup that counts (the last written) in one process's files, oldest segment
    first.

    Example:
        >>> from otel_titan.analysis import read_run
        >>> count, total_us = process_rollups(read_run("outputs").processes[0])[2].phases["fwd_bwd"]
        >>> count, total_us >= 0
        (1, True)
    """
    return scan_rollups(process).steps


def read_rollups(run: RunLogs) -> dict[tuple[str, int | None, int | None], dict[int, StepRollup]]:
    """(source, rank, attempt) → step → `StepRollup`, for every process of `run` that wrote rollups.

    Processes without any are left out: their steps come from their spans.
    Two processes with the same source, rank and attempt (several runs in
    one folder: choose one first, `read.runs`) are merged, the later file's
    steps winning.

    Example:
        >>> from otel_titan.analysis import read_run
        >>> rollups = read_rollups(read_run("outputs"))
        >>> sorted((key, len(steps)) for key, steps in rollups.items())
        [(('training', 0, 0), 3), (('training', 1, 0), 3)]
    """
    out: dict[tuple[str, int | None, int | None], dict[int, StepRollup]] = {}
    for process in run.processes:
        found = process_rollups(process)
        if found:
            out.setdefault((process.source, process.rank, process.attempt), {}).update(found)
    return out
