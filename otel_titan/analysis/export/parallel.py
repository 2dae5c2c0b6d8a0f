"""Export on several cores: trace processes are split between worker subprocesses.

Each trace process (a source/rank and its files) is converted independently,
so the work splits cleanly: every worker streams its share into a part file
of encoded events, exactly as the single-process export would, and the parent
copies the parts into the trace. Each worker holds what one streaming
conversion holds (open spans, tracks, a batch of events); the parent holds
nothing per record.

Each share is one task of `workers.run_shares`: in a fresh local
interpreter (``--jobs N``: `workers.InterpreterPool`, never a fork of a
possibly threaded caller) or on a Dask cluster's worker (``--scheduler``),
one code path; its warnings reach the person by the parent's one warning
path, escaped. On a cluster the part files are written beside the output,
which the workers must see (a shared filesystem, as the run's own files).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from otel_titan.analysis.export.chrome_events import EventStream, ExportStats
from otel_titan.analysis.export.perfetto import MAX_SEQUENCES, PerfettoStream
from otel_titan.analysis.export.pid_groups import PidGroup, write_groups
from otel_titan.analysis.read.filters import StepRange
from otel_titan.analysis.read.lines import SkippedLines
from otel_titan.analysis.workers import (
    balance,
    default_jobs,
    for_cluster,
    merge_skipped,
    open_workers,
    run_shares,
    skipped_result,
)

# default_jobs: the export's own choice of jobs
__all__ = [
    "convert_in_workers",
    "convert_share",
    "default_jobs",
]

_ADDITIVE = (
    "processes",
    "records",
    "spans",
    "incomplete_spans",
    "failed_spans",
    "instants",
    "counters",
    "steps",
)


def convert_in_workers(
    groups: list[PidGroup],
    jobs: int,
    steps: StepRange | None,
    out: EventStream,
    stats: ExportStats,
    skipped: SkippedLines,
    on_bytes: Callable[[int], None],
    log_skipped: bool = True,
    native: bool = False,
    scheduler: str | None = None,
) -> int | None:
    """Convert `groups` in `jobs` local workers (or on the Dask cluster at `scheduler`) and append
    their events to `out`; returns the earliest timestamp.

    Counts go into `stats` and `skipped`, bytes read to `on_bytes` as workers
    report them. The part files are written beside the output, so a cluster's
    workers must see that folder (a shared filesystem, as the run's).
    Raises `WorkerDiedError` (a RuntimeError) when a worker fails (its error is logged first).

    Example (not run here: it starts worker interpreters; `generate_gantt_trace(..., jobs=2)`
    calls it, and tests/analysis/export/test_parallel.py runs that):
        >>> first_us = convert_in_workers(pid_groups(run.processes), 2, None, trace_file, stats, run.skipped, print)  # doctest: +SKIP
    """
    with tempfile.TemporaryDirectory(
        prefix="otel-titan-export-", dir=os.path.dirname(os.path.abspath(getattr(out, "path", ".")))
    ) as work_dir:
        with open_workers(jobs, scheduler, "export worker", on_bytes) as workers:
            slots = min(workers.slots, len(groups))
            if native:
                # one packet sequence each, the parent's is 1: track uuids stay unique
                slots = min(slots, MAX_SEQUENCES - 1)
            shares = []
            for index, indices in enumerate(
                balance(groups, slots, lambda g: sum(p.size for p in g[1]))
            ):
                bucket = [groups[i] for i in indices]
                if workers.cluster:  # its workers run in directories of their own: absolute paths
                    bucket = [(pid, [for_cluster(p) for p in group]) for pid, group in bucket]
                part = os.path.join(work_dir, f"part-{index}")
                # native parts: one packet sequence each (the parent's is 1)
                shares.append(
                    (
                        part,
                        None if steps is None else (steps.first, steps.last),
                        log_skipped,
                        native,
                        index + 2,
                        bucket,
                    )
                )
            results = run_shares(workers, f"{__name__}:convert_share", shares, on_bytes)
        first_us: int | None = None
        for (part, *_), result in zip(shares, results, strict=True):
            out.add_encoded(part, result["events"])
            os.unlink(part)
            for name in _ADDITIVE:
                setattr(stats, name, getattr(stats, name) + result["stats"][name])
            stats.max_async_slots = max(stats.max_async_slots, result["stats"]["max_async_slots"])
            merge_skipped(skipped, result)
            if result["first_us"] is not None and (
                first_us is None or result["first_us"] < first_us
            ):
                first_us = result["first_us"]
        return first_us


def convert_share(
    part: str,
    steps: tuple[int, int] | None,
    log_skipped: bool,
    native: bool,
    sequence_id: int,
    groups: list[PidGroup],
    on_bytes: Callable[[int], None],
) -> dict[str, Any]:
    """One worker's share: convert `groups` into the part file `part`; its counts (a task of
    `workers.run_shares`)."""
    stats = ExportStats(output_path=part)
    skipped = SkippedLines(log=log_skipped)
    with open(part, "wb") as handle:
        out = PerfettoStream(handle, sequence_id) if native else EventStream(handle)
        first_us = write_groups(
            groups,
            out,
            stats,
            None if steps is None else StepRange(*steps),
            skipped,
            on_bytes,
            native,
        )
        out.flush()
    return {
        "events": out.events,
        "first_us": first_us,
        "stats": {name: getattr(stats, name) for name in (*_ADDITIVE, "max_async_slots")},
        **skipped_result(skipped),
    }
