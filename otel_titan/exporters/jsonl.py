"""The default handler: one JSONL file per process, in torchtitan's record format.

File: ``{output_dir}/structured_logs/{source}.global_rank_{rank}.{YYYYmmdd-HHMMSS}-{6
chars}.jsonl``, rotated at ``max_file_size_mb`` into ``….jsonl.1`` … ``….jsonl.<backup_count>``.

Besides one record per span start/end, instant and scalar (see
`records.py` and docs/schema.md), the file holds three kinds of records about
the logger itself:

* ``structured_logger_opened``: first line of the file, written when the
  exporter is created (during `init_structured_logger`, before it returns), so
  a file with nothing after it belongs to a process that has recorded nothing
  since (a rank hung before its first record), never to an unwritten one;
* ``records_dropped``: written when there is room again after records were
  lost, with the totals so far (``dropped_records``: queue full,
  ``failed_records``: writes that failed) and ``value`` = the loss since the
  previous report;
* ``heartbeat``: written when the process has been quiet for 10 s with spans
  open (a hang, or a very long phase), with their count and names, so the file
  shows how long they stayed open even if the process is then SIGKILLed;
* ``structured_logger_closed``: last line of a clean shutdown, with
  ``written_records``, ``dropped_records`` and ``failed_records``. A file
  without it belongs to a process that did not finish cleanly.

A write that fails (disk full, EIO, directory gone or read-only) never reaches
the training thread: the batch is counted in ``failed_records``, one warning
is logged per episode, and writing resumes (recreating the file if it
vanished) as soon as a write succeeds again.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import string
import sys
import time
from collections.abc import Sequence
from typing import Any

from otel_titan._version import __version__
from otel_titan.core import blackbox
from otel_titan.core.exporter import (
    PipelineStats,
    SpanExportResult,
    StartAwareSpanExporter,
    TimelineItem,
    delivery_losses,
)
from otel_titan.core.identity import RunIdentity
from otel_titan.exporters.records import RecordEncoder
from otel_titan.exporters.rotating_file import RotatingFile
from otel_titan.exporters.step_rollups import StepRollups, step_rollups_on
from otel_titan.schema import Field, MetaEvent, heartbeat_fields, stacks_file_name

__all__ = [
    "JsonlSpanExporter",
    "register_jsonl_handler",
    "jsonl_file_path",
    "check_file_name",
    "opened_fields",
]

_log = logging.getLogger("otel_titan")
_ALPHABET = string.ascii_lowercase + string.digits


#: The longest date-and-random part of a file name: ``.YYYYmmdd-HHMMSS-xxxxxx.jsonl``.
_NAME_TAIL = ".YYYYmmdd-HHMMSS-xxxxxx.jsonl"


def check_file_name(output_dir: str, source: str, rank: int, backup_count: int) -> None:
    """Raise `ValueError` when this process's file names would not fit the filesystem.

    The limits are in bytes (a file name is 255 bytes on most filesystems,
    143 on eCryptfs; a path 4096): checked at init, for the longest name the
    writer will use (the oldest rotated segment ``….jsonl.<backup_count>``),
    rather than failing with ENAMETOOLONG when the file is created or rotated.

    Example:
        >>> check_file_name("/tmp", "training", 0, 3)
        >>> check_file_name("/tmp", "x" * 240, 0, 3)
        Traceback (most recent call last):
        ...
        ValueError: the JSONL file name for source 'xxxxxxxxxxxxxxxx'... (240 bytes) and rank 0 would be 285 bytes, more than the 255 bytes a file name can have in '/tmp/structured_logs': use a shorter source
    """
    directory = os.path.join(output_dir, "structured_logs")
    name = f"{source}.global_rank_{rank}{_NAME_TAIL}" + (f".{backup_count}" if backup_count else "")
    name_bytes = len(os.fsencode(name))
    path_bytes = len(os.fsencode(os.path.join(directory, name)))
    name_max, path_max = (
        _limit(directory, "PC_NAME_MAX", 255),
        _limit(directory, "PC_PATH_MAX", 4096),
    )
    source_bytes = len(source.encode("utf-8", "surrogatepass"))
    if name_bytes > name_max:
        raise ValueError(
            f"the JSONL file name for source {source[:16]!r}{'...' if len(source) > 16 else ''} "
            f"({source_bytes} bytes) and rank {rank} would be {name_bytes} bytes, "
            f"more than the {name_max} bytes a file name can have in {directory!r}: use a shorter "
            "source"
        )
    if path_bytes >= path_max:
        raise ValueError(
            f"the JSONL file path in {directory!r} would be {path_bytes} bytes, more than the "
            f"{path_max - 1} a path can have: use a shorter output_dir"
        )


def _limit(directory: str, name: str, default: int) -> int:
    try:
        value = os.pathconf(directory, name)
    except (OSError, ValueError):
        return default
    return value if value and value > 0 else default


def jsonl_file_path(output_dir: str, source: str, rank: int, now: float | None = None) -> str:
    """A new file path following torchtitan's naming rule.

    Example:
        >>> jsonl_file_path("out", "training", 3, now=0).startswith("out/structured_logs/training.global_rank_3.19700101-000000-")
        True
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    suffix = "".join(secrets.choice(_ALPHABET) for _ in range(6))
    return os.path.join(
        output_dir, "structured_logs", f"{source}.global_rank_{rank}.{stamp}-{suffix}.jsonl"
    )


class JsonlSpanExporter(StartAwareSpanExporter):
    """Write every start, end, instant and scalar as JSONL records, as they happen.

    `register_jsonl_handler` makes one per process; standalone, the file opens
    with its ``structured_logger_opened`` record and closes with ``structured_logger_closed``.

    Example:
        >>> import json, os, tempfile
        >>> from otel_titan.core.identity import discover_identity
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     exporter = JsonlSpanExporter(os.path.join(folder, "x.jsonl"), discover_identity("training", environ={}), max_bytes=128 << 20, backup_count=3)
        ...     exporter.shutdown()
        ...     with open(exporter.path) as lines:
        ...         [json.loads(line)["log_type_name"] for line in lines]
        ['structured_logger_opened', 'structured_logger_closed']
    """

    def __init__(
        self,
        path: str,
        identity: RunIdentity,
        *,
        max_bytes: int = 128 * 1024 * 1024,
        backup_count: int = 3,
        stats: PipelineStats | None = None,
        opened_fields: dict[str, Any] | None = None,
        stacks_file: bool = False,
        step_rollups: bool = True,
    ) -> None:
        self._file = RotatingFile(path, max_bytes, backup_count)  # raises OSError: init reports it
        self.path = self._file.path  # absolute
        #: The side file faulthandler writes stacks to when a C call holds the interpreter lock
        #: (core/blackbox.py): ``<file>.stacks`` (`schema.stacks_file_name`: no ``*.jsonl*`` glob
        #: takes it for a segment), opened now, since it cannot be opened then.
        self.stacks_file: Any = None
        opened_fields = dict(opened_fields or {})
        if stacks_file:
            try:
                name = stacks_file_name(os.path.basename(self.path))
                self.stacks_file = blackbox.open_side_file(
                    os.path.join(os.path.dirname(self.path), name)
                )
                opened_fields[Field.STACKS_FILE] = name
            except OSError:
                self.stacks_file = None
        self._encoder = RecordEncoder(identity)
        #: Sums each step's spans as they pass, for its ``step_rollup`` record (step_rollups.py);
        #: None = off.
        self.rollups: StepRollups | None = StepRollups() if step_rollups else None
        self._stats = stats
        #: The other exporters of the pipeline (`observe_pipeline`): their delivery losses go into
        #: the closing record.
        self._pipeline: Sequence[Any] = ()
        self._opened_fields = opened_fields or {}
        self._opened_at_ns = time.time_ns()  # the opening record carries the creation time
        self._opened = False
        self._closed = False
        self.written_records = 0
        self.failed_records = 0
        self._reported_loss = 0  # dropped + failed already reported in a records_dropped line
        self._failing_since: float | None = None
        self._rotation_warned = False
        self._pending_meta: list[bytes] = []
        # Written when init has made every exporter (`observe_pipeline`: the others may add to it,
        # as the Prometheus endpoint a taken port moved), else with the first batch.
        self._opened_size = -1

    def _write_opened(self) -> int:
        """Write the opening record now, on the thread that creates the exporter (init's).

        Returns the file's size after it. A failed write (a full disk) is not
        an init error: the record is written with the first batch instead.
        """
        line = self._encoder.meta_line(MetaEvent.OPENED, self._opened_fields, self._opened_at_ns)
        try:
            self._file.write_lines([line])
        except OSError:
            return -1
        self._opened = True
        return self._file.size

    # -- accounting ---------------------------------------------------------------------------
    @property
    def dropped_records(self) -> int:
        """Records the capture queue dropped (process-wide)."""
        return self._stats.dropped_records if self._stats is not None else 0

    def _loss_report(self) -> bytes | None:
        lost = self.dropped_records + self.failed_records
        if lost == self._reported_loss:
            return None
        line = self._encoder.meta_line(
            MetaEvent.DROPPED,
            {
                Field.VALUE: lost - self._reported_loss,
                Field.DROPPED_RECORDS: self.dropped_records,
                Field.FAILED_RECORDS: self.failed_records,
                Field.MESSAGE: f"{lost - self._reported_loss} records lost (queue full: {self.dropped_records} in total, failed writes: {self.failed_records} in total)",
                Field.LOG_LEVEL: "WARNING",
            },
        )
        self._reported_loss = lost
        return line

    # -- exporting ----------------------------------------------------------------------------
    def export_timeline(self, timeline: Sequence[TimelineItem]) -> SpanExportResult:
        """Encode and append the records of `model.timeline` (called on the processor thread)."""
        if self._closed:
            return SpanExportResult.FAILURE
        lines: list[bytes] = []
        was_opened, reported = self._opened, self._reported_loss
        if not was_opened:
            self._opened = True
            lines.append(
                self._encoder.meta_line(MetaEvent.OPENED, self._opened_fields, self._opened_at_ns)
            )
        report = self._loss_report()
        if report is not None:
            lines.append(report)
        meta = len(lines)
        self._encoder.encode_timeline(timeline, lines)
        data_records = len(lines) - meta
        if self.rollups is not None:
            self._add_rollups(self._rollups_due(timeline), lines)
        result = self._write(lines, data_records)
        if result is SpanExportResult.FAILURE:
            # The opening line and the loss report were lost with the batch: write them next time.
            self._opened, self._reported_loss = was_opened, reported
        return result

    def _rollups_due(self, timeline: Sequence[TimelineItem] | None) -> list[dict[str, Any]]:
        """The rollups `timeline` completes (None: the last ones, at shutdown); a failure turns
        rollups off, never loses the batch."""
        rollups = self.rollups
        if rollups is None:
            return []
        try:
            return rollups.observe(timeline) if timeline is not None else rollups.final("close")
        except Exception:  # noqa: BLE001 - totals are a bonus: the records they sum must still be written
            self.rollups = None
            _log.exception(
                "otel-titan: step rollups failed; %s gets no more step_rollup records (every "
                "other record is still written)",
                self.path,
            )
            return []

    def _add_rollups(self, due: list[dict[str, Any]], lines: list[bytes]) -> None:
        """Append the ``step_rollup`` lines of the steps `due` (after the records they sum)."""
        if due:
            # Stamped with the latest record it has seen, not the clock: a rollup written late
            # (SIGTERM, shutdown) never stretches the process's last timestamp, to which readers
            # extend open spans.
            at_ns = (
                self.rollups.last_us * 1000
                if self.rollups is not None and self.rollups.last_us
                else time.time_ns()
            )
            for fields in due:
                lines.append(self._encoder.rollup_line(fields, at_ns))

    def _write(self, lines: list[bytes], data_records: int) -> SpanExportResult:
        try:
            self._file.write_lines(lines)
        except OSError as error:
            self.failed_records += data_records
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                _log.warning(
                    "otel-titan: cannot write %s (%s); training continues, records are counted as "
                    "failed until a write succeeds",
                    self.path,
                    f"{errno.errorcode.get(error.errno or 0, 'error')}: {error.strerror or error}",
                )
            return SpanExportResult.FAILURE
        self.written_records += data_records
        rotation_error = self._file.rotation_error
        if rotation_error is not None and not self._rotation_warned:
            self._rotation_warned = True
            _log.warning(
                "otel-titan: cannot rotate %s (%s); writing on past max_file_size_mb until "
                "rotation works again",
                self.path,
                f"{errno.errorcode.get(rotation_error.errno or 0, 'error')}: "
                f"{rotation_error.strerror or rotation_error}",
            )
        elif rotation_error is None:
            self._rotation_warned = False
        if self._failing_since is not None:
            _log.warning(
                "otel-titan: writing %s again after %.1f s; %d records were lost meanwhile "
                "(reported in the file)",
                self.path,
                time.monotonic() - self._failing_since,
                self.failed_records,
            )
            self._failing_since = None
            report = self._loss_report()
            if report is not None:
                try:
                    self._file.write_lines([report])
                except OSError:
                    pass
        return SpanExportResult.SUCCESS

    def observe_pipeline(self, exporters: Sequence[Any], processor: Any) -> None:
        """Know the other exporters (init, before any record): write the opening record with what
        they add to it (``opened_record_fields()``: the Prometheus endpoint); what the network ones
        did not deliver goes into the closing record."""
        self._pipeline = tuple(e for e in exporters if e is not self)
        for exporter in self._pipeline:
            extra = getattr(exporter, "opened_record_fields", None)
            if callable(extra):
                try:
                    self._opened_fields.update(extra())
                except Exception:  # noqa: BLE001 - an extra field must never cost the opening record
                    pass
        if not self._opened:
            self._opened_size = self._write_opened()

    def heartbeat(self, time_ns: int, open_spans: Sequence[Any]) -> None:
        """Write a ``heartbeat`` record: alive, quiet, and still inside `open_spans`."""
        if self._closed:
            return
        line = self._encoder.meta_line(
            MetaEvent.HEARTBEAT, heartbeat_fields([span.name for span in open_spans]), time_ns
        )
        try:
            self._file.write_lines([line])
        except OSError:
            pass  # a heartbeat is best effort; the next one retries

    def black_box(self, time_ns: int, record: dict[str, Any]) -> None:
        """Write a ``stall`` record: the hang black box (core/blackbox.py; fields in
        docs/schema.md)."""
        if self._closed:
            return
        line = self._encoder.meta_line(MetaEvent.STALL, record, time_ns)
        try:
            self._file.write_lines([line])
        except OSError:
            pass  # best effort, like a heartbeat

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Writes are unbuffered: everything exported is already in the kernel."""
        return True

    def shutdown(self) -> None:
        """Write the closing record (with totals) and close the file."""
        if self._closed:
            return
        lines: list[bytes] = []
        if not self._opened:
            self._opened = True
            lines.append(
                self._encoder.meta_line(MetaEvent.OPENED, self._opened_fields, self._opened_at_ns)
            )
        report = self._loss_report()
        if report is not None:
            lines.append(report)
        if self.rollups is not None:
            # The last step has no next step to end it: written now, marked not complete, before the
            # closing line.
            self._add_rollups(self._rollups_due(None), lines)
        fields: dict[str, Any] = {
            Field.CLOSING: True,
            Field.WRITTEN_RECORDS: self.written_records,
            Field.DROPPED_RECORDS: self.dropped_records,
            Field.FAILED_RECORDS: self.failed_records,
            # Scalar values log_trace_scalar skipped (None, tensors): not records, not lost;
            # counted.
            Field.SKIPPED_VALUES: self._stats.skipped_values if self._stats is not None else 0,
            Field.MESSAGE: f"closed cleanly: {self.written_records} records written, {self.dropped_records} dropped, {self.failed_records} failed",
        }
        # What the network exporters (OTLP traces, logs, records) did not deliver, read as they stop
        # beside this one.
        losses = delivery_losses(self._pipeline)
        if losses:
            fields[Field.EXPORTER_LOSSES] = losses
            lost = [
                f"{what} {entry['dropped']} dropped, {entry['failed']} failed"
                for what, entry in losses.items()
                if entry["dropped"] or entry["failed"]
            ]
            if lost:
                fields[Field.MESSAGE] += "; not delivered: " + "; ".join(lost)
        lines.append(self._encoder.meta_line(MetaEvent.CLOSED, fields))
        try:
            self._file.write_lines(lines)
        except OSError as error:
            _log.warning(
                "otel-titan: could not write the closing record to %s: %s", self.path, error
            )
        self._closed = True
        self._file.close()
        self._close_stacks(remove_empty=True)

    def _close_stacks(self, remove_empty: bool) -> None:
        stacks, self.stacks_file = self.stacks_file, None
        if stacks is None:
            return
        try:
            stacks.close()
            if remove_empty:
                with open(stacks.name, "rb") as handle:
                    dumped = b"most recent call first" in handle.read(1 << 20)
                if not dumped:  # only thread-name notes: nothing a reader needs
                    os.unlink(stacks.name)
        except OSError:
            pass

    def discard(self) -> None:
        """Undo a construction whose init failed later: close and remove the file, if it holds
        nothing but the opening record."""
        self._closed = True
        self._file.close()
        self._close_stacks(remove_empty=True)
        try:
            if os.path.getsize(self.path) in (0, self._opened_size):
                os.unlink(self.path)
        except OSError:
            pass

    def close_after_fork(self) -> None:
        """In a forked child: forget the parent's file without writing to it."""
        self._closed = True
        self._file.close_after_fork()
        stacks, self.stacks_file = self.stacks_file, None
        if stacks is not None:
            try:
                stacks.close()
            except OSError:
                pass

    def segment_paths(self) -> list[str]:
        """This process's file segments, oldest first."""
        return self._file.segment_paths()


def opened_fields(identity: RunIdentity, options: Any) -> dict[str, Any]:
    """The fields of this process's ``structured_logger_opened`` record (the file's, and the OTLP
    records stream's: exporters/otlp_records.py).

    Example:
        >>> from types import SimpleNamespace
        >>> from otel_titan.core.identity import discover_identity
        >>> opened_fields(discover_identity("training", environ={}), SimpleNamespace(max_file_size_mb=128, backup_count=3, queue_size=65536))["message"]
        'structured logger opened for training rank 0'
    """
    return {
        Field.LIBRARY_VERSION: __version__,
        Field.PYTHON_VERSION: sys.version.split()[0],
        Field.MAX_FILE_SIZE_MB: options.max_file_size_mb,
        Field.BACKUP_COUNT: options.backup_count,
        Field.QUEUE_SIZE: options.queue_size,
        # What a silence means (watch): alive with spans open, this process writes a heartbeat after
        # this long quiet.
        **(
            {Field.HEARTBEAT_INTERVAL_S: options.heartbeat_interval_s}
            if hasattr(options, "heartbeat_interval_s")
            else {}
        ),
        Field.MESSAGE: f"structured logger opened for {identity.source} rank {identity.rank}",
        # Where this rank sits in the job's mesh (core/mesh.py): the reader compares it with its
        # peers only.
        **(
            {Field.MESH: dict(identity.mesh), Field.MESH_SHAPE: dict(identity.mesh_shape or {})}
            if identity.mesh
            else {}
        ),
    }


def register_jsonl_handler(
    *,
    identity: RunIdentity,
    output_dir: str,
    add_span_exporter: Any,
    stats: PipelineStats,
    options: Any,
    **_: Any,
) -> JsonlSpanExporter:
    """Handler factory of the default JSONL file (the default of ``TITAN_STRUCT_LOGGER_HANDLERS``).

    Named in a handler list beside others, in the job's shell (an illustration, not Python)::

        export
        OTEL_TITAN_HANDLERS=otel_titan.exporters.jsonl.register_jsonl_handler,mypkg.register_db
    """

    check_file_name(output_dir, identity.source, identity.rank, options.backup_count)
    path = jsonl_file_path(output_dir, identity.source, identity.rank)
    exporter = JsonlSpanExporter(
        path,
        identity,
        max_bytes=int(options.max_file_size_mb * 1024 * 1024),
        backup_count=options.backup_count,
        stats=stats,
        opened_fields=opened_fields(identity, options),
        stacks_file=getattr(options, "stall_after_s", None) != 0,
        step_rollups=step_rollups_on(getattr(options, "step_rollups", None)),
    )
    add_span_exporter(exporter)
    return exporter
