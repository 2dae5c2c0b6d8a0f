"""Where a command's per-file work runs, one worker model for every command: `workers.executors`
(here with ``--jobs N``, or on a Dask cluster with ``--scheduler``), `interpreters` (the fresh
worker interpreters and the one path of a task's warnings and progress), `shares` (how the work is
cut and what a share sends back)."""

from otel_titan.analysis.workers.executors import (
    CLUSTER_HINT,
    ClusterError,
    MissingClusterError,
    Workers,
    open_workers,
    run_shares,
)
from otel_titan.analysis.workers.interpreters import (
    LOGGER,
    InterpreterPool,
    WorkerDiedError,
    run_task,
)
from otel_titan.analysis.workers.shares import (
    MAX_JOBS,
    PARALLEL_MIN_BYTES,
    balance,
    default_jobs,
    for_cluster,
    merge_skipped,
    skipped_result,
)

__all__ = [
    "CLUSTER_HINT",
    "ClusterError",
    "InterpreterPool",
    "LOGGER",
    "MAX_JOBS",
    "MissingClusterError",
    "PARALLEL_MIN_BYTES",
    "WorkerDiedError",
    "Workers",
    "balance",
    "default_jobs",
    "for_cluster",
    "merge_skipped",
    "open_workers",
    "run_shares",
    "run_task",
    "skipped_result",
]
