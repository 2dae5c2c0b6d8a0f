"""The console logger: stdout, with torchtitan's ``[titan]`` prefix.

Example (the last line not run by the doctests: the handler writes to the stdout of the first
`init_logger` in the process, not the test's, and the line carries the clock's time):
    >>> from otel_titan.logging import init_logger, logger
    >>> _ = init_logger()
    >>> logger.info("hello")  # doctest: +SKIP
    [titan] 2026-11-30 12:00:00,000 - root - INFO - hello
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["init_logger", "logger", "TITAN_FORMAT"]

TITAN_FORMAT = "[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s"

#: The root logger, configured by `init_logger` (as torchtitan's ``logger``).
logger = logging.getLogger()


def init_logger(level: int | str = logging.INFO) -> logging.Logger:
    """Send log records at `level` and above to stdout with the ``[titan]`` prefix.

    Idempotent: calling it again adjusts the level and never adds a second
    handler. Also quiets Kineto (``KINETO_LOG_LEVEL=5``) unless already set, as
    torchtitan does. Returns the configured (root) logger.

    Example:
        >>> import logging
        >>> init_logger() is logging.getLogger()
        True
    """
    logger.setLevel(level)
    for handler in logger.handlers:
        if getattr(handler, "_otel_titan_console", False):
            handler.setLevel(level)
            break
    else:
        handler = logging.StreamHandler(sys.stdout)
        handler.setLevel(level)
        handler.setFormatter(logging.Formatter(TITAN_FORMAT))
        handler._otel_titan_console = True  # type: ignore[attr-defined]  # a marker on the handler otel-titan added
        logger.addHandler(handler)
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    return logger
