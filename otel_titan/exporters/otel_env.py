"""The standard ``OTEL_*`` environment variables, read the way OpenTelemetry users expect.

* ``OTEL_SDK_DISABLED=true``: the OpenTelemetry side (OTLP, console) is off;
  the JSONL file stays on.
* ``OTEL_TRACES_EXPORTER``: a comma-separated list. ``otlp`` adds the OTLP
  handler beside the default JSONL one, ``console`` a console exporter,
  ``none`` nothing. Unset means ``none`` here (the specification's default is
  ``otlp``, but a training job that streams to ``localhost:4318`` without
  being asked would only log connection errors). An explicit handler list
  (``OTEL_TITAN_HANDLERS`` / ``TITAN_STRUCT_LOGGER_HANDLERS``) still wins.
* ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, then ``OTEL_EXPORTER_OTLP_PROTOCOL``:
  ``http/protobuf`` (the specification's default) or ``grpc``.
  ``http/json`` is not implemented by the Python exporter: ``http/protobuf``
  is used instead (an OTLP/HTTP collector takes both on the same port).

An unknown value of one of these standard variables is warned about once and
ignored, as the specification asks (`ignored_value`): a site-wide
``OTEL_LOGS_EXPORTER=console`` or ``OTEL_EXPORTER_OTLP_PROTOCOL=http/json``,
read by every OpenTelemetry program, must not keep a training job from starting.

Everything else (endpoint, headers, timeout, compression, certificates) is
left to the OTLP exporter itself, which reads the standard variables untouched.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping

__all__ = [
    "sdk_disabled",
    "traces_exporters",
    "traces_exporter_handler_specs",
    "otlp_protocol",
    "signal_protocol",
    "exporter_names",
    "ignored_value",
    "OTLP_HANDLER",
    "CONSOLE_HANDLER",
    "DEFAULT_PROTOCOL",
]

OTLP_HANDLER = "otel_titan.exporters.otlp.register_otlp_handler"
CONSOLE_HANDLER = "otel_titan.exporters.otlp.register_console_handler"
DEFAULT_PROTOCOL = "http/protobuf"
_PROTOCOLS = ("http/protobuf", "grpc")
_EXPORTERS = {"otlp": OTLP_HANDLER, "console": CONSOLE_HANDLER}
_log = logging.getLogger("otel_titan")
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def forget_warnings() -> None:
    """Forget which values were warned about: the next unknown value is warned about again (a new
    session, a test)."""
    with _warned_lock:
        _warned.clear()


def ignored_value(name: str, raw: str, why: str) -> None:
    """Warn, once per variable and value, that a standard variable's value is ignored (init goes
    on).

    Example:
        >>> ignored_value("OTEL_TRACES_EXPORTER", "zipkin", "unsupported exporter 'zipkin' (supported: otlp, console, none)")
    """
    with _warned_lock:
        if (name, raw) in _warned:
            return
        _warned.add((name, raw))
    _log.warning(
        "otel-titan: %s=%r: %s; ignored, as the OpenTelemetry specification asks for unknown "
        "values",
        name,
        raw,
        why,
    )


def exporter_names(
    name: str, supported: Iterable[str], environ: Mapping[str, str] | None = None, hint: str = ""
) -> list[str]:
    """The names in the comma-separated exporter variable `name` that are `supported` (``none``
    removed, duplicates once); the rest warned about and ignored.

    Example:
        >>> exporter_names("OTEL_TRACES_EXPORTER", ("otlp", "console"), {"OTEL_TRACES_EXPORTER": "otlp, zipkin,otlp"})
        ['otlp']
    """
    raw = _env(environ).get(name, "")
    known = tuple(supported)
    out: list[str] = []
    for part in (p.strip().lower() for p in raw.split(",")):
        if not part or part == "none" or part in out:
            continue
        if part not in known:
            ignored_value(
                name,
                raw,
                f"unsupported exporter {part!r} (supported: {', '.join(known)}, none{hint})",
            )
            continue
        out.append(part)
    return out


def signal_protocol(signal: str, environ: Mapping[str, str] | None = None) -> str:
    """The OTLP transport for `signal` (``TRACES``, ``METRICS``, ``LOGS``): its own variable, then
    the generic one, else ``http/protobuf``.

    An unknown value is warned about and ignored (the next variable decides);
    ``http/json``, which the Python exporter does not implement, means ``http/protobuf``.

    Example:
        >>> signal_protocol("LOGS", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
        'grpc'
        >>> signal_protocol("METRICS", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
        'http/protobuf'
    """
    env = _env(environ)
    for name in (f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = env.get(name, "").strip().lower()
        if not value:
            continue
        if value in _PROTOCOLS:
            return value
        if value == "http/json":
            ignored_value(
                name,
                value,
                "the Python OTLP exporter does not implement http/json: http/protobuf is used (an "
                "OTLP/HTTP collector takes both on the same port)",
            )
            return DEFAULT_PROTOCOL
        ignored_value(name, value, f"unsupported protocol (use one of: {', '.join(_PROTOCOLS)})")
    return DEFAULT_PROTOCOL


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def sdk_disabled(environ: Mapping[str, str] | None = None) -> bool:
    """``OTEL_SDK_DISABLED`` is ``true`` (case-insensitive), as the specification defines it.

    Example:
        >>> sdk_disabled({"OTEL_SDK_DISABLED": "TRUE"}), sdk_disabled({"OTEL_SDK_DISABLED": "1"})
        (True, False)
    """
    return _env(environ).get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def traces_exporters(environ: Mapping[str, str] | None = None) -> list[str]:
    """The exporter names in ``OTEL_TRACES_EXPORTER`` (``none`` removed); unknown names are warned
    about and ignored.

    Example:
        >>> traces_exporters({"OTEL_TRACES_EXPORTER": "otlp, console"})
        ['otlp', 'console']
    """
    return exporter_names("OTEL_TRACES_EXPORTER", _EXPORTERS, environ)


def traces_exporter_handler_specs(environ: Mapping[str, str] | None = None) -> list[str]:
    """The handler factories ``OTEL_TRACES_EXPORTER`` asks for (none when the SDK is disabled).

    Example:
        >>> traces_exporter_handler_specs({"OTEL_TRACES_EXPORTER": "otlp"})
        ['otel_titan.exporters.otlp.register_otlp_handler']
        >>> traces_exporter_handler_specs({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
        []
    """
    if sdk_disabled(environ):
        return []
    return [_EXPORTERS[name] for name in traces_exporters(environ)]


def otlp_protocol(environ: Mapping[str, str] | None = None) -> str:
    """The OTLP transport for traces: ``http/protobuf`` (default) or ``grpc``.

    Example:
        >>> otlp_protocol({}), otlp_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
        ('http/protobuf', 'grpc')
        >>> otlp_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
        'http/protobuf'
    """
    return signal_protocol("TRACES", environ)
