"""torchtitan's ``jsonl_handler`` module: ``TraceJsonlFormatter``, ``TraceJsonlHandler`` and the
default factory.

``register_jsonl_handler`` has torchtitan's signature and does what the caller
needs:

* named as a handler factory (``TITAN_STRUCT_LOGGER_HANDLERS``, torchtitan's
  default path), `init_structured_logger` calls it with otel-titan's factory
  arguments: it registers otel-titan's own JSONL file (background writer,
  rotation, the hang black box), the same as
  ``otel_titan.exporters.jsonl.register_jsonl_handler``;
* called directly, the torchtitan way (``structured_logger``, ``rank``,
  ``source``, ``output_dir``), it attaches a `TraceJsonlHandler` to that
  logger, as torchtitan does: a `logging.FileHandler` writing torchtitan's
  file name, which receives every record of the program's calls.

Example:
    >>> import logging, tempfile
    >>> log = logging.getLogger("doctest.jsonl_handler")
    >>> register_jsonl_handler(structured_logger=log, rank=2, source="training", output_dir=tempfile.mkdtemp())
    >>> "training.global_rank_2." in log.handlers[0].baseFilename
    True
    >>> log.handlers[0].close(); log.removeHandler(log.handlers[0])
"""

from __future__ import annotations

import logging
import os
from typing import Any

from otel_titan.exporters.compat import MAX_MESSAGE_SIZE, TraceEventsOnlyFilter, TraceJsonlFormatter
from otel_titan.exporters.jsonl import jsonl_file_path
from otel_titan.exporters.jsonl import register_jsonl_handler as _register_otel_titan_file

__all__ = ["TraceJsonlFormatter", "TraceJsonlHandler", "register_jsonl_handler", "MAX_MESSAGE_SIZE"]

_log = logging.getLogger(__name__)


class TraceJsonlHandler(logging.FileHandler):
    """Per-rank JSONL file handler, torchtitan's:
    ``{output_dir}/structured_logs/{source}.global_rank_{rank}.{timestamp}-{random}.jsonl``.

    Written on otel-titan's writer thread (the structured logger's handlers
    are fed there), with `TraceJsonlFormatter` and `TraceEventsOnlyFilter`.
    """

    def __init__(self, rank: int, source: str, output_dir: str | os.PathLike[str]) -> None:
        path = jsonl_file_path(os.path.abspath(os.fspath(output_dir)), source, rank)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        super().__init__(filename=path, encoding="utf-8")
        self.setFormatter(TraceJsonlFormatter(rank=rank, source=source))
        self.addFilter(TraceEventsOnlyFilter())


def register_jsonl_handler(
    *,
    structured_logger: logging.Logger,
    rank: int | None,
    source: str,
    output_dir: str,
    **kw: Any,
) -> None:
    """Default factory: the JSONL file of this process (see the module docstring for the two ways it
    is called).

    Example (a job script naming torchtitan's default factory beside another; shell, not Python)::

        export
        TITAN_STRUCT_LOGGER_HANDLERS=torchtitan.observability.structured_logger.jsonl_handler.register_jsonl_handler,mypkg.register_db
    """
    if "add_span_exporter" in kw:  # called by init_structured_logger: otel-titan's own file
        _register_otel_titan_file(output_dir=output_dir, **kw)
        return
    handler = TraceJsonlHandler(
        rank=rank if rank is not None else 0, source=source, output_dir=output_dir
    )
    structured_logger.addHandler(handler)
    _log.info("Structured logging -> JSONL: %s", handler.baseFilename)
