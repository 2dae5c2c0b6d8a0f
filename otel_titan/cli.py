"""`otel-titan`: the command line of the analysis tools (`export`, `summarize`, `sql`, `report`,
`watch`, `mcp`).

Exit codes: `ExitCode`, one meaning each, and `_failure`, the one place where
an error becomes its exit code and its one line on stderr: every command raises,
`main` maps (``otel-titan --help`` and docs/analysis.md list the codes).

Every line printed for a person goes through `read.safe_text.printable` (the
records' text, file names and paths are shown, control characters escaped,
never executed by the terminal), and the ``--json`` document through
`read.safe_text.json_bytes` (it never fails on odd data).
"""

from __future__ import annotations

import argparse
import enum
import gc
import ipaddress
import logging
import os
import secrets
import sys
import textwrap
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

import orjson

from otel_titan._version import __version__
from otel_titan.analysis import (
    NoRecordsError,
    NotARunError,
    RunAnalysis,
    RunSelection,
    parse_step_range,
)
from otel_titan.analysis.agents.server import guide_text, serve, serve_http
from otel_titan.analysis.export.checks import PERFETTO_MAX_TRACE_BYTES, TraceTooBigError
from otel_titan.analysis.model.wording import plural
from otel_titan.analysis.query.output import write_result
from otel_titan.analysis.query.sql import (
    VIEW_HELP,
    MissingDependencyError,
    open_saved,
    require_duckdb,
)
from otel_titan.analysis.read.filters import parse_rank_list
from otel_titan.analysis.read.safe_text import json_bytes, printable
from otel_titan.analysis.watch.detect import Rules
from otel_titan.analysis.watch.loop import (
    EXIT_ALERT,
    default_trigger,
    parse_exit_on,
    parse_seconds,
    run_watch,
    wait_for_run,
)
from otel_titan.analysis.workers import ClusterError, MissingClusterError, WorkerDiedError
from otel_titan.distribution import install_hint
from otel_titan.environment_variables import (
    OTEL_TITAN_DUMP_TRIGGER,
    OTEL_TITAN_MCP_TOKEN,
    OTEL_TITAN_WATCH_TOKEN,
)
from otel_titan.receive import (
    Limits,
    OtlpGrpcReceiver,
    OtlpHttpReceiver,
    ReceiverError,
    Spool,
    is_loopback,
    parse_address,
    raise_open_files_limit,
    receive_facts,
    server_tls,
)

if TYPE_CHECKING:
    import ssl

__all__ = ["main", "ExitCode", "EXIT_CODE_MEANINGS"]


class ExitCode(enum.IntEnum):
    """The exit status of every command, one meaning each (scripts and schedulers branch on them):
    `EXIT_CODE_MEANINGS`."""

    OK = 0
    NO_RECORDS = 1
    USAGE = 2
    ALERT = EXIT_ALERT
    CANNOT_WRITE = 4
    UNAVAILABLE = 5
    INTERNAL = 70
    INTERRUPTED = 130


#: When each code is given: ``otel-titan --help`` prints this, docs/analysis.md's table says the
#: same (tests/test_cli.py).
EXIT_CODE_MEANINGS = {
    ExitCode.OK: "done",
    ExitCode.NO_RECORDS: "no records: the run has none readable, or none is left after --steps, --ranks, --sources or --run",
    ExitCode.USAGE: "bad input: the command line (argparse's own exit), a path that is not a run, a query DuckDB refuses, "
    "a --save file that exists",
    ExitCode.ALERT: "watch --exit-on: an alert of the kinds named was confirmed",
    ExitCode.CANNOT_WRITE: "the output cannot be written: a folder not writable, the disk full, a directory or file in the way, "
    "a trace too big for Perfetto's UI (--force writes it)",
    ExitCode.UNAVAILABLE: "something the command needs is not there: a library not installed (DuckDB, Plotly, Dask), "
    "a Dask scheduler that cannot be reached, a worker process that died (out of memory, killed)",
    ExitCode.INTERNAL: "internal error: a bug in otel-titan; the traceback is printed above the error line, for a report",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C: 128 + SIGINT, as a shell says); watch ends on Ctrl-C with 0",
}

_EXIT_CODES_HELP = "exit codes:\n" + "".join(
    textwrap.fill(
        meaning, width=100, initial_indent=f"  {int(code):<4} ", subsequent_indent=" " * 7
    )
    + "\n"
    for code, meaning in EXIT_CODE_MEANINGS.items()
)


class UsageError(Exception):
    """A command line that cannot be meant, found by a command rather than by argparse
    (`ExitCode.USAGE`)."""


class QueryError(Exception):
    """DuckDB refused the query (`ExitCode.USAGE`); the message is DuckDB's, its lines kept so the
    caret still points."""


#: What each expected failure means, first match wins (a subclass before its base: `UnknownRunError`
#: is a `NoRecordsError`, `TraceTooBigError` a `ValueError`). Anything else is `ExitCode.INTERNAL`.
_FAILURES: tuple[tuple[tuple[type[BaseException], ...], ExitCode], ...] = (
    ((NoRecordsError,), ExitCode.NO_RECORDS),
    ((NotARunError, UsageError, QueryError), ExitCode.USAGE),
    ((TraceTooBigError, OSError), ExitCode.CANNOT_WRITE),
    (
        (MissingDependencyError, MissingClusterError, ClusterError, WorkerDiedError),
        ExitCode.UNAVAILABLE,
    ),
)


def _failure(error: BaseException, output: str | None = None) -> tuple[ExitCode, str]:
    """The exit code of `error` and its one line on stderr (`main` prints it): the one mapping of
    every command.

    `output` names what the command writes, for an `OSError` that names no file.

    Example:
        >>> _failure(NotARunError("outputs/x: no such file or directory"))
        (<ExitCode.USAGE: 2>, 'otel-titan: error: outputs/x: no such file or directory')
        >>> _failure(PermissionError(13, "Permission denied", "/ro/trace.json"))
        (<ExitCode.CANNOT_WRITE: 4>, 'otel-titan: error: cannot write /ro/trace.json: Permission denied')
        >>> _failure(KeyboardInterrupt())
        (<ExitCode.INTERRUPTED: 130>, 'otel-titan: interrupted')
        >>> _failure(ZeroDivisionError("division by zero"))[0]
        <ExitCode.INTERNAL: 70>
    """
    if isinstance(error, KeyboardInterrupt):
        return ExitCode.INTERRUPTED, "otel-titan: interrupted"
    code = next((code for kinds, code in _FAILURES if isinstance(error, kinds)), ExitCode.INTERNAL)
    if code is ExitCode.INTERNAL:
        what = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        return (
            code,
            "otel-titan: internal error (a bug in otel-titan; please report it with the "
            f"traceback above): {printable(what)}",
        )
    if isinstance(error, QueryError):
        # Each line escaped on its own, the line breaks kept: only DuckDB's own message keeps them
        # (a line break in a file name or a span name could otherwise forge a line of output).
        lines = [printable(line.rstrip()) for line in ("SQL: " + str(error).strip()).splitlines()]
        return code, "otel-titan: error: " + "\n".join(lines)
    if isinstance(error, OSError):
        message = (
            f"cannot write {error.filename or output or 'the output'}: {error.strerror or error}"
        )
    else:
        message = str(error)
    return code, "otel-titan: error: " + printable(message)


class _Parser(argparse.ArgumentParser):
    """argparse, with its exit on a bad command line spelled as ours (`ExitCode.USAGE`, its usual
    2)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message}\n")


_EXPORT_EPILOG = """\
examples:
  otel-titan export outputs                          # → outputs/analysis/trace.json
  otel-titan export outputs/structured_logs/X.jsonl  # one process → outputs/analysis/X.trace.json
  otel-titan export outputs/structured_logs -o /tmp/trace.json
  otel-titan export outputs --steps 100:200 --ranks 0-3,7 --sources training
  otel-titan export outputs --run RUN_ID             # another run in the same folder (default: the latest)
  otel-titan export outputs --format perfetto        # → outputs/analysis/trace.pftrace (Perfetto's native format)
  otel-titan export outputs -o /tmp/run.pftrace      # native too: chosen by the .pftrace / .perfetto-trace name
then open the file in https://ui.perfetto.dev (JSON also in chrome://tracing, speedscope).

formats: json (Chrome Trace Event JSON, any viewer) or perfetto (protobuf
TracePacket/TrackEvent with interned names: several times smaller, for big
runs; spans that never ended are slices that did not end, failed spans have
an "ERROR:" marker on their track).

layout: one process per (source, rank), sorted by source then rank; in each a
"steps" track, one track per thread, and "async slot 0..K-1" tracks for
asyncio tasks (K = peak concurrency). Spans are bars with step, tags, caller
and ids in their args; failed spans have error_type/error_message; spans that
never ended have incomplete: true and reach the process's last record.
Scalars are counter tracks. Timestamps are wall-clock µs since the epoch.
Unreadable lines are skipped with a warning naming file and line.
"""

_SUMMARIZE_EPILOG = """\
examples:
  otel-titan summarize outputs                 # tables, for a terminal
  otel-titan summarize outputs --json | jq '.processes[] | {label, last_event, last_phase}'
  otel-titan summarize outputs --run RUN_ID    # another run in the same folder (default: the latest)
  otel-titan summarize outputs --tail          # only where every process stopped, from the files' ends (seconds)
  otel-titan summarize outputs --all           # every process and every group, however many

what it shows:
  Summary         first: processes per state (closed, running, stalled, crashed,
                  terminated, hung before first record), what to look at first
                  (crashed, silent, the rank that differs, stragglers), how the
                  hosts' clocks were aligned, processes grouped by where they
                  stopped (attempt, state, step, open spans)
  Processes       per process: attempt, last step (relative step), last event and
                  its time, how long before the run's last record it went quiet,
                  whether it closed cleanly (and any signal), records lost
  Hang suspects   processes with no record since their file was created
  Where stopped   processes grouped by last event; a minority is flagged
  Open spans      spans with a _start and no _end, outermost > innermost
  Phases          per phase: count, errors, p50/p95/max ms, slowest rank and step
  Stragglers      per rank: its median step time, the other ranks' median, the
                  difference, the noise and a robust z; a straggler only on
                  evidence (>= 6 steps, >= 7.5% and >= 3.5 x noise, 5 x under
                  10%; a slowdown that starts late or comes and goes is
                  judged on its own steps: 'since step N'); the steps
                  with the largest excess; phase stragglers by the same rule
                  (step time = first record of step N to first record of step
                  N+1 on the rank); one run per folder, the latest by default
"""


_SQL_EPILOG = """\
examples:
  otel-titan sql outputs                      # the views and their columns
  otel-titan sql outputs "SELECT name, count(*), quantile_cont(duration_ms, 0.99) AS p99_ms FROM spans GROUP BY name"
  otel-titan sql outputs "SELECT * FROM processes WHERE NOT closed" --format csv > open.csv
  otel-titan sql outputs --save /tmp/run.duckdb "SELECT count(*) FROM records"   # then:
  otel-titan sql /tmp/run.duckdb "SELECT rank, max(duration_ms) FROM steps GROUP BY rank ORDER BY 2 DESC LIMIT 5"
  otel-titan sql outputs --parquet /tmp/run-parquet "SELECT 1"   # spans.parquet, scalars.parquet, ...

views: spans, instants, scalars, steps, processes; tables clock_offsets, records
(docs/sql.md: every column, and ready queries). Times are µs since the epoch,
aligned across hosts as in summarize (--no-align keeps them as written).
"""

_REPORT_EPILOG = """\
examples:
  otel-titan report outputs                   # → outputs/analysis/report.html
  otel-titan report outputs -o /tmp/run.html --run RUN_ID

The file works offline (the plotting library's JavaScript is inside; no
network request). Big runs are binned (steps and ranks) to stay small.
"""

_WATCH_EPILOG = """\
examples:
  otel-titan watch outputs                         # the screen, refreshed every 2 s
  otel-titan watch outputs --json | jq -c 'select(.type == "alert")'
  otel-titan watch outputs --exit-on hang,crashed  # beside a SLURM step: exit 3 to kill and requeue
  otel-titan watch outputs --hang-after 30 --exit-on hang:10m,crashed   # page after 30 s, kill after 10 min
  otel-titan watch outputs --once                  # one frame, then exit
  otel-titan watch outputs --wait 10m &            # started before the job: waits for its files (10 min at most)
  otel-titan watch --otlp 4318 --spool /tmp/job42 --json          # NFS or node-local files: receive over OTLP (loopback)
  otel-titan watch --otlp 0.0.0.0:4318 --otlp-token-file ~/.watch-token --otlp-tls-cert cert.pem --otlp-tls-key key.pem
                                                   # from other nodes: TLS and a token
  otel-titan watch --otlp-grpc 127.0.0.1:4317 --spool /tmp/job42    # the same, OTLP/gRPC (OTEL_EXPORTER_OTLP_PROTOCOL=grpc)

with --otlp, launch the ranks with OTEL_TITAN_OTLP_RECORDS=true and
OTEL_EXPORTER_OTLP_ENDPOINT=http(s)://THIS_HOST:PORT (or point a collector's logs there): every
record, each span's start included, arrives as an OTLP log record and is written to the spool
folder as the run's files (summarize, export and report read it afterwards). A port without a
host listens on loopback; beyond it a token is required ({token}, or --otlp-token-file), sent by
the ranks as OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20TOKEN; with TLS they also set
OTEL_EXPORTER_OTLP_CERTIFICATE=cert.pem (docs/security.md).

launch the ranks with {trigger}=RUN_DIR/dump-now (or pass --trigger) so that a
suspected hang brings every rank's black box, with the culprit's line of code, within seconds.
exit codes: 0 done (or Ctrl-C), 2 not a run (within --wait) or bad arguments, 3 an --exit-on alert was confirmed
(otel-titan --help lists every code).
"""


def _build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:

    parser = _Parser(
        prog="otel-titan",
        description="Analysis of otel-titan (and torchtitan / pimm) structured-log runs.",
        epilog="run `otel-titan COMMAND --help` for a command's options and examples.\n\n"
        + _EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"otel-titan {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    export = commands.add_parser(
        "export",
        help="write the run's trace for Perfetto (Chrome Trace JSON, or Perfetto's native format)",
        description="Convert a run's JSONL files into one trace file, Chrome Trace JSON or Perfetto's native protobuf (streaming: memory stays small for any run size).",
        epilog=_EXPORT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="run directory, its structured_logs/ folder, or one .jsonl file",
    )
    export.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="output file (default: RUN_DIR/analysis/trace.json; for one .jsonl file, analysis/<its name>.trace.json)",
    )
    export.add_argument(
        "--format",
        choices=("json", "perfetto"),
        help="json (default) or perfetto (native protobuf); default: perfetto when OUT ends in .pftrace or .perfetto-trace",
    )
    export.add_argument(
        "--steps", metavar="A:B", help="only steps A to B, both included (A:, :B and N work too)"
    )
    _add_filters(export)
    export.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="worker processes (default: one per CPU, at most 8, for runs of 64 MB or more; 1: this process only)",
    )
    _add_scheduler(
        export, "convert the files; they write their parts beside OUT, which they must see"
    )
    export.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress line (shown only when stderr is a terminal)",
    )
    export.add_argument(
        "--no-align",
        action="store_true",
        help="keep each host's clock as written (default: aligned on the step-closing collective)",
    )
    export.add_argument(
        "--force",
        action="store_true",
        help="write the trace even when it would be too big for Perfetto's UI (about 1 GB)",
    )

    summarize = commands.add_parser(
        "summarize",
        help="print where every process stopped, open spans, phase timings and stragglers",
        description="Summarize a run: the first command after a hang or a timeout. When a process stalled, was killed or did not "
        "close, a Hang section comes first: ranks grouped by where they are, the suspects named "
        "(docs/hangs.md).",
        epilog=_SUMMARIZE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    summarize.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="run directory, its structured_logs/ folder, or one .jsonl file",
    )
    summarize.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document instead of tables (for scripts and language models)",
    )
    summarize.add_argument(
        "--all",
        action="store_true",
        help="a row per process and every group (default: processes grouped when there are more than 8)",
    )
    summarize.add_argument(
        "--tail",
        action="store_true",
        help="only where every process stopped, from the ends of its files (seconds for thousands of ranks; no phases or stragglers)",
    )
    summarize.add_argument(
        "--no-align",
        action="store_true",
        help="keep each host's clock as written (default: aligned on the step-closing collective)",
    )
    summarize.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress line (shown only when stderr is a terminal)",
    )
    summarize.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="worker processes reading the files (default 1; more can help on many idle cores, at the cost of memory)",
    )
    summarize.add_argument(
        "--steps",
        metavar="A:B",
        help="judge the stragglers on steps A to B only, both included (A:, :B and N work too): "
        "to narrow a slowdown the summary found 'since step N' or 'in steps A–B only'",
    )
    _add_scheduler(summarize, "read the files")
    _add_no_cache(summarize)
    _add_filters(summarize)

    sql = commands.add_parser(
        "sql",
        help="query the run with SQL (DuckDB): spans, instants, scalars, steps, processes",
        description="Query a run with SQL: an embedded DuckDB reads the run's JSONL files in place (docs/sql.md lists the views and ready queries). "
        f"Needs DuckDB (in the project's .venv already; elsewhere: {install_hint('analysis')}).",
        epilog=_SQL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sql.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="run directory, its structured_logs/ folder, one .jsonl file, or a .duckdb file written by --save",
    )
    sql.add_argument(
        "query",
        metavar="QUERY",
        nargs="?",
        help="SQL to run ('-' reads it from stdin); without it, the views and their columns are listed",
    )
    sql.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="table (default; at most --max-rows rows), csv or json (one array, every row)",
    )
    sql.add_argument(
        "--max-rows",
        type=int,
        default=40,
        metavar="N",
        help="rows shown in a table (default 40; the count of all rows is printed)",
    )
    sql.add_argument(
        "--save",
        metavar="FILE.duckdb",
        help="also write the database (records and views) to this new file, for repeated queries: otel-titan sql FILE.duckdb QUERY",
    )
    sql.add_argument("--parquet", metavar="DIR", help="also write every view as DIR/<view>.parquet")
    sql.add_argument(
        "--no-align",
        action="store_true",
        help="keep each host's clock as written (default: aligned on the step-closing collective, as summarize)",
    )
    sql.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress line (shown only when stderr is a terminal)",
    )
    _add_scheduler(
        sql, "load the files (each worker's DuckDB reads a share, the rows come back here)"
    )
    _add_no_cache(sql)
    _add_filters(sql)

    report = commands.add_parser(
        "report",
        help="write a self-contained HTML report of the run (heatmap, phases, scalars, findings)",
        description="Write one offline HTML file with the run's pictures: headline, step-time heatmap, per-phase time by rank, "
        "scalars over steps, straggler and clock findings (summarize's: the report runs no rule "
        "of its own), from one read of the run, as summarize reads it. "
        f"Needs Plotly (in the project's .venv already; elsewhere: {install_hint('analysis')}).",
        epilog=_REPORT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="run directory, its structured_logs/ folder, or one .jsonl file",
    )
    report.add_argument(
        "-o",
        "--output",
        metavar="OUT.html",
        help="output file (default: RUN_DIR/analysis/report.html)",
    )
    report.add_argument(
        "--max-cells",
        type=int,
        default=200_000,
        metavar="N",
        help="most heatmap cells; steps and ranks are binned above it (default 200,000)",
    )
    report.add_argument(
        "--no-align",
        action="store_true",
        help="keep each host's clock as written (default: aligned, as summarize)",
    )
    report.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress line (shown only when stderr is a terminal)",
    )
    _add_no_cache(report)
    report.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="worker processes reading the files, as summarize's --jobs (default 1)",
    )
    _add_scheduler(report, "read the files (as summarize's)")
    _add_filters(report)

    watch = commands.add_parser(
        "watch",
        help="follow a running job: name the hung, crashed or slowing rank within seconds",
        description="Follow a running job from its per-rank files (only the bytes appended since the last refresh are read), or with --otlp "
        "from the records its ranks send over OTLP (for NFS and node-local folders), and name "
        "the hung, crashed, missing or slowing rank while it runs, with what it costs "
        "(docs/watch.md). On a suspected hang it "
        "touches the dump trigger file so every rank writes its black box.",
        epilog=_WATCH_EPILOG.format(trigger=OTEL_TITAN_DUMP_TRIGGER, token=OTEL_TITAN_WATCH_TOKEN),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    watch.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        nargs="?",
        help="run directory, its structured_logs/ folder, or one .jsonl file; with --otlp, the folder the received records are written to (as --spool)",
    )
    watch.add_argument(
        "--otlp",
        metavar="HOST:PORT",
        help="receive the records over OTLP/HTTP on HOST:PORT (4318 alone: loopback; port 0: any free one) from ranks launched with "
        "OTEL_TITAN_OTLP_RECORDS=true, or from a collector forwarding their logs, instead of "
        "reading their files; "
        f"beyond loopback a token is required (${OTEL_TITAN_WATCH_TOKEN} or --otlp-token-file)",
    )
    watch.add_argument(
        "--otlp-grpc",
        metavar="HOST:PORT",
        help="the same over OTLP/gRPC on HOST:PORT (127.0.0.1:4317), for ranks or collectors with OTEL_EXPORTER_OTLP_PROTOCOL=grpc; alone or beside --otlp",
    )
    watch.add_argument(
        "--otlp-token-file",
        metavar="FILE",
        help=f"with --otlp: the bearer token every request must carry (its first line), else ${OTEL_TITAN_WATCH_TOKEN}; a request without it "
        "gets 401 and changes nothing (the ranks: "
        "OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%%20TOKEN)",
    )
    watch.add_argument(
        "--otlp-tls-cert",
        metavar="FILE",
        help="with --otlp: serve TLS with this PEM certificate (chain); the ranks: https:// and OTEL_EXPORTER_OTLP_CERTIFICATE",
    )
    watch.add_argument(
        "--otlp-tls-key",
        metavar="FILE",
        help="with --otlp-tls-cert: its PEM private key (default: in the certificate's file)",
    )
    watch.add_argument(
        "--spool",
        metavar="DIR",
        help="with --otlp: where the received records are written, as a run folder (default: ./otel-titan-watch-YYYYmmdd-HHMMSS)",
    )
    watch.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between refreshes (default 2)",
    )
    watch.add_argument("--once", action="store_true", help="print one frame and exit")
    watch.add_argument(
        "--wait",
        type=_duration,
        metavar="S",
        help="started before the job: wait at most S seconds (30, 10m) for RUN_DIR to hold log files, then exit 2 "
        "(default: wait until it does, saying so on stderr; with --once: do not wait)",
    )
    watch.add_argument(
        "--json",
        action="store_true",
        help="one JSON object a line: frames, alerts, resolved alerts (docs/watch.md)",
    )
    watch.add_argument(
        "--exit-on",
        metavar="KINDS",
        help="exit with status 3 at the first confirmed alert of these kinds: hang,crashed,terminated,missing; KIND:S only once "
        "it has lasted S (hang:10m: the alert is raised at once, the job killed only if it stays "
        "hung: page early, kill late)",
    )
    watch.add_argument(
        "--hang-after",
        type=_duration,
        metavar="S",
        help="no progress for at least S seconds (30, 2m) before a hang is raised (default 8, and never under 2 steps)",
    )
    watch.add_argument(
        "--pause-after",
        type=_duration,
        metavar="S",
        help="a pause (every rank in one span never seen to finish, or the others waiting for one rank's own work, as rank 0's "
        "first checkpoint) is a hang only after S seconds (default 300)",
    )
    watch.add_argument(
        "--trigger",
        metavar="FILE",
        help=f"the dump trigger file to touch on a suspected hang (default: ${OTEL_TITAN_DUMP_TRIGGER}, else RUN_DIR/dump-now)",
    )
    watch.add_argument(
        "--no-trigger", action="store_true", help="never touch the dump trigger file"
    )
    watch.add_argument(
        "--plain",
        action="store_true",
        help="plain lines even on a terminal (no screen drawn in place)",
    )
    watch.set_defaults(ranks=None, sources=None, run=None)

    mcp = commands.add_parser(
        "mcp",
        help="serve the runs' questions to an agent as Model Context Protocol tools (stdio, or loopback HTTP)",
        description="Serve the runs under FOLDER (default: the current folder) as Model Context Protocol tools over stdio, for an agent "
        "client (Claude Desktop / Code, any MCP client) that starts it, or with --http over "
        "streamable HTTP on loopback: list_runs, diagnose, process, steps, compare, sql, live, "
        "export, "
        "each answer bounded to a budget of tokens and the records' strings kept as data "
        "(docs/agents.md). Needs the MCP SDK "
        "(in the project's .venv already; elsewhere: pip install 'otel-titan[mcp]'). The guide it "
        "serves to agents follows.",
        epilog=_MCP_EPILOG + _mcp_guide(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mcp.add_argument(
        "folders",
        metavar="FOLDER",
        nargs="*",
        help="folders whose runs are served (a run folder, or a folder of run folders); paths outside them are refused",
    )
    mcp.add_argument(
        "--http",
        metavar="HOST:PORT",
        help=f"serve over streamable HTTP on a loopback address (127.0.0.1:8765; port 0: any free one) instead of stdio; every request "
        f"must carry Authorization: Bearer ${OTEL_TITAN_MCP_TOKEN} (unset: a random token, "
        "printed on stderr with the URL)",
    )
    _add_no_cache(mcp)
    mcp.set_defaults(ranks=None, sources=None, run=None)
    return parser, {
        "export": export,
        "summarize": summarize,
        "sql": sql,
        "report": report,
        "watch": watch,
        "mcp": mcp,
    }


_MCP_EPILOG = """\
register it with a client (Claude Desktop's claude_desktop_config.json, Claude Code's .mcp.json):
  {"mcpServers": {"otel-titan": {"command": "/path/to/.venv/bin/otel-titan", "args": ["mcp", "/path/to/outputs"]}}}
or: claude mcp add otel-titan -- /path/to/.venv/bin/otel-titan mcp /path/to/outputs

"""


def _mcp_guide() -> str:
    """The guide the server gives agents (otel_titan/analysis/agents/guide.md), shown by
    ``otel-titan mcp --help``."""
    try:
        return guide_text()
    except OSError:
        return "(the guide for agents, otel_titan/analysis/agents/guide.md, is not installed)\n"


def _add_no_cache(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="read every byte again and keep nothing (default: what a read learned is kept in RUN_DIR/analysis/cache/, or, where "
        "that is not yours to write, in $XDG_CACHE_HOME/otel-titan/runs/ (~/.cache without "
        "XDG_CACHE_HOME), so that a second "
        "command on an unchanged run is not read again and a grown one only from where it was; "
        "used only when yours alone and "
        "signed with your key, bounded to 1 GiB and 30 days per folder; docs/analysis.md, "
        "docs/security.md)",
    )


def _add_scheduler(parser: argparse.ArgumentParser, work: str) -> None:
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help=f"a Dask scheduler (tcp://host:8786) whose workers {work}: the same result as here (docs/analysis.md; "
        f"needs {install_hint('cluster')}). Default: $DASK_SCHEDULER_ADDRESS unless --jobs is "
        "given",
    )


def _scheduler(args: argparse.Namespace) -> str | None:
    """--scheduler, else Dask's own DASK_SCHEDULER_ADDRESS (unless --jobs asks for local workers),
    else None: this machine."""
    if args.scheduler:
        return str(args.scheduler)
    if getattr(args, "jobs", None) is None:
        return os.environ.get("DASK_SCHEDULER_ADDRESS") or None
    return None


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", metavar="LIST", help="only these ranks, e.g. 0,3,8-11")
    parser.add_argument(
        "--sources", metavar="LIST", help="only these sources, e.g. training,rollouter"
    )
    parser.add_argument(
        "--run",
        metavar="RUN_ID",
        help="the run to read when the folder holds several (default: the latest; the output names the others)",
    )


class _Line:
    """One self-overwriting line on a terminal, cleared before anything else is printed."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.shown = False

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


class _Progress(_Line):
    """A progress line in MB read, at most 5 updates a second."""

    def __init__(self, stream: TextIO, command: str = "export") -> None:
        super().__init__(stream)
        self.command = command
        self.started = time.monotonic()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < 0.2 and done < total:
            return
        self.last = now
        rate = done / max(now - self.started, 1e-9) / 1e6
        percent = 100.0 * done / total if total else 100.0
        self.stream.write(
            f"\r{self.command}: {done / 1e6:,.1f} / {total / 1e6:,.1f} MB ({percent:.0f}%), "
            f"{rate:,.0f} MB/s\x1b[K"
        )
        self.stream.flush()
        self.shown = True


class _TextProgress(_Line):
    """`report`'s progress: a line of text."""

    def __call__(self, text: str) -> None:
        self.stream.write(f"\rreport: {text}\x1b[K")
        self.stream.flush()
        self.shown = True


class _WarningHandler(logging.Handler):
    """Skipped-line warnings on stderr, keeping a progress line intact."""

    def __init__(self, stream: TextIO, progress: _Progress | _TextProgress | None) -> None:
        super().__init__(logging.WARNING)
        self.stream, self.progress = stream, progress

    def emit(self, record: logging.LogRecord) -> None:
        if self.progress is not None:
            self.progress.clear()
        self.stream.write(f"otel-titan: warning: {printable(record.getMessage())}\n")
        self.stream.flush()


def _selection(args: argparse.Namespace, parser: argparse.ArgumentParser) -> RunSelection:
    """The run the command reads and how, from the options every reading command shares (``--run``,
    ``--ranks``, ``--sources``, ``--no-align``, ``--jobs``, ``--scheduler``, ``--no-cache``): one
    value, handed whole to `RunAnalysis`. A wrong option is a usage error naming it."""
    ranks = sources = None
    if args.ranks is not None:
        try:
            ranks = parse_rank_list(args.ranks)
        except ValueError as error:
            parser.error(f"--ranks: {error}")
    if args.sources is not None:
        sources = [s.strip() for s in args.sources.split(",") if s.strip()]
        if not sources:
            parser.error("--sources: no source names given (e.g. --sources training,rollouter)")
    jobs = getattr(args, "jobs", None)
    if jobs is not None and jobs < 1:
        parser.error(f"--jobs: must be at least 1, got {jobs}")
    return RunSelection.of(
        args.run_dir,
        run_id=args.run,
        ranks=ranks,
        sources=sources,
        align=not getattr(args, "no_align", False),
        jobs=jobs,
        scheduler=_scheduler(args) if hasattr(args, "scheduler") else None,
        cache=not getattr(args, "no_cache", False),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code.

    Example:
        >>> main(["export", "outputs", "-o", "outputs/analysis/trace.json"])
        trace: outputs/analysis/trace.json...
        <ExitCode.OK: 0>
        >>> main(["summarize", "outputs/nowhere"])
        <ExitCode.USAGE: 2>
    """
    parser, commands = _build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # `sql RUN_DIR --format csv QUERY`: argparse gives the optional QUERY up once options follow
        # RUN_DIR.
        if (
            getattr(args, "command", None) == "sql"
            and args.query is None
            and len(extra) == 1
            and (extra[0] == "-" or not extra[0].startswith("-"))
        ):
            args.query = extra[0]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    command = commands[args.command]
    selection = _selection(args, command) if args.command in _ONE_SHOT else None
    young = gc.get_threshold()
    if args.command in _ONE_SHOT or args.command == "watch":
        gc.set_threshold(max(young[0], _ONE_SHOT_YOUNG), *young[1:])
    try:
        if args.command == "watch":
            return _watch(args, command)
        if args.command == "mcp":
            return _mcp(args)
        assert selection is not None  # every reading command names its run
        if args.command == "export":
            return _export(args, command, selection)
        if args.command == "sql":
            return _sql(args, command, selection)
        if args.command == "report":
            return _report(args, command, selection)
        return _summarize(args, command, selection)
    except BrokenPipeError:
        # `otel-titan summarize run | head`: the reader left, which is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001 - every failure leaves through the one mapping
        code, line = _failure(error, getattr(args, "output", None) or getattr(args, "save", None))
        if code is ExitCode.INTERNAL:
            sys.stderr.write(
                "".join(
                    printable(text.rstrip("\n")) + "\n"
                    for text in traceback.format_exception(error)
                )
            )
        sys.stderr.write(line + "\n")
        return code
    finally:
        gc.set_threshold(*young)


#: The analysis commands that read a run, answer and exit: their graphs of facts (millions of dicts,
#: lists and floats at 1,024 ranks) live until the answer, and with the collector's default young
#: generation (700 allocations) it ran ~900 collections that free nothing (0.2 s CPU of a second
#: `summarize` at 1,024 ranks; docs/performance.md). A larger young generation only collects less
#: often (cyclic garbage waits a little longer). Restored when the command ends. `watch` too: each
#: refresh at 1,024 ranks makes ~50,000 records' dicts that live until the next, and the larger
#: young generation took its steady-state refresh from 0.75-0.77 s to 0.62-0.64 s CPU, its peak
#: memory unchanged over 200 steps (docs/performance.md).
_ONE_SHOT = frozenset({"summarize", "report", "sql", "export"})
_ONE_SHOT_YOUNG = 50_000


def _show_warnings(progress: _Progress | _TextProgress | None = None) -> Callable[[], None]:
    """Install the one path of every warning while a command runs, its workers' included
    (`workers.interpreters`); returns its undo.

    On stderr, escaped (`printable`), the progress line cleared first; never
    the raw text Python's last-resort handler would print.
    """
    logger = logging.getLogger("otel_titan.analysis")
    handler = _WarningHandler(sys.stderr, progress)
    logger.addHandler(handler)
    logger.propagate = False

    def stop() -> None:
        logger.removeHandler(handler)
        logger.propagate = True

    return stop


def _export(
    args: argparse.Namespace, parser: argparse.ArgumentParser, selection: RunSelection
) -> int:

    steps = None
    if args.steps is not None:
        try:
            steps = parse_step_range(args.steps)
        except ValueError as error:
            parser.error(f"--steps: {error}")
    progress = _Progress(sys.stderr) if not args.no_progress and sys.stderr.isatty() else None
    stop_warnings = _show_warnings(progress)
    try:
        run = RunAnalysis(selection)
        choice = run.choice()
        native = None if args.format is None else args.format == "perfetto"
        stats = run.export(
            args.output,
            steps=steps,
            progress=progress,
            max_output_bytes=None if args.force else PERFETTO_MAX_TRACE_BYTES,
            native=native,
        )
    finally:
        if progress is not None:
            progress.clear()
        stop_warnings()
    rate = stats.input_bytes / 1e6 / stats.seconds if stats.seconds > 0 else 0.0
    print(
        f"trace: {printable(stats.output_path)}"
        + (" (replaced the file that was there)" if stats.replaced else "")
    )
    print(
        f"  {plural(stats.processes, 'process')}, {plural(stats.spans, 'span')} "
        f"({stats.incomplete_spans:,} incomplete, {stats.failed_spans:,} failed), "
        f"{plural(stats.instants, 'instant')}, {plural(stats.counters, 'counter sample')}, "
        f"{plural(stats.steps, 'step bar')}, "
        f"{plural(stats.max_async_slots, 'async slot')} at most; {_size(stats.output_bytes)}"
    )
    print(
        f"  read {plural(stats.records, 'record')} ({_size(stats.input_bytes)}) in "
        f"{stats.seconds:.1f} s ({rate:,.0f} MB/s)"
        + (
            f"; {plural(stats.skipped_lines, 'unreadable line')} skipped"
            if stats.skipped_lines
            else ""
        )
        + (
            f"; {plural(stats.repaired_lines, 'line')} with invalid Unicode kept, escaped"
            if stats.repaired_lines
            else ""
        )
    )
    if choice.how != "only":
        print(f"  {printable(choice.describe())}")
    if stats.clock:
        print(f"  clocks: {printable(stats.clock)}")
    native = (
        stats.output_path.endswith((".pftrace", ".perfetto-trace")) or args.format == "perfetto"
    )
    print("  open it in https://ui.perfetto.dev" + ("" if native else " (or chrome://tracing)"))
    return ExitCode.OK


def _summarize(
    args: argparse.Namespace, parser: argparse.ArgumentParser, selection: RunSelection
) -> int:

    steps = None
    if args.steps is not None:
        if args.tail:
            parser.error(
                "--steps judges the stragglers, which --tail does not read (it reads only the "
                "files' ends)"
            )
        try:
            steps = parse_step_range(args.steps)
        except ValueError as error:
            parser.error(f"--steps: {error}")
    progress = (
        _Progress(sys.stderr, "summarize")
        if not args.no_progress and not args.tail and sys.stderr.isatty()
        else None
    )
    stop_warnings = _show_warnings(progress)
    run = RunAnalysis(selection, tail=args.tail, steps=steps, progress=progress)
    try:
        run.summary  # noqa: B018 - the read, while the progress line and the warnings' path are up
    finally:
        if progress is not None:
            progress.clear()
        stop_warnings()
    if args.json:
        sys.stdout.buffer.write(
            json_bytes(run.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"
        )
        sys.stdout.flush()
    else:
        sys.stdout.write(run.text(show_all=args.all))
    return ExitCode.OK


def _sql(args: argparse.Namespace, parser: argparse.ArgumentParser, selection: RunSelection) -> int:
    if args.max_rows < 1:
        parser.error(f"--max-rows: must be at least 1, got {args.max_rows}")
    query = sys.stdin.read() if args.query == "-" else args.query
    if query is not None and not query.strip():
        parser.error("QUERY is empty")
    saved = str(args.run_dir).endswith(".duckdb") and os.path.isfile(args.run_dir)
    if saved and (args.save or args.run or selection.ranks or selection.sources):
        parser.error(
            "--save, --run, --ranks and --sources apply to a run directory, not to a saved "
            ".duckdb file"
        )
    progress = (
        _Progress(sys.stderr, "sql") if not args.no_progress and sys.stderr.isatty() else None
    )
    stop_warnings = _show_warnings(progress)
    duckdb = None
    try:
        duckdb = require_duckdb()
        db = open_saved(args.run_dir) if saved else RunAnalysis(selection).database(save=args.save)
        if query is None and not args.save and not args.parquet:
            _print_views(db, VIEW_HELP)
            return ExitCode.OK
        if not db.loaded:
            db.load(
                (lambda percent: progress(int(percent / 100 * db.total_bytes), db.total_bytes))
                if progress is not None
                else None
            )
            if progress is not None:
                progress.clear()
                sys.stderr.write(
                    f"sql: read {plural(db.processes, 'process')} ({_size(db.total_bytes)}) in "
                    f"{db.load_seconds:.1f} s; clocks: {printable(db.clock)}\n"
                )
        if args.parquet:
            written = db.save_parquet(args.parquet)
            sys.stderr.write(
                f"sql: wrote {plural(len(written), 'Parquet file')} to {printable(args.parquet)}\n"
            )
        if args.save:
            sys.stderr.write(
                f"sql: saved the database to {printable(args.save)} (query it with: otel-titan "
                f"sql {printable(args.save)} QUERY)\n"
            )
        if query is not None:
            write_result(db.con, query, args.format, sys.stdout, max_rows=args.max_rows)
    # --save names a file that is there: a command line to change, not a disk to fix
    except FileExistsError as error:
        raise UsageError(f"--save: {error}") from error
    except Exception as error:
        if duckdb is not None and isinstance(error, duckdb.Error):
            raise QueryError(str(error)) from error
        raise
    finally:
        if progress is not None:
            progress.clear()
        stop_warnings()
    return ExitCode.OK


def _print_views(db, help_lines: dict[str, str]) -> None:
    columns = db.view_columns()
    out = ["views and tables (docs/sql.md has every column and ready queries):", ""]
    for name, cols in columns.items():
        out.append(f"{name}: {help_lines.get(name, '')}")
        out.append("  " + ", ".join(f"{c} {t}" for c, t in cols))
        out.append("")
    out.append(
        'example: otel-titan sql RUN_DIR "SELECT name, quantile_cont(duration_ms, 0.99) AS p99_ms FROM spans GROUP BY name"'
    )
    sys.stdout.write("\n".join(printable(line) for line in out) + "\n")


def _report(
    args: argparse.Namespace, parser: argparse.ArgumentParser, selection: RunSelection
) -> int:

    if args.max_cells < 100:
        parser.error(f"--max-cells: must be at least 100, got {args.max_cells}")
    progress = _TextProgress(sys.stderr) if not args.no_progress and sys.stderr.isatty() else None
    stop_warnings = _show_warnings(progress)
    try:
        result = RunAnalysis(selection).report(
            args.output, max_cells=args.max_cells, progress=progress
        )
    finally:
        if progress is not None:
            progress.clear()
        stop_warnings()
    print(
        f"report: {printable(result.path)} ({_size(result.bytes)}, "
        f"{plural(result.figures, 'figure')}; {printable(result.binning)})"
    )
    print(
        f"  {plural(result.ranks, 'rank')}, {plural(result.steps, 'step')}, read in "
        f"{result.seconds:.1f} s; open it in a browser (works offline)"
    )
    return ExitCode.OK


def _watch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        kinds = parse_exit_on(args.exit_on or "")
    except ValueError as error:
        parser.error(f"--exit-on: {error}")
    rules = Rules(
        **{
            name: value
            for name, value in (
                ("hang_floor_s", args.hang_after),
                ("shared_pause_s", args.pause_after),
            )
            if value is not None
        }
    )
    if not args.interval > 0:
        parser.error(f"--interval: must be a number of seconds > 0, got {args.interval}")
    if args.otlp is not None or args.otlp_grpc is not None:
        return _watch_otlp(args, parser, kinds, rules)
    for option in ("spool", "otlp_token_file", "otlp_tls_cert", "otlp_tls_key"):
        if getattr(args, option) is not None:
            parser.error(
                f"--{option.replace('_', '-')}: only with --otlp or --otlp-grpc (without them, "
                "watch reads RUN_DIR's files)"
            )
    if args.run_dir is None:
        parser.error("RUN_DIR is required (or --otlp HOST:PORT to receive the records over OTLP)")
    # Started before the job (the recipes in docs/watch.md): the folder appears when the first rank
    # opens its file.
    wait_s = args.wait if args.wait is not None else (0.0 if args.once else None)
    try:
        run_dir = wait_for_run(
            args.run_dir,
            wait_s=wait_s,
            say=lambda line: print(printable(line), file=sys.stderr, flush=True),
        )
    except KeyboardInterrupt:
        return ExitCode.OK
    return _follow(args, args.run_dir, run_dir, kinds, rules)


def _follow(
    args: argparse.Namespace,
    folder: str,
    trigger_beside: str,
    kinds: dict[str, float],
    rules: Rules,
    frame_facts: Callable[[], dict[str, Any]] | None = None,
) -> ExitCode:
    """`run_watch` on `folder` with the screen and alert options of `args`; the dump trigger (unless
    --no-trigger) is --trigger, else the default one of the run at `trigger_beside`."""
    trigger = None if args.no_trigger else (args.trigger or default_trigger(trigger_beside))
    return ExitCode(
        run_watch(
            folder,
            interval=args.interval,
            once=args.once,
            json_lines=args.json,
            exit_on=kinds,
            trigger=trigger,
            plain=args.plain or None,
            frame_facts=frame_facts,
            rules=rules,
        )
    )


#: A listening address asked for: (option, receiver class, host, port).
_Address = tuple[str, type[OtlpHttpReceiver], str, int]


def _watch_otlp(
    args: argparse.Namespace, parser: argparse.ArgumentParser, kinds: dict[str, float], rules: Rules
) -> int:
    """``watch --otlp HOST:PORT`` / ``--otlp-grpc HOST:PORT``: receive the records into a spool
    folder (otel_titan/receive/) and watch that folder."""
    addresses = _otlp_addresses(args, parser)
    _check_otlp_options(args, parser)
    token = _watch_token(args)
    tls = _watch_tls(args)
    _check_exposure(addresses, token, tls)
    spool = _open_spool(args)
    limits, limits_said = _receiver_limits()
    receivers: list[OtlpHttpReceiver] = []
    try:
        _start_receivers(receivers, addresses, spool, args, token=token, tls=tls, limits=limits)
        for receiver in receivers:
            _say_receiving(receiver, spool, token=token, tls=tls)
        if limits_said:
            print(limits_said, file=sys.stderr, flush=True)
        # The dump trigger reaches ranks only through a folder they see: --trigger or
        # $OTEL_TITAN_DUMP_TRIGGER (the spool is this machine's).
        return _follow(
            args, spool.folder, spool.folder, kinds, rules, lambda: receive_facts(receivers)
        )
    finally:
        for receiver in receivers:
            receiver.stop()


def _otlp_addresses(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[_Address]:
    """The addresses of --otlp (HTTP) and --otlp-grpc, in that order; a malformed one is a usage
    error naming its option."""
    addresses = []
    for option, value, kind in (
        ("--otlp", args.otlp, OtlpHttpReceiver),
        ("--otlp-grpc", args.otlp_grpc, OtlpGrpcReceiver),
    ):
        if value is not None:
            try:
                addresses.append((option, kind, *parse_address(value)))
            except ValueError as error:
                parser.error(f"{option}: {error}")
    return addresses


def _check_otlp_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Options that contradict or lack one another: the spool folder given twice, a TLS key without
    its certificate."""
    if args.run_dir is not None and args.spool is not None:
        parser.error("give the spool folder once: RUN_DIR or --spool, not both")
    if args.otlp_tls_key is not None and args.otlp_tls_cert is None:
        parser.error("--otlp-tls-key: only with --otlp-tls-cert (the certificate it is the key of)")


def _watch_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The server's TLS context from --otlp-tls-cert (and --otlp-tls-key); None without a
    certificate (clear text)."""
    if args.otlp_tls_cert is None:
        return None
    try:
        return server_tls(args.otlp_tls_cert, args.otlp_tls_key)
    except ReceiverError as error:
        raise UsageError(f"--otlp-tls-cert: {error.strerror}") from error


def _check_exposure(
    addresses: list[_Address], token: str | None, tls: ssl.SSLContext | None
) -> None:
    """Refuse to listen beyond loopback without a token, and warn when it is without TLS."""
    for option, _, host, port in addresses:
        if not is_loopback(host) and token is None:
            # Anyone who reaches the port could add records, and with --exit-on end the job: beyond
            # loopback, only with a token.
            raise UsageError(
                f"{option} {host}:{port}: listening beyond loopback needs a token "
                f"(${OTEL_TITAN_WATCH_TOKEN} or --otlp-token-file), and "
                "--otlp-tls-cert so that it does not cross the network in clear; or listen on "
                "127.0.0.1 behind a collector (docs/security.md)"
            )
        if not is_loopback(host) and tls is None:
            print(
                f"watch: warning: {option} {host}:{port} without TLS: the token and the records "
                "cross the network in clear (--otlp-tls-cert)",
                file=sys.stderr,
                flush=True,
            )


def _open_spool(args: argparse.Namespace) -> Spool:
    """The folder the records are written to: --spool, RUN_DIR, else a new one named after the
    time."""
    folder = args.spool or args.run_dir or f"otel-titan-watch-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        return Spool(folder)
    except OSError as error:
        raise UsageError(
            f"--spool: cannot create {folder}/structured_logs: {error.strerror or error}"
        ) from error


def _start_receivers(
    receivers: list[OtlpHttpReceiver],
    addresses: list[_Address],
    spool: Spool,
    args: argparse.Namespace,
    *,
    token: str | None,
    tls: ssl.SSLContext | None,
    limits: Limits,
) -> None:
    """Start a receiver per address, each added to `receivers` as it starts: the caller stops those
    started when a later one fails."""
    for option, kind, host, port in addresses:
        try:
            secure = (
                {"tls_files": (args.otlp_tls_cert, args.otlp_tls_key)}
                if kind is OtlpGrpcReceiver
                else {"tls": tls}
            )
            receivers.append(
                kind(
                    host, port, spool, token=token, limits=limits, **(secure if tls else {})
                ).start()
            )
        except ReceiverError as error:
            raise UsageError(f"{option}: {error.strerror}") from error


def _say_receiving(
    receiver: OtlpHttpReceiver, spool: Spool, *, token: str | None, tls: ssl.SSLContext | None
) -> None:
    """Where a receiver listens, and the variables that launch the ranks to send to it (a token and
    certificate as placeholders)."""
    protocol = (
        ""
        if receiver.protocol == "http/protobuf"
        else f"OTEL_EXPORTER_OTLP_PROTOCOL={receiver.protocol} "
    )
    credentials = (
        " OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<token>" if token else ""
    ) + (" OTEL_EXPORTER_OTLP_CERTIFICATE=<the certificate>" if tls else "")
    print(
        f"watch: receiving OTLP ({receiver.protocol}) on {printable(receiver.endpoint)}; launch "
        "the ranks with OTEL_TITAN_OTLP_RECORDS=true "
        f"{protocol}OTEL_EXPORTER_OTLP_ENDPOINT={printable(receiver.endpoint)}{credentials}; "
        f"records written to {printable(spool.log_dir)}",
        file=sys.stderr,
        flush=True,
    )


def _watch_token(args: argparse.Namespace) -> str | None:
    """The bearer token: the first line of --otlp-token-file, else $OTEL_TITAN_WATCH_TOKEN; None
    when neither (loopback only)."""
    if args.otlp_token_file is None:
        return os.environ.get(OTEL_TITAN_WATCH_TOKEN, "").strip() or None
    try:
        with open(args.otlp_token_file, encoding="utf-8") as handle:
            token = handle.readline().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(
            f"--otlp-token-file: cannot read {args.otlp_token_file}: "
            f"{getattr(error, 'strerror', None) or error}"
        ) from error
    if not token:
        raise UsageError(
            f"--otlp-token-file: {args.otlp_token_file} is empty (its first line is the token)"
        )
    return token


def _receiver_limits() -> tuple[Limits, str | None]:
    """The open-files soft limit raised to the hard one, the connection bound it allows, and what to
    say of it (None: nothing worth saying)."""
    before = _open_files_soft_limit()
    soft, hard = raise_open_files_limit()
    limits = Limits.for_open_files(soft)
    short = limits.max_connections < 2048
    if soft == before and not short:
        return limits, None
    raised = f" (raised from {before:,})" if soft != before else ""
    enough = (
        ""
        if not short
        else (
            "; fewer than the 2,048 that 1,024 ranks hold (records and spans): raise the hard "
            "limit (ulimit -Hn, systemd LimitNOFILE=, "
            "a container's --ulimit nofile=) to 4,096 or more; past the bound a connection gets "
            "503 and its rank retries"
        )
    )
    return limits, (
        f"watch: open files {soft:,}{raised}, hard limit "
        f"{'unlimited' if hard < 0 else f'{hard:,}'}: "
        f"at most {limits.max_connections:,} connections at once{enough}"
    )


def _open_files_soft_limit() -> int:
    import resource  # POSIX only, and only watch --otlp asks

    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _duration(text: str) -> float:
    """argparse's type for a duration option (`watch.loop.parse_seconds`): its error names the
    option."""
    try:
        return parse_seconds(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _mcp(args: argparse.Namespace) -> int:
    """``otel-titan mcp``: the MCP server over stdio (stdout is the protocol's: nothing else is
    printed there); the SDK is imported here alone."""
    folders = args.folders or [os.getcwd()]
    for folder in folders:
        if not os.path.exists(folder):
            raise UsageError(f"{folder}: no such file or directory")  # as every command says it
        if not os.path.isdir(folder):
            raise UsageError(
                f"{folder}: not a folder (FOLDER is a run folder, or a folder of run folders)"
            )
    address = _loopback(args.http) if args.http is not None else None
    stop_warnings = _show_warnings()
    try:
        if address is None:
            serve(folders, cache=not args.no_cache)
        else:
            token = os.environ.get(OTEL_TITAN_MCP_TOKEN, "").strip()
            told = "" if token else None
            token = token or secrets.token_urlsafe(24)

            def announce(url: str) -> None:
                bearer = (
                    f"the token in ${OTEL_TITAN_MCP_TOKEN}"
                    if told is not None
                    else f"token {token}"
                )
                sys.stderr.write(
                    f"mcp: serving {printable(', '.join(folders))} on {url}; every request needs "
                    f"Authorization: Bearer ({bearer})\n"
                )
                sys.stderr.flush()

            serve_http(
                folders, address[0], address[1], token, cache=not args.no_cache, announce=announce
            )
    finally:
        stop_warnings()
    return ExitCode.OK


def _loopback(text: str) -> tuple[str, int]:
    """``--http HOST:PORT`` on a loopback address only (127.0.0.0/8, ::1, localhost): the tools read
    the runs, and a token is no firewall."""
    try:
        host, port = parse_address(text, default_host="127.0.0.1")
    except ValueError as error:
        raise UsageError(f"--http: {error}") from error
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise UsageError(
            f"--http: {host} is not a loopback address (127.0.0.1, ::1 or localhost): the server "
            "answers about the runs of whoever starts it"
        )
    return ("127.0.0.1" if host == "localhost" else host), port


def _size(count: int) -> str:
    return f"{count / 1e6:,.1f} MB" if count >= 100_000 else f"{count / 1e3:,.1f} kB"


if __name__ == "__main__":  # pragma: no cover - `python -m otel_titan.cli`
    sys.exit(main())
