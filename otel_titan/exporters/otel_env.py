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
  ``http/json`` is not implemented by the Python exporter and is refused.

Everything else (endpoint, headers, timeout, compression, certificates) is
left to the OTLP exporter itself, which reads the standard variables untouched.
"""

from __future__ import annotations

import os
from typing import Mapping

__all__ = [
    "sdk_disabled",
    "traces_exporters",
    "traces_exporter_handler_specs",
    "otlp_protocol",
    "OTLP_HANDLER",
    "CONSOLE_HANDLER",
    "DEFAULT_PROTOCOL",
]

OTLP_HANDLER = "otel_titan.exporters.otlp.register_otlp_handler"
CONSOLE_HANDLER = "otel_titan.exporters.otlp.register_console_handler"
DEFAULT_PROTOCOL = "http/protobuf"
_PROTOCOLS = ("http/protobuf", "grpc")
_EXPORTERS = {"otlp": OTLP_HANDLER, "console": CONSOLE_HANDLER}


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
    """The exporter names in ``OTEL_TRACES_EXPORTER`` (``none`` removed); unknown names raise `ValueError`.

    Example:
        >>> traces_exporters({"OTEL_TRACES_EXPORTER": "otlp, console"})
        ['otlp', 'console']
    """
    raw = _env(environ).get("OTEL_TRACES_EXPORTER", "")
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    unknown = [name for name in names if name not in _EXPORTERS and name != "none"]
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER={raw!r}: unsupported exporter {unknown[0]!r} (supported: otlp, console, none)")
    out: list[str] = []
    for name in names:
        if name != "none" and name not in out:
            out.append(name)
    return out


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
    env = _env(environ)
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = env.get(name, "").strip().lower()
        if value:
            if value not in _PROTOCOLS:
                raise ValueError(f"{name}={value!r} is not supported (use one of: {', '.join(_PROTOCOLS)})")
            return value
    return DEFAULT_PROTOCOL
