"""Records → a Chrome Trace JSON file for Perfetto, streamed: one process at a time, one event at a
time.

`export_trace` (also importable as `generate_gantt_trace`, the name it had
first; torchtitan's function of that name, with torchtitan's behaviour, is
``otel_titan.compat.torchtitan``'s, docs/migrating-from-torchtitan.md) reads a run with
`read.records`, pairs each process's records with `model.timeline.walk_process`, turns
them into events with `export.chrome_events.ExportVisitor`, and streams them into a
temporary file created exclusively (``O_EXCL``, a fresh random name) in the
output's folder, renamed over the output when complete and removed on any
failure: a failed export never leaves a half-written trace or a stray file,
and nobody who can write that folder can plant a symlink the export would
follow. Big runs are converted on several cores (`export.parallel`).

One trace process per (source, rank), sorted by source, then rank; the
restarts of a rank (several files) share it. Perfetto shows a process as its
name followed by its pid, so the pid is the rank and the name ``training
rank``: it reads ``training rank 3``. When ranks repeat across sources, pids
are numbered instead and the name ends in ``#`` (``rollouter rank 0 #2``).
Timestamps are wall-clock µs since the epoch, the same on every process, so
ranks line up.

Memory: open spans, tracks, and one batch of events; nothing per record.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO

import orjson

from otel_titan.analysis.export import parallel as export_parallel
from otel_titan.analysis.export.checks import (
    PERFETTO_MAX_TRACE_BYTES,
    check_size,
    no_match_message,
    tail_alignment,
)
from otel_titan.analysis.export.chrome_events import EventStream, ExportStats
from otel_titan.analysis.export.perfetto import PerfettoStream, is_native
from otel_titan.analysis.export.pid_groups import PidGroup, pid_groups, process_name, write_groups
from otel_titan.analysis.model.clocks import ClockAlignment
from otel_titan.analysis.model.wording import plural
from otel_titan.analysis.read.cache_folder import make_private_folders, remove_made_folders
from otel_titan.analysis.read.filters import StepRange, parse_step_range
from otel_titan.analysis.read.records import NoRecordsError
from otel_titan.analysis.read.safe_text import json_bytes
from otel_titan.analysis.read.selection import RunSelection

__all__ = [
    "export_trace",
    "export_selected",
    "generate_gantt_trace",
    "default_output",
    "pid_groups",
    "process_name",
    "write_groups",
    "PidGroup",
]


class _TraceFile(EventStream):
    """``{"traceEvents": [ … ], …}`` written to a fresh temporary file next to `path`, renamed to
    `path` when complete.

    The temporary file is created with ``O_EXCL`` under a random name
    (`tempfile.mkstemp`), so a file or symlink someone planted in the folder
    is never opened; it gets the mode a plain ``open`` would give (0666 less
    the umask), and it is removed on every failure. Errors name `path`, the
    file the user asked for, never the temporary one.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.existed = os.path.lexists(path)
        if os.path.isdir(path):
            raise IsADirectoryError(
                errno.EISDIR, "is a directory (give a file name, e.g. -o DIR/trace.json)", path
            )
        folder = os.path.dirname(os.path.abspath(path))
        #: The folders made for it (0700, whatever the umask: a trace names the run's hosts),
        #: removed again by `abandon`.
        self.made_folders = make_private_folders(folder)
        try:
            fd, self.tmp_path = tempfile.mkstemp(
                prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder
            )
        except OSError as error:
            remove_made_folders(self.made_folders)
            raise OSError(error.errno, error.strerror, path) from None
        try:
            os.fchmod(fd, 0o666 & ~_umask())
            handle = os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            os.unlink(self.tmp_path)
            raise
        self._open(handle)
        try:
            self._file.write(self._header())
        except BaseException:
            self.abandon()
            raise

    def _open(self, handle: BinaryIO) -> None:
        EventStream.__init__(self, handle)

    def _header(self) -> bytes:
        return b'{"traceEvents":[\n'

    def _footer(self, other_data: dict[str, Any]) -> bytes:
        return (
            b'\n],"displayTimeUnit":"ms","otherData":'
            + json_bytes(other_data, option=orjson.OPT_NON_STR_KEYS)
            + b"}\n"
        )

    def finish(self, other_data: dict[str, Any]) -> int:
        try:
            self.flush()
            self._file.write(self._footer(other_data))
            self._file.close()
            size = os.path.getsize(self.tmp_path)
            os.replace(self.tmp_path, self.path)
        except OSError as error:
            self.abandon()
            raise OSError(error.errno, error.strerror, self.path) from None
        except BaseException:
            self.abandon()
            raise
        return size

    def abandon(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass  # a full disk fails the close's flush too; the file goes anyway
        try:
            os.unlink(self.tmp_path)
        except OSError:
            pass
        remove_made_folders(self.made_folders)  # a failed export leaves no empty analysis/ behind


class _PerfettoFile(PerfettoStream, _TraceFile):
    """The native trace (`export.perfetto.PerfettoStream`) in a `_TraceFile`'s temporary file; no
    header or footer."""

    __init__ = _TraceFile.__init__  # the temporary file's; it calls `_open` for the stream's

    def _open(self, handle: BinaryIO) -> None:
        PerfettoStream.__init__(self, handle, sequence_id=1)

    def _header(self) -> bytes:
        return b""

    def _footer(self, other_data: dict[str, Any]) -> bytes:
        return b""


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` would, for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def export_trace(
    input_dir: str | os.PathLike[str],
    output_path: str | os.PathLike[str] | None = None,
    *,
    steps: StepRange | str | None = None,
    ranks: Iterable[int] | None = None,
    sources: Iterable[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    jobs: int | None = None,
    run_id: str | None = None,
    log_skipped: bool = True,
    align: bool = True,
    max_output_bytes: int | None = PERFETTO_MAX_TRACE_BYTES,
    native: bool | None = None,
    scheduler: str | None = None,
) -> ExportStats:
    """Write a run's Chrome Trace JSON (open it in https://ui.perfetto.dev); returns what was
    written.

    `input_dir` is the run directory or its ``structured_logs/`` folder (as in
    torchtitan), or one ``.jsonl`` file; `output_path` defaults to
    ``<run>/analysis/trace.json``, and for one file to
    ``<run>/analysis/<that file's name without .jsonl>.trace.json`` (a trace of
    one process never replaces the whole run's). `stats.replaced` says whether
    an existing file was replaced.
    `steps` (``StepRange`` or ``"A:B"``), `ranks` and `sources` keep a slice.
    `progress(bytes_read, bytes_total)` is called as the input is read.
    `jobs`: worker processes (default: one per CPU, up to 8, for runs of
    64 MB or more with several processes; 1 converts in this process).
    `scheduler`: the address of a Dask scheduler (``tcp://host:8786``) whose
    workers convert instead (`workers.executors`; `jobs` is then ignored): the same
    trace. They write their parts beside `output_path`, which they must see.
    `run_id`: the run to export when the folder holds several (default: the
    latest; ``otherData`` names it and lists the runs found).
    `align`: shift each host's times by its clock offset (`export.checks.tail_alignment`).
    `max_output_bytes`: refuse (`TraceTooBigError`, proposing ``--steps`` / ``--ranks``)
    when the trace would be bigger (estimated before writing); None: no limit.
    `native`: write Perfetto's protobuf trace (`export.perfetto`) instead of
    JSON; by default when `output_path` ends in ``.pftrace`` or
    ``.perfetto-trace`` (the default output is then ``trace.pftrace``).
    Raises `NotARunError` (not a run) or `NoRecordsError` (nothing readable,
    or nothing left after the filters, or `run_id` names no run here; no file
    is written then).

    Example:
        >>> from otel_titan.analysis import export_trace
        >>> stats = export_trace("outputs/structured_logs/", "outputs/analysis/gantt.json")
        >>> print(stats.spans, stats.skipped_lines, stats.output_path)
        18 0 outputs/analysis/gantt.json
    """

    selection = RunSelection.of(
        input_dir,
        run_id=run_id,
        ranks=ranks,
        sources=sources,
        align=align,
        jobs=jobs,
        scheduler=scheduler,
        log_skipped=log_skipped,
    )
    return export_selected(
        selection,
        output_path,
        steps=steps,
        progress=progress,
        max_output_bytes=max_output_bytes,
        native=native,
    )


def export_selected(
    selection: RunSelection,
    output_path: str | os.PathLike[str] | None = None,
    *,
    steps: StepRange | str | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_output_bytes: int | None = PERFETTO_MAX_TRACE_BYTES,
    native: bool | None = None,
) -> ExportStats:
    """`export_trace` of the run `selection` names (its `cache` unused: a trace is made of every
    span); the other arguments as `export_trace`'s."""
    started = time.perf_counter()
    # One run: a folder can hold several (runs.select_run); the latest unless `run_id` names
    # another.
    run, choice = selection.read()
    jobs, scheduler, log_skipped = selection.jobs, selection.scheduler, selection.log_skipped
    step_range = parse_step_range(steps) if isinstance(steps, str) else steps
    native = (output_path is not None and is_native(output_path)) if native is None else native
    if max_output_bytes is not None and not native:
        # The limit is the browser's for JSON; the native trace is several times smaller.
        check_size(run, step_range, max_output_bytes)
    alignment = (
        tail_alignment(run) if selection.align else ClockAlignment(False, "turned off (--no-align)")
    )
    for process in run.processes:
        process.clock_offset_us = int(round(alignment.offset(process.host_name or process.label)))
    output = (
        os.fspath(output_path)
        if output_path is not None
        else default_output(run.run_dir, run.only_base, native)
    )
    stats = ExportStats(output_path=output, input_bytes=run.total_bytes, clock=alignment.describe())
    groups = pid_groups(run.processes)
    on_bytes = _progress_counter(run.total_bytes, progress)
    jobs = (
        export_parallel.default_jobs(run.total_bytes, len(groups))
        if jobs is None
        else max(1, min(jobs, len(groups)))
    )
    out = _PerfettoFile(output) if native else _TraceFile(output)
    stats.replaced = out.existed
    try:
        if jobs > 1 or scheduler is not None:
            first_us = export_parallel.convert_in_workers(
                groups,
                jobs,
                step_range,
                out,
                stats,
                run.skipped,
                on_bytes,
                log_skipped,
                native,
                scheduler,
            )
        else:
            first_us = write_groups(groups, out, stats, step_range, run.skipped, on_bytes, native)
        stats.skipped_lines = run.skipped.count
        stats.skipped_examples = run.skipped.examples[:20]
        stats.repaired_lines = run.skipped.repaired
        if stats.records == 0:
            raise NoRecordsError(
                f"{run.log_dir}: no readable records"
                + (
                    f" ({plural(stats.skipped_lines, 'unreadable line')} skipped)"
                    if stats.skipped_lines
                    else ""
                )
            )
        if stats.spans + stats.instants + stats.counters + stats.steps == 0:
            raise NoRecordsError(no_match_message(run, step_range, stats.processes))
    except BaseException:
        out.abandon()
        raise
    stats.events = out.count
    other = {
        "generator": "otel-titan export",
        "log_dir": os.path.abspath(run.log_dir),
        "time_unit": "ts and dur in microseconds; ts is wall-clock time since the Unix epoch",
        "first_time_us": first_us,
        "filters": {
            "steps": None if step_range is None else str(step_range),
            "ranks": None if selection.ranks is None else list(selection.ranks),
            "sources": None if selection.sources is None else list(selection.sources),
        },
        "run_ids": sorted({p.run_id for p in run.processes if p.run_id}),
        "clock_alignment": dataclasses.asdict(alignment),
        **choice.to_dict(),
        "stats": {
            k: v
            for k, v in stats.to_dict().items()
            if k not in ("output_path", "output_bytes", "seconds", "replaced", "clock")
        },
    }
    stats.output_bytes = out.finish(other)
    stats.seconds = time.perf_counter() - started
    return stats


#: The name `export_trace` had first, kept for existing callers: otel-titan's export (it returns
#: `ExportStats`), not torchtitan's function of that name (``otel_titan.compat.torchtitan``'s
#: gantt_generator has that one).
generate_gantt_trace = export_trace


def default_output(run_dir: str, only_base: str | None = None, native: bool = False) -> str:
    """Where `generate_gantt_trace` writes by default: the run's trace, or for one file a trace
    named after it.

    Example:
        >>> default_output("outputs"), default_output("outputs", "outputs/structured_logs/training.global_rank_1.20260101-000000-abc123.jsonl")
        ('outputs/analysis/trace.json', 'outputs/analysis/training.global_rank_1.20260101-000000-abc123.trace.json')
    """
    suffix = ".pftrace" if native else ".json"
    if only_base is None:
        return os.path.join(run_dir, "analysis", "trace" + suffix)
    name = os.path.basename(only_base)
    return os.path.join(
        run_dir,
        "analysis",
        (name[: -len(".jsonl")] if name.endswith(".jsonl") else name) + ".trace" + suffix,
    )


def _progress_counter(
    total: int, progress: Callable[[int, int], None] | None
) -> Callable[[int], None]:
    done = 0

    def on_bytes(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    return on_bytes
