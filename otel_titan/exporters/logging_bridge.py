"""Hands the user's records to torchtitan-style `logging.Handler`s attached to the structured
logger.

Always registered by `init_structured_logger`, for the handlers attached to
``structured_logger`` (``logging.getLogger("otel_titan.structured_logger")``)
by a factory or at any time later, as in torchtitan; with no handler attached
a batch costs one look at the logger's handler list. It runs on the processor
thread, so a handler never runs on the training thread; a slow handler delays
the other exporters of the same batch, so keep handlers quick (or queue
inside them).

Only the records of the program's own calls reach the handlers: the logger's
records about itself (`schema.META_EVENTS`: opened, heartbeat, stall…, and its
per-step process figures) would stand in a torchtitan-format file or database
as the user's scalars and instants, and as its last event.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from otel_titan.core.exporter import SpanExportResult, StartAwareSpanExporter, TimelineItem
from otel_titan.core.identity import RunIdentity
from otel_titan.exporters.compat import RECORD_ATTRIBUTE
from otel_titan.exporters.records import RecordEncoder
from otel_titan.schema import META_EVENTS

__all__ = ["LoggingBridgeExporter"]

# LogRecord attributes the structured fields must not overwrite.
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
}


class LoggingBridgeExporter(StartAwareSpanExporter):
    """Turn each record into a `logging.LogRecord` and call ``logger.handle`` with it.

    The record's fields are set as attributes (as torchtitan's ``extra=``
    does: ``record.log_type_name``, ``record.step``…) and the whole dict is
    ``record.otel_titan_record``, which `TraceJsonlFormatter._log_dict` returns.
    """

    def __init__(self, logger: logging.Logger, identity: RunIdentity) -> None:
        self._logger = logger
        self._encoder = RecordEncoder(identity)
        self._seq = 0

    def export_timeline(self, timeline: Sequence[TimelineItem]) -> SpanExportResult:
        logger = self._logger
        if not logger.handlers:
            return SpanExportResult.SUCCESS
        encoder = self._encoder
        for ended, span in timeline:
            if getattr(span, "by_logger", False) or span.name in META_EVENTS:
                continue
            for fields in encoder.records(ended, span):
                # from 0, as torchtitan's formatter numbers its records
                fields["seq_id"] = self._seq
                self._seq += 1
                full = encoder.full_record(fields)
                level = logging.ERROR if full.get("log_level") == "ERROR" else logging.INFO
                record = logging.LogRecord(
                    logger.name,
                    level,
                    full.get("log_file", ""),
                    int(full.get("caller", "::0:").rsplit(":", 2)[-2] or 0),
                    full.get("message", ""),
                    None,
                    None,
                    func=full.get("log_function"),
                )
                record.created = full["time_us"] / 1e6
                for key, value in full.items():
                    if key not in _RESERVED:
                        setattr(record, key, value)
                setattr(record, RECORD_ATTRIBUTE, full)
                logger.handle(record)
        return SpanExportResult.SUCCESS
