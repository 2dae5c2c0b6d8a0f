"""Several runs in one folder: group a folder's processes into runs and pick the one to analyse.

Runs reuse output folders (a re-launch with the same ``output_dir``, a sweep),
so a ``structured_logs/`` folder can hold the files of several runs. Their
records must never be mixed: run B's step 5 is not run A's step 5, and a slow
rank of run A must not vanish behind run B's times. `select_run` keeps one run:
the latest by default, or the one asked for.

Rules:

* a process whose first record names its run (``run_id``: given by the user,
  the launcher or a parent process, see docs/schema.md) belongs to that run;
  two run ids are two runs, even when they ran at the same time;
* processes that name no run (``run_id`` null: started by hand, with no
  launcher, and no otel-titan parent; torchtitan's files) are grouped: first
  by process tree (``process_run_id``, which an otel-titan parent shares with
  the processes it starts), then by time, every group whose time span (first
  to last record) overlaps another's in one run. A gap splits them: two jobs
  that merely follow each other in one folder are two runs, never chained.
  Such a group that overlaps a named run belongs to it (a reward server
  started by hand beside a torchrun job): to the one that had most recently
  started when the group began, else the first to start after;
* a process whose files hold no record at all (an empty file of a rank that
  hung before its first record) belongs to the run that had most recently
  started when that process began (its file's modification time);
* a run's start is the earliest first record of its processes; the *latest*
  run is the one that started last. A run with no run id is known by the
  process run id of its earliest process tree (``--run`` takes any of its
  trees' ids), or, for files that say neither, is ``None`` (several such:
  ``no-run-id@<start, UTC>``).

Restart attempts of one run id stay in that run (the summary keeps them apart
per attempt).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from otel_titan.analysis.read.lines import loads_line
from otel_titan.analysis.read.records import (
    NoRecordsError,
    ProcessLog,
    RunLogs,
    _first_record,
    read_run,
)
from otel_titan.schema import Field

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
    #: False when no process named the run: its processes were grouped by process tree and time
    #: (module docstring).
    named: bool = True
    #: The last record's time of its processes (µs), where it was needed to group processes by time.
    end_us: int | None = None
    #: For a run with no run id: the process run ids of the process trees grouped in it (each
    #: selects it with ``--run``).
    process_run_ids: list[str] = dataclasses.field(default_factory=list)


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
        chosen = next((r for r in self.runs if r.selected), None)
        if chosen is not None and not chosen.named:
            name += (
                f" (no run id was given: {chosen.processes} processes grouped by the time they ran)"
            )
        if self.how == "only":
            return f"run {name}"
        others = ", ".join(_name(r.run_id) for r in self.runs if not r.selected)
        what = "the latest" if self.how == "latest" else "chosen with --run, one"
        return f"run {name}: {what} of {len(self.runs)} runs in this folder (others: {others}; pick one with --run RUN_ID)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``run``, ``run_selection``, ``runs``)."""
        return {
            "run": self.run_id,
            "run_selection": self.how,
            "runs": [dataclasses.asdict(r) for r in self.runs],
        }


def _name(run_id: str | None) -> str:
    return run_id if run_id is not None else "(no run id)"


def select_run(run: RunLogs, run_id: str | None = None) -> tuple[RunLogs, RunChoice]:
    """Keep one run's processes: `run_id`'s, or the latest run's when `run_id` is None.

    Raises `UnknownRunError` (a `NoRecordsError`) when `run_id` names no run
    here; its message lists the runs found.

    Example (with several runs in the folder: ``'run B: the latest of 2 runs in this folder (others:
    A; …)'``):
        >>> run, choice = select_run(read_run("outputs"))
        >>> choice.describe(), len(run.processes)
        ('run doc-run', 2)
    """
    named: dict[str, list[ProcessLog]] = {}
    unnamed: list[ProcessLog] = []
    for process in run.processes:
        if process.run_id is None:
            unnamed.append(process)
        else:
            named.setdefault(process.run_id, []).append(process)
    trees = {p.process_run_id for p in unnamed}
    if (not unnamed and len(named) <= 1) or (
        not named and (len(unnamed) == 1 or (len(trees) == 1 and None not in trees))
    ):
        # One run (one run id, or one process tree with none): nothing to order, nothing more to
        # read.
        key = next(iter(named), None) if named else next(iter(trees))
        infos = [_info(key, list(run.processes), None, None, bool(named), sorted(trees - {None}))]  # type: ignore[arg-type]  # None taken out of the set
        return _choose(run, {key: list(run.processes)}, infos, key, run_id, "only")
    groups, infos = _group(named, unnamed)
    if len(infos) == 1:
        return _choose(run, groups, infos, infos[0].run_id, run_id, "only")
    if run_id is None:
        return _choose(run, groups, infos, infos[-1].run_id, None, "latest")
    return _choose(run, groups, infos, None, run_id, "requested")


def _group(
    named: dict[str, list[ProcessLog]], unnamed: list[ProcessLog]
) -> tuple[dict[str | None, list[ProcessLog]], list[RunInfo]]:
    """The runs (processes of each, and its `RunInfo`, oldest first), by the rules of the module
    docstring."""
    spans = _record_spans(named, unnamed)
    named_runs = _named_runs(named, spans)
    units, silent = _tree_units(unnamed, spans)
    runs = named_runs + _cluster_runs(_time_clusters(units), named_runs)
    runs.sort(key=lambda r: (r["start"], r["key"] is None, r["key"] or ""))
    # not one record in the folder (every file empty): one run, nothing to tell them apart by
    if not runs:
        start = min(_start_us(p) for p in silent)
        runs.append(
            {
                "key": None,
                "processes": [],
                "start": start,
                "end": start,
                "named": False,
                "trees": [],
            }
        )
    _place_silent(silent, runs)
    groups = {r["key"]: r["processes"] for r in runs}
    infos = [
        _info(r["key"], r["processes"], r["start"], r["end"], r["named"], sorted(set(r["trees"])))
        for r in runs
    ]
    return groups, infos


def _record_spans(
    named: dict[str, list[ProcessLog]], unnamed: list[ProcessLog]
) -> dict[int, tuple[int, int] | None]:
    """(first, last) record time of each process, by `id`: None for a named process when no process
    is unnamed."""
    # (first, last) record time of each process: the last costs a read at the end of each file, so
    # only where processes with no run id are to be grouped by time (named runs alone are ordered by
    # start).
    if unnamed:
        return {id(p): _span_us(p) for p in (*[p for ps in named.values() for p in ps], *unnamed)}
    return {id(p): None for ps in named.values() for p in ps}


def _named_runs(
    named: dict[str, list[ProcessLog]], spans: dict[int, tuple[int, int] | None]
) -> list[dict[str, Any]]:
    """One run per run id, in the order first seen."""
    # Named runs: fixed, never merged; their span is their processes'.
    runs: list[dict[str, Any]] = []
    for run_key, processes in named.items():
        timed = [spans[id(p)] for p in processes if spans[id(p)] is not None]
        start = min((t[0] for t in timed), default=min(_start_us(p) for p in processes))  # type: ignore[index]  # the None ones filtered out above
        runs.append(
            {
                "key": run_key,
                "processes": list(processes),
                "start": start,
                "end": max((t[1] for t in timed), default=start),  # type: ignore[index]  # the None ones filtered out above
                "named": True,
                "trees": [],
            }
        )
    return runs


def _tree_units(
    unnamed: list[ProcessLog], spans: dict[int, tuple[int, int] | None]
) -> tuple[dict[Any, dict[str, Any]], list[ProcessLog]]:
    """The processes with no run id as units to cluster, and those with no record at all (placed
    later by file time)."""
    # Processes with no run id: one unit per process tree (or per process when it says none), then
    # clusters by time.
    units: dict[Any, dict[str, Any]] = {}
    silent: list[ProcessLog] = []  # no record at all: placed by their file's time (`_place_silent`)
    for process in unnamed:
        span = spans[id(process)]
        if span is None:
            silent.append(process)
            continue
        unit_key = process.process_run_id if process.process_run_id is not None else id(process)
        unit = units.get(unit_key)
        if unit is None:
            unit = units[unit_key] = {
                "processes": [],
                "start": span[0],
                "end": span[1],
                "trees": [process.process_run_id] if process.process_run_id else [],
            }
        unit["processes"].append(process)
        unit["start"], unit["end"] = min(unit["start"], span[0]), max(unit["end"], span[1])
    return units, silent


def _time_clusters(units: dict[Any, dict[str, Any]]) -> list[dict[str, Any]]:
    """Units whose time spans overlap, chained into one cluster each, in the order they start."""
    clusters: list[dict[str, Any]] = []
    for unit in sorted(units.values(), key=lambda u: (u["start"], u["end"])):
        if clusters and unit["start"] <= clusters[-1]["end"]:  # overlaps: one run; any gap splits
            last = clusters[-1]
            last["processes"] += unit["processes"]
            last["trees"] += unit["trees"]
            last["end"] = max(last["end"], unit["end"])
        else:
            clusters.append(
                {
                    "processes": list(unit["processes"]),
                    "start": unit["start"],
                    "end": unit["end"],
                    "trees": list(unit["trees"]),
                }
            )
    return clusters


def _cluster_runs(
    clusters: list[dict[str, Any]], named_runs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The runs the clusters make: a cluster that overlaps a named run joins it (in place), any
    other is a run of its own."""
    anonymous = [c for c in clusters if not _overlapping(c, named_runs) and not c["trees"]]
    runs: list[dict[str, Any]] = []
    for cluster in clusters:
        overlapping = _overlapping(cluster, named_runs)
        if overlapping:
            host = _host(cluster, overlapping)
            host["processes"] += cluster["processes"]
            host["trees"] += cluster["trees"]
            continue
        runs.append(
            {
                "key": _cluster_key(cluster, anonymous),
                "processes": cluster["processes"],
                "start": cluster["start"],
                "end": cluster["end"],
                "named": False,
                "trees": cluster["trees"],
            }
        )
    return runs


def _host(cluster: dict[str, Any], overlapping: list[dict[str, Any]]) -> dict[str, Any]:
    """The named run a cluster joins: the one most recently started when it began, else the first to
    start after."""
    begun = [r for r in overlapping if r["start"] <= cluster["start"]]
    return (
        max(begun, key=lambda r: r["start"])
        if begun
        else min(overlapping, key=lambda r: r["start"])
    )


def _cluster_key(cluster: dict[str, Any], anonymous: list[dict[str, Any]]) -> str | None:
    """A run of its own's name: its earliest tree's id, else None when it is the only such run, else
    its start time."""
    if cluster["trees"]:
        return cluster["trees"][0]  # the earliest tree's
    return None if len(anonymous) == 1 else f"no-run-id@{_utc(cluster['start'])}"


def _place_silent(silent: list[ProcessLog], runs: list[dict[str, Any]]) -> None:
    """Each process with no record joins the run most recently started when its file began (else the
    first run)."""
    for process in silent:
        began = _start_us(process)
        earlier = [r for r in runs if r["start"] <= began]
        (earlier[-1] if earlier else runs[0])["processes"].append(process)


def _overlapping(cluster: dict[str, Any], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if r["start"] <= cluster["end"] and cluster["start"] <= r["end"]]


def _utc(time_us: int) -> str:
    """A run's start or end as ISO-8601 UTC; past the calendar's year 9999 (a corrupt timestamp the
    reader keeps), its µs as they are."""
    try:
        return datetime.datetime.fromtimestamp(time_us / 1e6, datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"
        )
    except (ValueError, OverflowError, OSError):
        return f"{time_us} µs"


def _info(
    key: str | None,
    processes: list[ProcessLog],
    start_us: int | None,
    end_us: int | None,
    named: bool,
    trees: list[str],
) -> RunInfo:
    return RunInfo(
        run_id=key,
        processes=len(processes),
        sources=sorted({p.source for p in processes}),
        ranks=sorted({p.rank for p in processes if p.rank is not None}),
        attempts=sorted({p.attempt for p in processes if p.attempt is not None}),
        start_us=start_us,
        named=named,
        end_us=end_us,
        process_run_ids=trees,
    )


def find_run(
    path: str | os.PathLike[str],
    *,
    run_id: str | None = None,
    ranks: Iterable[int] | None = None,
    sources: Iterable[str] | None = None,
) -> RunChoice:
    """Which run `summarize_run` / `generate_gantt_trace` would take from `path` (reads one line per
    process).

    Example (one run here; with two, ``'run B: the latest of 2 runs in this folder (others: A;
    …)'``):
        >>> find_run("outputs").describe()
        'run doc-run'
    """
    return select_run(read_run(path, ranks=ranks, sources=sources, log_skipped=False), run_id)[1]


def _choose(
    run: RunLogs,
    groups: dict[str | None, list[ProcessLog]],
    infos: list[RunInfo],
    key: str | None,
    requested: str | None,
    how: str,
) -> tuple[RunLogs, RunChoice]:
    if requested is not None:
        match = next((i for i in infos if i.run_id == requested), None) or next(
            (i for i in infos if requested in i.process_run_ids), None
        )
        if match is None:
            found = ", ".join(
                f"{_name(i.run_id)} ({i.processes} processes)"
                if len(infos) > 1
                else _name(i.run_id)
                for i in infos
            )
            raise UnknownRunError(f"{run.log_dir}: no run {requested!r} here; runs found: {found}")
        key = match.run_id
    for info in infos:
        info.selected = info.run_id == key
    chosen = set(map(id, groups[key]))
    kept = [p for p in run.processes if id(p) in chosen]  # in the reader's order
    return dataclasses.replace(run, processes=kept), RunChoice(run_id=key, how=how, runs=infos)


def _span_us(process: ProcessLog) -> tuple[int, int] | None:
    """(first, last) record time of the process (µs); None when its files hold no record."""
    first = _first_record(process.segments).get(Field.TIME_US)
    if type(first) is not int:
        return None
    last = _last_time_us(process)
    if last is None:
        last = process.modified_us if process.modified_us is not None else first
    return first, max(first, last)


def _last_time_us(process: ProcessLog, limit: int = 64 << 10) -> int | None:
    """The newest record's ``time_us``: from the end of the newest segment that holds one.

    Reads the last 4 kB of a file (a record, almost always: a thousand files cost a few MB), the
    last `limit` bytes when no whole record ends in those (a long stall record, a torn last line).
    """
    for path in reversed(process.segments):
        for size in (4096, limit):
            try:
                with open(path, "rb") as handle:
                    end = handle.seek(0, os.SEEK_END)
                    handle.seek(max(0, end - size))
                    tail = handle.read(size)
            except OSError:
                break
            for raw in reversed(tail.split(b"\n")):
                record = loads_line(raw)
                if type(record) is dict and type(record.get(Field.TIME_US)) is int:
                    return record[Field.TIME_US]
            if end <= size:
                break  # the whole file was read: no record in it
    return None


def _start_us(process: ProcessLog) -> int:
    """When the process began: its first record's time, else its oldest file's modification time
    (µs)."""
    time_us = _first_record(process.segments).get(Field.TIME_US)
    if type(time_us) is int:
        return time_us
    for path in process.segments:
        try:
            return int(os.stat(path).st_mtime * 1e6)
        except OSError:
            continue
    return 0
