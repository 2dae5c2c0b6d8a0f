"""Records → a Chrome Trace JSON file for Perfetto, streamed: one process at a time, one event at a time.

`generate_gantt_trace` (torchtitan's name and signature) reads a run with
`reader`, pairs each process's records with `timeline.walk_process`, turns
them into events with `chrome_events.ExportVisitor`, and streams them into
``<output>.tmp``, renamed into place when complete (a failed export never
leaves a half-written trace). Big runs are converted on several cores
(`export_parallel`).

One trace process per (source, rank), named ``training rank 3``, sorted by
source, then rank; the restarts of a rank (several files) share it.
Timestamps are wall-clock µs since the epoch, the same on every process, so
ranks line up.

Memory: open spans, tracks, and one batch of events; nothing per record.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable

import orjson

from otel_titan.analysis.chrome_events import STEP_TID, EventStream, ExportStats, ExportVisitor, ProcessTracks
from otel_titan.analysis.filters import StepRange, parse_step_range
from otel_titan.analysis.reader import NoRecordsError, ProcessLog, read_run
from otel_titan.analysis.record_lines import SkippedLines
from otel_titan.analysis.timeline import walk_process

__all__ = ["generate_gantt_trace", "trace_groups", "write_groups", "TraceGroup"]


class _TraceFile(EventStream):
    """``{"traceEvents": [ … ], …}`` written to ``<path>.tmp``, renamed to `path` when complete."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tmp_path = f"{path}.tmp"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        super().__init__(open(self.tmp_path, "wb"))
        self._file.write(b'{"traceEvents":[\n')

    def finish(self, other_data: dict[str, Any]) -> int:
        self.flush()
        self._file.write(b'\n],"displayTimeUnit":"ms","otherData":' + orjson.dumps(other_data, option=orjson.OPT_NON_STR_KEYS) + b"}\n")
        self._file.close()
        size = os.path.getsize(self.tmp_path)
        os.replace(self.tmp_path, self.path)
        return size

    def abandon(self) -> None:
        self._file.close()
        try:
            os.unlink(self.tmp_path)
        except OSError:
            pass


def generate_gantt_trace(
    input_dir: str | os.PathLike[str],
    output_path: str | os.PathLike[str] | None = None,
    *,
    steps: StepRange | str | None = None,
    ranks: Iterable[int] | None = None,
    sources: Iterable[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    jobs: int | None = None,
    log_skipped: bool = True,
) -> ExportStats:
    """Write a run's Chrome Trace JSON (open it in https://ui.perfetto.dev); returns what was written.

    `input_dir` is the run directory or its ``structured_logs/`` folder (as in
    torchtitan); `output_path` defaults to ``<run>/analysis/trace.json``.
    `steps` (``StepRange`` or ``"A:B"``), `ranks` and `sources` keep a slice.
    `progress(bytes_read, bytes_total)` is called as the input is read.
    `jobs`: worker processes (default: one per CPU, up to 8, for runs of
    64 MB or more with several processes; 1 converts in this process).
    Raises `NotARunError` (not a run) or `NoRecordsError` (nothing readable,
    or nothing left after the filters; no file is written then).

    Example:
        >>> # from otel_titan.analysis import generate_gantt_trace
        >>> # stats = generate_gantt_trace("outputs/structured_logs/", "outputs/analysis/gantt.json")
        >>> # print(stats.spans, stats.skipped_lines)
    """
    from otel_titan.analysis import export_parallel  # noqa: PLC0415 - it imports this module

    started = time.perf_counter()
    ranks = None if ranks is None else sorted(set(ranks))
    sources = None if sources is None else sorted(set(sources))
    run = read_run(input_dir, ranks=ranks, sources=sources, log_skipped=log_skipped)
    step_range = parse_step_range(steps) if isinstance(steps, str) else steps
    output = os.fspath(output_path) if output_path is not None else os.path.join(run.run_dir, "analysis", "trace.json")
    stats = ExportStats(output_path=output, input_bytes=run.total_bytes)
    groups = trace_groups(run.processes)
    on_bytes = _progress_counter(run.total_bytes, progress)
    jobs = export_parallel.default_jobs(run.total_bytes, len(groups)) if jobs is None else max(1, min(jobs, len(groups)))
    out = _TraceFile(output)
    try:
        if jobs > 1:
            first_us = export_parallel.convert_in_workers(groups, jobs, step_range, out, stats, run.skipped, on_bytes, log_skipped)
        else:
            first_us = write_groups(groups, out, stats, step_range, run.skipped, on_bytes)
        stats.skipped_lines = run.skipped.count
        stats.skipped_examples = run.skipped.examples[:20]
        if stats.records == 0:
            raise NoRecordsError(f"{run.log_dir}: no readable records" + (f" ({stats.skipped_lines} unreadable lines skipped)" if stats.skipped_lines else ""))
        if stats.spans + stats.instants + stats.counters + stats.steps == 0:
            raise NoRecordsError(f"{run.log_dir}: no records match the filters (steps {step_range}, {stats.processes} processes selected)")
    except BaseException:
        out.abandon()
        raise
    stats.events = out.count
    other = {
        "generator": "otel-titan export",
        "log_dir": os.path.abspath(run.log_dir),
        "time_unit": "ts and dur in microseconds; ts is wall-clock time since the Unix epoch",
        "first_time_us": first_us,
        "filters": {"steps": None if step_range is None else str(step_range), "ranks": ranks, "sources": sources},
        "run_ids": sorted({p.run_id for p in run.processes if p.run_id}),
        "stats": {k: v for k, v in stats.to_dict().items() if k not in ("output_path", "output_bytes", "seconds")},
    }
    stats.output_bytes = out.finish(other)
    stats.seconds = time.perf_counter() - started
    return stats


def _progress_counter(total: int, progress: Callable[[int, int], None] | None) -> Callable[[int], None]:
    done = 0

    def on_bytes(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    return on_bytes


TraceGroup = tuple[int, list[ProcessLog]]


def trace_groups(processes: list[ProcessLog]) -> list[TraceGroup]:
    """(trace pid, processes) per (source, rank), in sorted order; restarts of a rank share the pid.

    Example:
        >>> from otel_titan.analysis.reader import ProcessLog
        >>> logs = [ProcessLog("a", [], "training", 0), ProcessLog("b", [], "training", 0), ProcessLog("c", [], "training", 1)]
        >>> [(pid, [p.base for p in group]) for pid, group in trace_groups(logs)]
        [(1, ['a', 'b']), (2, ['c'])]
    """
    groups: dict[tuple[str, int | None], list[ProcessLog]] = {}
    for process in processes:
        groups.setdefault((process.source, process.rank), []).append(process)
    return list(enumerate(groups.values(), start=1))


def write_groups(groups: Iterable[TraceGroup], out: EventStream, stats: ExportStats, steps: StepRange | None, skipped: SkippedLines, on_bytes: Callable[[int], None] | None) -> int | None:
    """Stream the events of `groups` into `out`, counting into `stats`; returns the earliest timestamp.

    What `generate_gantt_trace` and each export worker run, one process after the other.

    Example:
        >>> # with open("part", "wb") as handle:
        >>> #     write_groups(trace_groups(run.processes), EventStream(handle), stats, None, run.skipped, None)
    """
    visitor = ExportVisitor(out, stats, steps)
    first_us: int | None = None
    for pid, processes in groups:
        tracks = ProcessTracks(pid=pid)
        stats.processes += 1
        out.add({"name": "process_name", "ph": "M", "pid": pid, "tid": STEP_TID, "args": {"name": processes[0].label}})
        out.add({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": STEP_TID, "args": {"sort_index": pid}})
        out.add({"name": "thread_name", "ph": "M", "pid": pid, "tid": STEP_TID, "args": {"name": "steps"}})
        out.add({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": STEP_TID, "args": {"sort_index": -1}})
        for process in processes:
            visitor.begin_process(tracks, process.pid)
            extent = walk_process(process.records(skipped, on_bytes), visitor)
            stats.records += extent.records
            if extent.first_us is not None and (first_us is None or extent.first_us < first_us):
                first_us = extent.first_us
    return first_us
