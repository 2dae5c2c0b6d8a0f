"""Hands every record to torchtitan-style `logging.Handler`s attached by handler factories.

Added by `init_structured_logger` only when a factory attached a handler to
``structured_logger``. It runs on the processor thread, so a handler never
runs on the training thread; a slow handler delays the other exporters of the
same batch, so keep handlers quick (or queue inside them).
"""

from __future__ import annotations

import logging
from typing import Sequence

from otel_titan.core.exporter import SpanExportResult, StartAwareSpanExporter, TimelineItem
from otel_titan.exporters.records import RecordEncoder
from otel_titan.exporters.compat import RECORD_ATTRIBUTE
from otel_titan.core.identity import RunIdentity

__all__ = ["LoggingBridgeExporter"]

# LogRecord attributes the structured fields must not overwrite.
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


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
        encoder = self._encoder
        for ended, span in timeline:
            for fields in encoder.records(ended, span):
                self._seq += 1
                fields["seq_id"] = self._seq
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
