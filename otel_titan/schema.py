"""The file format, defined once: what the writer (`exporters/`) writes and the reader (`analysis/`)
reads.

A leaf module, standard library only, so that both sides (and the CLI, which
must start without loading OpenTelemetry) can import it. The writer's record
encoder and file (`exporters.records`, `exporters.jsonl`) write every field
under its `Field` name, the reader's record layer (`analysis.read`: lines,
records, runs, tails) reads them by the same names, and both name the logger's
own records by `MetaEvent`: tests/test_schema.py checks that a real run writes
no field `Field` lacks, that docs/schema.md lists every one, and that none of
those modules spells a field out. ``closed_cleanly`` (summary) compares the
logger name the writer wrote with `LOGGER_NAME`, this very string.

Example:
    >>> from otel_titan import schema
    >>> schema.MetaEvent.CLOSED in schema.META_EVENTS
    True
    >>> sorted(schema.META_EVENTS)[0]
    'heartbeat'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "SCHEMA_VERSION",
    "LOGGER_NAME",
    "RecordKind",
    "MetaEvent",
    "META_EVENTS",
    "LOGGER_FIGURES_FILE",
    "is_logger_record",
    "Field",
    "FIELDS",
    "ATTR",
    "INT64_MIN",
    "INT64_MAX",
    "MAX_LINE_BYTES",
    "stacks_file_name",
    "MESH_DIMS",
    "DATA_PARALLEL_PREFIX",
    "OtlpRecords",
    "ROLLUP_VERSION",
    "RollupField",
    "StepCloser",
    "rollup_fields",
    "HEARTBEAT_NAMES_KEPT",
    "heartbeat_fields",
]

#: Bumped when a field changes meaning or disappears (adding fields does not bump it).
SCHEMA_VERSION = 1

#: ``logger_name`` of every record the library writes, and the name of the
#: `logging.Logger` handed to factories for torchtitan-style handlers.
LOGGER_NAME = "otel_titan.structured_logger"

#: Signed 64-bit bounds: OpenTelemetry int attributes and the file's integers (steps, metric
#: values).
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: The longest record line readers take (16 MiB): a longer "line" is skipped (a file of binary
#: garbage without newlines), and `watch --otlp` refuses a record longer than this (413) rather than
#: write what its follower skips.
MAX_LINE_BYTES = 16 << 20


#: The parallelism dimensions a job can declare (`init_structured_logger(mesh=...)`), and the record
#: fields ``mesh`` (this rank's coordinate per dimension) and ``mesh_shape`` (each dimension's size)
#: hold them.
MESH_DIMS = ("pp", "dp", "cp", "tp", "ep")
#: Dimensions whose names start with this are data-parallel: ranks that differ only in them do the
#: same work (``dp``, torchtitan's ``dp_replicate``, ``dp_shard``), so the straggler analysis
#: compares them.
DATA_PARALLEL_PREFIX = "dp"


class RecordKind:
    """What a span stands for: values of the ``titan.record_kind`` attribute."""

    SPAN = "span"
    INSTANT = "instant"
    SCALAR = "scalar"


class MetaEvent:
    """``log_type_name`` of the records the logger writes about itself (docs/schema.md)."""

    OPENED = "structured_logger_opened"
    DROPPED = "records_dropped"
    SIGNAL_RECEIVED = "signal_received"
    #: An exception nothing caught (``sys.excepthook``, ``threading.excepthook``): its type, message
    #: and where it was raised.
    UNCAUGHT_EXCEPTION = "uncaught_exception"
    HEARTBEAT = "heartbeat"
    STALL = "stall"
    CLOSED = "structured_logger_closed"
    #: One per rank and step, written by the background thread: the step's totals (`rollup_fields`).
    STEP_ROLLUP = "step_rollup"
    #: This rank's mesh coordinates found after init (``mesh``, ``mesh_shape``): a torch DeviceMesh
    #: the program did not pass in.
    MESH_FOUND = "mesh_found"


#: The logger's own records: the reader shows them as process-level markers, never as phases
#: (a step rollup sums spans already in the file: it is never a phase, an instant or progress).
META_EVENTS = frozenset(
    {
        MetaEvent.OPENED,
        MetaEvent.DROPPED,
        MetaEvent.SIGNAL_RECEIVED,
        MetaEvent.UNCAUGHT_EXCEPTION,
        MetaEvent.HEARTBEAT,
        MetaEvent.STALL,
        MetaEvent.CLOSED,
        MetaEvent.STEP_ROLLUP,
        MetaEvent.MESH_FOUND,
    }
)

#: The ``log_file`` of the per-step process figures the logger writes itself (scalars,
#: docs/schema.md "Memory and process figures"): the file of the code that writes them, relative or
#: absolute as any caller.
LOGGER_FIGURES_FILE = "otel_titan/core/step_sampler.py"


def is_logger_record(record: dict[str, Any]) -> bool:
    """Whether a record is the logger's own (`META_EVENTS`, or one of its per-step figures), not the
    program's.

    Example:
        >>> is_logger_record({"log_type_name": "heartbeat"})
        True
        >>> is_logger_record({"log_type_name": "metric_value", "log_file": "/site-packages/otel_titan/core/step_sampler.py"})
        True
        >>> is_logger_record({"log_type_name": "metric_value", "log_file": "train.py"})
        False
    """
    name = record.get(Field.LOG_TYPE_NAME)
    if name in META_EVENTS:
        return True
    log_file = record.get(Field.LOG_FILE)
    return (
        name == "metric_value"
        and isinstance(log_file, str)
        and log_file.endswith(LOGGER_FIGURES_FILE)
    )


class OtlpRecords:
    """The records over OTLP (``OTEL_TITAN_OTLP_RECORDS=true``): one log record per JSONL record,
    for `otel-titan watch --otlp`.

    The writer (exporters/otlp_records.py) and the receiver (receive/decode.py)
    agree on these names and on nothing else: ``body`` is the JSONL line itself
    (a JSON object as a string), ``time_unix_nano`` the record's time.
    """

    #: Instrumentation scope of the log records.
    SCOPE = "otel_titan.records"
    #: The process's file name under the schema's naming rule: the receiver writes its records to
    #: that file.
    FILE = "otel_titan.file"
    #: The record's ``seq_id``: orders the records, tells a duplicate (a retry) or a loss (a gap).
    SEQ = "otel_titan.seq"
    #: The record's ``log_type_name`` (for a collector's routing or filtering).
    RECORD = "otel_titan.record"


def stacks_file_name(jsonl_name: str) -> str:
    """The faulthandler side file's name beside a JSONL file: its ``.jsonl`` suffix replaced by
    ``.stacks``.

    Never ``<file>.jsonl.stacks``: readers that glob ``*.jsonl*`` to take in
    rotated segments (``X.jsonl.1``) would read the side file's text as JSONL.
    The writer names it in the opening record's ``stacks_file`` field; readers
    use this rule only when that record is gone (rotated away).

    Example:
        >>> stacks_file_name("training.global_rank_0.20260101-000000-abcdef.jsonl")
        'training.global_rank_0.20260101-000000-abcdef.stacks'
        >>> stacks_file_name("mine.log")
        'mine.log.stacks'
    """
    stem = jsonl_name[: -len(".jsonl")] if jsonl_name.endswith(".jsonl") else jsonl_name
    return stem + ".stacks"


class Field:
    """The name of every field of a record, and of the logger's own records' fields
    (docs/schema.md's table, the same list).

    The writer (`exporters.records`, `exporters.jsonl`) writes these names and
    the reader (`analysis.read`) reads them, both through this class:
    tests/test_schema.py checks that every field a real run writes is here, that
    docs/schema.md lists every one, and that neither side spells one out.
    The black box's ``stall`` record has fields of its own (docs/schema.md,
    `core.blackbox`); ``run_config``'s are `structured_logger.run_config`'s.
    """

    # -- every record --------------------------------------------------------------------------
    SCHEMA_VERSION = "schema_version"
    LOG_TYPE = "log_type"
    LOG_TYPE_NAME = "log_type_name"
    EVENT_NAME = "event_name"
    VALUE = "value"
    TIME = "time"
    TIME_MS = "time_ms"
    TIME_US = "time_us"
    LOG_LEVEL = "log_level"
    MESSAGE = "message"
    SEQ_ID = "seq_id"
    # The process's identity (the same on every record of a file).
    RANK = "rank"
    GLOBAL_RANK = "global_rank"
    LOCAL_RANK = "local_rank"
    WORLD_SIZE = "world_size"
    SOURCE = "source"
    HOST_NAME = "host_name"
    PID = "pid"
    RUN_ID = "run_id"
    PROCESS_RUN_ID = "process_run_id"
    ATTEMPT = "attempt"
    JOB_ID = "job_id"
    LOGGER_NAME = "logger_name"
    # -- span, instant and scalar records ------------------------------------------------------
    DELTA_MS = "delta_ms"
    TID = "tid"
    THREAD_NAME = "thread_name"
    TASK_NAME = "task_name"
    DESCRIPTION = "description"
    CALLER = "caller"
    LOG_FILE = "log_file"
    LOG_FUNCTION = "log_function"
    STEP = "step"
    RELATIVE_STEP = "relative_step"
    STEP_TAGS = "step_tags"
    TRACE_ID = "trace_id"
    SPAN_ID = "span_id"
    PARENT_SPAN_ID = "parent_span_id"
    ERROR_TYPE = "error_type"
    ERROR_MESSAGE = "error_message"
    #: On ``uncaught_exception``: where it was raised, innermost frame first
    #: (``["path:line:function", ...]``, at most 16).
    ERROR_FRAMES = "error_frames"
    #: On ``uncaught_exception``: True when it ended the program (the main thread's), False for
    #: another thread's.
    FATAL = "fatal"
    # -- the logger's own records (MetaEvent) ----------------------------------------------------
    LIBRARY_VERSION = "otel_titan_version"
    PYTHON_VERSION = "python_version"
    MAX_FILE_SIZE_MB = "max_file_size_mb"
    BACKUP_COUNT = "backup_count"
    QUEUE_SIZE = "queue_size"
    #: On ``structured_logger_opened``: the heartbeat's interval (0: none). A reader that sees it
    #: knows a process alive with spans open writes a ``heartbeat`` after that long quiet, so
    #: silence from every one means they are gone.
    HEARTBEAT_INTERVAL_S = "heartbeat_interval_s"
    MESH = "mesh"
    MESH_SHAPE = "mesh_shape"
    STACKS_FILE = "stacks_file"
    OPEN_SPANS = "open_spans"
    OPEN_SPAN_NAMES = "open_span_names"
    DROPPED_RECORDS = "dropped_records"
    FAILED_RECORDS = "failed_records"
    WRITTEN_RECORDS = "written_records"
    SKIPPED_VALUES = "skipped_values"
    EXPORTER_LOSSES = "exporter_losses"
    METRICS_ENDPOINT = "metrics_endpoint"
    CLOSING = "closing"
    SIGNAL = "signal"
    SIGNAL_NUMBER = "signal_number"


#: Every field name of `Field`, for checks ("is this a record field?").
FIELDS = frozenset(value for name, value in vars(Field).items() if name.isupper())


class ATTR:
    """OpenTelemetry attribute names used on spans (see docs/schema.md)."""

    RECORD_KIND = "titan.record_kind"
    STEP = "titan.step"
    RELATIVE_STEP = "titan.relative_step"
    STEP_TAGS = "titan.step_tags"
    DESCRIPTION = "titan.description"
    TASK_NAME = "titan.task_name"
    METRIC_NAME = "titan.metric.name"
    METRIC_VALUE = "titan.metric.value"
    CODE_FILE = "code.file.path"
    CODE_LINE = "code.line.number"
    CODE_FUNCTION = "code.function.name"
    THREAD_ID = "thread.id"
    ERROR_TYPE = "error.type"
    #: Prefix of fields the logger adds to its own instants (``titan.extra.signal``).
    EXTRA_PREFIX = "titan.extra."
    #: Resource attributes: this rank's coordinate in each mesh dimension (``titan.mesh.pp``), each
    #: size (``titan.mesh_shape.pp``).
    MESH_PREFIX = "titan.mesh."
    MESH_SHAPE_PREFIX = "titan.mesh_shape."
    #: On a span that was still open at shutdown or SIGTERM (its end is when the process stopped).
    INCOMPLETE = "titan.incomplete"


# -- step rollups ---------------------------------------------------------------------------------
#: Version of the ``step_rollup`` record's own fields (bumped when one changes meaning or
#: disappears). 2: ``late_spans`` (its absence means 0; in version 1 it meant "not counted", so a
#: version-1 file cannot promise that its rollups hold every span: readers answer from its spans).
ROLLUP_VERSION = 2


class RollupField:
    """Fields of a ``step_rollup`` record (docs/schema.md, "Step rollups")."""

    VERSION = "rollup_version"
    #: True when the step is over: the next step began (``end_us`` is then that step's begin).
    COMPLETE = "complete"
    #: ``"next_step"``, ``"close"`` (the last step, at a clean shutdown) or ``"signal"`` (SIGTERM).
    ENDED_BY = "ended_by"
    BEGIN_US = "begin_us"
    END_US = "end_us"
    DURATION_MS = "duration_ms"
    #: ``{span name: [count, total µs]}`` over the step's spans that ended.
    PHASES = "phases"
    #: The step-closing span (`StepCloser`): ``{"name", "start_us", "end_us"}``, or absent.
    CLOSING = "closing"
    #: Spans of the step still open when the record was written (not in ``phases``).
    OPEN_SPANS = "open_spans"
    #: Spans of this file so far that ended after their step's rollup was written (in no rollup's
    #: ``phases``): cumulative.
    LATE_SPANS = "late_spans"


class StepCloser:
    """Which span closes each step, the one rule for the writer's rollups and the reader's analysis.

    The *step-closing span* of step N on a process is the last top-level span
    (no parent) of step N to end before step N+1 begins, in the order the
    records were written. In synchronous training it is the collective every
    rank leaves together (an all-reduce, a barrier): the reader checks that
    (`analysis.model.clocks` keeps a name only if its ends agree across ranks),
    the writer cannot. Feed it every span end; ask for a step's span when the
    next step begins.

    Example:
        >>> closer = StepCloser()
        >>> closer.span_ended(5, "fwd", 10, 20, top_level=True)
        >>> closer.span_ended(5, "inner", 21, 22, top_level=False)
        >>> closer.span_ended(5, "all_reduce", 25, 40, top_level=True)
        >>> closer.closing(5), closer.closing(6)
        (('all_reduce', 25, 40), None)
    """

    __slots__ = ("step", "name", "start_us", "end_us")

    def __init__(self) -> None:
        self.step: int | None = None
        self.name = ""
        self.start_us = 0
        self.end_us = 0

    def span_ended(
        self, step: int | None, name: str, start_us: int, end_us: int, top_level: bool
    ) -> None:
        """A span of `step` ended (a span with no step, or a nested one, never closes a step)."""
        if top_level and step is not None:
            self.step, self.name, self.start_us, self.end_us = step, name, start_us, end_us

    def closing(self, step: int) -> tuple[str, int, int] | None:
        """``(name, start_us, end_us)`` of the span that closed `step` so far, or None."""
        return (self.name, self.start_us, self.end_us) if self.step == step else None


#: A heartbeat names this many of its open spans, the innermost.
HEARTBEAT_NAMES_KEPT = 8


def heartbeat_fields(open_span_names: Sequence[str]) -> dict[str, Any]:
    """The fields of a ``heartbeat`` record besides the logger's own (the processor writes one
    each interval while the process is alive and quiet with spans open; docs/schema.md), in the
    order the writer writes them: `open_span_names`, outermost first.

    Example:
        >>> heartbeat_fields(["step", "fwd_bwd"])
        {'message': 'alive, 2 span(s) open: step, fwd_bwd', 'open_spans': 2, 'open_span_names': ['step', 'fwd_bwd']}
    """
    names = list(open_span_names[-HEARTBEAT_NAMES_KEPT:])
    count = len(open_span_names)
    return {
        Field.MESSAGE: f"alive, {count} span(s) open: {', '.join(names)}",
        Field.OPEN_SPANS: count,
        Field.OPEN_SPAN_NAMES: names,
    }


def rollup_fields(
    step: int,
    begin_us: int,
    end_us: int,
    phases: dict[str, list[int]],
    closing: tuple[str, int, int] | None,
    *,
    complete: bool,
    ended_by: str,
    open_spans: int = 0,
    step_tags: tuple[str, ...] | list[str] = (),
    late_spans: int = 0,
) -> dict[str, object]:
    """The fields of one ``step_rollup`` record (without time, identity and ``seq_id``), as every
    writer spells them.

    Example:
        >>> fields = rollup_fields(5, 1000, 3500, {"fwd": [2, 1800]}, ("all_reduce", 3000, 3400), complete=True, ended_by="next_step")
        >>> fields["duration_ms"], fields["phases"], fields["closing"]["name"], fields["message"]
        (2.5, {'fwd': [2, 1800]}, 'all_reduce', '[step 5] step_rollup 2.500 ms')
    """
    duration_ms = round((end_us - begin_us) / 1000.0, 3)
    fields: dict[str, object] = {
        RollupField.VERSION: ROLLUP_VERSION,
        Field.STEP: step,
        RollupField.COMPLETE: complete,
        RollupField.ENDED_BY: ended_by,
        RollupField.BEGIN_US: begin_us,
        RollupField.END_US: end_us,
        RollupField.DURATION_MS: duration_ms,
        RollupField.PHASES: phases,
        "message": f"[step {step}] {MetaEvent.STEP_ROLLUP} {duration_ms:.3f} ms"
        + ("" if complete else f" ({ended_by}, step not over)"),
    }
    if closing is not None:
        fields[RollupField.CLOSING] = {
            "name": closing[0],
            "start_us": closing[1],
            "end_us": closing[2],
        }
    if open_spans:
        fields[RollupField.OPEN_SPANS] = open_spans
    if late_spans:
        fields[RollupField.LATE_SPANS] = late_spans
    if step_tags:
        fields[Field.STEP_TAGS] = list(step_tags)
    return fields
