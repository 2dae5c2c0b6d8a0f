"""One share of `summary_parallel`: summarize some of a run's processes, in a worker interpreter or on a Dask worker.

`collect_share` is a task of `executors.run_shares` (named by string, so
`summary_parallel` need not import it): it runs `summary.collect_processes`
on its share and returns its process summaries and run-wide accumulators
(`_Collector.state`), which the parent merges. A module of its own, above
`summary`, so that `summary` can import `summary_parallel` (the dispatcher)
and no module has to import its own caller.
"""

from __future__ import annotations

from typing import Any, Callable

from otel_titan.analysis.export_parallel import skipped_result
from otel_titan.analysis.reader import ProcessLog
from otel_titan.analysis.record_lines import SkippedLines
from otel_titan.analysis.summary import _Collector, collect_processes

__all__ = ["collect_share"]


def collect_share(processes: list[ProcessLog], log_skipped: bool, on_bytes: Callable[[int], None]) -> dict[str, Any]:
    """Summarize `processes`: their summaries, the accumulators and the lines skipped, for `summary_parallel` to merge."""
    skipped = SkippedLines(log=log_skipped)
    collector = _Collector()
    summaries = collect_processes(processes, collector, skipped, on_bytes)
    return {"state": collector.state(), "summaries": summaries, **skipped_result(skipped)}
