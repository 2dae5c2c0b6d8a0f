"""torchtitan's ``structured_logging`` module: the ``sl.*`` calls, ``LogType``, ``ExtraFields``,
``event_extra``.

The calls are otel-titan's (`otel_titan.structured_logger`). The rest are
torchtitan's small public names, kept so that handler factories and formatters
written against torchtitan import and run: ``LogType`` and ``ExtraFields``
(the record's kinds and the ``extra=`` keys), ``event_extra`` (the ``extra``
dict of a record logged by hand), ``TraceEventsOnlyFilter``.

``_structured_logger`` is the `logging.Logger` torchtitan-style handlers are
attached to: otel-titan's own (``otel_titan.structured_logger``), which
`otel_titan.compat.torchtitan.install` also registers under torchtitan's name
``torchtitan.structured_logger``. Every record the logger writes reaches the
handlers attached to it, on the writer's thread (the logger's own records, such
as its per-step figures, stay out: docs/migrating-from-torchtitan.md).

Example:
    >>> from otel_titan.compat.torchtitan.observability.structured_logger import structured_logging
    >>> structured_logging.event_extra("fwd_bwd_start", step=3)["log_type_name"]
    'fwd_bwd_start'
"""

from __future__ import annotations

import enum
import logging
import os
from typing import Any

from otel_titan.exporters.compat import TraceEventsOnlyFilter
from otel_titan.structured_logger import (
    flush_structured_logger,
    log_trace_instant,
    log_trace_scalar,
    log_trace_span,
)
from otel_titan.structured_logger import init_structured_logger as _init
from otel_titan.structured_logger.lifecycle import STRUCTURED_LOGGER_NAME

__all__ = [
    "init_structured_logger",
    "log_trace_span",
    "log_trace_instant",
    "log_trace_scalar",
    "flush_structured_logger",
    "LogType",
    "ExtraFields",
    "event_extra",
    "TraceEventsOnlyFilter",
]

#: The logger torchtitan-style handlers are attached to (otel-titan's own; see the module
#: docstring).
_structured_logger: logging.Logger = logging.getLogger(STRUCTURED_LOGGER_NAME)
_structured_logger.propagate = False


class LogType(str, enum.Enum):
    """Record kind in the JSONL stream (``log_type``), as torchtitan names them."""

    EVENT = "event"
    INSTANT = "instant"
    TEXT = "text"

    def __str__(self) -> str:
        return self.value


class ExtraFields(str, enum.Enum):
    """Keys of the ``extra`` dict of a record (torchtitan's names: they are record fields too)."""

    LOG_TYPE = "log_type"
    LOG_TYPE_NAME = "log_type_name"
    EVENT_NAME = "event_name"
    STEP = "step"
    VALUE = "value"
    RELATIVE_STEP = "relative_step"
    TASK_NAME = "task_name"

    def __str__(self) -> str:
        return self.value


def event_extra(
    event_type: str,
    event_name: str | None = None,
    step: int | None = None,
    relative_step: int | None = None,
    value: float | int | None = None,
    task_name: str | None = None,
    log_type: LogType = LogType.EVENT,
) -> dict[str, Any]:
    """The ``extra`` dict of a structured record logged by hand on a `logging.Logger` (torchtitan's
    helper).

    Example:
        >>> event_extra("loss", event_name="train.loss", value=2.5, log_type=LogType.INSTANT)["log_type"]
        'instant'
    """
    return {
        str(ExtraFields.LOG_TYPE): str(log_type),
        str(ExtraFields.LOG_TYPE_NAME): str(event_type),
        str(ExtraFields.EVENT_NAME): event_name,
        str(ExtraFields.STEP): step,
        str(ExtraFields.RELATIVE_STEP): relative_step,
        str(ExtraFields.VALUE): value,
        str(ExtraFields.TASK_NAME): task_name,
    }


def init_structured_logger(
    source: str,
    output_dir: str | os.PathLike[str],
    rank: int | None = None,
    enable: bool = True,
    **options: Any,
) -> None:
    """Start structured logging for this process: otel-titan's `init_structured_logger` under
    torchtitan's name.

    As in torchtitan, a second call is a no-op whatever its arguments, and
    ``enable=False`` makes every call a no-op. ``**options`` are otel-titan's
    (`otel_titan.structured_logger.LoggerOptions`). Handler factories come
    from ``TITAN_STRUCT_LOGGER_HANDLERS`` as in torchtitan (or
    ``OTEL_TITAN_HANDLERS``); a torchtitan factory receives the keyword
    arguments it expects (``structured_logger``, ``rank``, ``source``,
    ``output_dir``) among otel-titan's.

    Example:
        >>> import tempfile
        >>> init_structured_logger(source="training", output_dir=tempfile.mkdtemp(), rank=0, world_size=1)
        >>> from otel_titan import structured_logger as ot; ot.shutdown_structured_logger()
        True
    """
    _init(source, output_dir, rank=rank, enable=enable, **options)
