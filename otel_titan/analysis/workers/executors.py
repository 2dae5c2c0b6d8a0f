"""Where a command's per-file work runs: worker interpreters here (``--jobs N``) or a Dask cluster
(``--scheduler ADDRESS``).

Why one module: the export, the summary and `sql`'s load split their work
into shares of files that are independent of each other, and how a share is
run must not change what it computes. So there is one code path, `run_shares`,
over a `concurrent.futures.Executor`, and two executors:

* `workers.interpreters.InterpreterPool`: fresh interpreters on this machine, live
  progress (``--jobs N``);
* Dask's own ``distributed.Client(ADDRESS).get_executor()``: the workers of a
  Dask cluster (a ``dask scheduler`` and ``dask worker``s, or dask-jobqueue's
  SLURMCluster beside a training job: docs/analysis.md). No cluster code of
  ours: Dask schedules, moves the arguments and results, and retries a task
  whose worker died.

Each task is `workers.interpreters.run_task`: its warnings come back with its result
and are logged here, on the one path of every warning (escaped), and so is
its count of bytes read (a cluster's progress moves share by share). Dask
is optional (the ``cluster`` extra) and imported only when a
scheduler is named.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Executor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from otel_titan.analysis.workers.interpreters import LOGGER, InterpreterPool, run_task
from otel_titan.distribution import install_hint

__all__ = [
    "Workers",
    "ClusterError",
    "MissingClusterError",
    "CLUSTER_HINT",
    "open_workers",
    "run_shares",
]

CLUSTER_HINT = install_hint("cluster")
#: Seconds to reach the scheduler before giving up with `ClusterError`.
CONNECT_TIMEOUT_S = 30


class MissingClusterError(ImportError):
    """``--scheduler`` was given but Dask's distributed scheduler client is not installed (the
    message says how to install it)."""


class ClusterError(RuntimeError):
    """The Dask scheduler cannot be reached, or has no worker."""


@dataclass
class Workers:
    """An executor and how many tasks it runs at once (`slots`): the number of shares to cut the
    work into."""

    executor: Executor
    slots: int
    where: str
    what: str = "worker"
    cluster: bool = False


@contextmanager
def open_workers(
    jobs: int, scheduler: str | None, what: str, on_bytes: Callable[[int], None]
) -> Iterator[Workers]:
    """`Workers` for one command: `jobs` local interpreters, or the Dask cluster at `scheduler`
    (``tcp://host:8786``).

    On the way out the local workers still running are killed and the Dask
    client is closed (the cluster stays: it is the user's). Raises
    `MissingClusterError` without Dask, `ClusterError` when the scheduler
    cannot be reached or has no worker.

    Example (not run here: it starts two worker interpreters;
    tests/analysis/workers/test_executors.py runs them):
        >>> with open_workers(2, None, "summary worker", print) as workers:  # doctest: +SKIP
        ...     results = run_shares(workers, "otel_titan.analysis.model.collect:read_share", shares, print)
    """
    if scheduler is None:
        pool = InterpreterPool(jobs, what, on_bytes)
        try:
            yield Workers(pool, jobs, f"{jobs} local workers", what)
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
        pool.shutdown()
        return
    client = _connect(scheduler)
    try:
        slots = sum(client.nthreads().values())
        if slots == 0:
            raise ClusterError(
                f"the Dask scheduler at {scheduler} has no worker (start some: dask worker "
                f"{scheduler})"
            )
        yield Workers(
            client.get_executor(pure=False),
            slots,
            f"the Dask cluster at {scheduler}",
            what,
            cluster=True,
        )
    finally:
        client.close()


def _connect(scheduler: str) -> Any:
    try:
        from distributed import Client  # optional, only with --scheduler
    except ImportError as error:
        raise MissingClusterError(
            "--scheduler needs Dask's distributed scheduler, which is not installed: "
            f"{CLUSTER_HINT}"
        ) from error
    try:
        return Client(scheduler, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as error:
        raise ClusterError(f"cannot reach the Dask scheduler at {scheduler}: {error}") from error


def run_shares(
    workers: Workers, function: str, shares: list[tuple[Any, ...]], on_bytes: Callable[[int], None]
) -> list[Any]:
    """``function(*share, on_bytes)`` for every share on `workers`; the results in the order of
    `shares`.

    A share's warnings are logged here as it finishes, and the bytes it read
    that it could not report live. The first failure cancels what has not
    run and is raised (on a cluster as `ClusterError`, naming the cluster:
    most often its workers do not see the run at the same path).
    """
    logger = logging.getLogger(LOGGER)
    futures = [workers.executor.submit(run_task, function, *share) for share in shares]
    pending = set(futures)
    try:
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in done:
                if future.exception() is None:
                    _, warnings, total, live = future.result()
                    for warning in warnings:
                        logger.warning("%s", warning)
                    if total > live:
                        on_bytes(total - live)
            for future in done:
                error = future.exception()
                if error is not None and workers.cluster:
                    # A worker elsewhere: its error names its own view of the files, which may not
                    # be ours.
                    raise ClusterError(
                        f"a {workers.what} on {workers.where} failed: {type(error).__name__}: "
                        f"{error} "
                        "(the workers must see the run's files, and the export's output folder, "
                        "at the same paths)"
                    ) from error
                if error is not None:
                    raise error
    finally:
        for future in pending:
            future.cancel()
    return [future.result()[0] for future in futures]
