"""Spans → torchtitan-compatible JSONL records: the documented schema (docs/schema.md).

A started span gives a ``<name>_start`` record, a finished one ``<name>_end``
(``value`` = duration in ms), preceded by ``<name>_error`` when it failed; an
instant gives one ``log_type: "instant"`` record and a scalar span one
``metric_value`` record. Field names and meanings are torchtitan's, so its tools
read these files; otel-titan adds identity and OpenTelemetry ids.

The per-process constant fields are encoded once, at construction, and spliced
into every line; only the fields that change are encoded per record.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from otel_titan.core.capture import thread_names as capture_thread_names
from otel_titan.core.identity import RunIdentity
from otel_titan.core.titan_span import RecordKind, TitanSpan, fields_of
from otel_titan.schema import LOGGER_NAME, SCHEMA_VERSION, Field, MetaEvent

__all__ = ["RecordEncoder", "json_safe_number"]


def json_safe_number(value: Any) -> Any:
    """NaN and infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (as protobuf's
    JSON mapping does).

    Example:
        >>> json_safe_number(float("nan")), json_safe_number(1.5)
        ('NaN', 1.5)
    """
    if type(value) is float and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    return value


class RecordEncoder:
    """Encode spans of one process into JSONL lines, numbering them with ``seq_id``.

    Not thread-safe: one encoder per file, used on the processor thread.

    Example:
        >>> from otel_titan.core.identity import discover_identity
        >>> enc = RecordEncoder(discover_identity("training", environ={"TORCHELASTIC_RUN_ID": "r"}))
        >>> rec = orjson.loads(enc.meta_line("records_dropped", {"value": 3}))
        >>> rec["log_type_name"], rec["seq_id"], rec["rank"]
        ('records_dropped', 1, 0)
    """

    def __init__(self, identity: RunIdentity) -> None:
        constants: dict[str, Any] = {
            Field.SCHEMA_VERSION: SCHEMA_VERSION,
            Field.RANK: identity.rank,
            Field.GLOBAL_RANK: identity.rank,
            Field.LOCAL_RANK: identity.local_rank,
            Field.WORLD_SIZE: identity.world_size,
            Field.SOURCE: identity.source,
        }
        if identity.host_name is not None:
            constants[Field.HOST_NAME] = identity.host_name
        constants.update(
            {
                Field.PID: identity.pid,
                Field.RUN_ID: identity.run_id,
                Field.ATTEMPT: identity.attempt,
                Field.JOB_ID: identity.job_id,
                Field.LOGGER_NAME: LOGGER_NAME,
            }
        )
        if identity.run_id is None:
            # Nobody named the run: `run_id` is null, and this says which process tree the record is
            # from.
            constants[Field.PROCESS_RUN_ID] = identity.process_run_id
        self.constants = constants
        # `{...variable...,` + this + `}\n`
        self._tail = b"," + orjson.dumps(constants)[1:-1] + b"}\n"
        # A step rollup's identity: who and which attempt, no more (the file says the rest;
        # docs/schema.md).
        self._rollup_tail = (
            b","
            + orjson.dumps(
                {key: constants[key] for key in ("schema_version", "rank", "source", "attempt")}
            )[1:-1]
            + b"}\n"
        )
        self._seq = 0
        self._last_us_by_thread: dict[int, int] = {}
        # Encoded pieces of the fields a span's records share (see encode_timeline).
        self._site_fragments: dict[tuple[Any, ...], bytes] = {}
        self._step_fragments: dict[tuple[Any, ...], bytes] = {}
        # Native thread id → `threading` name, refreshed only when an unknown id shows up (a new
        # thread), so a name costs one `threading.enumerate()` per thread, not per record.
        self._thread_names: dict[int, str] = {}

    # -- encoding ---------------------------------------------------------------------------
    def _line(self, record: dict[str, Any]) -> bytes:
        self._seq += 1
        record[Field.SEQ_ID] = self._seq
        return _json(record)[:-1] + self._tail

    def meta_line(self, event: str, fields: Mapping[str, Any], time_ns: int | None = None) -> bytes:
        """A record the logger writes about itself (opened, dropped, closed)."""
        now = time.time_ns() if time_ns is None else time_ns
        record: dict[str, Any] = {
            Field.TIME: now // 1_000_000_000,
            Field.TIME_MS: now // 1_000_000,
            Field.TIME_US: now // 1_000,
            Field.LOG_TYPE: "instant",
            Field.LOG_TYPE_NAME: event,
            Field.EVENT_NAME: None,
            Field.LOG_LEVEL: "INFO",
            Field.MESSAGE: event,
        }
        record.update(fields)
        return self._line(record)

    def rollup_line(self, fields: Mapping[str, Any], time_ns: int | None = None) -> bytes:
        """A ``step_rollup`` record (`schema.rollup_fields`), with the short identity it carries."""
        now = time.time_ns() if time_ns is None else time_ns
        record: dict[str, Any] = {
            Field.TIME: now // 1_000_000_000,
            Field.TIME_MS: now // 1_000_000,
            Field.TIME_US: now // 1_000,
            Field.LOG_TYPE: "instant",
            Field.LOG_TYPE_NAME: MetaEvent.STEP_ROLLUP,
        }
        record.update(fields)
        self._seq += 1
        record[Field.SEQ_ID] = self._seq
        return _json(record)[:-1] + self._rollup_tail

    def full_record(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """`record` with the constant identity fields merged in (for logging handlers)."""
        merged = dict(record)
        merged.update(self.constants)
        return merged

    # -- records ------------------------------------------------------------------------------
    def lines(self, ended: bool, span: ReadableSpan) -> list[bytes]:
        """The JSONL lines for one timeline item (1, or 2 for a failed span)."""
        out: list[bytes] = []
        self.encode_timeline(((ended, span),), out)
        return out

    def encode_timeline(
        self, timeline: Sequence[tuple[bool, ReadableSpan]] | Any, out: list[bytes]
    ) -> None:
        """Append the JSONL lines of every ``(ended, span)`` item to `out`, in order.

        This loop is the writer thread's hot path, so it is written flat: the
        common item (a span's start, or its successful end) is encoded inline
        from pieces shared by the span's two records (encoded once, at the
        start, with the per-process constants after them); everything else
        goes through `records`, the reference that
        tests/exporters/test_records.py checks this path against.
        """
        tail = self._tail
        last_us = self._last_us_by_thread
        dumps = orjson.dumps
        append = out.append
        seq = self._seq
        sites = self._site_fragments
        steps = self._step_fragments
        for ended, span in timeline:
            # The fast path reads TitanSpan's slots directly; other spans, and
            # every record but a span's start or successful end, take `records`.
            if (
                not isinstance(span, TitanSpan)
                or span.record_kind != _SPAN
                or (ended and span._status.status_code is _ERROR)
            ):
                self._seq = seq
                for record in self.records(ended, span):
                    self._seq += 1
                    record[Field.SEQ_ID] = self._seq
                    append(_json(record)[:-1] + tail)
                seq = self._seq
                continue
            if ended:
                shared_json = span._encoded
                span._encoded = None
            else:
                shared_json = None
            if shared_json is None:
                # Three cached parts: the call site's fields (the same every
                # step), the step's fields (the same for every span of the
                # step), and the ids, which are the span's own.
                site_key = (
                    span.code_file,
                    span.code_line,
                    span.code_function,
                    span.thread_id,
                    span.task_name,
                    span.description,
                )
                site = sites.get(site_key)
                if site is None:
                    site = self._site_fragment(site_key)
                step_key = (span.step, span.relative_step, span.step_tags)
                step_part = steps.get(step_key)
                if step_part is None:
                    step_part = self._step_fragment(step_key)
                context = span._context
                parent = span._parent
                shared_json = _IDS_FORMAT % (
                    site,
                    step_part,
                    context.trace_id,
                    context.span_id,
                    b"null" if parent is None else b'"%016x"' % parent.span_id,
                    tail,
                )
                if not ended:
                    span._encoded = shared_json
            name = span._name
            step = span.step
            label = span.description or name
            prefix = "" if step is None else f"[step {step}] "
            start_time = span._start_time
            time_ns: int
            if ended:
                time_ns = span._end_time  # type: ignore[assignment]  # an ended span has its end time
                value = (time_ns - start_time) / 1e6
                type_name = f"{name}_end"
                message = f"{prefix}{label} {type_name} took {value:.3f} ms"
            else:
                time_ns = start_time
                type_name = f"{name}_start"
                message = f"{prefix}{label} {type_name}"
            tid = span.thread_id
            time_us = time_ns // 1000
            previous = last_us.get(tid)
            last_us[tid] = time_us
            seq += 1
            record = {
                _DELTA_MS: 0.0 if previous is None else (time_us - previous) / 1000,
                _TIME: time_ns // 1_000_000_000,
                _TIME_MS: time_ns // 1_000_000,
                _TIME_US: time_us,
                _LOG_TYPE_NAME: type_name,
                _MESSAGE: message,
                _SEQ_ID: seq,
            }
            if ended:
                record[_VALUE] = value
            try:
                append(dumps(record)[:-1] + shared_json)
            except (orjson.JSONEncodeError, TypeError):  # a name UTF-8 cannot carry
                append(_json(record)[:-1] + shared_json)
        self._seq = seq

    def thread_name(self, tid: Any) -> str | None:
        """The `threading` name of the thread with native id `tid` (cached), or None once it is
        gone."""
        names = self._thread_names
        name = names.get(tid)
        if name is None:
            # noted on the thread's first record, so ended threads keep their name
            name = capture_thread_names.get(tid)
            if name is not None:
                names[tid] = name
        if name is None and type(tid) is int:
            if len(names) > 4096:  # thread pools that churn: start over rather than grow
                names.clear()
            for thread in threading.enumerate():
                if thread.native_id is not None:
                    names[thread.native_id] = thread.name
            name = names.get(tid)
            if name is None:
                names[tid] = ""  # gone before its records were written: do not enumerate again
        return name or None

    def _site_fragment(self, key: tuple[Any, ...]) -> bytes:
        code_file, code_line, code_function, tid, task_name, description = key
        fields: dict[str, Any] = {
            Field.LOG_TYPE: "event",
            Field.EVENT_NAME: None,
            Field.LOG_LEVEL: "INFO",
            Field.TID: tid,
            Field.CALLER: f"{code_file}:{code_line}:{code_function}",
            Field.LOG_FILE: code_file,
            Field.LOG_FUNCTION: code_function,
        }
        thread_name = self.thread_name(tid)
        if thread_name is not None:
            fields[Field.THREAD_NAME] = thread_name
        if task_name is not None:
            fields[Field.TASK_NAME] = task_name
        if description is not None:
            fields[Field.DESCRIPTION] = description
        fragment = b"," + _json(fields)[1:-1]
        if len(self._site_fragments) > 4096:  # task names can be unbounded (one per asyncio task)
            self._site_fragments.clear()
        self._site_fragments[key] = fragment
        return fragment

    def _step_fragment(self, key: tuple[Any, ...]) -> bytes:
        step, relative_step, step_tags = key
        fields: dict[str, Any] = {}
        if step is not None:
            fields[Field.STEP] = step
        if relative_step is not None:
            fields[Field.RELATIVE_STEP] = relative_step
        if step_tags:
            fields[Field.STEP_TAGS] = step_tags
        fragment = b"," + _json(fields)[1:-1] if fields else b""
        if len(self._step_fragments) > 64:  # steps move forward: keep only recent ones
            self._step_fragments.clear()
        self._step_fragments[key] = fragment
        return fragment

    def records(self, ended: bool, span: ReadableSpan) -> list[dict[str, Any]]:
        """The records of one timeline item as dicts, without ``seq_id`` and the constant fields.

        A started span gives ``<name>_start``; an ended one ``<name>_end``
        (``value`` = duration in ms), preceded by ``<name>_error`` when it
        failed; an instant one ``log_type: "instant"`` record; a scalar span one
        ``metric_value`` record.
        """
        fields = span if isinstance(span, TitanSpan) else fields_of(span)
        # Strings shared by a span's _start and _end: made once, at the start.
        shared = span.__dict__.pop("_titan_shared", None) if ended else None
        if shared is None:
            context = span.context
            parent = span.parent
            shared = (
                f"{fields.code_file}:{fields.code_line}:{fields.code_function}",
                f"{context.trace_id:032x}" if context is not None else None,
                f"{context.span_id:016x}" if context is not None else None,
                f"{parent.span_id:016x}" if parent is not None else None,
            )
            if not ended and fields.record_kind == _SPAN:
                span.__dict__["_titan_shared"] = shared
        caller, trace_hex, span_hex, parent_hex = shared
        name = span.name
        step = fields.step
        prefix = "" if step is None else f"[step {step}] "
        kind = fields.record_kind
        value: Any = None
        event_name = None
        level = "INFO"
        error_record = None
        if kind == _SPAN:
            label = fields.description or name
            if not ended:
                time_ns = span.start_time or 0
                log_type, type_name = "event", f"{name}_start"
                message = f"{prefix}{label} {type_name}"
            else:
                start_time = span.start_time or 0
                time_ns = span.end_time or start_time
                value = (time_ns - start_time) / 1e6
                log_type, type_name = "event", f"{name}_end"
                message = f"{prefix}{label} {type_name} took {value:.3f} ms"
                if span.status.status_code is _ERROR:
                    error_type = fields.error_type or ""
                    error_message = fields.error_message or ""
                    detail = f"{error_type}: {error_message}" if error_message else error_type
                    error_record = self._record(
                        time_ns,
                        fields,
                        "event",
                        f"{name}_error",
                        None,
                        "ERROR",
                        f"{prefix}{name}_error: {detail}",
                        None,
                        shared,
                    )
                    error_record[Field.ERROR_TYPE] = error_type
                    error_record[Field.ERROR_MESSAGE] = error_message
        elif kind == _SCALAR:
            time_ns = span.start_time or 0
            event_name = fields.metric_name or name
            value = json_safe_number(fields.metric_value)
            log_type, type_name = "instant", "metric_value"
            message = f"{prefix}{event_name}={fields.metric_value}"
        else:
            time_ns = span.start_time or 0
            log_type, type_name = "instant", name
            message = f"{prefix}{name}"
        record = self._record(
            time_ns, fields, log_type, type_name, event_name, level, message, value, shared
        )
        if fields.extra:
            for key, extra in fields.extra.items():
                record.setdefault(key, extra)
        return [record] if error_record is None else [error_record, record]

    def _record(
        self,
        time_ns: int,
        fields: Any,
        log_type: str,
        type_name: str,
        event_name: str | None,
        level: str,
        message: str,
        value: Any,
        shared: tuple[Any, ...],
    ) -> dict[str, Any]:
        time_us = time_ns // 1000
        tid = fields.thread_id
        last = self._last_us_by_thread
        previous = last.get(tid)
        last[tid] = time_us
        caller, trace_hex, span_hex, parent_hex = shared
        record: dict[str, Any] = {
            Field.DELTA_MS: 0.0 if previous is None else (time_us - previous) / 1000,
            Field.TID: tid,
            Field.TIME: time_ns // 1_000_000_000,
            Field.TIME_MS: time_ns // 1_000_000,
            Field.TIME_US: time_us,
            Field.LOG_TYPE: log_type,
            Field.LOG_TYPE_NAME: type_name,
            Field.EVENT_NAME: event_name,
            Field.CALLER: caller,
            Field.LOG_FILE: fields.code_file,
            Field.LOG_FUNCTION: fields.code_function,
            Field.LOG_LEVEL: level,
            Field.MESSAGE: message,
            Field.TRACE_ID: trace_hex,
            Field.SPAN_ID: span_hex,
            Field.PARENT_SPAN_ID: parent_hex,
        }
        if value is not None:
            record[Field.VALUE] = value
        if fields.step is not None:
            record[Field.STEP] = fields.step
        if fields.relative_step is not None:
            record[Field.RELATIVE_STEP] = fields.relative_step
        if fields.step_tags:
            record[Field.STEP_TAGS] = fields.step_tags
        thread_name = self.thread_name(tid)
        if thread_name is not None:
            record[Field.THREAD_NAME] = thread_name
        if fields.task_name is not None:
            record[Field.TASK_NAME] = fields.task_name
        if fields.description is not None:
            record[Field.DESCRIPTION] = fields.description
        return record


_SPAN = RecordKind.SPAN
_SCALAR = RecordKind.SCALAR
_ERROR = StatusCode.ERROR
# The hot path's field names as module globals: each use is one specialised global load (a class
# attribute, `Field.TIME_US`, would be a lookup per use, per record).
_DELTA_MS, _TIME, _TIME_MS, _TIME_US, _LOG_TYPE_NAME, _MESSAGE, _SEQ_ID, _VALUE = (
    Field.DELTA_MS,
    Field.TIME,
    Field.TIME_MS,
    Field.TIME_US,
    Field.LOG_TYPE_NAME,
    Field.MESSAGE,
    Field.SEQ_ID,
    Field.VALUE,
)
#: The ids' part of a span record: site, step, the three ids, then the per-process tail.
_IDS_FORMAT = f'%b%b,"{Field.TRACE_ID}":"%032x","{Field.SPAN_ID}":"%016x","{Field.PARENT_SPAN_ID}":%b%b'.encode()


def _json(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        # Lone surrogates and other strings UTF-8 cannot carry: the standard
        # library escapes them (\udXXX), and they read back unchanged.
        return json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=str).encode()
