"""SQL over a run: an embedded DuckDB database whose views are the run's spans, instants, scalars,
steps and processes.

Why: every team asks questions the summary did not foresee ("p99 of
`data_fetch` on host 12 after step 5,000"). Rather than a flag per question,
`open_run` gives them a database: the run's JSONL files are read in place by
DuckDB's own JSON reader (``read_json``, newline-delimited, every segment of
every process, rotated ones included; torn and unreadable lines become empty
rows that the views leave out and `processes.unreadable_lines` counts), into
one ``records`` table, and documented views (docs/sql.md) turn the records
into spans (``_start`` / ``_end`` / ``_error`` paired by span id within a
process; records without one, torchtitan's, by name, last in first out per
thread and task, as summarize and export pair them), instants, scalars, steps
and processes. Times are aligned across
hosts as in ``summarize``: the per-host offsets are estimated by
`model.clocks.estimate_offsets` from the step-closing spans (found with SQL
once the records are in) and subtracted from every time (``host_time_us``
keeps the time as written); the ``clock_offsets`` table says what was applied.

The loaded records (and the clock offsets) are cached (`_SqlCache`): a DuckDB
file in the run's analysis cache (`read.cache_folder`), keyed by the content
of every file read (`read.content`, as summarize's cache) and by the reader
that made it; a second ``sql`` or ``report`` on an unchanged run attaches it
read-only instead of reading the JSONL. A run that grew is loaded again in
full (DuckDB's reader is fast enough that appending rows, then moving every
time by the new clock offsets, would save little).

DuckDB is an optional dependency (the ``analysis`` extra: `otel_titan.distribution.install_hint`):
the library and the other commands never import it.

Example:
    >>> db = open_run("outputs"); db.load()
    >>> db.con.sql("SELECT name, count(*) AS spans FROM spans GROUP BY name ORDER BY name").fetchall()
    [('data_fetch', 6), ('fwd_bwd', 6), ('optimizer', 6)]
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from otel_titan.analysis.model.cache import cache_version
from otel_titan.analysis.model.clocks import ClosingSpans, estimate_offsets
from otel_titan.analysis.model.rules import (
    CLOSING_SPAN_SQL,
    LOGGER_RECORDS,
    MAD_TO_SD,
    STEP_BEGIN_SQL,
    attempt_step,
    sql_in_list,
)
from otel_titan.analysis.read.cache_folder import CacheFolder, make_private_folders
from otel_titan.analysis.read.content import content_key
from otel_titan.analysis.read.lines import MAX_LINE_BYTES, SkippedLines, copy_without_long_lines
from otel_titan.analysis.read.records import NoRecordsError
from otel_titan.analysis.read.runs import RunChoice
from otel_titan.analysis.read.selection import RunSelection
from otel_titan.analysis.workers import open_workers, run_shares
from otel_titan.distribution import install_hint
from otel_titan.schema import ROLLUP_VERSION, MetaEvent

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "MissingDependencyError",
    "RunDatabase",
    "load_share",
    "open_run",
    "open_selected",
    "open_saved",
    "require_duckdb",
    "VIEWS",
    "INSTALL_HINT",
]

# otel-titan is installed from a checkout or a wheel (no package index has it): the hint says the
# command that works here.
INSTALL_HINT = install_hint("analysis")


class MissingDependencyError(ImportError):
    """An optional dependency of the analysis commands is not installed (the message says how to
    install it)."""


def require_duckdb() -> Any:
    """Import duckdb, or raise `MissingDependencyError` naming the extra to install."""
    try:
        import duckdb  # optional
    except ImportError as error:
        raise MissingDependencyError(
            f"`otel-titan sql` needs DuckDB, which is not installed: {INSTALL_HINT} (or pip "
            "install duckdb)"
        ) from error
    return duckdb


#: The fields read from every line (docs/schema.md), and their SQL types. Other fields are not read.
RECORD_COLUMNS: dict[str, str] = {
    "time_us": "BIGINT",
    "log_type": "VARCHAR",
    "log_type_name": "VARCHAR",
    "event_name": "VARCHAR",
    "value": "VARCHAR",  # a number, or "NaN" / "Infinity" / "-Infinity": cast with TRY_CAST(value AS DOUBLE)
    "step": "BIGINT",
    "relative_step": "BIGINT",
    "step_tags": "VARCHAR[]",
    "trace_id": "VARCHAR",
    "span_id": "VARCHAR",
    "parent_span_id": "VARCHAR",
    "error_type": "VARCHAR",
    "error_message": "VARCHAR",
    "tid": "BIGINT",
    "task_name": "VARCHAR",
    "seq_id": "BIGINT",
    "caller": "VARCHAR",
    "description": "VARCHAR",
    "signal": "VARCHAR",
    # The `step_rollup` records' own fields (docs/schema.md, "Step rollups"): the `step_rollups`
    # view. JSON where another record uses the name for something else (`closing` is a boolean on
    # the closed record).
    "rollup_version": "BIGINT",
    "complete": "BOOLEAN",
    "ended_by": "VARCHAR",
    "begin_us": "BIGINT",
    "end_us": "BIGINT",
    "phases": "JSON",
    "closing": "JSON",
    "late_spans": "BIGINT",
}

_PROCESS_INFO = """
CREATE TABLE process_info (
    process_id INTEGER PRIMARY KEY, run_id VARCHAR, source VARCHAR, rank INTEGER, host_name VARCHAR, pid BIGINT,
    attempt INTEGER, world_size INTEGER, file VARCHAR, segments INTEGER, bytes BIGINT, clock_offset_us BIGINT)
"""
_FILES = "CREATE TABLE files (filename VARCHAR PRIMARY KEY, process_id INTEGER, segment INTEGER)"
_CLOCK = "CREATE TABLE clock_offsets (host_name VARCHAR, offset_us DOUBLE, anchor VARCHAR, applied BOOLEAN, note VARCHAR)"
_RECORDS = (
    "CREATE TABLE records (process_id INTEGER, host_time_us BIGINT, "
    + ", ".join(f"{name} {kind}" for name, kind in RECORD_COLUMNS.items() if name != "time_us")
    + ", time_us BIGINT)"
)


# The views: what docs/sql.md documents. Identity columns first, in the same order everywhere. The
# rules in them (which records begin a step, which are the logger's own) are `model.rules`', as SQL
# text.
_IDENTITY = "p.run_id, p.source, p.rank, p.host_name, p.attempt"
_LOGGER_RECORDS = sql_in_list(LOGGER_RECORDS)
VIEWS: dict[str, str] = {
    "spans": f"""
CREATE VIEW spans AS
WITH kinds AS (
    SELECT process_id, span_id, time_us, log_type_name, value, step, relative_step, step_tags, parent_span_id, error_type,
           error_message, tid, task_name, caller, description, trace_id, seq_id,
           CASE WHEN suffix(log_type_name, '_start') THEN 's' WHEN suffix(log_type_name, '_end') THEN 'e'
                WHEN suffix(log_type_name, '_error') THEN 'x' END AS kind
    FROM records WHERE log_type = 'event'),
-- Records without a span id (torchtitan's and pimm's files) pair by name, last in first out, per thread and asyncio
-- task, in the order written (seq_id; time where a file has none), as summarize and export pair them (model.timeline): a `_start` opens level n of its name
-- there, an `_end` closes the open level n, an `_error` marks it; each takes the latest `_start` of its level.
named AS (
    SELECT *, regexp_replace(log_type_name, '_(start|end|error)$', '') AS base,
           row_number() OVER (PARTITION BY process_id ORDER BY seq_id, time_us) AS ord
    FROM kinds WHERE span_id IS NULL AND kind IS NOT NULL),
levelled AS (
    SELECT *, sum(CASE kind WHEN 's' THEN 1 WHEN 'e' THEN -1 ELSE 0 END)
                  OVER (PARTITION BY process_id, tid, task_name, base ORDER BY ord ROWS UNBOUNDED PRECEDING)
              + CASE kind WHEN 'e' THEN 1 ELSE 0 END AS level
    FROM named),
paired_by_name AS (
    SELECT *, max(CASE WHEN kind = 's' THEN ord END)
                  OVER (PARTITION BY process_id, tid, task_name, base, level ORDER BY ord ROWS UNBOUNDED PRECEDING) AS opened_at
    FROM levelled),
ev AS (
    SELECT * EXCLUDE (seq_id) FROM kinds WHERE span_id IS NOT NULL
    UNION ALL BY NAME
    SELECT * EXCLUDE (span_id, seq_id, base, ord, level, opened_at), 'line ' || opened_at AS span_id
    FROM paired_by_name WHERE opened_at IS NOT NULL),
paired AS (
    SELECT process_id, span_id,
           min(time_us) FILTER (WHERE kind = 's') AS start_us,
           max(time_us) FILTER (WHERE kind = 'e') AS end_us,
           max(TRY_CAST(value AS DOUBLE)) FILTER (WHERE kind = 'e') AS end_ms,
           arg_min(log_type_name, time_us) FILTER (WHERE kind = 's') AS start_name,
           arg_min(step, time_us) FILTER (WHERE kind = 's') AS step,
           arg_min(relative_step, time_us) FILTER (WHERE kind = 's') AS relative_step,
           arg_min(step_tags, time_us) FILTER (WHERE kind = 's') AS step_tags,
           arg_min(parent_span_id, time_us) FILTER (WHERE kind = 's') AS parent_span_id,
           arg_min(tid, time_us) FILTER (WHERE kind = 's') AS thread,
           arg_min(task_name, time_us) FILTER (WHERE kind = 's') AS task,
           arg_min(caller, time_us) FILTER (WHERE kind = 's') AS caller,
           arg_min(description, time_us) FILTER (WHERE kind = 's') AS description,
           arg_min(trace_id, time_us) FILTER (WHERE kind = 's') AS trace_id,
           any_value(error_type) FILTER (WHERE kind = 'x') AS error_type,
           any_value(error_message) FILTER (WHERE kind = 'x') AS error_message
    FROM ev GROUP BY process_id, span_id),
last AS (SELECT process_id, max(time_us) AS last_us FROM records WHERE log_type_name IS NOT NULL GROUP BY process_id)
SELECT {_IDENTITY}, s.step, s.relative_step, s.step_tags, left(s.start_name, length(s.start_name) - 6) AS name,
       s.start_us, coalesce(s.end_us, l.last_us) AS end_us,
       coalesce(s.end_ms, (coalesce(s.end_us, l.last_us) - s.start_us) / 1000.0) AS duration_ms,
       s.span_id, s.parent_span_id, s.error_type, s.error_message, s.end_us IS NULL AS incomplete,
       s.thread, s.task, s.caller, s.description, s.trace_id, s.process_id
FROM paired s JOIN process_info p USING (process_id) LEFT JOIN last l USING (process_id)
WHERE s.start_us IS NOT NULL
""",
    "instants": f"""
CREATE VIEW instants AS
SELECT {_IDENTITY}, r.step, r.relative_step, r.step_tags, r.log_type_name AS name, r.time_us,
       r.log_type_name IN {_LOGGER_RECORDS} AS logger_record,
       r.span_id, r.parent_span_id, r.tid AS thread, r.task_name AS task, r.caller, r.signal, r.process_id
FROM records r JOIN process_info p USING (process_id)
WHERE r.log_type = 'instant' AND r.log_type_name NOT IN ('metric_value', '{MetaEvent.STEP_ROLLUP}')
""",
    "scalars": f"""
CREATE VIEW scalars AS
SELECT {_IDENTITY}, r.step, r.relative_step, r.step_tags, r.event_name AS name, TRY_CAST(r.value AS DOUBLE) AS value, r.time_us,
       r.tid AS thread, r.task_name AS task, r.process_id
FROM records r JOIN process_info p USING (process_id)
WHERE r.log_type_name = 'metric_value'
""",
    "steps": f"""
CREATE VIEW steps AS
WITH firsts AS (SELECT process_id, step, min(time_us) AS start_us FROM records WHERE step IS NOT NULL AND {STEP_BEGIN_SQL} GROUP BY process_id, step),
ordered AS (SELECT *, max(step) OVER (PARTITION BY process_id ORDER BY start_us, step ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS above
            FROM firsts),
begun AS (SELECT process_id, step, start_us FROM ordered WHERE above IS NULL OR step > above)
SELECT {_IDENTITY}, f.step, f.start_us,
       lead(f.start_us) OVER (PARTITION BY f.process_id ORDER BY f.step) AS end_us,
       (lead(f.start_us) OVER (PARTITION BY f.process_id ORDER BY f.step) - f.start_us) / 1000.0 AS duration_ms,
       f.process_id
FROM begun f JOIN process_info p USING (process_id)
""",
    "processes": f"""
CREATE VIEW processes AS
WITH agg AS (
    SELECT process_id,
           count(*) FILTER (WHERE log_type_name IS NOT NULL) AS records,
           count(*) FILTER (WHERE log_type_name IS NULL) AS unreadable_lines,
           min(time_us) AS first_us, max(time_us) AS last_us,
           -- Not a step_rollup: totals of records already here, written after them (after SIGTERM's record too).
           arg_max(log_type_name, (time_us, seq_id)) FILTER (WHERE log_type_name <> '{MetaEvent.STEP_ROLLUP}') AS last_record,
           arg_max(log_type_name, (time_us, seq_id)) FILTER (WHERE log_type_name NOT IN {_LOGGER_RECORDS}) AS last_event,
           max(step) AS last_step,
           bool_or(log_type_name = 'structured_logger_closed') AS closed,
           any_value(signal) FILTER (WHERE signal IS NOT NULL) AS signal
    FROM records GROUP BY process_id)
SELECT {_IDENTITY}, p.pid, p.world_size, a.first_us, a.last_us, a.last_record, a.last_event, a.last_step,
       coalesce(a.closed, false) AS closed, a.signal, coalesce(a.records, 0) AS records,
       coalesce(a.unreadable_lines, 0) AS unreadable_lines, p.file, p.segments, p.bytes, p.clock_offset_us, p.process_id
FROM process_info p LEFT JOIN agg a USING (process_id)
""",
}

#: SQL functions of the rules (docs/sql.md): `robust_sd(x)`, the spread a robust z is measured in
#: (`model.rules.robust_sd`).
MACROS: dict[str, str] = {
    "robust_sd": f"CREATE MACRO robust_sd(x) AS {MAD_TO_SD!r} * mad(x)",
}

#: Per process and step, its step-closing span (`model.rules.CLOSING_SPAN_SQL`: the top-level span
#: started in the step that ended last, before the next step began, as `model.timeline` sees them in
#: file order), as (process_id, host, attempt, step, name, start_us, end_us): what the clocks are
#: aligned on, as in summarize.
CLOSING_SPANS_QUERY = f"""
SELECT s.process_id, coalesce(s.host_name, 'process ' || s.process_id) AS host, s.attempt, s.step,
       arg_max(s.name, s.end_us), arg_max(s.start_us, s.end_us), max(s.end_us)
FROM (SELECT * FROM spans WHERE {CLOSING_SPAN_SQL}) s JOIN steps t ON t.process_id = s.process_id AND t.step = s.step
WHERE t.end_us IS NULL OR s.end_us <= t.end_us
GROUP BY ALL ORDER BY s.process_id, s.attempt, s.step
"""

# The writer's rollups, the last one written of each (process, step) (one after SIGTERM is
# superseded), of a version this reader knows; times moved by the process's clock offset as every
# `time_us` is (host_time_us - time_us).
VIEWS["step_rollups"] = f"""
CREATE VIEW step_rollups AS
WITH r AS (
    SELECT *, host_time_us - time_us AS offset_us,
           row_number() OVER (PARTITION BY process_id, step ORDER BY seq_id DESC) AS latest
    FROM records
    WHERE log_type_name = '{MetaEvent.STEP_ROLLUP}' AND rollup_version BETWEEN 1 AND {ROLLUP_VERSION} AND step IS NOT NULL
      AND begin_us IS NOT NULL AND end_us IS NOT NULL)
SELECT {_IDENTITY}, r.step, r.complete, r.ended_by, r.begin_us - r.offset_us AS begin_us, r.end_us - r.offset_us AS end_us,
       CASE WHEN r.complete THEN (r.end_us - r.begin_us) / 1000.0 END AS step_ms,
       r.phases,
       json_extract_string(r.closing, '$.name') AS closing,
       TRY_CAST(json_extract(r.closing, '$.start_us') AS BIGINT) - r.offset_us AS closing_enter_us,
       TRY_CAST(json_extract(r.closing, '$.end_us') AS BIGINT) - r.offset_us AS closing_exit_us,
       coalesce(r.late_spans, 0) AS late_spans, r.rollup_version, r.process_id
FROM r JOIN process_info p USING (process_id)
WHERE r.latest = 1
"""

#: One line per view, for `describe` and docs/sql.md.
VIEW_HELP = {
    "spans": "one row per span (_start paired with its _end / _error by span id, or by name in files without span ids); incomplete spans end at the process's last record",
    "instants": "one row per instant (sl.log_trace_instant and the logger's own records: logger_record = true)",
    "scalars": "one row per scalar value (log_trace_scalar); NaN / ±Infinity are DOUBLE nan / ±inf",
    "steps": "one row per (process, step): the step's first _start, instant or scalar to the next step's, as summarize's step time",
    "processes": "one row per process: identity, first and last record, closed or not, unreadable lines",
    "step_rollups": "one row per (process, step) from the writer's step_rollup records (the last of each): step time, phases' [count, total µs], the step-closing span",
    "clock_offsets": "per host, the clock offset subtracted from its times (empty when not aligned)",
    "records": "every line read (torn lines are rows of NULLs): the base table of the views",
}


@dataclass
class RunDatabase:
    """A DuckDB connection holding one run: tables ``process_info``, ``files``, ``clock_offsets``,
    ``records``, and the views.

    `load` reads the JSONL into ``records`` (once); until then the views are
    empty, so their columns can be listed without reading anything.
    """

    con: duckdb.DuckDBPyConnection
    paths: list[str] = field(default_factory=list)
    total_bytes: int = 0
    processes: int = 0
    choice: RunChoice | None = None
    clock: str = ""
    loaded: bool = False
    load_seconds: float = 0.0
    align: bool = False
    scheduler: str | None = None
    #: Where the loaded records are cached (None: ``--no-cache``, ``--save``, or a file that cannot
    #: be read).
    cache: _SqlCache | None = None
    #: Whether `load` found them there.
    from_cache: bool = False
    #: The run's log folder (what an error names).
    log_dir: str = ""

    def load(self, progress: Callable[[float], None] | None = None) -> None:
        """Read every file into ``records`` with DuckDB's JSON reader (both cores); `progress` gets
        0..100.

        With `scheduler` (a Dask scheduler's address) the files are read on
        the cluster's workers instead, a share each, by the same query
        (`load_share`); their rows come back as Parquet: the same records.
        """
        if self.loaded:
            return
        started = time.monotonic()
        if self.cache is not None and self.cache.attach(self):
            self.from_cache = self.loaded = True
            self.load_seconds = time.monotonic() - started
            return
        if self.paths and self.scheduler is not None:
            self._load_on_cluster(progress)
        elif self.paths:
            _read_records(
                self.paths,
                lambda query: _run_with_progress(
                    self.con, "INSERT INTO records " + query, progress
                ),
                "JOIN process_info p ON p.process_id = f.process_id",
            )
        self._check_readable()
        if self.align:
            self._align()
        if self.cache is not None:
            self.cache.keep(self)
        self.loaded = True
        self.load_seconds = time.monotonic() - started

    def _load_on_cluster(self, progress: Callable[[float], None] | None) -> None:
        assert self.scheduler is not None
        files = self.con.execute(
            "SELECT filename, process_id FROM files ORDER BY process_id, segment"
        ).fetchall()
        sizes = {path: os.path.getsize(path) if os.path.exists(path) else 0 for path, _ in files}
        read = 0

        def on_bytes(count: int) -> None:
            nonlocal read
            read += count
            if progress is not None and self.total_bytes:
                progress(min(100.0, 100.0 * read / self.total_bytes))

        with open_workers(1, self.scheduler, "sql worker", on_bytes) as workers:
            buckets: list[list[tuple[str, int]]] = [
                [] for _ in range(min(workers.slots, len(files)))
            ]
            loads = [0] * len(buckets)
            # largest first onto the least loaded
            for path, process_id in sorted(files, key=lambda f: -sizes[f[0]]):
                target = loads.index(min(loads))
                # The workers run in directories of their own (dask-jobqueue's, other nodes'):
                # absolute paths.
                buckets[target].append((os.path.abspath(path), process_id))
                loads[target] += sizes[path]
            parts = run_shares(
                workers,
                f"{__name__}:load_share",
                [(bucket,) for bucket in buckets if bucket],
                on_bytes,
            )
        with tempfile.TemporaryDirectory(prefix="otel-titan-sql-") as folder:
            names = []
            for index, part in enumerate(parts):
                names.append(os.path.join(folder, f"part-{index}.parquet"))
                with open(names[-1], "wb") as handle:
                    handle.write(part)
            self.con.execute(
                "INSERT INTO records SELECT * FROM "
                f"read_parquet([{', '.join(_quote(n) for n in names)}])"
            )

    def _check_readable(self) -> None:
        """Raise `NoRecordsError` when not one line read is a record while some could not be read: a
        folder that is not a run (as ``summarize``).

        (Files with no line at all are a run that stopped before its first record: its processes are
        still shown.)
        """
        readable, unreadable = self.con.execute(
            "SELECT count(log_type_name), count(*) - count(log_type_name) FROM records"
        ).fetchone()  # type: ignore[misc]  # an aggregate query returns one row
        if readable == 0 and unreadable:
            raise NoRecordsError(
                f"{self.log_dir or 'the run'}: no readable records ({unreadable:,} unreadable "
                f"line{'s' if unreadable != 1 else ''} skipped)"
            )

    def _align(self) -> None:
        """Estimate each host's clock offset as ``summarize`` does (`model.clocks`), then shift
        every record's time by it.

        The step-closing spans (`CLOSING_SPANS_QUERY`, the rule of
        `model.rules.CLOSING_SPAN_SQL`), on the clocks as written.
        """
        groups: dict[int, ClosingSpans] = {}
        for process_id, host, attempt, step, name, start_us, end_us in self.con.execute(
            CLOSING_SPANS_QUERY
        ).fetchall():
            spans = groups.get(process_id)
            if spans is None:
                spans = groups[process_id] = ClosingSpans(host=host, key=process_id)
            spans.add(attempt_step(attempt, step), name, start_us, end_us)
        alignment = estimate_offsets(groups.values())
        self.clock = alignment.describe()
        if not alignment.applied:
            return
        _insert_columns(
            self.con,
            "clock_offsets",
            [
                (h, o, alignment.anchor, True, self.clock)
                for h, o in sorted(alignment.offsets_us.items())
            ],
            5,
        )
        self.con.execute(
            "UPDATE process_info SET clock_offset_us = CAST(round(o.offset_us) AS BIGINT) FROM "
            "clock_offsets o "
            "WHERE coalesce(process_info.host_name, 'process ' || process_info.process_id) = "
            "o.host_name"
        )
        self.con.execute(
            "UPDATE records SET time_us = records.host_time_us - p.clock_offset_us FROM "
            "process_info p "
            "WHERE records.process_id = p.process_id AND p.clock_offset_us <> 0"
        )

    def view_columns(self) -> dict[str, list[tuple[str, str]]]:
        """View (and table) name → [(column, type)], for `describe`."""
        out = {}
        for name in [*VIEWS, "clock_offsets", "records"]:
            out[name] = [
                (row[0], row[1]) for row in self.con.execute(f"DESCRIBE {name}").fetchall()
            ]
        return out

    def save_parquet(self, folder: str) -> list[str]:
        """Write every view and the clock offsets as ``folder/<view>.parquet``; returns the
        paths."""
        make_private_folders(folder)  # 0700 where made, as analysis/ is
        written = []
        for name in [*VIEWS, "clock_offsets"]:
            path = os.path.join(folder, f"{name}.parquet")
            self.con.execute(f"COPY (SELECT * FROM {name}) TO {_quote(path)} (FORMAT parquet)")
            written.append(path)
        return written


class _SqlCache:
    """The loaded ``records`` and ``clock_offsets`` of one selection of a run, kept as a DuckDB file
    in the run's analysis cache.

    `name` is the selection's (its processes' files and the alignment), so a
    selection has one entry, replaced when its content changes; `key` names
    the content (every file's `read.content.ContentKey`, the partial last lines
    included: DuckDB read them), this module and the model's version. The
    file is sealed with the key (a MAC over its bytes with the user's key,
    `read.cache_folder`): a file that is not ours, or of other content, is
    never opened. The small tables
    (``process_info``, ``files``) are made afresh every time: they name the
    files where they are now (a copied run).
    """

    def __init__(self, folder: CacheFolder, name: str, key: str) -> None:
        self.folder, self.name, self.key = folder, name, key

    @classmethod
    def of(cls, run_dir: str, log_dir: str, processes: list[Any], align: bool) -> _SqlCache | None:
        """The cache of these processes (None when a file cannot be read now)."""
        selection, content = [], []
        for process in processes:
            keys = [content_key(path) for path in process.segments]
            if any(key is None for key in keys):
                return None
            selection.append(os.path.basename(process.base))
            content.append([[k.length, k.head, k.tail, k.size, k.rest] for k in keys])  # type: ignore[union-attr]  # keys of readable segments only, checked before
        name = (
            "sql-"
            + hashlib.blake2b(
                json.dumps([align, selection]).encode(errors="surrogateescape"), digest_size=16
            ).hexdigest()
            + ".duckdb"
        )
        key = hashlib.blake2b(
            json.dumps([cache_version(), _module_version(), content]).encode(), digest_size=16
        ).hexdigest()
        return cls(CacheFolder(run_dir, log_dir), name, key)

    def attach(self, db: RunDatabase) -> bool:
        """Use the cached records if there are ours for this content: ``records`` becomes a view of
        them (read-only).

        Nothing of a file is run before it is known to be ours: its seal (a
        MAC over all its bytes with the user's key, `CacheFolder.sealed`) is
        checked before DuckDB opens it; it is then opened alone, with no
        access to other files or the network and no extension loaded
        (`_LOCKED`), and must hold the three tables `keep` writes and no view
        or macro; only then is it attached to the run's database.
        """
        duckdb = require_duckdb()
        con = db.con
        with self.folder.sealed(self.name, self.key) as paths:
            for path in paths:
                clock = _checked_entry(duckdb, path)
                if clock is None:
                    continue
                try:
                    con.execute(f"ATTACH {_quote(path)} AS run_cache (READ_ONLY)")
                except duckdb.Error:
                    continue  # replaced as we looked: a miss
                try:
                    # all or nothing: a miss leaves the empty `records` table to load into
                    con.execute("BEGIN TRANSACTION")
                    con.execute("DROP TABLE records")
                    con.execute("CREATE VIEW records AS SELECT * FROM run_cache.records")
                    con.execute("INSERT INTO clock_offsets SELECT * FROM run_cache.clock_offsets")
                    con.execute(
                        "UPDATE process_info SET clock_offset_us = CAST(round(o.offset_us) AS "
                        "BIGINT) FROM clock_offsets o "
                        "WHERE coalesce(process_info.host_name, 'process ' || "
                        "process_info.process_id) = o.host_name"
                    )
                    con.execute("COMMIT")
                    db.clock = clock
                    return True
                except duckdb.Error:
                    con.execute("ROLLBACK")
                    con.execute("DETACH run_cache")
        return False

    def keep(self, db: RunDatabase) -> None:
        """Write the loaded records to the cache (a new file, sealed, renamed over the old entry);
        best effort: a failure only means no cache."""
        duckdb = require_duckdb()
        con = db.con
        try:
            with self.folder.new_sealed(self.name, self.key) as temp:
                if temp is None:
                    return
                con.execute(f"ATTACH {_quote(temp)} AS cache_out")
                try:
                    con.execute("CREATE TABLE cache_out.records AS SELECT * FROM records")
                    con.execute(
                        "CREATE TABLE cache_out.clock_offsets AS SELECT * FROM clock_offsets"
                    )
                    con.execute(
                        "CREATE TABLE cache_out.cache_key AS SELECT $1 AS key, $2 AS clock",
                        [self.key, db.clock],
                    )
                finally:
                    con.execute("DETACH cache_out")
        except (duckdb.Error, OSError):
            pass


#: How a cache file is first opened: its own files only (no other file, no URL), no extension
#: installed or loaded.
_LOCKED = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
#: The tables `_SqlCache.keep` writes: a cache file holds exactly these.
_CACHE_TABLES = {"records", "clock_offsets", "cache_key"}


def _checked_entry(duckdb: Any, path: str) -> str | None:
    """The clock description of the sealed cache file at `path` when it holds only `_CACHE_TABLES`
    (no view, no macro); None otherwise.

    Opened on its own with `_LOCKED`: even a file that passed its seal runs
    nothing that reaches beyond it.
    """
    try:
        check = duckdb.connect(path, read_only=True, config=_LOCKED)
    except duckdb.Error:
        return None
    try:
        tables = {
            row[0]
            for row in check.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
            ).fetchall()
        }
        views = check.execute(
            "SELECT count(*) FROM duckdb_views() WHERE database_name = current_database() AND NOT "
            "internal"
        ).fetchone()
        macros = check.execute(
            "SELECT count(*) FROM duckdb_functions() WHERE database_name = current_database() AND "
            "NOT internal"
        ).fetchone()
        if tables != _CACHE_TABLES or (views and views[0]) or (macros and macros[0]):
            return None
        row = check.execute("SELECT clock FROM cache_key").fetchone()
        return row[0] if row is not None and isinstance(row[0], str) else None
    except duckdb.Error:
        return None
    finally:
        check.close()


def _module_version() -> str:
    """This module's source (its load query and alignment make the cached records)."""
    try:
        with open(__file__, "rb") as handle:
            return hashlib.blake2b(handle.read(), digest_size=16).hexdigest()
    except OSError:
        return "?"


def _records_query(paths: list[str], join: str = "", copies: dict[str, str] | None = None) -> str:
    """The SELECT of ``records``' rows from `paths` (each joined to its process by the ``files``
    table): one query for every loader.

    `copies`: a path read in place of a run's file (a copy without its long lines) → that file.
    """
    copies = copies or {}
    originals = {original: copy for copy, original in copies.items()}
    files = "[" + ", ".join(_quote(originals.get(p, p)) for p in paths) + "]"
    columns = "{" + ", ".join(f"{_quote(k)}: {_quote(v)}" for k, v in RECORD_COLUMNS.items()) + "}"
    names = [k for k in RECORD_COLUMNS if k != "time_us"]
    filename = "r.filename"
    if copies:
        filename = (
            "CASE r.filename "
            + " ".join(
                f"WHEN {_quote(copy)} THEN {_quote(original)}" for copy, original in copies.items()
            )
            + " ELSE r.filename END"
        )
    return (
        f"SELECT f.process_id, r.time_us, {', '.join('r.' + n for n in names)}, r.time_us "
        f"FROM read_json({files}, format = 'newline_delimited', ignore_errors = true, filename = "
        "true, "
        f"maximum_object_size = {MAX_LINE_BYTES}, columns = {columns}) r "
        f"JOIN files f ON {filename} = f.filename {join}"
    )


#: DuckDB's error for a line over `maximum_object_size`: it fails the whole query, however many
#: lines are fine.
_TOO_LONG = re.compile(r'"maximum_object_size" of \d+ bytes exceeded while reading file "(.*?)"')


def _read_records(paths: list[str], execute: Callable[[str], None], join: str = "") -> None:
    """`execute` the records query over `paths`, reading a file with a line too long for DuckDB from
    a copy without it.

    The other commands skip a line longer than `MAX_LINE_BYTES` with a warning (`read.lines`); so
    does this one: the file DuckDB names is copied without its long lines
    (`copy_without_long_lines`, a block of memory at a time, with the other commands' warning), and
    the query runs again on the copy, whose rows are the file's (a long line is a row of NULLs,
    counted in ``processes.unreadable_lines``).
    """
    duckdb = require_duckdb()
    copies: dict[str, str] = {}
    skipped = SkippedLines()
    with tempfile.TemporaryDirectory(prefix="otel-titan-sql-lines-") as folder:
        while True:
            try:
                execute(_records_query(paths, join, copies))
                return
            except duckdb.Error as error:
                match = _TOO_LONG.search(str(error))
                named = match.group(1) if match else None
                if named is None or named not in paths or named in copies.values():
                    raise  # not a long line of a run's file (or its copy still has one): a real error
                copy = os.path.join(folder, f"{len(copies)}-{os.path.basename(named)}")
                copy_without_long_lines(named, copy, skipped)
                copies[copy] = named


def load_share(files: list[tuple[str, int]], on_bytes: Callable[[int], None]) -> bytes:
    """One Dask worker's share of `RunDatabase.load`: ``records``' rows of `files` ((path, process
    id) pairs), as Parquet bytes.

    The same query as the local load (`_records_query`), in a DuckDB of the
    worker's own; the bytes travel back to the command (no shared folder
    needed), which inserts them.
    """
    duckdb = require_duckdb()
    con = duckdb.connect()
    try:
        con.execute(_FILES)
        _insert_columns(con, "files", [(path, process_id, 0) for path, process_id in files], 3)
        with tempfile.TemporaryDirectory(prefix="otel-titan-sql-share-") as folder:
            part = os.path.join(folder, "part.parquet")
            _read_records(
                [path for path, _ in files],
                lambda query: con.execute(f"COPY ({query}) TO {_quote(part)} (FORMAT parquet)"),
            )
            with open(part, "rb") as handle:
                data = handle.read()
    finally:
        con.close()
    on_bytes(sum(os.path.getsize(path) for path, _ in files if os.path.exists(path)))
    return data


def _insert_columns(
    con: duckdb.DuckDBPyConnection, table: str, rows: list[tuple], width: int
) -> None:
    """Insert `rows` in one statement (one list parameter per column: executemany is a round trip
    per row)."""
    if not rows:
        return
    columns = [list(column) for column in zip(*rows)]
    con.execute(
        f"INSERT INTO {table} SELECT {', '.join(f'unnest(${i + 1})' for i in range(width))}",
        columns,
    )


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _run_with_progress(
    con: duckdb.DuckDBPyConnection, sql: str, progress: Callable[[float], None] | None
) -> None:
    """Run `sql`; while it runs, report DuckDB's own progress estimate (`query_progress`) every 0.2
    s."""
    if progress is None:
        con.execute(sql)
        return
    error: list[BaseException] = []

    def work() -> None:
        try:
            con.execute(sql)
        except BaseException as caught:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(caught)

    worker = threading.Thread(target=work, name="otel-titan-sql-load", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
        try:
            done = con.query_progress()
        except Exception:  # noqa: BLE001 - progress is best effort
            done = -1
        if done >= 0:
            progress(float(done))
    if error:
        raise error[0]


def open_run(
    path: str | os.PathLike[str],
    *,
    run_id: str | None = None,
    align: bool = True,
    database: str | None = None,
    ranks: list[int] | None = None,
    sources: list[str] | None = None,
    scheduler: str | None = None,
    cache: bool = True,
) -> RunDatabase:
    """A `RunDatabase` for the run at `path` (a run directory, its ``structured_logs/``, or one
    .jsonl file).

    `run_id`: the run when the folder holds several (default: the latest, as ``summarize``).
    `align`: subtract each host's clock offset from its times. `database`: a ``.duckdb`` file to
    build the database in (``--save``; it must not exist yet), else in memory. `scheduler`: a Dask
    scheduler's address; its workers read the files on `RunDatabase.load`. `cache`: load from the
    analysis cache when it holds this content, and keep what is loaded there (not with `database`:
    ``--save`` writes a database of its own). Reads one line per process; `RunDatabase.load` reads
    the rest and aligns the clocks. Raises `NotARunError` / `NoRecordsError` as ``summarize``,
    `MissingDependencyError` without duckdb, `FileExistsError` when `database` exists.
    """
    selection = RunSelection.of(
        path,
        run_id=run_id,
        align=align,
        ranks=ranks,
        sources=sources,
        scheduler=scheduler,
        cache=cache,
    )
    return open_selected(selection, database)


def open_selected(selection: RunSelection, database: str | None = None) -> RunDatabase:
    """`open_run` of the run `selection` names (its `jobs` unused: DuckDB reads with its own
    threads, a `scheduler`'s workers on `RunDatabase.load`); `database` and the errors as
    `open_run`'s."""
    duckdb = require_duckdb()
    run, choice = selection.read(log_skipped=False)
    align, scheduler, cache = selection.align, selection.scheduler, selection.cache
    if not run.processes:
        raise NoRecordsError(f"{run.log_dir}: no process left after the filters")
    if database is not None:
        if os.path.exists(database):
            raise FileExistsError(
                f"{database} exists already (--save writes a new database; remove it or pick "
                "another name)"
            )
        con = duckdb.connect(database)
    else:
        con = duckdb.connect()
    # query_progress needs the progress bar on; DuckDB must not print its own (it would mix into the
    # output).
    con.execute("SET enable_progress_bar = true")
    con.execute("SET enable_progress_bar_print = false")
    for ddl in (_PROCESS_INFO, _FILES, _CLOCK, _RECORDS, *VIEWS.values(), *MACROS.values()):
        con.execute(ddl)
    info_rows, file_rows, paths, total = [], [], [], 0
    for index, process in enumerate(run.processes):
        info_rows.append(
            (
                index,
                process.run_id,
                process.source,
                process.rank,
                process.host_name,
                process.pid,
                process.attempt,
                process.world_size,
                os.path.basename(process.base),
                len(process.segments),
                process.size,
                0,
            )
        )
        for segment, file_path in enumerate(process.segments):
            file_rows.append((file_path, index, segment))
            paths.append(file_path)
        total += process.size
    _insert_columns(con, "process_info", info_rows, 12)
    _insert_columns(con, "files", file_rows, 3)
    cached = (
        _SqlCache.of(run.run_dir, run.log_dir, run.processes, align)
        if cache and database is None
        else None
    )
    return RunDatabase(
        con=con,
        paths=paths,
        total_bytes=total,
        processes=len(run.processes),
        choice=choice,
        align=align,
        scheduler=scheduler,
        clock="turned off (--no-align)" if not align else "",
        cache=cached,
        log_dir=run.log_dir,
    )


def open_saved(path: str) -> RunDatabase:
    """Open a database written by ``--save`` (read-only): its tables and views as they were
    saved."""
    duckdb = require_duckdb()
    try:
        con = duckdb.connect(path, read_only=True)
    except duckdb.Error as error:
        raise NoRecordsError(
            f"{path}: not a DuckDB database written by `otel-titan sql --save` ({error})"
        ) from error
    tables = {
        row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
    }
    missing = sorted({*VIEWS, "records", "process_info"} - tables)
    if missing:
        con.close()
        raise NoRecordsError(
            f"{path}: not a database written by `otel-titan sql --save` (no {', '.join(missing)})"
        )
    return RunDatabase(con=con, loaded=True)
