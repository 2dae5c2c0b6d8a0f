"""The talk between the analysis and its worker interpreters: start, spec, progress, warnings, result.

Why one module: the export workers (`export_parallel`) and the summary
workers (`summary_worker`) are started, fed and heard the same way, and a
warning must reach the person the same way whichever process saw it. So:

* **Start**: a fresh interpreter (never a fork of a possibly threaded
  caller) that calls one function, ``python -c "from M import F; ..."``.
  Not ``python -m M``: ``-m`` imports the package ``otel_titan.analysis``
  first, which imports `export_parallel`, and runpy then warns
  ``<frozen runpy>: RuntimeWarning: ... found in sys.modules`` once per worker.
* **Spec**: one JSON document on stdin, written with ``ensure_ascii`` so a
  file name's undecodable bytes (surrogates in Python) survive exactly.
* **Lines on stdout**: ``P <bytes>`` progress, ``W <json>`` a warning,
  ``R <json>`` a result. A worker's warnings are not written to the
  terminal by the worker: the parent logs each one on its own
  ``otel_titan.analysis`` logger, so it goes the one path every warning of
  the command goes (`cli`: control characters escaped by
  `safe_text.printable`, the progress line kept intact). The worker escapes
  the text as well, so nothing raw reaches a terminal even where the parent
  has no handler.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import subprocess
import sys
from typing import Any, Callable

from otel_titan.analysis.safe_text import printable

__all__ = ["LOGGER", "encode", "start_process", "start_worker", "read_workers"]

#: The logger of every analysis warning (skipped lines, repaired lines), in the parent and in each worker.
LOGGER = "otel_titan.analysis"


def encode(message: Any) -> bytes:
    """One line of JSON that carries any Python string exactly (surrogates as ``\\udXXX`` escapes).

    Example:
        >>> encode({"path": "a\\udcff"})
        b'{"path":"a\\\\udcff"}'
    """
    return json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def start_process(module: str, function: str, spec: dict[str, Any]) -> subprocess.Popen[bytes]:
    """A worker interpreter running ``module.function()`` (its exit status the function's result), `spec` on its stdin.

    The package this module belongs to is put first on the worker's
    ``PYTHONPATH``, so the worker runs this very code, installed or not.
    """
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    code = f"import sys; from {module} import {function} as main; sys.exit(main())"
    worker = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert worker.stdin is not None
    try:
        worker.stdin.write(encode(spec))
        worker.stdin.close()
    except BrokenPipeError:
        pass  # it died at once: the caller reports its exit status
    return worker


class _ToParent(logging.Handler):
    """A worker's warnings as ``W <json>`` lines on its stdout, for the parent to log."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = b"W " + encode(printable(record.getMessage())) + b"\n"
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
        except Exception:  # noqa: BLE001 - a warning that cannot be sent must not fail the work
            self.handleError(record)


def start_worker() -> dict[str, Any]:
    """A worker's start: its spec from stdin; its warnings go to the parent (``W`` lines), never to the terminal directly."""
    spec = json.loads(sys.stdin.buffer.read())
    logger = logging.getLogger(LOGGER)
    logger.addHandler(_ToParent())
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    return spec


def read_workers(workers: list[subprocess.Popen[bytes]], on_bytes: Callable[[int], None], what: str) -> list[Any]:
    """Read every worker's lines until all have exited; returns each one's ``R`` result (None when it sent none).

    ``P`` lines go to `on_bytes`, ``W`` lines to the ``otel_titan.analysis``
    logger of this process, and so does anything a worker writes to its
    stderr (a traceback, a message of Python's), as a warning naming the
    worker: the same path, escaped, whatever it holds. Raises RuntimeError
    naming `what` (``export worker``) when a worker exits with an error.
    """
    results: list[Any] = [None] * len(workers)
    logger = logging.getLogger(LOGGER)
    selector = selectors.DefaultSelector()
    for index, worker in enumerate(workers):
        selector.register(worker.stdout, selectors.EVENT_READ, (index, False))  # type: ignore[arg-type]
        if worker.stderr is not None:
            selector.register(worker.stderr, selectors.EVENT_READ, (index, True))
    open_streams = len(selector.get_map())
    while open_streams:
        for key, _ in selector.select():
            index, is_stderr = key.data
            line = key.fileobj.readline()  # type: ignore[union-attr]
            if not line:
                selector.unregister(key.fileobj)
                open_streams -= 1
            elif is_stderr:
                logger.warning("%s %d: %s", what, index, line.rstrip(b"\n").decode("utf-8", "backslashreplace"))
            elif line.startswith(b"P "):
                on_bytes(int(line[2:]))
            elif line.startswith(b"W "):
                logger.warning("%s", json.loads(line[2:]))
            elif line.startswith(b"R "):
                results[index] = json.loads(line[2:])
    selector.close()
    for index, worker in enumerate(workers):
        code = worker.wait()
        if code != 0:
            raise RuntimeError(f"{what} {index} failed (exit status {code}); its error is above")
    return results
