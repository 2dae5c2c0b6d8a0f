"""`RunSelection`: which run, which of its processes, and how to read them, as one value.

Every question asked of a run (``summarize``, ``export``, ``report``, ``sql``,
`RunAnalysis`) reads it the same way: the folder, the run in it (``--run``),
the ranks and sources kept (``--ranks``, ``--sources``), whether the hosts'
clocks are aligned (``--no-align``), where the per-file work runs (``--jobs``,
``--scheduler``) and whether the analysis cache is used (``--no-cache``). They
were once threaded through each command's signature one by one, so a new read
option touched ten places; now the CLI builds one `RunSelection` from its
options, `RunAnalysis` keeps it, and each layer below takes it whole.

Example:
    >>> selection = RunSelection.of("outputs", ranks=[1, 0, 1])
    >>> selection.ranks, selection.sources, selection.align
    ((0, 1), None, True)
    >>> logs, choice = selection.read()
    >>> [p.rank for p in logs.processes], choice.describe()
    ([0, 1], 'run doc-run')
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from otel_titan.analysis.read.records import RunLogs, read_run
from otel_titan.analysis.read.runs import RunChoice, select_run

__all__ = ["RunSelection"]


@dataclass(frozen=True)
class RunSelection:
    """What to read of a run folder and how: the options every reading command shares.

    `path`: the run directory, its ``structured_logs/``, or one ``.jsonl``
    file. `run_id`: the run when the folder holds several (None: the latest,
    `read.runs.select_run`). `ranks`, `sources`: keep only these (None: all;
    kept sorted and without repeats). `align`: shift each host's clock by its
    offset (`model.clocks`). `jobs`: worker processes for the per-file work
    (None: the command's default), `scheduler`: a Dask scheduler's address
    whose workers do it instead (`workers.executors`). `cache`: use and keep
    the analysis cache (`model.cache`). `log_skipped`: warn about unreadable
    lines as they are met.

    Build it with `of`, which checks and normalizes; `with_` changes a field.
    """

    path: str
    run_id: str | None = None
    ranks: tuple[int, ...] | None = None
    sources: tuple[str, ...] | None = None
    align: bool = True
    jobs: int | None = None
    scheduler: str | None = None
    cache: bool = True
    log_skipped: bool = True

    @classmethod
    def of(
        cls,
        path: str | os.PathLike[str],
        *,
        run_id: str | None = None,
        ranks: Iterable[int] | None = None,
        sources: Iterable[str] | None = None,
        align: bool = True,
        jobs: int | None = None,
        scheduler: str | None = None,
        cache: bool = True,
        log_skipped: bool = True,
    ) -> RunSelection:
        """A selection with its filters sorted and deduplicated; raises ValueError naming the
        option that is wrong (``jobs`` under 1, an empty ``sources``)."""
        if jobs is not None and jobs < 1:
            raise ValueError(f"jobs: must be at least 1, got {jobs}")
        kept_sources = None if sources is None else tuple(sorted(set(sources)))
        if kept_sources is not None and not kept_sources:
            raise ValueError("sources: no source names given (None keeps every source)")
        return cls(
            path=os.fspath(path),
            run_id=run_id,
            ranks=None if ranks is None else tuple(sorted(set(ranks))),
            sources=kept_sources,
            align=align,
            jobs=jobs,
            scheduler=scheduler or None,
            cache=cache,
            log_skipped=log_skipped,
        )

    def with_(self, **changes: Any) -> RunSelection:
        """The same selection with `changes` (field names as in the constructor), checked as
        `of` checks."""
        fields: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields.update(changes)
        path = fields.pop("path")
        return RunSelection.of(path, **fields)

    def read(self, *, log_skipped: bool | None = None) -> tuple[RunLogs, RunChoice]:
        """The selected run's files (one line read per process) and how the run was chosen.

        `log_skipped` overrides the selection's for this read (the step table
        and the database read quietly: the model's read warns once).
        """
        logs = read_run(
            self.path,
            ranks=self.ranks,
            sources=self.sources,
            log_skipped=self.log_skipped if log_skipped is None else log_skipped,
        )
        return select_run(logs, self.run_id)
