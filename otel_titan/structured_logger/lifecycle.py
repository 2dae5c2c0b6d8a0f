"""Starting, flushing and stopping the logger: the public lifecycle API, in short steps.

`init_structured_logger` validates everything first (source, options,
identity, output directory: `validation.py`; every handler factory:
`handler_factories.py`) and only then starts the processor and publishes the
queue to the hot path: if any step fails, what was created is undone and the
exception names the cause. Nothing half-attached.

Calling it again does nothing, as in torchtitan (its code calls it from more than one place, an RL
actor under another source): with different arguments the call also warns once, naming each
difference, since a silently ignored option would mislead; raising would take training down over a
log setting. The output directory is made absolute once, here: a later ``os.chdir`` (Hydra does one)
cannot move or split the run.

What happens at exit, on SIGTERM and at fork is `process_hooks.py`; the state
all of them share is `runtime.py`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_titan._version import __version__
from otel_titan.core import blackbox, capture, otel_context, step_context
from otel_titan.core.event_queue import EventQueue
from otel_titan.core.host_figures import HostFigures
from otel_titan.core.identity import RunIdentity, build_resource, discover_identity, export_run_id
from otel_titan.core.mesh import mesh_from_process_groups, resolve_mesh
from otel_titan.core.options import LoggerOptions, parse_options
from otel_titan.core.process_figures import BoundaryReadings, ProcessFigures, process_figures_on
from otel_titan.core.processor import BatchProcessor
from otel_titan.core.span_builder import SpanBuilder
from otel_titan.core.step_sampler import StepSampler
from otel_titan.core.trace_ids import (
    SpanIdAllocator,
    StepTraceIds,
    resolve_trace_group_size,
    trace_group_of,
)
from otel_titan.core.warn_once import WarnOnce
from otel_titan.environment_variables import OTEL_TITAN_DUMP_TRIGGER, OTEL_TITAN_STALL_AFTER_S
from otel_titan.exporters.logging_bridge import LoggingBridgeExporter
from otel_titan.schema import LOGGER_NAME, Field, MetaEvent
from otel_titan.structured_logger import process_hooks, runtime
from otel_titan.structured_logger.handler_factories import run_factories
from otel_titan.structured_logger.runtime import STATE, Runtime
from otel_titan.structured_logger.validation import (
    MAX_SOURCE_BYTES,
    check_output_dir,
    differences,
    validate_call,
)

__all__ = [
    "init_structured_logger",
    "flush_structured_logger",
    "shutdown_structured_logger",
    "is_initialized",
    "get_run_identity",
    "get_exporters",
    "STRUCTURED_LOGGER_NAME",
    "MAX_SOURCE_BYTES",
]

#: Name of the `logging.Logger` handed to factories for torchtitan-style handlers.
STRUCTURED_LOGGER_NAME = LOGGER_NAME

_log = logging.getLogger("otel_titan")
#: Second calls already warned about (one warning per distinct set of differences).
_second_calls = WarnOnce()


def init_structured_logger(
    source: str,
    output_dir: str | os.PathLike[str],
    rank: int | None = None,
    enable: bool = True,
    **options: Any,
) -> None:
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
            (0.05), ``heartbeat_interval_s`` (10), ``exit_timeout_s`` (5), ``handle_sigterm``
            (True),
            ``join_otel_context`` (auto), ``propagate_otel_context`` (False),
            ``trace_group_size`` (ranks per trace and step; None = ``OTEL_TITAN_TRACE_GROUP_SIZE``,
            else 32; 0 = all),
            ``mesh`` (the job's device mesh: ``{"pp": 2, "dp": 4}`` or a torch ``DeviceMesh``;
            None = ``OTEL_TITAN_MESH``, e.g. ``pp=2,dp=4``; each rank's coordinates are recorded).
            ``stall_after_s`` (seconds without a span ending that make a stall, which writes the
            black box;
            None = ``OTEL_TITAN_STALL_AFTER_S``, else automatic: the larger of
            ``OTEL_TITAN_STALL_MIN_S`` (120 s) and 10 × the longest gap
            seen; 0 = no stall detection; docs/hangs.md).
            ``process_figures`` (None = ``OTEL_TITAN_PROCESS_FIGURES``, else on: memory and CPU
            figures as scalars of each step, docs/schema.md).
            ``step_rollups`` (None = ``OTEL_TITAN_STEP_ROLLUPS``, else on: one ``step_rollup``
            record per step in the JSONL file, docs/schema.md).

    Raises:
        TypeError / ValueError: a bad source, rank or option (named in the message).
        OSError: ``output_dir`` cannot be created or written.
        HandlerFactoryError: a handler factory cannot be imported or raised
            (the JSONL file's: its name would be too long for the filesystem).

    A second call while the logger runs does nothing, as in torchtitan; when
    its arguments differ from the running logger's it also warns (on the
    ``otel_titan`` logger, once per distinct call), naming each difference.

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
    with STATE.lock:
        validate_call(source, enable, rank)
        parsed = parse_options(options)
        running = STATE.running
        if running is not None:
            _check_same_call(running, source, output_dir, rank, enable, options, parsed)
            return  # the same arguments: torchtitan code may call it more than once
        if not enable:
            return
        _start(source, check_output_dir(output_dir), rank, parsed)


def _check_same_call(
    running: Runtime,
    source: str,
    output_dir: Any,
    rank: int | None,
    enable: bool,
    options: dict[str, Any],
    parsed: LoggerOptions,
) -> None:
    found = differences(running, source, output_dir, rank, enable, options, parsed)
    if found and _second_calls.first((id(running), "; ".join(found))):
        _log.warning(
            "otel-titan: init_structured_logger() is already running in this process; this call "
            "with other arguments does nothing: %s. "
            "Call shutdown_structured_logger() first to start another logger.",
            "; ".join(found),
        )


def _start(source: str, directory: str, rank: int | None, parsed: LoggerOptions) -> None:
    """Assemble identity → factories → processor, then publish it to the hot path (the last
    step)."""
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
    place = resolve_mesh(parsed.mesh, identity.rank, identity.world_size)
    # where this rank sits in the job's mesh: the analysis compares it with its peers only
    if place is not None:
        identity = dataclasses.replace(identity, mesh=place[0], mesh_shape=place[1])
    trace_group = trace_group_of(identity.rank, resolve_trace_group_size(parsed.trace_group_size))
    resource = build_resource(identity, trace_group)
    parsed, stall_floor_s = _stall_settings(parsed)
    queue = EventQueue(parsed.queue_size)
    structured_logger = logging.getLogger(STRUCTURED_LOGGER_NAME)
    structured_logger.propagate = False
    exporters, handlers = run_factories(
        parsed.handlers,
        structured_logger,
        identity=identity,
        resource=resource,
        options=parsed,
        stats=queue,
        output_dir=directory,
    )
    trace_ids = StepTraceIds(identity.process_run_id, identity.attempt, trace_group)  # type: ignore[arg-type]  # resolved by discover_identity before the logger starts
    span_ids = SpanIdAllocator()
    builder = SpanBuilder(
        resource, InstrumentationScope("otel_titan", __version__), trace_ids, span_ids
    )
    # The exporters that write stacks have a `stacks_file` (getattr checks).
    stacks = (getattr(e, "stacks_file", None) for e in exporters)
    stacks_file = next((path for path in stacks if path is not None), None)
    boundary = BoundaryReadings() if process_figures_on(parsed.process_figures) else None
    processor = BatchProcessor(
        queue,
        builder,
        exporters,
        schedule_delay=parsed.flush_interval_s,
        heartbeat_s=parsed.heartbeat_interval_s,
        stall_after_s=parsed.stall_after_s,
        stacks_file=stacks_file,
        stall_floor_s=stall_floor_s,
        trigger_path=os.environ.get(OTEL_TITAN_DUMP_TRIGGER, "").strip() or None,
        step_sampler=StepSampler(builder, _step_figures(identity.local_rank), boundary)
        if boundary is not None
        else None,
    )
    for exporter in exporters:  # exporters that report the pipeline's own health (metrics.py)
        observe = getattr(exporter, "observe_pipeline", None)
        if callable(observe):
            observe(exporters, processor)
    processor.start()
    # Children started from now on (subprocesses, multiprocessing workers) name the same run; undone
    # at shutdown.
    STATE.running = Runtime(
        identity=identity,
        options=parsed,
        queue=queue,
        processor=processor,
        exporters=exporters,
        logging_handlers=handlers,
        output_dir=directory,
        unshare_run_id=export_run_id(identity),
    )
    process_hooks.install(parsed)
    if boundary is not None:
        # the per-step memory and CPU time, read at the boundary itself
        step_context.add_boundary_hook(boundary)
    if place is None:
        _look_for_a_mesh(identity.rank, identity.world_size)
    join = (
        parsed.join_otel_context
        if parsed.join_otel_context is not None
        else otel_context.sdk_tracer_provider_configured()
    )
    capture.attach(
        queue,
        wake_writer=processor.wake,
        remote_parent=otel_context.remote_parent_hook() if join else None,
        propagate=otel_context.propagation_hooks(trace_ids, span_ids)
        if parsed.propagate_otel_context
        else None,
        trace_ids=trace_ids,
        span_ids=span_ids,
    )


#: How many step boundaries the logger looks at for a DeviceMesh the program did not pass in (its
#: groups exist by then).
MESH_LOOK_STEPS = 8


def _look_for_a_mesh(rank: int, world_size: int | None) -> None:
    """At the first `MESH_LOOK_STEPS` step boundaries, read a DeviceMesh from torch's process groups
    (`core.mesh`); once found, write it.

    Why: the analysis compares a rank only with ranks that should do the same
    work (a pipeline's last stage is no straggler for being a stage), and most
    programs build their mesh with ``init_device_mesh`` without passing it to
    the logger. The coordinates go into a ``mesh_found`` record
    (docs/schema.md), which the reader takes as the opening record's ``mesh``.
    """
    left = [MESH_LOOK_STEPS]

    def look(ended: int) -> None:
        left[0] -= 1
        try:
            place = mesh_from_process_groups(rank, world_size)
        except Exception:  # noqa: BLE001 - a logger never takes training down
            place = None
        if place is not None:
            capture.emit_internal_instant(
                MetaEvent.MESH_FOUND, {Field.MESH: place[0], Field.MESH_SHAPE: place[1]}
            )
            runtime = STATE.running
            if runtime is not None:
                runtime.identity = dataclasses.replace(
                    runtime.identity, mesh=place[0], mesh_shape=place[1]
                )
        if place is not None or left[0] <= 0:
            remove()

    remove = step_context.add_boundary_hook(look)


def _step_figures(local_rank: int | None) -> Callable[[], dict[str, int | float]]:
    """What each step's figures read: the process's, plus the host's on local rank 0 (once per
    host)."""
    process = ProcessFigures(local_rank)
    if local_rank not in (0, None):
        return process.read
    host = HostFigures()
    return lambda: {**process.read(), **host.read()}


def _stall_settings(parsed: LoggerOptions) -> tuple[LoggerOptions, float]:
    """``stall_after_s`` from the option, else ``OTEL_TITAN_STALL_AFTER_S``; and the automatic
    threshold's floor.

    Raises ValueError naming the variable when it is not a number >= 0.
    """
    floor = blackbox.min_stall_s()
    if parsed.stall_after_s is not None:
        return parsed, floor
    raw = os.environ.get(OTEL_TITAN_STALL_AFTER_S, "").strip()
    if not raw:
        return parsed, floor
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(
            f"{OTEL_TITAN_STALL_AFTER_S} must be a number of seconds >= 0 (0: no stall "
            f"detection), got {raw!r}"
        )
    return dataclasses.replace(parsed, stall_after_s=value), floor


def flush_structured_logger(timeout: float | None = 5.0) -> bool:
    """Write everything recorded so far; return False if `timeout` seconds passed first.

    Safe to call when the logger was never initialised (returns True).

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.flush_structured_logger(timeout=1.0)
        True
    """
    running = STATE.running
    if running is None or not running.is_ours():
        return True
    return running.processor.flush(timeout)


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
    return runtime.shutdown(timeout)


def is_initialized() -> bool:
    """Whether `sl` calls currently record anything in this process.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.is_initialized()
        False
    """
    return STATE.running is not None and capture.is_attached()


def get_run_identity() -> RunIdentity | None:
    """The identity (rank, run id…) of the running logger, or None.

    Example:
        >>> from otel_titan import structured_logger as sl
        >>> sl.get_run_identity() is None
        True
    """
    running = STATE.running
    return running.identity if running is not None else None


def get_exporters() -> list[SpanExporter]:
    """The exporters the handler factories registered (empty when not initialised).

    The bridge to the structured logger's `logging.Handler`s, always there, is not one of them.
    """
    running = STATE.running
    return (
        [e for e in running.exporters if not isinstance(e, LoggingBridgeExporter)]
        if running is not None
        else []
    )
