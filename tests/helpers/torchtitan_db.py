"""The custom-handler example of torchtitan's README, with only its imports changed.

(`MyDBClient` is a small in-memory "database" so the example runs.)
"""

import logging
import os

from otel_titan.structured_logger import (
    TraceEventsOnlyFilter,
    TraceJsonlFormatter,
)


class MyDBClient:
    """In-memory stand-in for a remote database client."""

    ROWS: list = []

    def __init__(self, url):
        self.url = url

    def insert_row(self, row):
        MyDBClient.ROWS.append(row)


class MyDBFormatter(TraceJsonlFormatter):
    """Enrich each record with backend-specific fields before serialization."""

    def _log_dict(self, record):
        d = super()._log_dict(record)
        d["cluster"] = os.environ.get("CLUSTER_NAME", "unknown")
        return d


class MyDBHandler(logging.Handler):
    """Send each trace event to a remote DB as it's emitted."""

    def __init__(self, rank: int, source: str, db_url: str):
        super().__init__()
        self.client = MyDBClient(db_url)
        self.setFormatter(MyDBFormatter(rank=rank, source=source))
        self.addFilter(TraceEventsOnlyFilter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.client.insert_row(self.format(record))
        except Exception:  # noqa: BLE001 - logging's own convention: handleError reports, emit never raises
            self.handleError(record)


def register_my_db_handler(
    *, structured_logger: logging.Logger, rank: int, source: str, **kw
) -> None:
    structured_logger.addHandler(
        MyDBHandler(rank=rank, source=source, db_url="mydb://..."),
    )
