"""Starting, flushing and stopping the logger, and the process events around it.

`init_structured_logger` validates everything first (source, options,
identity, output directory, every handler factory) and only then starts the
processor and publishes the queue to the hot path: if any step fails, what was
created is undone and the exception names the cause. Nothing half-attached.

Calling it again with the same arguments does nothing (torchtitan code calls
it from more than one place); with different ones it raises, naming each
difference, since a second file or a silently ignored option would both
mislead. The output directory is made absolute once, here: a later
``os.chdir`` (Hydra does one) cannot move or split the run.

Around the process:

* **exit**: an `atexit` hook writes what is queued (bounded by ``exit_timeout_s``)
  and the closing record. In a `multiprocessing` child (Pool and Process
  workers, DataLoader workers, with fork, forkserver or spawn) the same is done
  by a `multiprocessing.util.Finalize`: fork and forkserver children end with
  ``os._exit``, which skips `atexit`, but their bootstrap runs these finalizers first;
* **SIGTERM** (what torchrun's agent sends on failure): the queue is written,
  a ``signal_received`` record says so, then the signal takes its usual course:
  a handler installed before ours is called, the default action still kills
  the process (so the exit status is unchanged), an ignored signal stays
  ignored. A watcher thread does this even while the main thread is stuck in
  native code (see `sigterm`);
* **fork** (DataLoader workers, multiprocessing): the child starts with logging
  off and never writes to the parent's file; it may call
  `init_structured_logger` for a file of its own.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_titan._version import __version__
from otel_titan.schema import LOGGER_NAME, MetaEvent
from otel_titan.core import capture, otel_context
from otel_titan.structured_logger import sigterm
from otel_titan.core.event_queue import EventQueue
from otel_titan.core.exporter import HandlerFactoryError, HandlerSkipped, close_exporter_after_fork, discard_exporter, drain_exporter
from otel_titan.exporters.logging_bridge import LoggingBridgeExporter
from otel_titan.structured_logger.handler_factories import describe, load_factory, resolve_handler_specs
from otel_titan.core.identity import RunIdentity, build_resource, discover_identity
from otel_titan.core.options import LoggerOptions, parse_options
from otel_titan.core.processor import BatchProcessor
from otel_titan.core.span_builder import SpanBuilder
from otel_titan.core.trace_ids import SpanIdAllocator, StepTraceIds

__all__ = [
    "init_structured_logger",
    "flush_structured_logger",
    "shutdown_structured_logger",
    "is_initialized",
    "get_run_identity",
    "get_exporters",
    "STRUCTURED_LOGGER_NAME",
]

_log = logging.getLogger("otel_titan")

#: Name of the `logging.Logger` handed to factories for torchtitan-style handlers.
STRUCTURED_LOGGER_NAME = LOGGER_NAME
_SOURCE_PATTERN = re.compile(r"[^\W][\w.\-]*")
#: A source names the file: at most this many bytes of UTF-8 (a file name has 255 on most filesystems).
MAX_SOURCE_BYTES = 128


@dataclass
class _Runtime:
    identity: RunIdentity
    options: LoggerOptions
    queue: EventQueue
    processor: BatchProcessor
    exporters: list[SpanExporter]
    logging_handlers: list[logging.Handler]
    output_dir: str
    pid: int = field(default_factory=os.getpid)


_runtime: _Runtime | None = None
_closing: _Runtime | None = None  # being shut down: a SIGTERM now waits for its last records
_lifecycle_lock = threading.RLock()
_process_hooks_installed = False
_mp_finalizer_pid = 0


def _validate_source(source: object) -> str:
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__} {source!r}")
    if not _SOURCE_PATTERN.fullmatch(source):
        raise ValueError(
            f"source {source!r} cannot be used in a file name: use letters, digits, '_', '-' or '.', not starting with '.' or '-' (no path separators)"
        )
    # Limits on file names are in bytes: 100 CJK characters are 300 bytes.
    size = len(source.encode("utf-8"))
    if size > MAX_SOURCE_BYTES:
        raise ValueError(
            f"source {source[:16]!r}{'...' if len(source) > 16 else ''} is {size} bytes in UTF-8 ({len(source)} characters); it names the file, so at most {MAX_SOURCE_BYTES} bytes"
        )
    return source


def _absolute_dir(output_dir: object) -> str:
    """`output_dir` as an absolute path, resolved against the working directory of now."""
    if not isinstance(output_dir, (str, os.PathLike)):
        raise TypeError(f"output_dir must be a path, got {type(output_dir).__name__} {output_dir!r}")
    path = os.fspath(output_dir)
    if not path or "\x00" in path:
        raise ValueError(f"output_dir {path!r} is not a usable path")
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def _check_output_dir(output_dir: object) -> str:
    """Create ``output_dir/structured_logs`` and return `output_dir` as an absolute path.

    Absolute once, at init: every later use (the file's path, the writer's
    check that the file still exists, the factories' ``output_dir``) then
    names the same directory after an ``os.chdir``.
    """
    path = _absolute_dir(output_dir)
    logs = os.path.join(path, "structured_logs")
    try:
        os.makedirs(logs, exist_ok=True)
    except OSError as error:
        raise OSError(error.errno, f"otel-titan: cannot create {logs!r}: {error.strerror}") from error
    if not os.access(logs, os.W_OK | os.X_OK):
        raise PermissionError(f"otel-titan: output directory {logs!r} is not writable")
    # Tidy ("a/./b/.." → "a") only where that names the same directory: ".." after a symlink may not.
    tidy = os.path.normpath(path)
    try:
        return tidy if tidy == path or os.path.samefile(tidy, path) else path
    except OSError:
        return path


def _same_dir(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _differences(runtime: _Runtime, source: str, output_dir: object, rank: int | None, enable: bool, options: dict[str, Any], parsed: LoggerOptions) -> list[str]:
    """What a second `init_structured_logger` call asks for that the running logger does not have.

    An argument left out agrees with anything (a library calling
    ``init_structured_logger(source, output_dir)`` after the training script
    configured more); identity options are compared with what was discovered.
    """
    identity = runtime.identity
    found: list[str] = []
    if not enable:
        found.append("enable=False (the logger is running)")
    if source != identity.source:
        found.append(f"source {source!r} (running: {identity.source!r})")
    directory = _absolute_dir(output_dir)
    if not _same_dir(directory, runtime.output_dir):
        found.append(f"output_dir {directory!r} (running: {runtime.output_dir!r})")
    if rank is not None and rank != identity.rank:
        found.append(f"rank {rank} (running: {identity.rank})")
    discovered = {"world_size": identity.world_size, "local_rank": identity.local_rank, "run_id": identity.run_id, "attempt": identity.attempt, "job_id": identity.job_id}
    for name in options:
        value = getattr(parsed, name)
        if name in discovered:
            if value is not None and value != discovered[name]:
                found.append(f"{name}={value!r} (running: {discovered[name]!r})")
            continue
        running = getattr(runtime.options, name)
        if name == "handlers":  # a list or a tuple of the same factories is the same
            value, running = (list(v) if v is not None else None for v in (value, running))
        if value != running:
            found.append(f"{name}={value!r} (running: {running!r})")
    return found


def init_structured_logger(source: str, output_dir: str | os.PathLike[str], rank: int | None = None, enable: bool = True, **options: Any) -> None:
    """Start structured logging for this process (call once, before any trace call).

    Args:
        source: the process's role, ``"training"``, ``"rollouter"``, ``"reward"``…;
            it names the file, so letters, digits, ``_ - .`` only.
        output_dir: run directory; files go to ``output_dir/structured_logs/``.
        rank: global rank; None = ``RANK`` / SLURM / torch.distributed / 0.
        enable: False makes every `sl` call a no-op (nothing is created).
        **options: see `LoggerOptions`: ``world_size``, ``local_rank``,
            ``run_id``, ``attempt``, ``job_id``, ``max_file_size_mb`` (128),
            ``backup_count`` (3), ``queue_size`` (65536 events),
            ``include_hostname`` (True), ``handlers``, ``flush_interval_s``
            (0.05), ``heartbeat_interval_s`` (10), ``exit_timeout_s`` (5), ``handle_sigterm`` (True),
            ``join_otel_context`` (auto), ``propagate_otel_context`` (False).

    Raises:
        TypeError / ValueError: a bad source, rank or option (named in the message).
        OSError: ``output_dir`` cannot be created or written.
        HandlerFactoryError: a handler factory cannot be imported or raised
            (the JSONL file's: its name would be too long for the filesystem).
        RuntimeError: the logger is already running in this process with
            different arguments (each difference is named). With the same
            arguments, or a subset of them, a second call does nothing, as in
            torchtitan.

    A relative ``output_dir`` is resolved once, here: a later ``os.chdir``
    does not move the files. The file's first record (``structured_logger_opened``)
    is on disk when this returns, so an empty file never stands for a live rank.

    Example:
        >>> import tempfile
        >>> from otel_titan import structured_logger as sl
        >>> sl.init_structured_logger(source="training", output_dir=tempfile.mkdtemp(), rank=0, world_size=1)
        >>> sl.log_trace_instant("training_start")
        >>> sl.shutdown_structured_logger()
        True
    """
    global _runtime
    with _lifecycle_lock:
        _validate_source(source)
        if not isinstance(enable, bool):
            raise TypeError(f"enable must be a bool, got {type(enable).__name__}")
        parsed = parse_options(options)
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
            raise TypeError(f"rank must be an int or None, got {type(rank).__name__} {rank!r}")
        running = _runtime
        if running is not None:
            differences = _differences(running, source, output_dir, rank, enable, options, parsed)
            if differences:
                raise RuntimeError(
                    f"init_structured_logger() is already running in this process with other arguments: {'; '.join(differences)}. "
                    "Call it with the same arguments (a no-op), or call shutdown_structured_logger() first"
                )
            return  # the same arguments: torchtitan code may call it more than once
        if not enable:
            return
        directory = _check_output_dir(output_dir)
        identity = discover_identity(
            source,
            rank=rank,
            world_size=parsed.world_size,
            local_rank=parsed.local_rank,
            run_id=parsed.run_id,
            attempt=parsed.attempt,
            job_id=parsed.job_id,
            include_hostname=parsed.include_hostname,
        )
        resource = build_resource(identity)
        queue = EventQueue(parsed.queue_size)
        exporters: list[SpanExporter] = []
        structured_logger = logging.getLogger(STRUCTURED_LOGGER_NAME)
        structured_logger.propagate = False
        handlers_before = list(structured_logger.handlers)

        def add_span_exporter(exporter: SpanExporter) -> None:
            if not isinstance(exporter, SpanExporter):
                raise TypeError(f"add_span_exporter() takes an opentelemetry SpanExporter, got {type(exporter).__name__}")
            exporters.append(exporter)

        try:
            specs, origin = resolve_handler_specs(parsed.handlers)
        except ValueError as error:  # e.g. OTEL_TRACES_EXPORTER=zipkin
            raise HandlerFactoryError(str(error)) from error
        try:
            for spec in specs:
                factory = load_factory(spec)
                registered_before = len(exporters) + len(structured_logger.handlers)
                try:
                    factory(
                        structured_logger=structured_logger,
                        add_span_exporter=add_span_exporter,
                        rank=identity.rank,
                        local_rank=identity.local_rank,
                        world_size=identity.world_size,
                        source=source,
                        output_dir=directory,
                        run_id=identity.run_id,
                        attempt=identity.attempt,
                        job_id=identity.job_id,
                        trace_id=identity.run_id,
                        identity=identity,
                        resource=resource,
                        options=parsed,
                        stats=queue,
                    )
                except HandlerSkipped as skipped:
                    _log.info("otel-titan: handler factory %s skipped: %s", describe(spec), skipped)
                    continue
                except Exception as error:
                    raise HandlerFactoryError(f"handler factory {describe(spec)!r} (from {origin}) raised {type(error).__name__}: {error}") from error
                if len(exporters) + len(structured_logger.handlers) == registered_before:
                    # Strict: a factory the user asked for that attaches nothing
                    # would silently run without the observability they enabled.
                    raise HandlerFactoryError(
                        f"handler factory {describe(spec)!r} (from {origin}) registered no exporter (add_span_exporter) and no handler (structured_logger.addHandler)"
                    )
            if not specs:
                raise HandlerFactoryError(f"no handler factory to run ({origin} is empty)")
            new_handlers = [h for h in structured_logger.handlers if h not in handlers_before]
            if new_handlers:
                exporters.append(LoggingBridgeExporter(structured_logger, identity))
        except BaseException:
            _undo(exporters, structured_logger, handlers_before)
            raise

        trace_ids = StepTraceIds(identity.run_id, identity.attempt)
        span_ids = SpanIdAllocator()
        builder = SpanBuilder(resource, InstrumentationScope("otel_titan", __version__), trace_ids, span_ids)
        processor = BatchProcessor(queue, builder, exporters, schedule_delay=parsed.flush_interval_s, heartbeat_s=parsed.heartbeat_interval_s)
        processor.start()
        _runtime = _Runtime(
            identity=identity,
            options=parsed,
            queue=queue,
            processor=processor,
            exporters=exporters,
            logging_handlers=[h for h in structured_logger.handlers if h not in handlers_before],
            output_dir=directory,
        )
        _install_process_hooks(parsed)
        join = parsed.join_otel_context if parsed.join_otel_context is not None else otel_context.sdk_tracer_provider_configured()
        capture.attach(
            queue,
            wake_writer=processor.wake,
            remote_parent=otel_context.remote_parent_hook() if join else None,
            propagate=otel_context.propagation_hooks(trace_ids, span_ids) if parsed.propagate_otel_context else None,
            trace_ids=trace_ids,
            span_ids=span_ids,
        )


def _undo(exporters: list[SpanExporter], structured_logger: logging.Logger, handlers_before: list[logging.Handler]) -> None:
    for exporter in exporters:
        try:
            discard_exporter(exporter)
        except Exception:  # noqa: BLE001 - already failing; report the original error
            pass
    for handler in list(structured_logger.handlers):
        if handler not in handlers_before:
            structured_logger.removeHandler(handler)
            try:
                handler.close()
            except Exception:  # noqa: BLE001
                pass


def flush_structured_logger(timeout: float | None = 5.0) -> bool:
    """Write everything recorded so far; return False if `timeout` seconds passed first.

    Safe to call when the logger was never initialised (returns True).

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.flush_structured_logger(timeout=1.0)
        True
    """
    runtime = _runtime
    if runtime is None or runtime.pid != os.getpid():
        return True
    return runtime.processor.flush(timeout)


def shutdown_structured_logger(timeout: float | None = 5.0) -> bool:
    """Write what is queued, write the closing record, and stop; later calls are no-ops.

    Returns False when the writer did not finish within `timeout` (a frozen
    filesystem, say); the process can still exit. Safe to call more than once
    and when nothing was initialised.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.shutdown_structured_logger()
        True
    """
    global _runtime, _closing
    with _lifecycle_lock:
        runtime = _runtime
        if runtime is None:
            return True
        _closing, _runtime = runtime, None
        capture.detach()
        try:
            finished = runtime.processor.shutdown(timeout)
        finally:
            _closing = None
        # Only now: a SIGTERM during the writing above (a Pool worker ending as the pool is
        # terminated) waits for it instead of killing the process with the records still queued.
        sigterm.uninstall()  # on the main thread; from another, the handler stays and finds no logger
        structured_logger = logging.getLogger(STRUCTURED_LOGGER_NAME)
        for handler in runtime.logging_handlers:
            structured_logger.removeHandler(handler)
            try:
                handler.close()
            except Exception:  # noqa: BLE001
                pass
        if not finished:
            _log.warning("otel-titan: the writer did not finish within %s s; records still queued may be lost", timeout)
        return finished


def is_initialized() -> bool:
    """Whether `sl` calls currently record anything in this process.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.is_initialized()
        False
    """
    return _runtime is not None and capture.is_attached()


def get_run_identity() -> RunIdentity | None:
    """The identity (rank, run id…) of the running logger, or None.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.get_run_identity() is None
        True
    """
    runtime = _runtime
    return runtime.identity if runtime is not None else None


def get_exporters() -> list[SpanExporter]:
    """The exporters the handler factories registered (empty when not initialised)."""
    runtime = _runtime
    return list(runtime.exporters) if runtime is not None else []


# -- process events ------------------------------------------------------------------------------
def _install_process_hooks(options: LoggerOptions) -> None:
    global _process_hooks_installed
    if not _process_hooks_installed:
        atexit.register(_at_exit)
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _process_hooks_installed = True
    _register_multiprocessing_exit()
    if options.handle_sigterm:
        sigterm.install(_flush_for_sigterm)
    else:
        sigterm.uninstall()


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
    global _mp_finalizer_pid
    pid = os.getpid()
    if _mp_finalizer_pid == pid:
        return
    multiprocessing = sys.modules.get("multiprocessing")  # a multiprocessing child has imported it
    if multiprocessing is None:
        return
    try:
        if multiprocessing.parent_process() is None:
            return  # the main process: atexit runs
        from multiprocessing import util  # noqa: PLC0415

        util.Finalize(None, _at_exit, exitpriority=0)
    except Exception as error:  # noqa: BLE001 - atexit still covers spawn children
        _log.debug("otel-titan: no multiprocessing exit hook: %s", error)
        return
    _mp_finalizer_pid = pid


def _at_exit() -> None:
    runtime = _runtime
    if runtime is None or runtime.pid != os.getpid():
        return
    # Bounded: another thread stuck inside init or shutdown must not hang the exit.
    if not _lifecycle_lock.acquire(timeout=max(runtime.options.exit_timeout_s, 0.001)):
        return
    try:
        shutdown_structured_logger(timeout=runtime.options.exit_timeout_s)
    finally:
        _lifecycle_lock.release()


def _flush_for_sigterm(signum: int, dying: bool) -> None:
    """Write what is queued and a ``signal_received`` record (on the signal watcher thread, or the main thread)."""
    runtime = _runtime
    if runtime is None:
        closing = _closing
        if closing is not None and closing.pid == os.getpid():
            # Shutting down: finish it here (the signal may have interrupted the
            # shutdown before it asked the writer to stop), bounded as at exit.
            closing.processor.stop(closing.options.exit_timeout_s)
        return
    if runtime.pid != os.getpid() or not runtime.options.handle_sigterm:
        return
    capture.emit_internal_instant(MetaEvent.SIGNAL_RECEIVED, {"signal": "SIGTERM", "signal_number": int(signum)})
    deadline = time.monotonic() + runtime.options.exit_timeout_s
    # About to die of the signal: send spans still open (the hung phase) to
    # the OTLP side too, marked incomplete. The JSONL file already has their _start.
    runtime.processor.flush(runtime.options.exit_timeout_s, open_spans=dying)
    # Then give queued network exporters (OTLP) what is left of the budget
    # to deliver; waited for here, not on the processor, so the file never waits.
    for exporter in runtime.exporters:
        drain_exporter(exporter, max(0.0, deadline - time.monotonic()))


def _after_fork_in_child() -> None:
    global _runtime, _closing, _lifecycle_lock
    _lifecycle_lock = threading.RLock()  # another thread may have held it at fork time
    runtime = _runtime
    _runtime = _closing = None
    capture.detach()
    capture.forget_thread_ids()
    # The SIGTERM disposition and wakeup fd the child would have had without us.
    sigterm.after_fork_in_child()
    if runtime is None:
        return
    for exporter in runtime.exporters:
        try:
            close_exporter_after_fork(exporter)
        except Exception:  # noqa: BLE001
            pass
