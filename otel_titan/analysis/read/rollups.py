"""The writer's ``step_rollup`` records → per process and step totals, found without parsing the spans around them.

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from otel_titan.analysis.read.lines import BLOCK_BYTES, loads_line
from otel_titan.analysis.read.records import ProcessLog, RunLogs
from otel_titan.schema import ROLLUP_VERSION, Field, MetaEvent, RollupField

__all__ = ["StepRollup", "parse_rollup", "process_rollups", "read_rollups"]

#: A line holding this may be a rollup (parsed, then checked): spacing-blind, so a file rewritten by another JSON tool still counts.
_MARKER = b'"' + MetaEvent.STEP_ROLLUP.encode() + b'"'


@dataclass(frozen=True)
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


def _int(value: Any) -> bool:
    return type(value) is int


def parse_rollup(record: Any, offset_us: int = 0) -> StepRollup | None:
    """`record` as a `StepRollup`, or None when it is no rollup this reader can use.

    Example:
        >>> line = {"log_type_name": "step_rollup", "rollup_version": 1, "step": 5, "complete": True, "ended_by": "next_step",
        ...         "begin_us": 1000, "end_us": 3500, "duration_ms": 2.5, "phases": {"fwd": [2, 1800]},
        ...         "closing": {"name": "all_reduce", "start_us": 3000, "end_us": 3400}}
        >>> rollup = parse_rollup(line)
        >>> rollup.phases, rollup.closing, parse_rollup({**line, "rollup_version": 2})
        ({'fwd': (2, 1800)}, ('all_reduce', 3000, 3400), None)
    """
    if type(record) is not dict or record.get(Field.LOG_TYPE_NAME) != MetaEvent.STEP_ROLLUP:
        return None
    version, step, begin, end = record.get(RollupField.VERSION), record.get(Field.STEP), record.get(RollupField.BEGIN_US), record.get(RollupField.END_US)
    if not (_int(version) and 1 <= version <= ROLLUP_VERSION and _int(step) and _int(begin) and _int(end)):
        return None
    raw_phases = record.get(RollupField.PHASES)
    if not isinstance(raw_phases, dict):
        return None
    phases: dict[str, tuple[int, int]] = {}
    for name, pair in raw_phases.items():
        if not (isinstance(pair, list) and len(pair) == 2 and _int(pair[0]) and _int(pair[1])):
            return None
        phases[name] = (pair[0], pair[1])
    closing = record.get(RollupField.CLOSING)
    closed_by: tuple[str, int, int] | None = None
    if isinstance(closing, dict) and isinstance(closing.get("name"), str) and _int(closing.get("start_us")) and _int(closing.get("end_us")):
        closed_by = (closing["name"], closing["start_us"] - offset_us, closing["end_us"] - offset_us)
    duration = record.get(RollupField.DURATION_MS)
    open_spans = record.get(RollupField.OPEN_SPANS, 0)
    tags = record.get(Field.STEP_TAGS)
    return StepRollup(
        step=step,
        complete=record.get(RollupField.COMPLETE) is True,
        ended_by=str(record.get(RollupField.ENDED_BY, "")),
        begin_us=begin - offset_us,
        end_us=end - offset_us,
        duration_ms=float(duration) if type(duration) in (int, float) else (end - begin) / 1000.0,
        phases=phases,
        closing=closed_by,
        open_spans=open_spans if _int(open_spans) else 0,
        step_tags=tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else (),
    )


def _rollup_lines(path: str) -> Iterable[bytes]:
    """The lines of `path` that name themselves a rollup (complete lines only), read block by block."""
    try:
        handle = open(path, "rb")
    except OSError:
        return  # rotated away or unreadable: the full reader reports it
    with handle:
        carry = b""
        while True:
            try:
                block = handle.read(BLOCK_BYTES)
            except OSError:
                return
            if not block:
                return
            data = carry + block if carry else block
            last_newline = data.rfind(b"\n")
            if last_newline < 0:
                carry = data
                continue
            at = data.find(_MARKER, 0, last_newline)
            while at >= 0:
                start = data.rfind(b"\n", 0, at) + 1
                stop = data.find(b"\n", at)
                yield data[start:stop]
                at = data.find(_MARKER, stop, last_newline)
            carry = data[last_newline + 1 :]


def process_rollups(process: ProcessLog) -> dict[int, StepRollup]:
    """step → the rollup that counts (the last written) in one process's files, oldest segment first.

    Example:
        >>> # process_rollups(read_run("outputs").processes[0])[5].phases["fwd_bwd"]   → (1, 110234)
    """
    out: dict[int, StepRollup] = {}
    for path in process.segments:
        for line in _rollup_lines(path):
            rollup = parse_rollup(loads_line(line), process.clock_offset_us)
            if rollup is not None:
                out[rollup.step] = rollup
    return out


def read_rollups(run: RunLogs) -> dict[tuple[str, int | None, int | None], dict[int, StepRollup]]:
    """(source, rank, attempt) → step → `StepRollup`, for every process of `run` that wrote rollups.

    Processes without any are left out: their steps come from their spans.
    Two processes with the same source, rank and attempt (several runs in
    one folder: choose one first, `read.runs`) are merged, the later file's
    steps winning.

    Example:
        >>> # rollups = read_rollups(read_run("outputs"))
        >>> # {key: len(steps) for key, steps in rollups.items()}   → {('training', 0, 0): 200, ('training', 1, 0): 200}
    """
    out: dict[tuple[str, int | None, int | None], dict[int, StepRollup]] = {}
    for process in run.processes:
        found = process_rollups(process)
        if found:
            out.setdefault((process.source, process.rank, process.attempt), {}).update(found)
    return out
