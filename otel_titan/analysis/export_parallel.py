"""Export on several cores: trace processes are split between worker subprocesses.

Each trace process (a source/rank and its files) is converted independently,
so the work splits cleanly: every worker streams its share into a part file
of encoded events, exactly as the single-process export would, and the parent
copies the parts into the trace. Each worker holds what one streaming
conversion holds (open spans, tracks, a batch of events); the parent holds
nothing per record.

Workers are fresh interpreters running `_worker_main` (`worker_io.start_process`),
not forks: a fork of a threaded program (a training process with its logger
thread) can deadlock, and a fresh interpreter needs no ``__main__`` guard in the
caller's script. They report progress, warnings and results as lines on
stdout (`worker_io`: a worker's skipped-line warnings reach the person by the
parent's one warning path, escaped). The job and the results travel as JSON
written by the standard library with ``ensure_ascii``: a file name's
undecodable bytes (surrogates in Python) survive the trip exactly, where
orjson would refuse them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, fields
from typing import Any, Callable

from otel_titan.analysis.chrome_events import EventStream, ExportStats
from otel_titan.analysis.filters import StepRange
from otel_titan.analysis.perfetto_trace import MAX_SEQUENCES, PerfettoStream
from otel_titan.analysis.reader import ProcessLog
from otel_titan.analysis.record_lines import SkippedLines
from otel_titan.analysis.trace_groups import TraceGroup, write_groups
from otel_titan.analysis.worker_io import encode, read_workers, start_process, start_worker

__all__ = ["default_jobs", "convert_in_workers", "PARALLEL_MIN_BYTES", "MAX_JOBS"]

#: Below this much JSONL, starting interpreters costs more than it saves.
PARALLEL_MIN_BYTES = 64 << 20
MAX_JOBS = 8
#: A worker reports progress after this many bytes read.
_PROGRESS_BYTES = 8 << 20
_ADDITIVE = ("processes", "records", "spans", "incomplete_spans", "failed_spans", "instants", "counters", "steps")


def default_jobs(total_bytes: int, groups: int) -> int:
    """Workers to use by default: one per CPU (at most `MAX_JOBS`) for big runs, else 1 (in-process).

    Example:
        >>> default_jobs(10 << 20, 16)
        1
    """
    if total_bytes < PARALLEL_MIN_BYTES or groups < 2:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, groups, MAX_JOBS))


def _balance(groups: list[TraceGroup], jobs: int) -> list[list[TraceGroup]]:
    """Largest first onto the least-loaded worker (by bytes)."""
    buckets: list[list[TraceGroup]] = [[] for _ in range(jobs)]
    loads = [0] * jobs
    for group in sorted(groups, key=lambda g: -sum(p.size for p in g[1])):
        target = loads.index(min(loads))
        buckets[target].append(group)
        loads[target] += sum(p.size for p in group[1])
    return [sorted(bucket, key=lambda g: g[0]) for bucket in buckets if bucket]


def convert_in_workers(
    groups: list[TraceGroup],
    jobs: int,
    steps: StepRange | None,
    out: EventStream,
    stats: ExportStats,
    skipped: SkippedLines,
    on_bytes: Callable[[int], None],
    log_skipped: bool = True,
    native: bool = False,
) -> int | None:
    """Convert `groups` in `jobs` worker processes and append their events to `out`; returns the earliest timestamp.

    Counts go into `stats` and `skipped`, bytes read to `on_bytes` as workers
    report them. Raises RuntimeError when a worker fails (its error is on stderr).

    Example:
        >>> # called by generate_gantt_trace(..., jobs=2):
        >>> # first_us = convert_in_workers(trace_groups(run.processes), 2, None, trace_file, stats, run.skipped, print)
    """
    with tempfile.TemporaryDirectory(prefix="otel-titan-export-", dir=os.path.dirname(os.path.abspath(getattr(out, "path", ".")))) as work_dir:
        workers: list[tuple[subprocess.Popen[bytes], str]] = []
        try:
            if native:
                jobs = min(jobs, MAX_SEQUENCES - 1)  # one packet sequence each, the parent's is 1: track uuids stay unique
            for index, bucket in enumerate(_balance(groups, jobs)):
                part = os.path.join(work_dir, f"part-{index}")
                spec = {
                    "part": part,
                    "steps": None if steps is None else [steps.first, steps.last],
                    "log_skipped": log_skipped,
                    "native": native,
                    "sequence_id": index + 2,  # native parts: one packet sequence each (the parent's is 1)
                    "groups": [[pid, [asdict(p) for p in processes]] for pid, processes in bucket],
                }
                workers.append((start_process(__name__, "_worker_main", spec), part))
            results = read_workers([worker for worker, _ in workers], on_bytes, "export worker")
        finally:
            for worker, _ in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        first_us: int | None = None
        for (_, part), result in zip(workers, results, strict=True):
            if result is None:
                raise RuntimeError("an export worker exited without its result; its error is above")
            out.add_encoded(part, result["events"])
            os.unlink(part)
            for name in _ADDITIVE:
                setattr(stats, name, getattr(stats, name) + result["stats"][name])
            stats.max_async_slots = max(stats.max_async_slots, result["stats"]["max_async_slots"])
            skipped.count += result["skipped"]
            skipped.repaired += result["repaired"]
            for path, count in result["repaired_by_file"].items():
                skipped.repaired_by_file[path] += count
            skipped.examples.extend(result["skipped_examples"][: max(0, 100 - len(skipped.examples))])
            for path, count in result["skipped_by_file"].items():
                skipped.by_file[path] += count
            if result["first_us"] is not None and (first_us is None or result["first_us"] < first_us):
                first_us = result["first_us"]
        return first_us


def process_logs(items: list[dict[str, Any]]) -> list[ProcessLog]:
    """`ProcessLog`s back from their ``asdict`` form, as sent to a worker (unknown keys ignored)."""
    names = {f.name for f in fields(ProcessLog)}
    return [ProcessLog(**{k: v for k, v in p.items() if k in names}) for p in items]


def _worker_main() -> int:
    spec = start_worker()
    steps = None if spec["steps"] is None else StepRange(*spec["steps"])
    groups = [(pid, process_logs(processes)) for pid, processes in spec["groups"]]
    stats = ExportStats(output_path=spec["part"])
    skipped = SkippedLines(log=spec["log_skipped"])
    unreported = 0
    stdout = sys.stdout.buffer

    def on_bytes(count: int) -> None:
        nonlocal unreported
        unreported += count
        if unreported >= _PROGRESS_BYTES:
            stdout.write(b"P %d\n" % unreported)
            stdout.flush()
            unreported = 0

    with open(spec["part"], "wb") as handle:
        native = spec.get("native", False)
        out = PerfettoStream(handle, spec["sequence_id"]) if native else EventStream(handle)
        first_us = write_groups(groups, out, stats, steps, skipped, on_bytes, native)
        out.flush()
    if unreported:
        stdout.write(b"P %d\n" % unreported)
    result = {
        "events": out.events,
        "first_us": first_us,
        "stats": {name: getattr(stats, name) for name in (*_ADDITIVE, "max_async_slots")},
        "skipped": skipped.count,
        "skipped_examples": skipped.examples,
        "skipped_by_file": dict(skipped.by_file),
        "repaired": skipped.repaired,
        "repaired_by_file": dict(skipped.repaired_by_file),
    }
    stdout.write(b"R " + encode(result) + b"\n")
    stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
