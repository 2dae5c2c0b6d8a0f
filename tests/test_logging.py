"""otel_titan.logging.init_logger: the [titan] console logger."""

from __future__ import annotations

import logging

from tests.conftest import run_python


def test_init_logger_prints_with_the_titan_prefix_once():
    result = run_python(
        """
from otel_titan.logging import init_logger, logger
init_logger(); init_logger()
logger.info("hello %s", "world")
logger.debug("hidden")
"""
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("[titan] ") and lines[0].endswith(" - root - INFO - hello world")


def test_init_logger_returns_the_root_logger():
    from otel_titan.logging import init_logger

    root = logging.getLogger()
    before = list(root.handlers)
    try:
        assert init_logger(logging.WARNING) is root and root.level == logging.WARNING
    finally:
        for handler in root.handlers:
            if handler not in before:
                root.removeHandler(handler)
