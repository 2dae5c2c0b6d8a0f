"""Summary on several cores: processes are split between worker interpreters, their accumulators merged.

Why: at 1,000 ranks and gigabytes the summary is bound by parsing and pairing
records, which is independent per process, as in the export
(`export_parallel`, whose process model this follows, by `worker_io`: fresh
interpreters, never forks of a possibly threaded caller; progress and
warnings as lines on stdout, the warnings logged here, on the one path). Each worker runs `summary.collect_processes`
on its share and pickles its process summaries and run-wide accumulators
(per-phase durations, per-rank step and phase times, step-closing spans: a
few MB at 1,000 ranks) into a file of a private temporary folder; the parent
merges them (`_Collector.merge`) and computes the figures exactly as a
single pass would. Process order is kept.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import tempfile
from dataclasses import asdict
from typing import Any, Callable

from otel_titan.analysis.export_parallel import default_jobs as export_jobs
from otel_titan.analysis.reader import ProcessLog
from otel_titan.analysis.record_lines import SkippedLines
from otel_titan.analysis.worker_io import read_workers, start_process

__all__ = ["default_jobs", "collect_in_workers"]

PROGRESS_BYTES = 8 << 20


def default_jobs(total_bytes: int, processes: int) -> int:
    """As the export: one worker per CPU (at most 8) for runs of 64 MB or more with several processes, else 1.

    Example:
        >>> default_jobs(1 << 20, 16)
        1
    """
    return export_jobs(total_bytes, processes)


def _balance(processes: list[ProcessLog], jobs: int) -> list[list[int]]:
    """Indices of `processes`, largest first onto the least-loaded worker (by bytes)."""
    buckets: list[list[int]] = [[] for _ in range(jobs)]
    loads = [0] * jobs
    for index in sorted(range(len(processes)), key=lambda i: -processes[i].size):
        target = loads.index(min(loads))
        buckets[target].append(index)
        loads[target] += processes[index].size
    return [sorted(bucket) for bucket in buckets if bucket]


def collect_in_workers(collector: Any, processes: list[ProcessLog], jobs: int, skipped: SkippedLines, on_bytes: Callable[[int], None], log_skipped: bool = True) -> tuple[Any, list[Any]]:
    """(`collector` with the workers' accumulators merged in, process summaries in the order of `processes`), computed in `jobs` workers.

    `collector` is a fresh `summary._Collector`, passed in so that this module
    sits below `summary` (which calls it) and `summary_worker` (which each worker runs).

    Raises RuntimeError when a worker fails (its error is on stderr).

    Example:
        >>> # collector, summaries = collect_in_workers(_Collector(), run.processes, 2, run.skipped, print)
    """
    buckets = _balance(processes, jobs)
    with tempfile.TemporaryDirectory(prefix="otel-titan-summary-") as work_dir:
        workers: list[subprocess.Popen[bytes]] = []
        try:
            for index, bucket in enumerate(buckets):
                spec = {"result": os.path.join(work_dir, f"part-{index}"), "log_skipped": log_skipped, "processes": [asdict(processes[i]) for i in bucket]}
                workers.append(start_process("otel_titan.analysis.summary_worker", "worker_main", spec))
            read_workers(workers, on_bytes, "summary worker")
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        summaries: list[Any] = [None] * len(processes)
        for index, bucket in enumerate(buckets):
            with open(os.path.join(work_dir, f"part-{index}"), "rb") as handle:
                result = pickle.load(handle)  # written just now by our own worker, in our private folder
            collector.merge(result["state"])
            for position, summary in zip(bucket, result["summaries"], strict=True):
                summaries[position] = summary
            skipped.count += result["skipped"]
            skipped.repaired += result["repaired"]
            skipped.by_file.update(result["skipped_by_file"])
            skipped.repaired_by_file.update(result["repaired_by_file"])
            skipped.examples.extend(result["skipped_examples"][: max(0, 100 - len(skipped.examples))])
        return collector, summaries
