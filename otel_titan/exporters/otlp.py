"""Handler factories for the OpenTelemetry side: OTLP to a collector, Jaeger or Tempo; console.

Usually selected with the standard variables, nothing else::

    OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 torchrun ...
    train.py

or named in a handler list
(``OTEL_TITAN_HANDLERS=...jsonl.register_jsonl_handler,otel_titan.exporters.otlp.register_otlp_handler``).

The exporter is the standard ``opentelemetry-exporter-otlp`` one, over HTTP/protobuf (default) or
gRPC as ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` say; endpoint,
headers, timeout, compression, certificates and retries come from the standard
``OTEL_EXPORTER_OTLP_*`` variables, read by that exporter untouched. Only its encoding step is
replaced (`otlp_grpc`, `otlp_http`): `otlp_encoder.OtlpSpanEncoder` writes the same protobuf from
cached fragments, a few µs per span instead of ~25 µs. It runs behind a `QueuedSpanExporter`: its
own bounded queue (``OTEL_BSP_MAX_QUEUE_SIZE``, default 16384 spans) and thread, batches of
``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` (512) every ``OTEL_BSP_SCHEDULE_DELAY`` ms (1000), so a collector
that is down, slow or refusing never slows training or the JSONL file; drops are counted and
shutdown gives the collector at most 3 s.

What the backend receives: spans with their step attributes, errors with
status and an ``exception`` event; instants and scalars as events on their
enclosing span, or as zero-length spans at top level.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from otel_titan.core.exporter import HandlerSkipped
from otel_titan.exporters.otel_env import ignored_value, otlp_protocol, sdk_disabled
from otel_titan.exporters.otlp_grpc import grpc_exporter_class
from otel_titan.exporters.otlp_http import http_exporter_class
from otel_titan.exporters.queued import QueuedSpanExporter

__all__ = [
    "register_otlp_handler",
    "register_console_handler",
    "is_sent_as_span",
    "quiet_exporter_logs",
]

#: The loggers the OTLP exporters and the SDK's readers report export errors on, every signal's: a
#: filter on a logger sees only what is logged on that very logger, so each is named.
_OTLP_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
    "opentelemetry.exporter.otlp.proto.grpc._log_exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._log_exporter",
    "opentelemetry.exporter.otlp.proto.http",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk.metrics._internal.export",
)
_SIGNALS = ("spans", "metrics", "logs")


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
        value = 0.0
    if not value > 0:
        ignored_value(name, raw, f"not a positive number: {default:g} is used")
        return default
    return value


class _ExporterLogFilter(logging.Filter):
    """Tame the OTLP exporter's own log lines: no secrets, no floods.

    * Credentials are redacted: the gRPC exporter prints its endpoint, which may
      carry ``user:password@``, and header values (``OTEL_EXPORTER_OTLP_HEADERS``,
      typically an API token) must never reach a console or a log file.
    * Each distinct message passes once a minute per signal (traces, metrics,
      logs alike): a collector down for an hour is one problem, not thousands
      of lines. The next one that passes says how many like it were held back.
    """

    _USERINFO = re.compile(r"(?<![\w.-])([^\s/@:]+):([^\s/@]+)@")

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[tuple[Any, ...], float] = {}
        self._held: dict[tuple[Any, ...], int] = {}
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget what passed and what was held back (a fresh minute for every message and
        signal)."""
        with self._lock:
            self._last.clear()
            self._held.clear()

    @staticmethod
    def secrets() -> list[str]:
        """Header values of the standard variables (read each time: tests and users change them)."""
        values = []
        for name in (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
        ):
            for pair in os.environ.get(name, "").split(","):
                _, _, value = pair.partition("=")
                value = value.strip()
                if value:
                    values.append(value)
                    # "Bearer <token>": the token alone too
                    values.extend(part for part in value.split() if len(part) >= 6)
        return values

    def redact(self, text: str) -> str:
        text = self._USERINFO.sub(r"\1:***@", text)
        for secret in sorted(self.secrets(), key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        # One key per message and signal: the gRPC exporters of all three share one logger and one
        # message.
        key = (
            record.name,
            str(record.msg),
            tuple(a for a in args if isinstance(a, str) and a in _SIGNALS),
        )
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.every_s:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            self._last[key] = now
            held = self._held.pop(key, 0)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record: let logging report it
            return True
        if held:
            message += f" (and {held} more like it in the last {self.every_s:g} s, not shown; otel-titan shows each once a minute)"
            record.msg, record.args = message, None
        redacted = self.redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and record.exc_info[1] is not None:
            text = self.redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info, record.exc_text = None, text
        return True


_quiet = _ExporterLogFilter()


def quiet_exporter_logs() -> None:
    """Put the redacting, once-a-minute filter on every OTLP exporter's and SDK reader's logger (all
    signals)."""
    for name in _OTLP_LOGGERS:
        logger = logging.getLogger(name)
        if _quiet not in logger.filters:
            logger.addFilter(_quiet)


def _session_honouring_otlp_certificate() -> Any:
    """A `requests.Session` for the HTTP exporter in which ``OTEL_EXPORTER_OTLP_CERTIFICATE`` wins.

    The exporter sets the certificate as ``session.verify``, but requests lets
    ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` from the environment override a
    session's ``verify`` on every request (psf/requests#3829), so on machines
    that set those (many clusters do) a collector with a private CA would be
    refused. Proxies and the rest of the environment still apply.
    """
    import requests  # a dependency of the HTTP exporter

    class Session(requests.Session):
        def merge_environment_settings(
            self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
        ) -> Any:
            settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
            if isinstance(self.verify, str) and verify in (None, True):
                settings["verify"] = self.verify
            return settings

    return Session()


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

    Chosen by the standard variables, in the job's shell (an illustration, not Python; docs/collectors.md)::

        OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 python train.py
    """
    if sdk_disabled():
        raise HandlerSkipped("OTEL_SDK_DISABLED=true")
    protocol = otlp_protocol()
    quiet_exporter_logs()
    if protocol == "grpc":
        otlp: Any = grpc_exporter_class()()  # grpc is heavy: loaded only here
    else:
        otlp = http_exporter_class()(session=_session_honouring_otlp_certificate())
    exporter = _queued(otlp, f"otlp-{protocol.replace('/', '-')}")
    add_span_exporter(exporter)
    return exporter


def register_console_handler(*, add_span_exporter: Any, **_: Any) -> QueuedSpanExporter:
    """Handler factory: print every span as JSON on stdout (``OTEL_TRACES_EXPORTER=console``).

    Chosen by the standard variable, in the job's shell (an illustration, not Python)::

        OTEL_TRACES_EXPORTER=console python train.py
    """
    if sdk_disabled():
        raise HandlerSkipped("OTEL_SDK_DISABLED=true")
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    exporter = _queued(ConsoleSpanExporter(), "console")
    add_span_exporter(exporter)
    return exporter
