"""One share of `parallel`: read some of a run's processes, in a worker interpreter or on a Dask worker.

`read_share` is a task of `workers.run_shares` (named by string, so
`parallel` need not import it): it reads each process of its share as its
`model.cache.ReadPlan` says (from the start, or from where its cached read
stopped: `collect.read_process`) and returns each one's read, pickled, for
the parent to cache, finish and merge. A module of its own, above `collect`,
so that `collect` can import `parallel` (the dispatcher) and no module has to
import its own caller.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

from otel_titan.analysis.model.cache import ReadPlan
from otel_titan.analysis.model.collect import read_process
from otel_titan.analysis.read.records import ProcessLog

__all__ = ["read_share"]


def read_share(processes: list[ProcessLog], plans: list[ReadPlan], log_skipped: bool, on_bytes: Callable[[int], None]) -> list[bytes]:
    """Read each of `processes` as its plan says (`collect.read_process`): their reads, pickled (what the cache keeps and the parent finishes)."""
    return [pickle.dumps(read_process(process, plan, log_skipped, on_bytes), protocol=pickle.HIGHEST_PROTOCOL) for process, plan in zip(processes, plans, strict=True)]
