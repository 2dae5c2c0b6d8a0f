"""The options of `init_structured_logger`, validated up front.

Strict by design (as pimm's logger is): an unknown option or a value of the
wrong type or range raises here, naming the option, before anything is
created.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from otel_titan.core.event_queue import DEFAULT_QUEUE_SIZE
from otel_titan.core.mesh import check_mesh_option

__all__ = ["LoggerOptions", "parse_options"]

HandlerSpec = str | Callable[..., Any]


@dataclass(frozen=True)
class LoggerOptions:
    """Everything `init_structured_logger(**options)` accepts besides
    source/output_dir/rank/enable."""

    #: Process identity; None = discover (see `identity.py`).
    world_size: int | None = None
    local_rank: int | None = None
    run_id: str | None = None
    attempt: int | None = None
    job_id: str | None = None
    #: Rotate a process's JSONL file at about this size.
    max_file_size_mb: float = 128.0
    #: Older segments kept besides the active file: disk ≈ (backup_count + 1) × max_file_size_mb.
    backup_count: int = 3
    #: Capacity of the capture queue, in events; a full queue drops (and counts), never blocks.
    queue_size: int = DEFAULT_QUEUE_SIZE
    #: False leaves the host name out of every record and of the OpenTelemetry Resource.
    include_hostname: bool = True
    #: Handler factories (``"module.function"`` paths or callables); None = environment, then the
    #: default.
    handlers: Sequence[HandlerSpec] | None = None
    #: Seconds the processor sleeps between drains: how late a record reaches the OS at most,
    #: roughly.
    flush_interval_s: float = 0.05
    #: Quiet seconds with spans open before a `heartbeat` record is written (0: never).
    heartbeat_interval_s: float = 10.0
    #: Seconds without a span ending (with spans open) before the hang black box is written
    #: (docs/hangs.md); None = ``OTEL_TITAN_STALL_AFTER_S``, else automatic (the larger of 120 s and
    #: 10 × the slowest gap seen); 0 = off.
    stall_after_s: float | None = None
    #: Seconds to spend writing what is queued at interpreter exit (or a multiprocessing child's) or
    #: on SIGTERM.
    exit_timeout_s: float = 5.0
    #: Flush on SIGTERM, then let the signal take its usual course (chaining any handler already
    #: installed); done by a watcher thread, so it works while the main thread is stuck in native
    #: code (see `sigterm`).
    handle_sigterm: bool = True
    #: A top-level span opened inside another instrumentation's active span becomes its child.
    #: None = on when a global OpenTelemetry SDK TracerProvider is configured at init.
    join_otel_context: bool | None = None
    #: While an `sl` span is open it is the current OpenTelemetry span, so spans other code
    #: opens inside it become its children (costs an OpenTelemetry context attach per span).
    propagate_otel_context: bool = False
    #: Ranks sharing one trace per step (rank // size); 0 = every rank in one trace per step. None =
    #: ``OTEL_TITAN_TRACE_GROUP_SIZE``, else 32 (keeps a 1,024-rank step's traces within Tempo's and
    #: Jaeger's limits).
    trace_group_size: int | None = None
    #: The job's device mesh: sizes per dimension (``{"pp": 2, "dp": 4, "tp": 2}``, laid out as
    #: ``init_device_mesh`` does) or torch's ``DeviceMesh``; None = ``OTEL_TITAN_MESH``, else none.
    #: Each rank's coordinates are recorded, and the analysis compares a rank only with ranks that
    #: differ in dp alone.
    mesh: Any = None
    #: Write the process's memory and CPU figures (and the rank's own CUDA memory, where the program
    #: uses CUDA) as scalars of each step, from the background thread (``memory/…``, ``process/…``:
    #: docs/schema.md). None = ``OTEL_TITAN_PROCESS_FIGURES`` (``0`` / ``false``: off), else on.
    process_figures: bool | None = None
    #: Write one ``step_rollup`` record per step into the JSONL file, from the background thread:
    #: the step's time, each phase's total and count, its step-closing span (docs/schema.md). None =
    #: ``OTEL_TITAN_STEP_ROLLUPS`` (``0`` / ``false``: off), else on.
    step_rollups: bool | None = None


_CHECKS: dict[str, tuple[tuple[type, ...], Callable[[Any], bool], str]] = {
    "world_size": ((int,), lambda v: v >= 1, "an int >= 1"),
    "local_rank": ((int,), lambda v: v >= 0, "an int >= 0"),
    "run_id": ((str,), lambda v: bool(v), "a non-empty str"),
    "attempt": ((int,), lambda v: v >= 0, "an int >= 0"),
    "job_id": ((str,), lambda v: bool(v), "a non-empty str"),
    "max_file_size_mb": ((int, float), lambda v: v > 0, "a number > 0"),
    "backup_count": ((int,), lambda v: v >= 0, "an int >= 0"),
    "queue_size": ((int,), lambda v: v >= 1, "an int >= 1"),
    "include_hostname": ((bool,), lambda v: True, "a bool"),
    "handlers": (
        (list, tuple),
        lambda v: all(isinstance(h, str) or callable(h) for h in v),
        "a list of 'module.function' strings or callables",
    ),
    "flush_interval_s": ((int, float), lambda v: 0 < v <= 10, "a number of seconds in (0, 10]"),
    "exit_timeout_s": ((int, float), lambda v: v >= 0, "a number of seconds >= 0"),
    "heartbeat_interval_s": (
        (int, float),
        lambda v: v >= 0,
        "a number of seconds >= 0 (0: no heartbeat)",
    ),
    "stall_after_s": (
        (int, float),
        lambda v: v >= 0 and v == v,
        "a number of seconds >= 0 (0: no stall detection) or None (automatic)",
    ),
    "handle_sigterm": ((bool,), lambda v: True, "a bool"),
    "join_otel_context": ((bool,), lambda v: True, "a bool or None"),
    "propagate_otel_context": ((bool,), lambda v: True, "a bool"),
    "trace_group_size": (
        (int,),
        lambda v: v >= 0,
        "an int >= 0 (ranks per trace; 0 = all ranks in one trace)",
    ),
    "process_figures": ((bool,), lambda v: True, "a bool"),
    "step_rollups": ((bool,), lambda v: True, "a bool"),
}


def parse_options(options: dict[str, Any]) -> LoggerOptions:
    """Validate `options` and return them as `LoggerOptions`.

    Example:
        >>> parse_options({"backup_count": 5}).backup_count
        5
        >>> parse_options({"max_file_sizemb": 1})
        Traceback (most recent call last):
        ...
        TypeError: init_structured_logger() got an unknown option 'max_file_sizemb' (did you mean 'max_file_size_mb'?)
    """
    known = {f.name for f in fields(LoggerOptions)}
    for name, value in options.items():
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = (
                f" (did you mean {close[0]!r}?)"
                if close
                else f"; known options: {', '.join(sorted(known))}"
            )
            raise TypeError(f"init_structured_logger() got an unknown option {name!r}{hint}")
        if value is None and name in (
            "world_size",
            "local_rank",
            "run_id",
            "attempt",
            "job_id",
            "handlers",
            "join_otel_context",
            "stall_after_s",
            "trace_group_size",
            "mesh",
            "process_figures",
            "step_rollups",
        ):
            continue
        if name == "mesh":  # a mapping of sizes or a DeviceMesh: not a type check
            check_mesh_option(value)
            continue
        types, valid, expected = _CHECKS[name]
        if isinstance(value, bool) and bool not in types:
            raise TypeError(f"option {name} must be {expected}, got bool {value!r}")
        if not isinstance(value, types):
            raise TypeError(
                f"option {name} must be {expected}, got {type(value).__name__} {value!r}"
            )
        if not valid(value):
            raise ValueError(f"option {name} must be {expected}, got {value!r}")
    return LoggerOptions(**options)
