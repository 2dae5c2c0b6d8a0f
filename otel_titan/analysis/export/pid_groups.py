"""Processes grouped into Perfetto processes (pids: one per source and rank, restarts sharing it),
and the loop that streams their events.

A "pid group" here; not the "trace group" of `core/trace_ids.py` (ranks sharing a trace id).

What `export.chrome_trace.generate_gantt_trace` runs in-process and each
`export.parallel` worker runs on its share: a module of its own, below both,
so neither has to import the other's caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from otel_titan.analysis.export.chrome_events import (
    STEP_TID,
    EventStream,
    ExportStats,
    ExportVisitor,
    ProcessTracks,
)
from otel_titan.analysis.export.perfetto import NativeVisitor, PerfettoStream
from otel_titan.analysis.model.timeline import walk_process
from otel_titan.analysis.read.filters import StepRange
from otel_titan.analysis.read.lines import SkippedLines
from otel_titan.analysis.read.records import ProcessLog

__all__ = ["PidGroup", "pid_groups", "process_name", "write_groups"]

PidGroup = tuple[int, list[ProcessLog]]


def pid_groups(processes: list[ProcessLog]) -> list[PidGroup]:
    """(trace pid, processes) per (source, rank), in sorted order; restarts of a rank share the pid
    (the rank, when unique).

    Example:
        >>> from otel_titan.analysis.read.records import ProcessLog
        >>> logs = [ProcessLog("a", [], "training", 0), ProcessLog("b", [], "training", 0), ProcessLog("c", [], "training", 1)]
        >>> [(pid, [p.base for p in group]) for pid, group in pid_groups(logs)]
        [(0, ['a', 'b']), (1, ['c'])]
        >>> [pid for pid, _ in pid_groups(logs + [ProcessLog("d", [], "reward", 0)])]
        [1, 2, 3]
    """
    groups: dict[tuple[str, int | None], list[ProcessLog]] = {}
    for process in processes:
        groups.setdefault((process.source, process.rank), []).append(process)
    ranks = [rank for _, rank in groups]
    # Perfetto's pids are 32-bit: a rank beyond that (a broken file name) cannot be one.
    if all(rank is not None and 0 <= rank < 1 << 31 for rank in ranks) and len(set(ranks)) == len(
        ranks
    ):
        return [(rank, group) for (_, rank), group in groups.items()]  # type: ignore[misc]  # every rank is an int here: checked just above
    return list(enumerate(groups.values(), start=1))


def process_name(pid: int, processes: list[ProcessLog]) -> str:
    """The trace process's name; Perfetto appends the pid, so ``training rank`` with pid 3 reads
    ``training rank 3``.

    Example:
        >>> from otel_titan.analysis.read.records import ProcessLog
        >>> process_name(3, [ProcessLog("a", [], "training", 3)]), process_name(2, [ProcessLog("a", [], "rollouter", 0)])
        ('training rank', 'rollouter rank 0 #')
    """
    first = processes[0]
    return (
        f"{first.source} rank"
        if first.rank is not None and first.rank == pid
        else f"{first.label} #"
    )


def write_groups(
    groups: Iterable[PidGroup],
    out: EventStream | PerfettoStream,
    stats: ExportStats,
    steps: StepRange | None,
    skipped: SkippedLines,
    on_bytes: Callable[[int], None] | None,
    native: bool = False,
) -> int | None:
    """Stream the events of `groups` into `out`, counting into `stats`; returns the earliest
    timestamp.

    What `generate_gantt_trace` and each export worker run, one process after the other.

    Example:
        >>> import io
        >>> from otel_titan.analysis import ExportStats, read_run
        >>> from otel_titan.analysis.export.chrome_events import EventStream
        >>> run, stats = read_run("outputs"), ExportStats(output_path="part")
        >>> first_us = write_groups(pid_groups(run.processes), EventStream(io.BytesIO()), stats, None, run.skipped, None)
        >>> stats.processes, stats.spans, first_us > 0
        (2, 18, True)
    """
    visitor = (NativeVisitor if native else ExportVisitor)(out, stats, steps)  # type: ignore[arg-type]  # either stream: both visitors take the writer they are given
    first_us: int | None = None
    for pid, processes in groups:
        tracks = ProcessTracks(pid=pid)
        stats.processes += 1
        out.add(
            {
                "name": "process_name",
                "ph": "M",
                "pid": pid,
                "tid": STEP_TID,
                "args": {"name": process_name(pid, processes)},
            }
        )
        out.add(
            {
                "name": "process_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": STEP_TID,
                "args": {"sort_index": pid},
            }
        )
        out.add(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": pid,
                "tid": STEP_TID,
                "args": {"name": "steps"},
            }
        )
        out.add(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": STEP_TID,
                "args": {"sort_index": -1},
            }
        )
        last_us: int | None = None
        for process in processes:
            visitor.begin_process(tracks, process.pid, process.modified_us)
            extent = walk_process(process.records(skipped, on_bytes, trimmed=True), visitor)
            stats.records += extent.records
            if extent.first_us is not None and (first_us is None or extent.first_us < first_us):
                first_us = extent.first_us
            if extent.last_us is not None and (last_us is None or extent.last_us > last_us):
                last_us = extent.last_us
        if native and last_us is not None:
            out.end_process(pid, last_us)  # type: ignore[union-attr]  # JSON cannot end a counter track
    return first_us
