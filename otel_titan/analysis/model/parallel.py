"""Summary on several cores: processes are split between worker interpreters, their accumulators merged.

Why: at 1,000 ranks and gigabytes the summary is bound by parsing and pairing
records, which is independent per process, as in the export
(`export.parallel`). Each share is one task of `workers.run_shares`, in a
fresh local interpreter (``--jobs N``) or on a Dask cluster's worker
(``--scheduler``), one code path: `share.collect_share` runs
`collect.collect_processes` on its share and returns its process summaries
and run-wide accumulators (per-phase durations, per-rank step and phase
times, step-closing spans: a few MB at 1,000 ranks); the parent merges them
(`_Collector.merge`) and computes the figures exactly as a single pass
would. Process order is kept.

`read_in_workers` is the same with the analysis cache (`model.cache`): each
worker reads its processes from where their cached reads stopped (or from
the start) and sends back each process's read (`collect.ProcessRead`,
pickled: what the cache keeps); the parent finishes and merges them.
"""

from __future__ import annotations

from typing import Any, Callable

from otel_titan.analysis.workers import balance, merge_skipped, open_workers, run_shares
from otel_titan.analysis.workers import default_jobs as _shared_default_jobs
from otel_titan.analysis.read.records import ProcessLog
from otel_titan.analysis.model.cache import ReadPlan
from otel_titan.analysis.read.lines import SkippedLines

__all__ = ["default_jobs", "collect_in_workers", "read_in_workers"]

def default_jobs(total_bytes: int, processes: int) -> int:
    """As the export: one worker per CPU (at most 8) for runs of 64 MB or more with several processes, else 1.

    Example:
        >>> default_jobs(1 << 20, 16)
        1
    """
    return _shared_default_jobs(total_bytes, processes)


def collect_in_workers(
    collector: Any, processes: list[ProcessLog], jobs: int, skipped: SkippedLines, on_bytes: Callable[[int], None], log_skipped: bool = True, scheduler: str | None = None
) -> tuple[Any, list[Any]]:
    """(`collector` with the workers' accumulators merged in, process summaries in the order of `processes`), computed in `jobs` local workers or on the Dask cluster at `scheduler`.

    `collector` is a fresh `collect._Collector`, passed in so that this module
    sits below `collect` (which calls it) and `share` (which each worker runs).

    Raises RuntimeError when a worker fails (its error is logged first).

    Example:
        >>> # collector, summaries = collect_in_workers(_Collector(), run.processes, 2, run.skipped, print)
    """
    with open_workers(jobs, scheduler, "summary worker", on_bytes) as workers:
        buckets = balance(processes, min(workers.slots, len(processes)), lambda p: p.size)
        shares = [([processes[i] for i in bucket], log_skipped) for bucket in buckets]
        results = run_shares(workers, "otel_titan.analysis.model.share:collect_share", shares, on_bytes)
    summaries: list[Any] = [None] * len(processes)
    for bucket, result in zip(buckets, results, strict=True):
        collector.merge(result["state"])
        for position, summary in zip(bucket, result["summaries"], strict=True):
            summaries[position] = summary
        merge_skipped(skipped, result)
    return collector, summaries


def read_in_workers(processes: list[ProcessLog], plans: list[ReadPlan], jobs: int, on_bytes: Callable[[int], None], log_skipped: bool = True, scheduler: str | None = None) -> list[bytes]:
    """Each process read as its `ReadPlan` says, in `jobs` local workers or on the Dask cluster at `scheduler`: the pickled reads, in the order of `processes`.

    Shares are cut by the bytes left to read (a resumed read costs only what
    was appended). Raises RuntimeError when a worker fails (its error is logged first).
    """
    with open_workers(jobs, scheduler, "summary worker", on_bytes) as workers:
        buckets = balance(plans, min(workers.slots, len(plans)), lambda plan: plan.bytes_to_read)
        shares = [([processes[i] for i in bucket], [plans[i] for i in bucket], log_skipped) for bucket in buckets]
        results = run_shares(workers, "otel_titan.analysis.model.share:read_share", shares, on_bytes)
    blobs: list[bytes] = [b""] * len(processes)
    for bucket, result in zip(buckets, results, strict=True):
        for position, blob in zip(bucket, result, strict=True):
            blobs[position] = blob
    return blobs
