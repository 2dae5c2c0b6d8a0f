"""How a command's per-file work is cut into shares, and what a share sends back of the lines it
skipped.

Why here, once: the export, the summary and `sql`'s load all split a run's
processes between workers the same way (by bytes, largest first onto the
least-loaded worker) and merge the workers' `SkippedLines` the same way, so
neither command has to import the other's worker code.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from otel_titan.analysis.read.lines import MAX_WARNINGS_KEPT, SkippedLines
from otel_titan.analysis.read.records import ProcessLog

__all__ = [
    "PARALLEL_MIN_BYTES",
    "MAX_JOBS",
    "default_jobs",
    "balance",
    "skipped_result",
    "merge_skipped",
    "for_cluster",
]

#: Below this much JSONL, starting interpreters costs more than it saves.
PARALLEL_MIN_BYTES = 64 << 20
MAX_JOBS = 8

Item = TypeVar("Item")


def default_jobs(total_bytes: int, items: int) -> int:
    """Workers to use by default: one per CPU (at most `MAX_JOBS`) for runs of `PARALLEL_MIN_BYTES`
    or more with several items, else 1 (in-process).

    Example:
        >>> default_jobs(10 << 20, 16)
        1
        >>> default_jobs(1 << 30, 1)
        1
    """
    if total_bytes < PARALLEL_MIN_BYTES or items < 2:
        return 1
    cpus = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    return max(1, min(cpus, items, MAX_JOBS))


def for_cluster(process: ProcessLog) -> ProcessLog:
    """`process` with absolute file paths: what a Dask worker, in a working directory of its own,
    must be sent.

    The user types the run's path as seen from the job's folder
    (``summarize run --scheduler tcp://…``); a cluster's workers run
    elsewhere (dask-jobqueue starts them in the batch system's folder, on
    other nodes that see the run through the shared filesystem at the same
    absolute path). Local workers share the command's directory and are sent
    the paths as given, so their warnings name the files as the user did.

    Example:
        >>> p = for_cluster(ProcessLog(base="run/structured_logs/a.jsonl", segments=["run/structured_logs/a.jsonl"], source="training", rank=0))
        >>> os.path.isabs(p.base) and p.segments == [p.base]
        True
    """
    return dataclasses.replace(
        process,
        base=os.path.abspath(process.base),
        segments=[os.path.abspath(path) for path in process.segments],
    )


def balance(items: Sequence[Item], jobs: int, size: Callable[[Item], int]) -> list[list[int]]:
    """Indices of `items` in at most `jobs` shares: largest first onto the least-loaded share (by
    `size`), each share in the items' order.

    Example:
        >>> balance([5, 1, 4, 2], 2, lambda n: n)
        [[0, 1], [2, 3]]
    """
    buckets: list[list[int]] = [[] for _ in range(jobs)]
    loads = [0] * jobs
    for index in sorted(range(len(items)), key=lambda i: -size(items[i])):
        target = loads.index(min(loads))
        buckets[target].append(index)
        loads[target] += size(items[index])
    return [sorted(bucket) for bucket in buckets if bucket]


def skipped_result(skipped: SkippedLines) -> dict[str, Any]:
    """What a worker sends back of its `SkippedLines` (for `merge_skipped`)."""
    return {
        "skipped": skipped.count,
        "skipped_examples": skipped.examples,
        "skipped_by_file": dict(skipped.by_file),
        "repaired": skipped.repaired,
        "repaired_by_file": dict(skipped.repaired_by_file),
        "warnings": skipped.warnings,
    }


def merge_skipped(skipped: SkippedLines, result: dict[str, Any]) -> None:
    """Add a worker's `skipped_result` into `skipped` (at most 100 examples kept, as one reader
    keeps)."""
    skipped.count += result["skipped"]
    skipped.repaired += result["repaired"]
    for path, count in result["repaired_by_file"].items():
        skipped.repaired_by_file[path] += count
    skipped.examples.extend(result["skipped_examples"][: max(0, 100 - len(skipped.examples))])
    for path, count in result["skipped_by_file"].items():
        skipped.by_file[path] += count
    skipped.warnings.extend(
        result.get("warnings", ())[: max(0, MAX_WARNINGS_KEPT - len(skipped.warnings))]
    )
