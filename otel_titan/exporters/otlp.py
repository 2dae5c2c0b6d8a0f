"""Handler factories for the OpenTelemetry side: OTLP to a collector, Jaeger or Tempo; console.

Usually selected with the standard variables, nothing else::

    OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 torchrun ... train.py

or named in a handler list (``OTEL_TITAN_HANDLERS=...jsonl.register_jsonl_handler,otel_titan.exporters.otlp.register_otlp_handler``).

The exporter is the standard ``opentelemetry-exporter-otlp`` one, over
HTTP/protobuf (default) or gRPC as ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` /
``OTEL_EXPORTER_OTLP_PROTOCOL`` say; endpoint, headers, timeout, compression
and certificates come from the standard ``OTEL_EXPORTER_OTLP_*`` variables,
read by that exporter untouched. It runs behind a `QueuedSpanExporter`: its
own bounded queue (``OTEL_BSP_MAX_QUEUE_SIZE``, default 16384 spans) and
thread, batches of ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` (512) every
``OTEL_BSP_SCHEDULE_DELAY`` ms (1000), so a collector that is down, slow or
refusing never slows training or the JSONL file; drops are counted and shutdown
gives the collector at most 3 s.

What the backend receives: spans with their step attributes, errors with
status and an ``exception`` event; instants and scalars as events on their
enclosing span, or as zero-length spans at top level.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from otel_titan.exporters.otel_env import otlp_protocol, sdk_disabled
from otel_titan.exporters.queued import QueuedSpanExporter
from otel_titan.structured_logger.handler_factories import HandlerSkipped

__all__ = ["register_otlp_handler", "register_console_handler", "is_sent_as_span"]

_OTLP_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http",
    "opentelemetry.exporter.otlp.proto.http._common",
)


def is_sent_as_span(span: ReadableSpan) -> bool:
    """False for an instant or scalar already sent as an event of its enclosing span.

    Example:
        >>> from opentelemetry.sdk.trace import ReadableSpan
        >>> is_sent_as_span(ReadableSpan("any"))
        True
    """
    return not getattr(span, "attached_to_parent", False)


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be positive")
    return value


class _QuietRepeats(logging.Filter):
    """Let each distinct exporter message through once a minute (a dead collector is one problem)."""

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = f"{record.name}:{record.msg}"
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.every_s:
                return False
            self._last[key] = now
        return True


_quiet = _QuietRepeats()


def _quiet_exporter_logs() -> None:
    for name in _OTLP_LOGGERS:
        logger = logging.getLogger(name)
        if _quiet not in logger.filters:
            logger.addFilter(_quiet)


def _queued(exporter: Any, name: str) -> QueuedSpanExporter:
    return QueuedSpanExporter(
        exporter,
        name=name,
        max_queue_size=int(_env_number("OTEL_BSP_MAX_QUEUE_SIZE", 16384)),
        max_export_batch_size=int(_env_number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)),
        schedule_delay_s=_env_number("OTEL_BSP_SCHEDULE_DELAY", 1000) / 1000,
        keep=is_sent_as_span,
    )


def register_otlp_handler(*, add_span_exporter: Any, **_: Any) -> QueuedSpanExporter:
    """Handler factory: stream spans to an OTLP endpoint (collector, Jaeger, Tempo).

    Skipped (not an error) when ``OTEL_SDK_DISABLED=true``.

    Example:
        >>> # OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 python train.py
    """
    if sdk_disabled():
        raise HandlerSkipped("OTEL_SDK_DISABLED=true")
    protocol = otlp_protocol()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # noqa: PLC0415 - grpc is heavy; load only when used
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]  # noqa: PLC0415
    _quiet_exporter_logs()
    exporter = _queued(OTLPSpanExporter(), f"otlp-{protocol.replace('/', '-')}")
    add_span_exporter(exporter)
    return exporter


def register_console_handler(*, add_span_exporter: Any, **_: Any) -> QueuedSpanExporter:
    """Handler factory: print every span as JSON on stdout (``OTEL_TRACES_EXPORTER=console``).

    Example:
        >>> # OTEL_TRACES_EXPORTER=console python train.py
    """
    if sdk_disabled():
        raise HandlerSkipped("OTEL_SDK_DISABLED=true")
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter  # noqa: PLC0415

    exporter = _queued(ConsoleSpanExporter(), "console")
    add_span_exporter(exporter)
    return exporter
