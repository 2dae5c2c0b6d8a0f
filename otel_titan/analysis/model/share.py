"""One share of `parallel`: summarize some of a run's processes, in a worker interpreter or on a Dask worker.

`collect_share` is a task of `workers.run_shares` (named by string, so
`parallel` need not import it): it runs `collect.collect_processes`
on its share and returns its process summaries and run-wide accumulators
(`_Collector.state`), which the parent merges. `read_share` (what
`summarize` runs) reads each process as its `model.cache.ReadPlan` says and
returns each one's read, pickled, for the parent to cache, finish and merge. A module of its own, above
`collect`, so that `collect` can import `parallel` (the dispatcher)
and no module has to import its own caller.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable

from otel_titan.analysis.workers import skipped_result
from otel_titan.analysis.read.records import ProcessLog
from otel_titan.analysis.read.lines import SkippedLines
from otel_titan.analysis.model.cache import ReadPlan
from otel_titan.analysis.model.collect import _Collector, collect_processes, read_process

__all__ = ["collect_share", "read_share"]


def collect_share(processes: list[ProcessLog], log_skipped: bool, on_bytes: Callable[[int], None]) -> dict[str, Any]:
    """Summarize `processes`: their summaries, the accumulators and the lines skipped, for `parallel` to merge."""
    skipped = SkippedLines(log=log_skipped)
    collector = _Collector()
    summaries = collect_processes(processes, collector, skipped, on_bytes)
    return {"state": collector.state(), "summaries": summaries, **skipped_result(skipped)}


def read_share(processes: list[ProcessLog], plans: list[ReadPlan], log_skipped: bool, on_bytes: Callable[[int], None]) -> list[bytes]:
    """Read each of `processes` as its plan says (`collect.read_process`): their reads, pickled (what the cache keeps and the parent finishes)."""
    return [pickle.dumps(read_process(process, plan, log_skipped, on_bytes), protocol=pickle.HIGHEST_PROTOCOL) for process, plan in zip(processes, plans, strict=True)]
