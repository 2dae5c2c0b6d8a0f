"""The talk between the analysis and its worker interpreters, and the one path of a task's warnings
and progress.

Why one module: the export, summary and sql workers are started, fed and
heard the same way, on this machine (`InterpreterPool`, ``--jobs N``) or on a
Dask cluster (`workers.executors`), and a warning must reach the person the same way
whichever process saw it. So:

* **A task** is `run_task` calling a function named ``"module:function"``
  (by name: the worker imports it, so no module imports its own caller, and
  Dask sends a string, not code). It captures the warnings the task logs on
  the ``otel_titan.analysis`` logger (only the task's own thread: a Dask
  worker runs several tasks at once), escaped by `read.safe_text.printable`, and
  returns them with the result; the parent logs each one on its own logger,
  so it goes the one path every warning of the command goes (`cli`: escaped,
  the progress line kept intact). Nothing of a task is written to a
  terminal by the worker.
* **On this machine** a task runs in a fresh interpreter (never a fork of a
  possibly threaded caller, and no ``__main__`` guard needed in the caller's
  script, which a `multiprocessing` spawn pool would re-import), started as
  ``python -c "from M import F; ..."``. Not ``python -m M``: ``-m`` imports
  the package ``otel_titan.analysis`` first, and runpy then warns
  ``<frozen runpy>: RuntimeWarning: ... found in sys.modules`` once per worker.
  The call travels pickled on stdin (a file name's undecodable bytes,
  surrogates in Python, survive exactly), the result pickled in a file of a
  private folder; ``P <bytes>`` lines on stdout report progress while it
  reads, and whatever it writes on stderr (a traceback, a message of
  Python's) is logged here as a warning naming the worker: the same path,
  escaped, whatever it holds.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
import pickle
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from otel_titan.analysis.read.safe_text import printable

__all__ = [
    "LOGGER",
    "InterpreterPool",
    "TaskResult",
    "WorkerDiedError",
    "run_task",
    "start_process",
    "read_workers",
]

#: The logger of every analysis warning (skipped lines, repaired lines), in the parent and in each
#: worker.
LOGGER = "otel_titan.analysis"
#: A local worker reports progress after this many bytes read.
PROGRESS_BYTES = 8 << 20

#: What `run_task` returns: (the function's result, its warnings escaped, bytes it read, of which
#: already reported live).
TaskResult = tuple[Any, list[str], int, int]


class WorkerDiedError(RuntimeError):
    """A worker interpreter exited with an error or without its result (out of memory, killed); what
    it wrote on stderr is logged first."""


_capturing = threading.local()
_filter_lock = threading.Lock()
#: Set in a local worker interpreter: where live progress goes (``P`` lines on stdout).
_live_progress: Callable[[int], None] | None = None


class _TaskWarnings(logging.Filter):
    """On the analysis logger: a record logged by a thread running a task is kept for the task's
    result, not emitted here."""

    def filter(self, record: logging.LogRecord) -> bool:
        kept = getattr(_capturing, "warnings", None)
        if kept is None:
            return True
        if record.levelno >= logging.WARNING:
            kept.append(printable(record.getMessage()))
        return False


_FILTER = _TaskWarnings()


def _install_filter() -> None:
    logger = logging.getLogger(LOGGER)
    with _filter_lock:
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


def _function(name: str) -> Callable[..., Any]:
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


def run_task(function: str, *args: Any) -> TaskResult:
    """Run ``function(*args, on_bytes)`` (named ``"module:function"``) as one task of a worker,
    anywhere.

    Returns (its result, the warnings it logged on ``otel_titan.analysis``,
    escaped, in order; the bytes it reported to `on_bytes`; of which already
    sent live to a local parent). The caller logs the warnings and counts the
    bytes not yet reported (`workers.executors.run_shares`).

    Example:
        >>> run_task("builtins:callable")  # callable(on_bytes): a task gets its progress callback last
        (True, [], 0, 0)
    """
    _install_filter()
    total = live = 0
    unreported = 0

    def on_bytes(count: int) -> None:
        nonlocal total, live, unreported
        total += count
        if _live_progress is not None:
            unreported += count
            if unreported >= PROGRESS_BYTES:
                _live_progress(unreported)
                live += unreported
                unreported = 0

    _capturing.warnings = warnings = []  # type: ignore[var-annotated]  # a thread-local's list of whatever warnings come
    try:
        value = _function(function)(*args, on_bytes)
    finally:
        _capturing.warnings = None
    if unreported and _live_progress is not None:
        _live_progress(unreported)
        live += unreported
    return value, warnings, total, live


#: The worker's own unblocking of SIGINT, after it ignores it (nothing where the platform has no
#: signal masks).
_UNBLOCK_SIGINT = (
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    if hasattr(signal, "pthread_sigmask")
    else ""
)


@contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in the calling thread (and so in a child it starts), its mask restored after.

    In a pool's thread a Ctrl-C meanwhile goes to the main thread, as it does
    anyway; in the main thread it is held until the mask is restored, then
    raises KeyboardInterrupt there as usual.
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_process(module: str, function: str, payload: bytes) -> subprocess.Popen[bytes]:
    """A worker interpreter running ``module.function()`` (its exit status the function's result),
    `payload` on its stdin.

    The package this module belongs to is put first on the worker's
    ``PYTHONPATH``, so the worker runs this very code, installed or not.
    The worker ignores SIGINT: a Ctrl-C is the command's to handle. It is
    started with SIGINT blocked (the mask of the calling thread, which the
    child inherits across exec) until its first line ignores it, so a Ctrl-C
    during the ~30 ms of its interpreter's start-up (longer on a loaded
    machine) neither kills it nor makes it print ``Fatal Python error:
    init_import_site`` and a KeyboardInterrupt traceback, which the command
    relayed as warnings above its one line ``otel-titan: interrupted``.
    """
    # the folder holding otel_titan/
    package_root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = package_root + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    # Ctrl-C reaches the whole foreground group: the command stops its workers
    # (`InterpreterPool.shutdown`) and says "interrupted" once, instead of each worker printing its
    # KeyboardInterrupt traceback. Ignoring SIGINT discards one that came while it was blocked; only
    # then is it unblocked.
    code = (
        f"import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); {_UNBLOCK_SIGINT}"
        f"from {module} import {function} as main; sys.exit(main())"
    )
    with _sigint_blocked():
        worker = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
    assert worker.stdin is not None
    try:
        worker.stdin.write(payload)
        worker.stdin.close()
    except BrokenPipeError:
        pass  # it died at once: the caller reports its exit status
    return worker


def _progress_line(count: int) -> None:
    sys.stdout.buffer.write(b"P %d\n" % count)
    sys.stdout.buffer.flush()


def _call_main() -> int:
    """A local worker: ``(function, args, result_path)`` pickled on stdin; `run_task`'s result
    pickled into `result_path`."""
    global _live_progress
    function, args, result_path = pickle.loads(sys.stdin.buffer.read())
    _live_progress = _progress_line
    result = run_task(function, *args)
    with open(result_path, "wb") as handle:
        pickle.dump(result, handle, protocol=pickle.HIGHEST_PROTOCOL)
    return 0


def read_workers(
    workers: list[subprocess.Popen[bytes]],
    on_bytes: Callable[[int], None],
    what: str,
    first_index: int = 0,
) -> None:
    """Read every worker's lines until all have exited.

    ``P`` lines go to `on_bytes`; anything a worker writes to its stderr goes
    to the ``otel_titan.analysis`` logger of this process as a warning naming
    the worker (``export worker 0: ...``). Raises `WorkerDiedError` naming `what`
    when a worker exits with an error.
    """
    logger = logging.getLogger(LOGGER)
    selector = selectors.DefaultSelector()
    for index, worker in enumerate(workers, first_index):
        selector.register(worker.stdout, selectors.EVENT_READ, (index, False))  # type: ignore[arg-type]  # a worker started with a stdout pipe
        if worker.stderr is not None:
            selector.register(worker.stderr, selectors.EVENT_READ, (index, True))
    open_streams = len(selector.get_map())
    while open_streams:
        for key, _ in selector.select():
            index, is_stderr = key.data
            line = key.fileobj.readline()  # type: ignore[union-attr]  # the worker's stdout pipe registered above
            if not line:
                selector.unregister(key.fileobj)
                open_streams -= 1
            elif is_stderr:
                logger.warning(
                    "%s %d: %s", what, index, line.rstrip(b"\n").decode("utf-8", "backslashreplace")
                )
            elif line.startswith(b"P "):
                on_bytes(int(line[2:]))
    selector.close()
    for index, worker in enumerate(workers, first_index):
        code = worker.wait()
        if code != 0:
            raise WorkerDiedError(f"{what} {index} failed (exit status {code}); its error is above")


class InterpreterPool(Executor):
    """A `concurrent.futures.Executor` on this machine: each call in a fresh worker interpreter,
    `max_workers` at once.

    The local half of `workers.executors` (the other is Dask's ``Client.get_executor``):
    ``submit(run_task, "module:function", *args)`` runs `run_task` in a worker
    started by `start_process`. Progress lines go to `on_bytes` (called under
    a lock: several workers report at once); a worker that exits with an error
    fails its future with `WorkerDiedError` (what it wrote on stderr logged first).
    `shutdown(cancel_futures=True)` kills the workers still running, and any
    that a thread was starting meanwhile as soon as it has started (on Ctrl-C
    one otherwise converted its whole share before the command could exit).
    """

    def __init__(self, max_workers: int, what: str, on_bytes: Callable[[int], None]) -> None:
        self._threads = ThreadPoolExecutor(max_workers, thread_name_prefix="otel-titan-worker")
        self._what = what
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()
        self._cancelled = False  # shutdown(cancel_futures=True) has begun: a worker started from now on is killed at once
        self._numbers = itertools.count()
        self._folder = tempfile.mkdtemp(prefix="otel-titan-workers-")

        def report(count: int) -> None:
            with self._lock:
                on_bytes(count)

        self._on_bytes = report

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if fn is not run_task or kwargs:
            raise TypeError(
                'InterpreterPool runs run_task("module:function", *args) only: the worker imports the function by name'
            )
        return self._threads.submit(self._call, next(self._numbers), args)

    def _call(self, number: int, args: tuple[Any, ...]) -> Any:
        result_path = os.path.join(self._folder, f"result-{number}")
        function, *rest = args
        worker = start_process(
            __name__,
            "_call_main",
            pickle.dumps((function, tuple(rest), result_path), protocol=pickle.HIGHEST_PROTOCOL),
        )
        with self._lock:
            self._running.add(worker)
            if self._cancelled:
                worker.kill()
        try:
            read_workers([worker], self._on_bytes, self._what, number)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            with self._lock:
                self._running.discard(worker)
        if not os.path.exists(result_path):
            raise WorkerDiedError(
                f"{self._what} {number} exited without its result; its error is above"
            )
        with open(result_path, "rb") as handle:
            # written just now by our own worker, in our private folder
            result = pickle.load(handle)
        os.unlink(result_path)
        return result

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            with self._lock:
                self._cancelled = True
                for worker in self._running:
                    worker.kill()
        self._threads.shutdown(wait=True, cancel_futures=cancel_futures)
        shutil.rmtree(self._folder, ignore_errors=True)
