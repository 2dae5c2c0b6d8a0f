"""OTLP protobuf for `TitanSpan`s, assembled from cached wire-format fragments.

Why: the OpenTelemetry SDK's encoder (``encode_spans``) builds a protobuf
message attribute by attribute in Python, about 25 µs of CPU per span, on a
thread that shares the interpreter lock with training. Most of what it encodes
never changes between spans: the Resource and scope once per process, the
call-site attributes (record kind, ``code.*``, ``thread.id``) once per call
site and thread, the step attributes (``titan.step``, ``titan.relative_step``,
``titan.step_tags``) once per step. This module encodes each of those pieces
once, keeps the bytes, and joins a span's message from them plus what is its
own (ids, name, times, status, events), a few microseconds per span.

The bytes mean exactly what the SDK's ``encode_spans(spans).SerializeToString()``
means (same messages, fields and values; tests/exporters/test_otlp_encoder.py
decodes both and compares them field by field). Protobuf repeated fields may be
concatenated, so a batch mixing `TitanSpan`s with other SDK spans is our bytes
for ours followed by the SDK's bytes for the rest; a `TitanSpan` carrying
something this encoder does not know (an attribute value of a type outside
OTLP's, an integer beyond 64 bits) goes to the SDK encoder too, which handles
(and logs) it its own way.

One span never costs the batch. Protobuf strings must be valid UTF-8, and a
Python str need not be: a file name decoded with ``surrogateescape`` holds lone
surrogates. Every string is encoded with ``backslashreplace``, so such a
character arrives as its escape (``\\udcff``), the text the JSONL writer
writes for it (records.py) and the Perfetto export gives it. A span that still
cannot be encoded, by this encoder or the SDK's, is left out alone, counted in
`OtlpSpanEncoder.dropped_spans` and warned about once; the rest of its batch
goes.

Wire format reference: opentelemetry/proto/trace/v1/trace.proto,
common/v1/common.proto; https://protobuf.dev/programming-guides/encoding/.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common._internal import (
    _encode_instrumentation_scope,
    _encode_resource,
)
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import DEFAULT_TRACE_STATE, SpanKind, StatusCode

from otel_titan.core.titan_span import ATTR, TitanSpan
from otel_titan.core.warn_once import WarnOnce

__all__ = ["OtlpSpanEncoder", "encode_varint"]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_UINT64 = (1 << 64) - 1
_log = logging.getLogger("otel_titan")


def _utf8(text: str) -> bytes:
    """`text` as UTF-8, a lone surrogate (``surrogateescape``'d bytes) as its escape ``\\udcXX``:
    protobuf strings must be valid UTF-8.

    Example:
        >>> _utf8("shard_\\udcff.bin"), _utf8("step")
        (b'shard_\\\\udcff.bin', b'step')
    """
    return text.encode("utf-8", "backslashreplace")


def encode_varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer below 2**64.

    Example:
        >>> encode_varint(1), encode_varint(300)
        (b'\\x01', b'\\xac\\x02')
    """
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_VARINTS = [encode_varint(n) for n in range(1 << 14)]


def _varint(value: int) -> bytes:
    return _SMALL_VARINTS[value] if value < 16384 else encode_varint(value)


def _len_field(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


class _Unsupported(Exception):
    """A value this encoder does not handle: the span goes to the SDK encoder."""


_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_times = struct.Struct("<BQBQ").pack  # start (field 7) and end (field 8), both fixed64


def _any_value(value: Any) -> bytes:
    """An ``AnyValue`` message, as the SDK's ``_encode_value`` would build it."""
    if value is None:
        return b""
    if value is True:
        return b"\x10\x01"
    if value is False:
        return b"\x10\x00"
    cls = type(value)
    if cls is str:
        return _len_field(b"\x0a", _utf8(value))
    if cls is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _Unsupported(value)
        return b"\x18" + encode_varint(value & _UINT64)
    if cls is float:
        return b"\x21" + _pack_double(value)
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _len_field(b"\x0a", _utf8(str(value)))
    if isinstance(value, int):
        return _any_value(int(value))
    if isinstance(value, float):
        return _any_value(float(value))
    if isinstance(value, bytes):
        return _len_field(b"\x3a", value)
    if isinstance(value, (list, tuple)):
        return _len_field(
            b"\x2a", b"".join(_len_field(b"\x0a", _any_value(item)) for item in value)
        )
    raise _Unsupported(value)


def _key_value(key: str, value: Any) -> bytes:
    """A ``KeyValue`` message (key, value)."""
    return _len_field(b"\x0a", _utf8(key)) + _len_field(b"\x12", _any_value(value))


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Repeated ``KeyValue`` field `tag` for every attribute, in the mapping's order."""
    if not attributes:
        return b""
    return b"".join(_len_field(tag, _key_value(key, value)) for key, value in attributes.items())


_SPAN_ATTR = b"\x4a"  # Span.attributes = 9
_EVENT_ATTR = b"\x1a"  # Span.Event.attributes = 3
_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)  # Span.flags = 16 (fixed32): HAS_IS_REMOTE
_FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x300)  # HAS_IS_REMOTE | IS_REMOTE
_EMPTY_STATUS = b"\x7a\x00"  # Span.status = 15, always present (as the SDK sends it)
_TAIL_LOCAL = _EMPTY_STATUS + _FLAGS_LOCAL
_TAIL_REMOTE = _EMPTY_STATUS + _FLAGS_REMOTE
_DEFAULT_TRACE_STATE = DEFAULT_TRACE_STATE
# Span.kind = 6 (proto enum = SDK value + 1)
_KIND = {kind: b"\x30" + _varint(kind.value + 1) for kind in SpanKind}


def _resource_message(resource: Any) -> bytes:
    """The ``Resource`` message: the SDK's own encoding, or ours with strings escaped where one is
    not valid UTF-8.

    (The SDK would log a traceback and leave such an attribute out: an
    ``OTEL_RESOURCE_ATTRIBUTES`` value holding bytes that are not UTF-8, say.)
    """
    if any(
        not _valid_utf8(key) or (type(value) is str and not _valid_utf8(value))
        for key, value in resource.attributes.items()
    ):
        return _attributes(b"\x0a", resource.attributes)
    encoded: bytes = _encode_resource(resource).SerializeToString()
    return encoded


def _valid_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(text: str) -> str:
    return _utf8(text).decode("utf-8")


class OtlpSpanEncoder:
    """Encode spans to an ``ExportTraceServiceRequest``'s bytes; caches what repeats.

    One instance per exporter; not thread-safe (the exporter's own thread uses it).
    Caches are bounded: each is cleared when it reaches `MAX_CACHE` entries.

    Example:
        >>> from opentelemetry.sdk.trace import TracerProvider
        >>> from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        >>> span = TracerProvider().get_tracer("doc").start_span("plain"); span.end()
        >>> data = OtlpSpanEncoder().encode([span])   # not a TitanSpan: the SDK's encoder does it
        >>> ExportTraceServiceRequest.FromString(data).resource_spans[0].scope_spans[0].spans[0].name
        'plain'
    """

    MAX_CACHE = 4096

    def __init__(self) -> None:
        self._heads: dict[type, tuple[Any, ...]] = {}
        self._sites: dict[tuple[Any, ...], bytes] = {}
        self._steps: dict[tuple[Any, ...], bytes] = {}
        self._names: dict[tuple[str, Any], bytes] = {}
        self._shapes: dict[tuple[Any, ...], bytes] = {}
        self._traces: dict[int, bytes] = {}
        self._kvs: dict[tuple[str, Any], bytes] = {}
        #: Spans encoded here, and spans handed to the SDK's encoder (not TitanSpans, or unsupported
        #: values).
        self.fast_spans = 0
        self.sdk_spans = 0
        #: Spans left out because neither encoder could encode them (each kind of failure is warned
        #: about once).
        self.dropped_spans = 0
        self._warned = WarnOnce(limit=64)

    # -- the request -------------------------------------------------------------------------
    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        """The serialized ``ExportTraceServiceRequest`` for `spans`."""
        groups: dict[type, list[bytes]] = {}
        others: list[ReadableSpan] = []
        encode_span = self.encode_span
        for span in spans:
            if isinstance(span, TitanSpan):
                try:
                    data = encode_span(span)
                except Exception:  # noqa: BLE001 - _Unsupported, or a value no one foresaw: the SDK's encoder tries it
                    others.append(span)
                    continue
                group = groups.get(type(span))
                if group is None:
                    group = groups[type(span)] = []
                group.append(data)
            else:
                others.append(span)
        out = []
        for cls, group in groups.items():
            try:
                _resource, _scope, resource_head, scope_head, scope_tail, resource_tail = (
                    self._head(cls)
                )
            except Exception as error:  # noqa: BLE001 - a Resource the SDK cannot encode must not cost the batch
                self._drop(len(group), error, "its Resource")
                continue
            scope_spans = scope_head + b"".join(group) + scope_tail
            resource_spans = (
                resource_head + b"\x12" + _varint(len(scope_spans)) + scope_spans + resource_tail
            )
            out.append(b"\x0a" + _varint(len(resource_spans)) + resource_spans)
            self.fast_spans += len(group)
        if others:
            out.append(self._sdk_encode(others))
        return b"".join(out)

    def _sdk_encode(self, spans: list[ReadableSpan]) -> bytes:
        """The SDK's encoding of `spans`; one at a time when the batch fails, leaving out only the
        spans that fail alone."""
        try:
            data: bytes = encode_spans(spans).SerializeToString()
        except Exception:  # noqa: BLE001 - find the span at fault below
            pass
        else:
            self.sdk_spans += len(spans)
            return data
        out = []
        for span in spans:
            try:
                out.append(encode_spans([span]).SerializeToString())
            except Exception as error:  # noqa: BLE001 - this one span is lost, never its batch
                self._drop(1, error, f"span {getattr(span, 'name', '?')!r}")
            else:
                self.sdk_spans += 1
        return b"".join(out)

    def _drop(self, count: int, error: BaseException, what: str) -> None:
        self.dropped_spans += count
        if self._warned.first(type(error).__name__):
            _log.warning(
                "otel-titan: OTLP: %d span(s) left out of a batch, %s could not be encoded (%s: "
                "%s); the rest of the batch is sent, "
                "the JSONL file has them all. Later such failures are counted in dropped_spans "
                "without a warning.",
                count,
                _printable(what),
                type(error).__name__,
                _printable(str(error)),
            )

    def _head(self, cls: type) -> tuple[Any, ...]:
        """(resource, scope, ResourceSpans.resource field, ScopeSpans.scope field,
        ScopeSpans.schema_url, ResourceSpans.schema_url) of a span class."""
        cached = self._heads.get(cls)
        resource, scope = cls._resource, cls._instrumentation_scope  # type: ignore[attr-defined]  # set by TitanSpan.bind on the logger's subclass
        if cached is None or cached[0] is not resource or cached[1] is not scope:
            # Encoded once with the SDK's own helpers: the Resource and scope are exactly what it
            # sends.
            cached = self._heads[cls] = (
                resource,
                scope,
                _len_field(b"\x0a", _resource_message(resource)),
                _len_field(b"\x0a", _encode_instrumentation_scope(scope).SerializeToString()),
                _len_field(b"\x1a", _utf8(scope.schema_url))
                if scope is not None and scope.schema_url
                else b"",
                _len_field(b"\x1a", _utf8(resource.schema_url)) if resource.schema_url else b"",
            )
        return cached

    # -- one span ----------------------------------------------------------------------------
    def encode_span(self, span: TitanSpan) -> bytes:
        """``ScopeSpans.spans`` field (tag, length, ``Span`` message) for one `TitanSpan`."""
        context = span._context
        trace_id = context.trace_id
        trace = self._traces.get(trace_id)
        if trace is None:
            if len(self._traces) >= self.MAX_CACHE:
                self._traces.clear()
            trace = self._traces[trace_id] = b"\x0a\x10" + trace_id.to_bytes(16, "big")
        # Name, kind, call-site and step attributes: one fragment per shape of span.
        shape_key = (
            span._name,
            span.record_kind,
            span.code_file,
            span.code_line,
            span.code_function,
            span.thread_id,
            span.step,
            span.relative_step,
            span.step_tags,
            span._kind,
        )
        shape = self._shapes.get(shape_key)
        if shape is None:
            shape = self._shape(span, shape_key)
        end = span._end_time
        times = (
            _pack_times(0x39, span._start_time, 0x41, end)
            if end is not None
            else b"\x39" + _pack_fixed64(span._start_time)
        )
        parent = span._parent
        if (
            not span.__dict__
            and span.task_name is None
            and context.trace_state is _DEFAULT_TRACE_STATE
        ):
            # The common span: nothing set beyond the slots (no description, metric, error,
            # extra, event, link or status), no task, no trace state: one join.
            if parent is None:
                body = b"".join(
                    (
                        trace,
                        b"\x12\x08",
                        context.span_id.to_bytes(8, "big"),
                        shape,
                        times,
                        _TAIL_LOCAL,
                    )
                )
            else:
                body = b"".join(
                    (
                        trace,
                        b"\x12\x08",
                        context.span_id.to_bytes(8, "big"),
                        shape,
                        times,
                        b"\x22\x08",
                        parent.span_id.to_bytes(8, "big"),
                        _TAIL_REMOTE if parent.is_remote else _TAIL_LOCAL,
                    )
                )
            return b"\x12" + _varint(len(body)) + body
        parts = [trace, b"\x12\x08", context.span_id.to_bytes(8, "big"), shape, times]
        if parent is not None:
            parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
        if context.trace_state:
            parts.append(
                _len_field(
                    b"\x1a", _utf8(",".join(f"{k}={v}" for k, v in context.trace_state.items()))
                )
            )
        if (
            span.task_name is not None
            or span.description is not None
            or span.metric_name is not None
            or span.error_type is not None
            or span.extra
            or span.incomplete
        ):
            parts.append(self._rare_attributes(span))
        if span._events:
            parts.append(self._events(span))
        if span._links:
            parts.append(self._links(span._links))
        status = span._status
        if status.status_code is StatusCode.UNSET and not status.description:
            parts.append(_EMPTY_STATUS)
        else:
            parts.append(self._status(status))
        parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
        body = b"".join(parts)
        return b"\x12" + _varint(len(body)) + body

    def _shape(self, span: TitanSpan, key: tuple[Any, ...]) -> bytes:
        """Name and kind (fields 5, 6), then the call-site and step attributes, in
        `_build_attributes`'s order."""
        name_key = (span._name, span._kind)
        name = self._names.get(name_key)
        if name is None:
            if len(self._names) >= self.MAX_CACHE:
                self._names.clear()
            name = self._names[name_key] = (
                _len_field(b"\x2a", _utf8(span._name)) + _KIND[span._kind]
            )
        site_key = (
            span.record_kind,
            span.code_file,
            span.code_line,
            span.code_function,
            span.thread_id,
        )
        site = self._sites.get(site_key) or self._site(site_key)
        step_key = (span.step, span.relative_step, span.step_tags)
        step = self._steps.get(step_key)
        if step is None:
            step = self._step(step_key)
        if len(self._shapes) >= self.MAX_CACHE:
            self._shapes.clear()
        shape = self._shapes[key] = name + site + step
        return shape

    def _site(self, key: tuple[Any, ...]) -> bytes:
        record_kind, code_file, code_line, code_function, thread_id = key
        data = b"".join(
            _len_field(_SPAN_ATTR, _key_value(k, v))
            for k, v in (
                (ATTR.RECORD_KIND, record_kind),
                (ATTR.CODE_FILE, code_file),
                (ATTR.CODE_LINE, code_line),
                (ATTR.CODE_FUNCTION, code_function),
                (ATTR.THREAD_ID, thread_id),
            )
        )
        if len(self._sites) >= self.MAX_CACHE:
            self._sites.clear()
        self._sites[key] = data
        return data

    def _step(self, key: tuple[Any, ...]) -> bytes:
        step, relative_step, tags = key
        parts = []
        if step is not None:
            parts.append(_len_field(_SPAN_ATTR, _key_value(ATTR.STEP, step)))
        if relative_step is not None:
            parts.append(_len_field(_SPAN_ATTR, _key_value(ATTR.RELATIVE_STEP, relative_step)))
        if tags:
            parts.append(_len_field(_SPAN_ATTR, _key_value(ATTR.STEP_TAGS, tags)))
        data = b"".join(parts)
        if len(self._steps) >= self.MAX_CACHE:
            self._steps.clear()
        self._steps[key] = data
        return data

    def _kv(self, tag: bytes, key: str, value: Any) -> bytes:
        """One attribute field, cached when its value is a short string or a bool."""
        if (type(value) is str and len(value) <= 256) or type(value) is bool:
            cache_key = (tag, key, value, type(value))
            data = self._kvs.get(cache_key)  # type: ignore[arg-type]  # a str or bool value: hashable, checked just above
            if data is None:
                if len(self._kvs) >= self.MAX_CACHE:
                    self._kvs.clear()
                data = self._kvs[cache_key] = _len_field(tag, _key_value(key, value))  # type: ignore[index]  # a str or bool value: hashable, checked just above
            return data
        return _len_field(tag, _key_value(key, value))

    def _rare_attributes(self, span: TitanSpan) -> bytes:
        """The attributes after the step ones, in `TitanSpan._build_attributes`'s order."""
        kv = self._kv
        parts = []
        if span.task_name is not None:
            parts.append(kv(_SPAN_ATTR, ATTR.TASK_NAME, span.task_name))
        if span.description is not None:
            parts.append(kv(_SPAN_ATTR, ATTR.DESCRIPTION, span.description))
        if span.metric_name is not None:
            parts.append(kv(_SPAN_ATTR, ATTR.METRIC_NAME, span.metric_name))
            parts.append(kv(_SPAN_ATTR, ATTR.METRIC_VALUE, span.metric_value))
        if span.error_type is not None:
            parts.append(kv(_SPAN_ATTR, ATTR.ERROR_TYPE, span.error_type))
        if span.extra:
            for key, value in span.extra.items():
                parts.append(kv(_SPAN_ATTR, ATTR.EXTRA_PREFIX + key, value))
        if span.incomplete:
            parts.append(kv(_SPAN_ATTR, ATTR.INCOMPLETE, True))
        return b"".join(parts)

    def _events(self, span: TitanSpan) -> bytes:
        kv = self._kv
        parts = []
        for event in span._events:
            body = [
                b"\x09" + _pack_fixed64(event.timestamp),
                _len_field(b"\x12", _utf8(event.name)),
            ]
            attributes = event.attributes
            if attributes:
                for key, value in attributes.items():
                    body.append(kv(_EVENT_ATTR, key, value))
            dropped = event.dropped_attributes
            if dropped:
                body.append(b"\x20" + _varint(dropped))
            parts.append(_len_field(b"\x5a", b"".join(body)))  # Span.events = 11
        dropped_events = span.dropped_events
        if dropped_events:
            parts.append(b"\x60" + _varint(dropped_events))  # Span.dropped_events_count = 12
        return b"".join(parts)

    def _links(self, links: Sequence[Any]) -> bytes:
        parts = []
        for link in links:
            context = link.context
            body = [
                b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
                b"\x12\x08" + context.span_id.to_bytes(8, "big"),
            ]
            # (Link.trace_state stays empty: the SDK's encoder does not send it either.)
            body.append(_attributes(b"\x22", link.attributes))
            if link.dropped_attributes:
                body.append(b"\x28" + _varint(link.dropped_attributes))
            # Link.flags = 6 (fixed32)
            body.append(b"\x35" + struct.pack("<I", 0x300 if context.is_remote else 0x100))
            parts.append(_len_field(b"\x6a", b"".join(body)))  # Span.links = 13
        return b"".join(parts)

    @staticmethod
    def _status(status: Any) -> bytes:
        body = b""
        if status.description:
            body += _len_field(b"\x12", _utf8(status.description))
        if status.status_code.value:
            body += b"\x18" + _varint(status.status_code.value)
        return _len_field(b"\x7a", body)
