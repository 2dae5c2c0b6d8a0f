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

import itertools
import json
import logging
import os
import socket
import threading
import time
from typing import Any

import orjson

from otel_titan.core.step_context import current_step_state

__all__ = ["TraceJsonlFormatter", "TraceEventsOnlyFilter", "RECORD_ATTRIBUTE", "MAX_MESSAGE_SIZE"]

#: The `LogRecord` attribute holding the full structured record (a dict).
RECORD_ATTRIBUTE = "otel_titan_record"

#: Characters of a plain log record's message kept by `TraceJsonlFormatter` (torchtitan's limit):
#: longer ones keep both ends.
MAX_MESSAGE_SIZE = 1000


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

    A record that did not come from otel-titan (logged by hand on a
    `logging.Logger`, with torchtitan's ``extra=event_extra(...)`` or none)
    becomes the record torchtitan's formatter writes: the step and tags the
    calling thread sees at format time, ``caller`` relative to the working
    directory, ``local_rank`` from ``LOCAL_RANK`` (0 when unset), ``seq_id``
    from 0 per formatter, a message cut to `MAX_MESSAGE_SIZE` characters.
    """

    def __init__(self, rank: int | None = None, source: str | None = None, **identity: Any) -> None:
        super().__init__()
        self._seq = itertools.count()
        self._last_record_at = threading.local()
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
            data = self._plain_record(record)
        data.update(self._baked)
        return data

    def _plain_record(self, record: logging.LogRecord) -> dict[str, Any]:
        """A record logged by hand, as torchtitan's formatter writes it (field for field, in its
        order)."""
        data: dict[str, Any] = {"delta_ms": self._delta_ms(), "tid": threading.get_native_id()}
        data.update(
            rank=self.rank,
            global_rank=self.rank,
            local_rank=_local_rank(),
            source=self.source,
            host_name=socket.gethostname(),
            pid=os.getpid(),
        )
        state = current_step_state()
        if state.step is not None:
            data["step"] = state.step
        if state.relative_step is not None:
            data["relative_step"] = state.relative_step
        if state.tags:
            data["step_tags"] = list(state.tags)
        data.update(
            time=int(record.created),
            time_ms=int(record.created * 1000),
            time_us=int(record.created * 1_000_000),
        )
        data["log_type"] = getattr(record, "log_type", "text")
        data["log_type_name"] = getattr(record, "log_type_name", None)
        for key in ("step", "relative_step"):  # the record's own (extra=) win over the thread's
            if getattr(record, key, None) is not None:
                data[key] = getattr(record, key)
        data["event_name"] = getattr(record, "event_name", None)
        value = getattr(record, "value", None)
        if isinstance(value, (int, float)):
            data["value"] = float(value)
        if getattr(record, "task_name", None) is not None:
            data["task_name"] = record.task_name  # type: ignore[attr-defined]  # an extra= field, checked above
        data.update(
            caller=f"{_relative(record.pathname)}:{record.lineno}:{record.funcName}",
            log_file=record.filename,
            log_function=record.funcName,
            log_level=record.levelname,
            logger_name=record.name,
        )
        if record.stack_info:
            data["stack_info"] = record.stack_info
        data["seq_id"] = next(self._seq)
        message = record.getMessage()
        half = MAX_MESSAGE_SIZE // 2
        data["message"] = (
            message
            if len(message) <= MAX_MESSAGE_SIZE
            else message[:half] + "..." + message[-half:]
        )
        return data

    def _delta_ms(self) -> float:
        """Milliseconds since this formatter's previous record on this thread (0 for the first)."""
        now = time.perf_counter()
        last = getattr(self._last_record_at, "value", now)
        self._last_record_at.value = now
        return (now - last) * 1000

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


def _local_rank() -> int:
    try:
        return int(os.environ.get("LOCAL_RANK", 0))
    except ValueError:
        return 0


def _relative(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
