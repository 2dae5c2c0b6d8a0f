"""Run directory → its processes, each an ordered stream of records: rotation-aware, streaming.

A *process log* is the chain of files one OS process wrote:
``X.jsonl.<backup_count>`` (oldest) … ``X.jsonl.1``, then ``X.jsonl`` (active).
`read_run` finds them (in a run directory, its ``structured_logs/`` folder,
or for one file) and reads one line of each to learn who wrote it; records
are then yielded line by line, one process at a time, in the order written
(see `read.lines` for what happens to unreadable lines). Files written by
torchtitan and pimm are read the same way.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from otel_titan.analysis.read.lines import SkippedLines, file_records, loads_line
from otel_titan.analysis.read.safe_text import escape_surrogates
from otel_titan.schema import META_EVENTS, Field

__all__ = [
    "NotARunError",
    "NoRecordsError",
    "ProcessLog",
    "RunLogs",
    "SkippedLines",
    "find_log_dir",
    "read_run",
    "read_mesh",
    "META_EVENTS",
]

_log = logging.getLogger("otel_titan.analysis")

#: The logger's own records (docs/schema.md): shown as process-level markers, never as phases.

#: torchtitan's naming rule: `{source}.global_rank_{rank}.{stamp}-{rand}.jsonl` (rotated segments
#: add `.N`).
_TITAN_NAME = re.compile(
    r"^(?P<source>.+)\.global_rank_(?P<rank>\d+)\.(?P<stamp>\d{8}-\d{6})-(?P<suffix>[A-Za-z0-9]+)\.jsonl$"
)
_SEGMENT = re.compile(r"^(?P<base>.+\.jsonl)(?:\.(?P<segment>\d+))?$")


class NotARunError(ValueError):
    """The path is not a run: it does not exist, or holds no structured-log files."""


class NoRecordsError(ValueError):
    """The run has log files but not one readable record (or none left after the filters)."""


@dataclass
class ProcessLog:
    """The files one process wrote, oldest segment first, and who wrote them.

    `source` and `rank` come from the file name (torchtitan's naming rule) or,
    for other names, from the first readable record. `attempt`, `pid`,
    `host_name`, `run_id`, `process_run_id` and `world_size` come from the first readable record
    (`run_id` None: the file names no run, see `read.runs`).
    `modified_us` is the newest segment's modification time (µs since the
    epoch): the process was alive when it last wrote, even if the record it
    wrote then is older (see `export.chrome_events.ExportVisitor`).

    Example:
        >>> p = ProcessLog(base="x/training.global_rank_3.20260101-000000-abcdef.jsonl", segments=[], source="training", rank=3)
        >>> p.label
        'training rank 3'
    """

    base: str
    segments: list[str]
    source: str
    rank: int | None
    stamp: str = ""
    size: int = 0
    attempt: int | None = None
    pid: int | None = None
    host_name: str | None = None
    run_id: str | None = None
    world_size: int | None = None
    modified_us: int | None = None
    #: Its coordinates in the job's mesh (``{"pp": 1, "dp": 3}``), from the
    #: ``structured_logger_opened`` record; None if none declared.
    mesh: dict[str, int] | None = None
    #: Subtracted from every record's ``time_us`` as it is read: its host's clock offset
    #: (`model.clocks`), 0 for none.
    clock_offset_us: int = 0
    #: With no `run_id`: the id of the process tree the file is from (docs/schema.md), if it says.
    process_run_id: str | None = None

    @property
    def label(self) -> str:
        """Human name: ``training rank 3`` (``training`` when the rank is unknown)."""
        return self.source if self.rank is None else f"{self.source} rank {self.rank}"

    @property
    def sort_key(self) -> tuple[str, int, str, int]:
        """Source, then rank, then start (restarts of one rank in order)."""
        return (self.source, -1 if self.rank is None else self.rank, self.stamp, self.attempt or 0)

    def records(
        self,
        skipped: SkippedLines,
        on_bytes: Callable[[int], None] | None = None,
        trimmed: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Every readable record of this process, in the order written; unreadable lines go to
        `skipped`.

        `trimmed`: span, instant and scalar records hold only the fields the analysis reads
        (`read.lines.ANALYSIS_FIELDS`, decoded by a typed decoder: what summarize and export read).

        Example:
            >>> process = read_run("outputs").processes[0]
            >>> [record["log_type_name"] for record in process.records(SkippedLines())][:3]
            ['structured_logger_opened', 'data_fetch_start', 'data_fetch_end']
        """
        # chain, not `yield from`: no extra Python frame to resume per record; the clock offset is
        # taken off as each line is read (no generator of its own either).
        offset_us = self.clock_offset_us
        return itertools.chain.from_iterable(
            file_records(path, skipped, on_bytes, offset_us=offset_us, trimmed=trimmed)
            for path in self.segments
        )


@dataclass
class RunLogs:
    """A run's log folder: its processes (sorted by source, rank, start) and what was skipped.

    Example:
        >>> run = read_run("outputs")
        >>> [sum(1 for record in process.records(run.skipped)) for process in run.processes], run.skipped.count
        ([26, 26], 0)
    """

    run_dir: str
    log_dir: str
    processes: list[ProcessLog]
    skipped: SkippedLines
    #: The one process's base file when the path given was a single ``.jsonl`` file, else None.
    only_base: str | None = None

    @property
    def total_bytes(self) -> int:
        """Bytes of JSONL in the selected processes' files."""
        return sum(p.size for p in self.processes)


def find_log_dir(path: str | os.PathLike[str]) -> tuple[str, str, str | None]:
    """(run directory, log directory, one process's base file or None) for a user-given path.

    Accepts a run directory (holding ``structured_logs/``), the
    ``structured_logs/`` folder itself (or any folder of ``*.jsonl`` files),
    or one ``.jsonl`` file (its process only). Raises `NotARunError` otherwise.

    Example:
        >>> import tempfile, os
        >>> run = tempfile.mkdtemp(); os.mkdir(os.path.join(run, "structured_logs"))
        >>> find_log_dir(run)[1] == os.path.join(run, "structured_logs")
        True
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise NotARunError(f"{path}: no such file or directory")
    if os.path.isfile(path):
        match = _SEGMENT.match(os.path.basename(path))
        if match is None:
            raise NotARunError(
                f"{path}: not a structured-log file (expected a .jsonl file or a run directory)"
            )
        log_dir = os.path.dirname(os.path.abspath(path))
        run_dir = (
            os.path.dirname(log_dir) if os.path.basename(log_dir) == "structured_logs" else log_dir
        )
        return run_dir, log_dir, os.path.join(log_dir, match.group("base"))
    nested = os.path.join(path, "structured_logs")
    if os.path.isdir(nested):
        return path, nested, None
    if any(_SEGMENT.match(name) for name in _listdir(path)):
        run_dir = (
            os.path.dirname(os.path.abspath(path))
            if os.path.basename(os.path.abspath(path)) == "structured_logs"
            else path
        )
        return run_dir, path, None
    raise NotARunError(
        f"{path}: not a run directory (no structured_logs/ folder and no .jsonl files in it)"
    )


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError as error:
        raise NotARunError(f"{path}: cannot list it ({error.strerror or error})") from None


def read_run(
    path: str | os.PathLike[str],
    *,
    ranks: Iterable[int] | None = None,
    sources: Iterable[str] | None = None,
    log_skipped: bool = True,
) -> RunLogs:
    """Discover a run's process logs (nothing is read yet but one line per process).

    `ranks` / `sources` keep only those processes (the others' files are never
    read). Raises `NotARunError` for a path that is not a run or has no log
    files, `NoRecordsError` when no process matches the filters.

    Example:
        >>> run = read_run("outputs", ranks=[0, 1], sources=["training"])
        >>> [p.label for p in run.processes]
        ['training rank 0', 'training rank 1']
    """
    run_dir, log_dir, only_base = find_log_dir(path)
    chains: dict[str, list[tuple[int, str]]] = {}
    for name in _listdir(log_dir):
        match = _SEGMENT.match(name)
        full = os.path.join(log_dir, name)
        if match is None or not os.path.isfile(full):
            continue
        base = os.path.join(log_dir, match.group("base"))
        if only_base is not None and base != only_base:
            continue
        segment = int(match.group("segment") or 0)
        chains.setdefault(base, []).append((segment, full))
    if not chains:
        raise NotARunError(f"{log_dir}: no structured-log files (*.jsonl) in it")
    skipped = SkippedLines(log=log_skipped)
    wanted_ranks = None if ranks is None else set(ranks)
    wanted_sources = None if sources is None else set(sources)
    processes = []
    for base, segments in chains.items():
        # Higher segment number = older: read them first, the active file (0) last.
        ordered = [p for _, p in sorted(segments, key=lambda item: (item[0] == 0, -item[0]))]
        process = _identify(base, ordered)
        if wanted_sources is not None and process.source not in wanted_sources:
            continue
        if wanted_ranks is not None and process.rank not in wanted_ranks:
            continue
        processes.append(process)
    if not processes:
        wanted = [
            f"ranks {sorted(wanted_ranks)}" if wanted_ranks is not None else "",
            f"sources {sorted(wanted_sources)}" if wanted_sources is not None else "",
        ]
        raise NoRecordsError(
            f"{log_dir}: no process matches the filters ({', '.join(w for w in wanted if w)})"
        )
    processes.sort(key=lambda p: p.sort_key)
    return RunLogs(
        run_dir=run_dir, log_dir=log_dir, processes=processes, skipped=skipped, only_base=only_base
    )


def _identify(base: str, segments: list[str]) -> ProcessLog:
    match = _TITAN_NAME.match(os.path.basename(base))
    first = _first_record(segments)
    if match is not None:
        # A file name's undecodable bytes arrive as surrogates: escaped, so the label prints and
        # encodes.
        source, rank, stamp = (
            escape_surrogates(match.group("source")),
            int(match.group("rank")),
            match.group("stamp"),
        )
    else:
        source = (
            first.get(Field.SOURCE)  # type: ignore[assignment]  # a str when isinstance says so, else the escaped file name
            if isinstance(first.get(Field.SOURCE), str)
            else escape_surrogates(os.path.basename(base).split(".")[0])
        )
        rank_value = first.get(Field.GLOBAL_RANK, first.get(Field.RANK))
        rank = rank_value if type(rank_value) is int else None  # type: ignore[assignment]  # None when the record names no rank: the label says so
        stamp = ""
    size = 0
    modified_us: int | None = None
    for segment in segments:
        try:
            info = os.stat(segment)
        except OSError:
            continue
        size += info.st_size
        if modified_us is None or info.st_mtime_ns // 1000 > modified_us:
            modified_us = info.st_mtime_ns // 1000

    def _int(key: str) -> int | None:
        value = first.get(key)
        return value if type(value) is int else None

    host = first.get(Field.HOST_NAME)
    run_id = first.get(Field.RUN_ID)
    process_run_id = first.get(Field.PROCESS_RUN_ID)
    return ProcessLog(
        base=base,
        segments=segments,
        source=source,
        rank=rank,
        stamp=stamp or str(first.get(Field.TIME_US, "")),
        size=size,
        attempt=_int("attempt"),
        pid=_int("pid"),
        host_name=host if isinstance(host, str) else None,
        run_id=run_id if isinstance(run_id, str) else None,
        world_size=_int("world_size"),
        modified_us=modified_us,
        process_run_id=process_run_id
        if isinstance(process_run_id, str) and process_run_id
        else None,
        mesh=read_mesh(first.get(Field.MESH)),
    )


def read_mesh(value: Any) -> dict[str, int] | None:
    """A record's ``mesh`` field as coordinates (name → int), None when absent or not of that shape.

    The one reading of the field for `summarize` and `watch`: every dimension
    is kept whatever its name; one value that is not an int makes the whole
    field untrusted (a half-read mesh would group the wrong ranks).

    Example:
        >>> read_mesh({"pp": 1, "dp_shard": 2}), read_mesh({"pp": 1, "dp": "2"}), read_mesh(None)
        ({'pp': 1, 'dp_shard': 2}, None, None)
    """
    if not isinstance(value, dict) or not value:
        return None
    coords = {
        name: coord for name, coord in value.items() if isinstance(name, str) and type(coord) is int
    }
    return coords if len(coords) == len(value) else None


def _first_record(segments: list[str], limit: int = 64 << 10) -> dict[str, Any]:
    """The first parseable object in the oldest readable segment (empty when none in its first
    `limit` bytes)."""
    for path in segments:
        try:
            with open(path, "rb") as handle:
                # one line is enough, almost always: no need to read more of a thousand files
                head = handle.read(4096)
                if b"\n" not in head:
                    head += handle.read(limit - len(head))
        except OSError:
            continue
        lines = head.split(b"\n")
        for index, raw in enumerate(lines):
            record = loads_line(raw)
            if type(record) is dict:
                return record
            if index == len(lines) - 1 and len(head) < limit:
                break  # the cut line of the 4 kB read: look further only if no earlier line was a record
        else:
            continue
        try:
            with open(path, "rb") as handle:
                head = handle.read(limit)
        except OSError:
            continue
        for raw in head.split(b"\n"):
            record = loads_line(raw)
            if type(record) is dict:
                return record
    return {}
