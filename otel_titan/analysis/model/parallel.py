"""Summary on several cores: processes are split between worker interpreters, their reads merged.

Why: at 1,000 ranks and gigabytes the summary is bound by parsing and pairing records, which is
independent per process, as in the export (`export.parallel`). Each share is one task of
`workers.run_shares`, in a fresh local interpreter (``--jobs N``) or on a Dask cluster's worker
(``--scheduler``), one code path: the task `collect` hands over (`collect.read_share`) reads each
process of its share from the start, or from where its cached read stopped (`model.cache`), and
sends back each process's read (`collect.ProcessRead`, pickled: the per-phase durations, per-rank
step and phase times, step-closing spans so far, what the cache keeps: a few MB at 1,000 ranks); the
parent caches them, finishes each process and merges them (`_Collector.merge`) in process order,
exactly as the reads of one process merge, so the figures are those of a single pass.
"""

from __future__ import annotations

from collections.abc import Callable

from otel_titan.analysis.model.cache import ReadPlan
from otel_titan.analysis.read.records import ProcessLog
from otel_titan.analysis.workers import balance, for_cluster, open_workers, run_shares
from otel_titan.analysis.workers import default_jobs as _shared_default_jobs

__all__ = ["ShareTask", "default_jobs", "read_in_workers", "task_name"]

#: A worker's task: ``task(processes, plans, log_skipped, on_bytes)``, each process's read, pickled,
#: in order. Given by the caller (`collect.read_share`): this module, which `collect` imports,
#: cannot import `collect`.
ShareTask = Callable[[list[ProcessLog], list[ReadPlan], bool, Callable[[int], None]], list[bytes]]


def default_jobs(total_bytes: int, processes: int) -> int:
    """As the export: one worker per CPU (at most 8) for runs of 64 MB or more with several
    processes, else 1.

    Example:
        >>> default_jobs(1 << 20, 16)
        1
    """
    return _shared_default_jobs(total_bytes, processes)


def task_name(task: Callable[..., object]) -> str:
    """``"module:function"``, the name a worker imports `task` by; ValueError for a function a
    worker cannot import (a lambda, a local one).

    Example:
        >>> task_name(default_jobs)
        'otel_titan.analysis.model.parallel:default_jobs'
    """
    module, qualname = getattr(task, "__module__", None), getattr(task, "__qualname__", "")
    if not module or not qualname or "<" in qualname or "." in qualname:
        raise ValueError(
            f"a worker's task must be a module-level function, importable by name: {task!r}"
        )
    return f"{module}:{qualname}"


def read_in_workers(
    task: ShareTask,
    processes: list[ProcessLog],
    plans: list[ReadPlan],
    jobs: int,
    on_bytes: Callable[[int], None],
    log_skipped: bool = True,
    scheduler: str | None = None,
) -> list[bytes]:
    """Each process read as its `ReadPlan` says, by `task`, in `jobs` local workers or on the Dask
    cluster at `scheduler`: the pickled reads, in the order of `processes`.

    Shares are cut by the bytes left to read (a resumed read costs only what
    was appended). Raises `WorkerDiedError` (a RuntimeError) when a worker
    fails (its error is logged first).

    Example (not run here: it starts worker interpreters; `summarize_run(..., jobs=2)` is the call
    to make, and tests/analysis/workers/test_executors.py runs it):
        >>> blobs = read_in_workers(read_share, run.processes, plans, 2, print)  # doctest: +SKIP
    """
    with open_workers(jobs, scheduler, "summary worker", on_bytes) as workers:
        buckets = balance(plans, min(workers.slots, len(plans)), lambda plan: plan.bytes_to_read)
        # A cluster's workers run in directories of their own: they are sent absolute paths (the
        # reads come back rebound to the paths as given: `collect.ProcessRead.rebind`).
        sent = [for_cluster(p) for p in processes] if workers.cluster else processes
        shares = [
            ([sent[i] for i in bucket], [plans[i] for i in bucket], log_skipped)
            for bucket in buckets
        ]
        results = run_shares(workers, task_name(task), shares, on_bytes)
    blobs: list[bytes] = [b""] * len(processes)
    for bucket, result in zip(buckets, results, strict=True):
        for position, blob in zip(bucket, result, strict=True):
            blobs[position] = blob
    return blobs
