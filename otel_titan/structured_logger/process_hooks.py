"""What the running logger does when the process exits, is sent SIGTERM, or forks.

* **exit**: an `atexit` hook writes what is queued (bounded by ``exit_timeout_s``)
  and the closing record. In a `multiprocessing` child (Pool and Process
  workers, DataLoader workers, with fork, forkserver or spawn) the same is done
  by a `multiprocessing.util.Finalize`: fork and forkserver children end with
  ``os._exit``, which skips `atexit`, but their bootstrap runs these finalizers first;
* **SIGTERM** (what torchrun's agent sends on failure): the queue is written,
  a ``signal_received`` record says so, every exporter declaring `drain`
  (core/exporter.py) gets what is left of the budget to deliver, then the
  signal takes its usual course: a handler installed before ours is called,
  the default action still kills the process (so the exit status is
  unchanged), an ignored signal stays ignored. A watcher thread does this even
  while the main thread is stuck in native code (see `sigterm`);
* **an uncaught exception** (a CUDA out-of-memory, a NCCL error raised by the
  next call: how most training processes die): `sys.excepthook` and
  `threading.excepthook` write an ``uncaught_exception`` record (its type,
  message, the frames it was raised in; ``fatal`` for the main thread's, which
  ends the program) before the hook in place before ours prints it, so the
  closing record that follows at exit never passes for a clean end;
* **fork** (DataLoader workers, multiprocessing): the child starts with logging
  off and never writes to the parent's file; it may call
  `init_structured_logger` for a file of its own.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from otel_titan.core import capture, step_context
from otel_titan.core.blackbox import exception_frames
from otel_titan.core.exporter import close_exporter_after_fork, drain_exporters
from otel_titan.core.options import LoggerOptions
from otel_titan.environment_variables import OTEL_TITAN_DUMP_SIGNAL
from otel_titan.schema import Field, MetaEvent
from otel_titan.structured_logger import sigterm
from otel_titan.structured_logger.runtime import STATE, shutdown

__all__ = ["install"]

_log = logging.getLogger("otel_titan")


def install(options: LoggerOptions) -> None:
    """Put the exit, fork and (unless ``handle_sigterm=False``) SIGTERM hooks in place for a new
    logger."""
    if not STATE.hooks_installed:
        atexit.register(_at_exit)
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _install_excepthooks()
        STATE.hooks_installed = True
    _register_multiprocessing_exit()
    if options.handle_sigterm:
        sigterm.install(_flush_for_sigterm)
    else:
        sigterm.uninstall()
    _install_dump_signal()


#: The hooks in place before ours (called after ours: the traceback is still printed as it was).
_previous_hooks: dict[str, Any] = {}


def _install_excepthooks() -> None:
    """Chain `sys.excepthook` and `threading.excepthook` (once per process): an uncaught exception
    is recorded as one."""
    _previous_hooks["sys"] = sys.excepthook
    _previous_hooks["threading"] = threading.excepthook
    sys.excepthook = _on_uncaught
    threading.excepthook = _on_uncaught_in_thread


def _on_uncaught(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    """`sys.excepthook`: the main thread's exception, about to end the program (not in an
    interactive session)."""
    _record_uncaught(exc_type, exc, tb, fatal=not (sys.flags.interactive or hasattr(sys, "ps1")))
    (_previous_hooks.get("sys") or sys.__excepthook__)(exc_type, exc, tb)


def _on_uncaught_in_thread(args: Any) -> None:
    """`threading.excepthook`: a thread died of it; the program goes on (SystemExit ends a thread
    quietly, as threading's own hook)."""
    if args.exc_type is not SystemExit:
        _record_uncaught(args.exc_type, args.exc_value, args.exc_traceback, fatal=False)
    (_previous_hooks.get("threading") or threading.__excepthook__)(args)


def _record_uncaught(
    exc_type: type[BaseException], exc: BaseException | None, tb: Any, fatal: bool
) -> None:
    """The ``uncaught_exception`` record, queued like any instant (the exit hook then writes it
    before the closing record)."""
    runtime = STATE.running
    if runtime is None or not runtime.is_ours():
        return
    try:
        name = (
            exc_type.__qualname__
            if exc_type.__module__ == "builtins"
            else f"{exc_type.__module__}.{exc_type.__qualname__}"
        )
        try:
            message = str(exc) if exc is not None else ""
        except Exception as str_error:  # noqa: BLE001 - a broken __str__ must not hide the crash
            message = f"<str() failed: {type(str_error).__name__}>"
        capture.emit_internal_instant(
            MetaEvent.UNCAUGHT_EXCEPTION,
            {
                Field.ERROR_TYPE: name,
                Field.ERROR_MESSAGE: message[:4096],
                Field.ERROR_FRAMES: exception_frames(tb),
                Field.FATAL: fatal,
            },
        )
    except Exception:  # noqa: BLE001 - the logger never changes how a program dies
        _log.debug("otel-titan: could not record the uncaught exception", exc_info=True)


def _install_dump_signal() -> None:
    """``OTEL_TITAN_DUMP_SIGNAL=SIGUSR2`` (a name or a number): that signal writes the black box,
    nothing else."""
    raw = os.environ.get(OTEL_TITAN_DUMP_SIGNAL, "").strip()
    if not raw:
        return
    try:
        signum = (
            int(raw)
            if raw.isdigit()
            else int(
                getattr(
                    signal.Signals,
                    raw.upper() if raw.upper().startswith("SIG") else "SIG" + raw.upper(),
                )
            )
        )
    except (AttributeError, ValueError):
        _log.warning(
            "otel-titan: %s must name a signal (SIGUSR2, USR1, 12), got %r; no dump signal",
            OTEL_TITAN_DUMP_SIGNAL,
            raw,
        )
        return
    if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGSTOP):
        _log.warning(
            "otel-titan: %s=%s: that signal has another job; use SIGUSR1 or SIGUSR2",
            OTEL_TITAN_DUMP_SIGNAL,
            raw,
        )
        return
    sigterm.install_dump_signal(signum, _dump_black_box)


def _dump_black_box() -> None:
    runtime = STATE.running
    if runtime is not None and runtime.is_ours():
        runtime.processor.black_box("signal", timeout=0)  # not waited for: the processor writes it


def _register_multiprocessing_exit() -> None:
    """In a `multiprocessing` child, shut down from its exit finalizers too.

    Fork and forkserver children end with ``os._exit`` after ``Process._bootstrap``,
    so `atexit` never runs there; the bootstrap does run
    ``multiprocessing.util._exit_function`` first, which calls the finalizers
    registered with an exit priority (priority 0: after those of the process's
    own pools and queues, before its daemonic children are terminated). The
    registry is emptied at the start of every child, so this is registered
    here, at init, in the child. Shutting down is bounded by ``exit_timeout_s``.
    """
    pid = os.getpid()
    if STATE.mp_finalizer_pid == pid:
        return
    multiprocessing = sys.modules.get("multiprocessing")  # a multiprocessing child has imported it
    if multiprocessing is None:
        return
    try:
        if multiprocessing.parent_process() is None:
            return  # the main process: atexit runs
        # Imported here, not at the top: only a multiprocessing child gets this far, and
        # every other process would pay for loading multiprocessing.util at import.
        from multiprocessing import util

        util.Finalize(None, _at_exit, exitpriority=0)
    except Exception as error:  # noqa: BLE001 - atexit still covers spawn children
        _log.debug("otel-titan: no multiprocessing exit hook: %s", error)
        return
    STATE.mp_finalizer_pid = pid


def _at_exit() -> None:
    runtime = STATE.running
    if runtime is None or not runtime.is_ours():
        return
    # Bounded: another thread stuck inside init or shutdown must not hang the exit.
    lock = STATE.lock
    if not lock.acquire(timeout=max(runtime.options.exit_timeout_s, 0.001)):
        return
    try:
        shutdown(timeout=runtime.options.exit_timeout_s)
    finally:
        lock.release()


def _flush_for_sigterm(signum: int, dying: bool) -> None:
    """Write what is queued and a ``signal_received`` record (on the signal watcher thread, or the
    main thread)."""
    runtime = STATE.running
    if runtime is None:
        closing = STATE.closing
        if closing is not None and closing.is_ours():
            # Shutting down: finish it here (the signal may have interrupted the
            # shutdown before it asked the writer to stop), bounded as at exit.
            closing.processor.stop(closing.options.exit_timeout_s)
        return
    if not runtime.is_ours() or not runtime.options.handle_sigterm:
        return
    capture.emit_internal_instant(
        MetaEvent.SIGNAL_RECEIVED, {Field.SIGNAL: "SIGTERM", Field.SIGNAL_NUMBER: int(signum)}
    )
    deadline = time.monotonic() + runtime.options.exit_timeout_s
    # The hang black box first (where every thread is, open spans, collectives), bounded:
    # a launcher's SIGTERM is most often the end of a hang.
    if runtime.processor.stall_after_s != 0:
        runtime.processor.black_box("SIGTERM", timeout=min(2.0, runtime.options.exit_timeout_s / 2))
    # About to die of the signal: send spans still open (the hung phase) to
    # the OTLP side too, marked incomplete. The JSONL file already has their _start.
    runtime.processor.flush(runtime.options.exit_timeout_s, open_spans=dying)
    # Then give exporters with work of their own in flight (queued network
    # exporters: OTLP, a user's) what is left of the budget to deliver, side by
    # side (one hung endpoint must not starve the others; logs and traces start
    # before the metrics); waited for here, not on the processor, so the file never waits.
    drain_exporters(runtime.exporters, deadline)


def _after_fork_in_child() -> None:
    inherited = STATE.reset_after_fork()
    capture.detach()  # also forgets the parent's threads' cached native ids
    step_context.clear_boundary_hooks()
    # The SIGTERM disposition and wakeup fd the child would have had without us.
    sigterm.after_fork_in_child()
    if inherited is None:
        return
    for exporter in inherited.exporters:
        try:
            close_exporter_after_fork(exporter)
        except Exception:  # noqa: BLE001 - in the child after fork: one exporter's failure must not stop the others closing
            pass
