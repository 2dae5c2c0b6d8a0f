"""Several runs in one folder: group a folder's processes by run id and pick the one to analyse.

Runs reuse output folders (a re-launch with the same ``output_dir``, a sweep),
so a ``structured_logs/`` folder can hold the files of several runs. Their
records must never be mixed: run B's step 5 is not run A's step 5, and a slow
rank of run A must not vanish behind run B's times. `select_run` keeps one run:
the latest by default, or the one asked for.

Rules:

* a process belongs to the run its first record names (``run_id``);
* a process whose files do not say (torchtitan's files, an empty file of a rank
  that hung before its first record) belongs to the run that had most recently
  started when that process began (its first record, or its file's
  modification time when it has none); when no process names a run, the
  folder is one run;
* a run's start is the earliest first record of its processes; the *latest*
  run is the one that started last.

Restart attempts of one run id stay in that run (the summary keeps them apart
per attempt).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Iterable

from otel_titan.analysis.reader import NoRecordsError, ProcessLog, RunLogs, _first_record, read_run

__all__ = ["RunInfo", "RunChoice", "UnknownRunError", "select_run", "find_run"]


class UnknownRunError(NoRecordsError):
    """``--run RUN_ID`` names no run in the folder (the message lists the runs found)."""


@dataclass
class RunInfo:
    """One run found in the folder."""

    run_id: str | None
    processes: int
    sources: list[str]
    ranks: list[int]
    attempts: list[int]
    start_us: int | None
    selected: bool = False


@dataclass
class RunChoice:
    """Which run was analysed, how it was chosen, and every run the folder holds (oldest first).

    `how` is ``"only"`` (the folder holds one run), ``"latest"`` (the default
    among several) or ``"requested"`` (``run_id=`` / ``--run``).
    """

    run_id: str | None
    how: str
    runs: list[RunInfo]

    def describe(self) -> str:
        """One line for a terminal: which run, and how to pick another.

        Example:
            >>> a, b = RunInfo("A", 2, ["training"], [0, 1], [0], 1), RunInfo("B", 2, ["training"], [0, 1], [0], 2, True)
            >>> RunChoice("B", "latest", [a, b]).describe()
            'run B: the latest of 2 runs in this folder (others: A; pick one with --run RUN_ID)'
        """
        name = self.run_id if self.run_id is not None else "(no run id)"
        if self.how == "only":
            return f"run {name}"
        others = ", ".join(_name(r.run_id) for r in self.runs if not r.selected)
        what = "the latest" if self.how == "latest" else "chosen with --run, one"
        return f"run {name}: {what} of {len(self.runs)} runs in this folder (others: {others}; pick one with --run RUN_ID)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``run``, ``run_selection``, ``runs``)."""
        return {"run": self.run_id, "run_selection": self.how, "runs": [dataclasses.asdict(r) for r in self.runs]}


def _name(run_id: str | None) -> str:
    return run_id if run_id is not None else "(no run id)"


def select_run(run: RunLogs, run_id: str | None = None) -> tuple[RunLogs, RunChoice]:
    """Keep one run's processes: `run_id`'s, or the latest run's when `run_id` is None.

    Raises `UnknownRunError` (a `NoRecordsError`) when `run_id` names no run
    here; its message lists the runs found.

    Example:
        >>> # run, choice = select_run(read_run("outputs"))
        >>> # choice.describe()  → 'run 314b…: the latest of 2 runs in this folder (others: 8f14…; …)'
    """
    named: dict[str, list[ProcessLog]] = {}
    unnamed: list[ProcessLog] = []
    for process in run.processes:
        if process.run_id is None:
            unnamed.append(process)
        else:
            named.setdefault(process.run_id, []).append(process)
    if len(named) <= 1:
        # One run (files that do not say theirs belong to it): nothing to order, nothing more to read.
        key = next(iter(named), None)
        if run_id is not None and run_id != key:
            raise UnknownRunError(f"{run.log_dir}: no run {run_id!r} here; runs found: {_name(key)}")
        return _choose(run, {key: list(run.processes)}, {key: None}, key, "only")
    # Several runs (or files that do not say theirs): order the runs by start, place the unnamed files.
    process_start = {id(p): _start_us(p) for p in run.processes}
    groups = {key: list(processes) for key, processes in named.items()}
    starts = {key: min(process_start[id(p)] for p in processes) for key, processes in groups.items()}
    ordered = sorted(groups, key=lambda key: starts[key])  # type: ignore[arg-type,return-value]
    for process in unnamed:
        begun = [key for key in ordered if starts[key] <= process_start[id(process)]]  # type: ignore[operator]
        groups[begun[-1] if begun else ordered[0]].append(process)
    if run_id is None:
        return _choose(run, groups, starts, ordered[-1], "latest")
    if run_id not in groups:
        found = ", ".join(f"{key} ({len(groups[key])} processes)" for key in ordered)
        raise UnknownRunError(f"{run.log_dir}: no run {run_id!r} here; runs found: {found}")
    return _choose(run, groups, starts, run_id, "requested")


def find_run(path: str | os.PathLike[str], *, run_id: str | None = None, ranks: Iterable[int] | None = None, sources: Iterable[str] | None = None) -> RunChoice:
    """Which run `summarize_run` / `generate_gantt_trace` would take from `path` (reads one line per process).

    Example:
        >>> # find_run("outputs").describe()  → 'run B: the latest of 2 runs in this folder (others: A; …)'
    """
    return select_run(read_run(path, ranks=ranks, sources=sources, log_skipped=False), run_id)[1]


def _choose(run: RunLogs, groups: dict[str | None, list[ProcessLog]], starts: dict[str | None, int | None], key: str | None, how: str) -> tuple[RunLogs, RunChoice]:
    infos = []
    for name in sorted(groups, key=lambda k: (starts[k] is None, starts[k] or 0)):
        processes = groups[name]
        infos.append(
            RunInfo(
                run_id=name,
                processes=len(processes),
                sources=sorted({p.source for p in processes}),
                ranks=sorted({p.rank for p in processes if p.rank is not None}),
                attempts=sorted({p.attempt for p in processes if p.attempt is not None}),
                start_us=starts[name],
                selected=name == key,
            )
        )
    chosen = set(map(id, groups[key]))
    kept = [p for p in run.processes if id(p) in chosen]  # in the reader's order
    return dataclasses.replace(run, processes=kept), RunChoice(run_id=key, how=how, runs=infos)


def _start_us(process: ProcessLog) -> int:
    """When the process began: its first record's time, else its oldest file's modification time (µs)."""
    time_us = _first_record(process.segments).get("time_us")
    if type(time_us) is int:
        return time_us
    for path in process.segments:
        try:
            return int(os.stat(path).st_mtime * 1e6)
        except OSError:
            continue
    return 0
