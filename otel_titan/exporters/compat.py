"""torchtitan's handler API, so handler factories written for torchtitan keep working.

A torchtitan (or pimm) handler factory receives ``structured_logger`` (a
`logging.Logger`) and adds a `logging.Handler` whose formatter subclasses
`TraceJsonlFormatter` (often overriding ``_log_dict``) and which carries a
`TraceEventsOnlyFilter`. With only its imports changed to::

    from otel_titan.structured_logger import TraceEventsOnlyFilter, TraceJsonlFormatter

it works here: when a factory attaches such a handler, otel-titan adds a
bridge exporter (`otel_titan.exporters.logging_bridge`) that turns every
record into a `logging.LogRecord` on the background thread and hands it to
that logger. When no factory attaches a handler there is no bridge, and the
default path pays nothing for this compatibility.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import orjson

__all__ = ["TraceJsonlFormatter", "TraceEventsOnlyFilter", "RECORD_ATTRIBUTE"]

#: The `LogRecord` attribute holding the full structured record (a dict).
RECORD_ATTRIBUTE = "otel_titan_record"


class TraceEventsOnlyFilter(logging.Filter):
    """Pass only structured trace records (those with a ``log_type_name``).

    Example:
        >>> rec = logging.LogRecord("x", logging.INFO, __file__, 1, "plain", None, None)
        >>> TraceEventsOnlyFilter().filter(rec)
        False
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return hasattr(record, "log_type_name")


class TraceJsonlFormatter(logging.Formatter):
    """Format a structured trace record as one JSON line (the JSONL schema).

    Subclasses override `_log_dict` to enrich or reshape the record. The
    identity passed to the constructor (``rank``, ``source``, and pimm's
    ``world_size``, ``attempt``, ``job_id``, ``trace_id``) is "baked in" and
    overrides what the record carries, as in torchtitan.

    Example:
        >>> class WithCluster(TraceJsonlFormatter):
        ...     def _log_dict(self, record):
        ...         d = super()._log_dict(record)
        ...         d["cluster"] = "a"
        ...         return d
        >>> rec = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
        >>> rec.otel_titan_record = {"log_type_name": "fwd_start", "rank": 0}
        >>> WithCluster(rank=3, source="training").format(rec)
        '{"log_type_name":"fwd_start","rank":3,"global_rank":3,"source":"training","cluster":"a"}'
    """

    def __init__(self, rank: int | None = None, source: str | None = None, **identity: Any) -> None:
        super().__init__()
        baked: dict[str, Any] = {}
        if rank is not None:
            baked["rank"] = rank
            baked["global_rank"] = rank
        if source is not None:
            baked["source"] = source
        for key, value in identity.items():
            if value is not None:
                baked[key] = value
        self.rank = rank
        self.source = source
        self._baked = baked

    def _log_dict(self, record: logging.LogRecord) -> dict[str, Any]:
        """The dict that `format` serialises; override to add or change fields."""
        structured = getattr(record, RECORD_ATTRIBUTE, None)
        if structured is not None:
            data = dict(structured)
        else:
            # A record that did not come from otel-titan: keep what logging knows.
            data = {
                "time_us": int(record.created * 1_000_000),
                "log_type": "log",
                "log_type_name": getattr(record, "log_type_name", None),
                "log_level": record.levelname,
                "logger_name": record.name,
                "message": record.getMessage(),
                "caller": f"{record.pathname}:{record.lineno}:{record.funcName}",
            }
        data.update(self._baked)
        return data

    def format(self, record: logging.LogRecord) -> str:
        """One JSON object, no trailing newline (NaN/inf already arrive as strings).

        Whatever the record holds, it is written: a string orjson refuses (a
        lone surrogate such as ``"\\ud800"``, valid in JSON and in a Python
        str) or an int beyond 64 bits goes through the standard library, which
        writes the surrogate as its JSON escape, exactly as the JSONL writer
        does (`otel_titan.exporters.records`), so the line reads back the same.
        """
        data = self._log_dict(record)
        try:
            return orjson.dumps(data, default=str).decode()
        except orjson.JSONEncodeError:
            return json.dumps(data, ensure_ascii=True, separators=(",", ":"), default=str)
