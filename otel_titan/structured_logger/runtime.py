"""The running logger of this process, and its shutdown: the one home of lifecycle state.

`LoggerState` holds what init, shutdown, exit, SIGTERM and fork share (the
running logger, the one being closed, the lock around them, which process
hooks are in place); `STATE` is the process's instance and
`LoggerState.reset_after_fork` its one reset. The SIGTERM and exit hooks
(`process_hooks.py`) and the public API (`lifecycle.py`) both stand on this
module, so neither imports the other.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.sdk.trace.export import SpanExporter

from otel_titan.core import capture, step_context
from otel_titan.core.event_queue import EventQueue
from otel_titan.core.identity import RunIdentity
from otel_titan.core.options import LoggerOptions
from otel_titan.core.processor import BatchProcessor
from otel_titan.schema import LOGGER_NAME
from otel_titan.structured_logger import sigterm
from otel_titan.structured_logger.handler_factories import close_handlers

__all__ = ["Runtime", "LoggerState", "STATE", "shutdown"]

_log = logging.getLogger("otel_titan")


@dataclass
class Runtime:
    """One initialised logger: what init assembled, and the process it belongs to."""

    identity: RunIdentity
    options: LoggerOptions
    queue: EventQueue
    processor: BatchProcessor
    exporters: list[SpanExporter]
    logging_handlers: list[logging.Handler]
    output_dir: str
    pid: int = field(default_factory=os.getpid)
    #: Takes back the run id init shared with child processes (`identity.export_run_id`).
    unshare_run_id: Callable[[], None] | None = None

    def is_ours(self) -> bool:
        """Whether it was started in this process (not inherited through fork)."""
        return self.pid == os.getpid()


class LoggerState:
    """The process's logger state, reset in one place.

    * ``running``: the running logger, or None;
    * ``closing``: the logger being shut down (a SIGTERM now waits for its last records);
    * ``lock``: held by init and shutdown (re-entrant: exit calls shutdown under it);
    * ``hooks_installed``: atexit and the fork hook are registered (once per process);
    * ``mp_finalizer_pid``: the process whose `multiprocessing` exit finalizer is registered.
    """

    __slots__ = ("running", "closing", "lock", "hooks_installed", "mp_finalizer_pid")

    def __init__(self) -> None:
        self.running: Runtime | None = None
        self.closing: Runtime | None = None
        self.lock = threading.RLock()
        self.hooks_installed = False
        self.mp_finalizer_pid = 0

    def reset_after_fork(self) -> Runtime | None:
        """In a forked child: forget the parent's logger (returned, for its exporters to let go) and
        its lock."""
        inherited = self.running
        self.running = self.closing = None
        self.lock = threading.RLock()  # another thread may have held it at fork time
        return inherited


STATE = LoggerState()


def shutdown(timeout: float | None) -> bool:
    """Write what is queued, the closing record, and stop; True when done within `timeout` (see
    lifecycle)."""
    with STATE.lock:
        runtime = STATE.running
        if runtime is None:
            return True
        STATE.closing, STATE.running = runtime, None
        capture.detach()
        step_context.clear_boundary_hooks()  # the per-step figures, and the look for a mesh (`lifecycle._look_for_a_mesh`)
        try:
            finished = runtime.processor.shutdown(timeout)
        finally:
            STATE.closing = None
        # Only now: a SIGTERM during the writing above (a Pool worker ending as the pool is
        # terminated) waits for it instead of killing the process with the records still queued.
        sigterm.uninstall()  # on the main thread; from another, the handler stays and finds no logger
        close_handlers(logging.getLogger(LOGGER_NAME), runtime.logging_handlers)
        if runtime.unshare_run_id is not None and runtime.is_ours():
            runtime.unshare_run_id()  # a later init in this process (a test, a notebook) must not read it as a parent's
        if not finished:
            _log.warning(
                "otel-titan: the writer did not finish within %s s; records still queued may be "
                "lost",
                timeout,
            )
        return finished
