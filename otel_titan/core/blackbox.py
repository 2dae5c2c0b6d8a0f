"""The hang black box: what a process that stopped making progress writes about where it is.

A stalled rank is usually not where its last record says: it is inside a
collective, a data loader, a lock, a C call. So when the watchdog (the
processor thread, `processor.py`) sees no span end for ``stall_after_s`` while
spans are open, or an operator asks (a signal, a trigger file), or the launcher
sends SIGTERM, this module collects, with the interpreter lock (from Python):

* every open span on every thread and task, with how long it has been open;
* every thread's Python stack, innermost frame first, with its `threading` name;
* when ``torch.distributed`` is initialised and its flight recorder is on
  (``TORCH_FR_BUFFER_SIZE`` or ``TORCH_NCCL_TRACE_BUFFER_SIZE``), its most recent
  entries (``torch._C._distributed_c10d._dump_fr_trace_json``): process group,
  ``collective_seq_id``, op, sizes, state and times. torch is never imported
  here: only used when the program already did.

Everything is bounded: frames per thread, threads, flight-recorder entries,
bytes per record (`MAX_RECORD_BYTES`), records per run (`MAX_RECORDS`) and bytes
per run (`MAX_RUN_BYTES`), so a black box stays under 1 MB per rank with the
faulthandler side file (`FaulthandlerArm`, `MAX_SIDE_FILE_BYTES`).

When a C call holds the interpreter lock, none of this can run. `FaulthandlerArm`
covers that case: it keeps ``faulthandler.dump_traceback_later`` armed a little
beyond the stall threshold (re-armed from the processor thread when progress
is seen, at most once a second), writing to a side file opened in advance; the
Python black box cancels it whenever it could run itself. Its traps, handled:

* faulthandler dumps at most 100 threads and 100 frames per thread (its own
  limits): the side file says so with ``...``; the Python black box has no
  such limit (its own, above, are larger in threads);
* it walks other threads' frames without the interpreter lock; a thread that
  runs meanwhile can be read half-updated, and CPython has crashed doing so
  (cpython#140815). It therefore fires only when the Python black box could
  not run ``grace`` seconds after the threshold: the lock is held by a C call,
  so the other threads are parked and their frames do not move;
* an armed dump must not cross a ``fork()`` (DataLoader workers): the child has
  no watchdog thread, and its exit would wait for it forever. It is disarmed
  before every fork and re-armed in the parent after;
* there is one ``dump_traceback_later`` per process: arming it cancels any
  other. The functions of the `faulthandler` module are wrapped when this module
  is imported (with ``otel_titan.structured_logger``): once the program calls
  them itself, it owns the dump for good and it is never armed again. A dump
  armed before otel-titan was imported cannot be seen: set
  ``OTEL_TITAN_FAULTHANDLER=0`` then.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import time
from typing import Any, Sequence

__all__ = [
    "MAX_FRAMES",
    "MAX_THREADS",
    "MAX_FR_ENTRIES",
    "MAX_RECORD_BYTES",
    "MAX_RUN_BYTES",
    "MAX_RECORDS",
    "MAX_SIDE_FILE_BYTES",
    "DEFAULT_MIN_STALL_S",
    "STALL_FACTOR",
    "thread_stacks",
    "flight_recorder",
    "BlackBoxBudget",
    "FaulthandlerArm",
    "stall_threshold",
]

#: Frames kept per thread (the innermost), threads per record, flight-recorder entries (the latest).
MAX_FRAMES = 48
MAX_THREADS = 128
MAX_FR_ENTRIES = 64
#: One black-box record at most (trimmed down to it), all records of a run at most, and how many.
MAX_RECORD_BYTES = 192 * 1024
MAX_RUN_BYTES = 640 * 1024
MAX_RECORDS = 8
#: faulthandler's side file: no arming once it is this large (a dump of 100 × 100 frames is ~300 KB more at worst).
MAX_SIDE_FILE_BYTES = 64 * 1024
#: The default threshold: the larger of this and `STALL_FACTOR` × the longest gap between progress seen so far.
DEFAULT_MIN_STALL_S = 120.0
STALL_FACTOR = 10.0

_OUR_THREADS = ("otel-titan-",)
_CWD = os.getcwd()


def min_stall_s() -> float:
    """The automatic threshold's floor: ``OTEL_TITAN_STALL_MIN_S`` (for short jobs and tests), else 120 s."""
    try:
        value = float(os.environ.get("OTEL_TITAN_STALL_MIN_S", "") or DEFAULT_MIN_STALL_S)
    except ValueError:
        raise ValueError(f"OTEL_TITAN_STALL_MIN_S must be a number of seconds, got {os.environ.get('OTEL_TITAN_STALL_MIN_S')!r}") from None
    return value if value > 0 else DEFAULT_MIN_STALL_S


def stall_threshold(configured: float | None, slowest_gap_s: float, gaps_seen: bool = True, floor: float | None = None) -> float:
    """Seconds without a span end that make a stall.

    The configured value; else the larger of the floor (120 s) and 10 × the
    longest gap between two span ends seen so far. Before a second span end
    (the first step's length unknown: compilation, loading a checkpoint) the
    floor is 5 times higher, so a slow first step is not a stall.

    Example:
        >>> stall_threshold(None, 3.0, floor=120), stall_threshold(None, 30.0, floor=120), stall_threshold(5.0, 30.0)
        (120.0, 300.0, 5.0)
        >>> stall_threshold(None, 0.0, gaps_seen=False, floor=120)
        600.0
    """
    if configured is not None:
        return configured
    floor = min_stall_s() if floor is None else float(floor)
    if not gaps_seen:
        return 5 * floor
    return max(floor, STALL_FACTOR * slowest_gap_s)


def _short(path: str) -> str:
    if path.startswith(_CWD + os.sep):
        return path[len(_CWD) + 1 :]
    return path


def thread_stacks(max_threads: int = MAX_THREADS, max_frames: int = MAX_FRAMES) -> list[dict[str, Any]]:
    """Every thread's Python stack (innermost frame first), main thread first; otel-titan's own threads left out.

    Each: ``thread_name``, ``thread_id`` (`threading` ident), ``native_id``, ``main``, ``daemon``,
    ``frames`` (``{"file", "line", "function"}``), ``frames_total``.
    """
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    out: list[dict[str, Any]] = []
    for ident, frame in frames.items():
        thread = threads.get(ident)
        name = thread.name if thread is not None else f"Thread-{ident:#x}"
        if name.startswith(_OUR_THREADS):
            continue
        stack = []
        total = 0
        f: Any = frame
        while f is not None:
            if total < max_frames:
                code = f.f_code
                stack.append({"file": _short(code.co_filename), "line": f.f_lineno, "function": code.co_name})
            total += 1
            f = f.f_back
        out.append(
            {
                "thread_name": name,
                "thread_id": ident,
                "native_id": getattr(thread, "native_id", None),
                "main": ident == main_ident,
                "daemon": bool(getattr(thread, "daemon", False)),
                "frames": stack,
                "frames_total": total,
            }
        )
    out.sort(key=lambda t: (not t["main"], t["thread_name"]))
    return out[:max_threads]


def flight_recorder(max_entries: int = MAX_FR_ENTRIES) -> dict[str, Any] | None:
    """torch's flight-recorder entries (the latest `max_entries`) and per-group status, or None when off.

    None unless torch is already imported, ``torch.distributed`` is initialised and
    ``TORCH_FR_BUFFER_SIZE`` / ``TORCH_NCCL_TRACE_BUFFER_SIZE`` is set; an error becomes ``{"error": ...}``.
    """
    if not (os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")):
        return None
    dist = sys.modules.get("torch.distributed")
    torch = sys.modules.get("torch")
    if dist is None or torch is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        raw = torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
        data = json.loads(raw)
    except Exception as error:  # noqa: BLE001 - an old torch, a backend without it: say so, write the rest
        return {"error": f"{type(error).__name__}: {error}"[:300]}
    entries = []
    for entry in (data.get("entries") or [])[-max_entries:]:
        pg = entry.get("process_group")
        entries.append(
            {
                "pg_id": entry.get("pg_id"),
                # torch's group name: the same on every member (pg_id is not: it counts this rank's groups).
                "pg_name": pg[0] if isinstance(pg, list) and pg else None,
                "pg_desc": pg[1] if isinstance(pg, list) and len(pg) > 1 else None,
                "collective_seq_id": entry.get("collective_seq_id"),
                "p2p_seq_id": entry.get("p2p_seq_id"),
                "is_p2p": entry.get("is_p2p"),
                "op": entry.get("profiling_name"),
                "input_sizes": entry.get("input_sizes"),
                "output_sizes": entry.get("output_sizes"),
                "input_dtypes": entry.get("input_dtypes"),
                "state": entry.get("state"),
                "retired": entry.get("retired"),
                "time_created_ns": entry.get("time_created_ns"),
                "time_started_ns": entry.get("time_discovered_started_ns") or None,
                "time_completed_ns": entry.get("time_discovered_completed_ns") or None,
                "thread_name": entry.get("thread_name"),
            }
        )
    return {"version": data.get("version"), "pg_status": data.get("pg_status"), "pg_config": _group_members(dist, data.get("pg_config")), "entries": entries}


#: Sub-groups whose members the black box lists (the default group's are implied by world_size).
MAX_GROUPS_LISTED = 64


def _group_members(dist: Any, torch_config: Any) -> dict[str, Any]:
    """Group name → {"desc", "ranks"} of this rank's groups: torch's ``pg_config`` when it has members, else asked of torch.

    torch 2.13 leaves ``pg_config`` empty for gloo; the analysis compares ranks by group membership, never by pg_id.
    """
    if isinstance(torch_config, dict) and any(isinstance(v, dict) and v.get("ranks") not in (None, "", "[]") for v in torch_config.values()):
        return {str(k): v for k, v in list(torch_config.items())[:MAX_GROUPS_LISTED]}
    out: dict[str, Any] = {}
    try:
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        for group, name in list(getattr(getattr(c10d, "_world", None), "pg_names", {}).items())[: MAX_GROUPS_LISTED + 1]:
            if str(name) == "0":
                continue
            out[str(name)] = {"desc": getattr(group, "group_desc", None), "ranks": list(dist.get_process_group_ranks(group))}
    except Exception:  # noqa: BLE001 - a torch without these: the analysis infers members from the entries
        return out
    return out


def _encoded_size(record: dict[str, Any]) -> int:
    return len(json.dumps(record, separators=(",", ":"), default=str))


class BlackBoxBudget:
    """How many black-box records and bytes this run may still write; trims a record to fit.

    Example:
        >>> budget = BlackBoxBudget(max_records=1)
        >>> budget.fit({"threads": [], "open_spans": []}) is not None, budget.fit({"threads": []})
        (True, None)
    """

    def __init__(self, max_records: int = MAX_RECORDS, max_bytes: int = MAX_RUN_BYTES, max_record_bytes: int = MAX_RECORD_BYTES) -> None:
        self.records_left = max_records
        self.bytes_left = max_bytes
        self.max_record_bytes = max_record_bytes

    def fit(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """`record`, trimmed until it fits (fewer frames, entries, threads), or None when the budget is spent."""
        if self.records_left <= 0:
            return None
        limit = min(self.max_record_bytes, self.bytes_left)
        size = _encoded_size(record)
        for frames, entries, threads in ((16, 32, 64), (8, 16, 16), (4, 8, 4), (2, 4, 1), (0, 0, 0)):
            if size <= limit:
                break
            record["truncated"] = True
            for thread in record.get("threads") or []:
                del thread["frames"][frames:]
            del (record.get("threads") or [])[threads:]
            recorder = record.get("flight_recorder")
            if isinstance(recorder, dict) and isinstance(recorder.get("entries"), list):
                del recorder["entries"][: max(0, len(recorder["entries"]) - entries)]
            del (record.get("open_spans") or [])[: max(0, len(record.get("open_spans") or []) - 32)]
            size = _encoded_size(record)
        if size > limit:
            return None
        self.records_left -= 1
        self.bytes_left -= size
        return record


class FaulthandlerArm:
    """Keeps ``faulthandler.dump_traceback_later`` armed past the stall threshold, writing to `file`.

    Used from the processor thread only (see the module docstring for why and
    for the traps). `rearm` is cheap and rate-limited; `cancel` when the Python
    black box ran, or when the process is idle (no span open).
    """

    REARM_EVERY_S = 1.0

    @property
    def user_owns(self) -> bool:
        """The program armed or cancelled its own dump (since otel-titan was imported): never touch it again."""
        return _USER_OWNS[0]

    def __init__(self, file: Any) -> None:
        self.file = file
        self.armed = False
        self._armed_at = 0.0
        self._threads_written: tuple[Any, ...] = ()
        self._timeout_s = 0.0
        self._rearm_after_fork = False
        self.enabled = os.environ.get("OTEL_TITAN_FAULTHANDLER", "1").strip().lower() not in ("0", "false", "no", "off")
        if self.enabled:
            _watch_user_calls(self)

    def _room(self) -> bool:
        try:
            return os.fstat(self.file.fileno()).st_size < MAX_SIDE_FILE_BYTES
        except (OSError, ValueError):
            return False

    def rearm(self, timeout_s: float, now: float | None = None) -> None:
        """Progress was seen: push the dump `timeout_s` into the future (at most once per `REARM_EVERY_S`)."""
        if not self.enabled or self.user_owns or timeout_s <= 0:
            return
        now = time.monotonic() if now is None else now
        if self.armed and now - self._armed_at < self.REARM_EVERY_S:
            return
        if not self._room():
            self.cancel()
            return
        self._note_threads()
        try:
            _ORIGINAL[0](timeout_s, repeat=False, file=self.file)
        except (OSError, ValueError, RuntimeError):
            return
        self.armed, self._armed_at, self._timeout_s = True, now, timeout_s

    def _note_threads(self) -> None:
        # faulthandler names threads by ident only: write the names down, when they changed.
        threads = tuple((t.ident, t.name) for t in threading.enumerate() if t.ident is not None)
        if threads == self._threads_written:
            return
        self._threads_written = threads
        main = threading.main_thread().ident or 0
        names = " ".join(f"{ident:#018x}={name!r}" for ident, name in threads)
        try:
            self.file.write(f"# otel-titan threads (pid {os.getpid()}, main {main:#018x}): {names}\n".encode())
            self.file.flush()
        except (OSError, ValueError):
            pass

    def cancel(self) -> None:
        """Disarm (the Python black box ran, or nothing is open)."""
        if self.armed and not self.user_owns:
            _ORIGINAL[1]()
        self.armed = False


    def before_fork(self) -> None:
        """A child must not inherit an armed dump: its watchdog thread does not survive fork, and the
        child's exit would then wait forever in faulthandler's cancel. Disarmed here, re-armed in the parent."""
        if self.armed and not self.user_owns:
            _ORIGINAL[1]()
            self.armed, self._rearm_after_fork = False, True

    def after_fork_in_parent(self) -> None:
        if self._rearm_after_fork:
            self._rearm_after_fork = False
            self.rearm(self._timeout_s)


_ORIGINAL: list[Any] = [faulthandler.dump_traceback_later, faulthandler.cancel_dump_traceback_later]
_ARMS: list[FaulthandlerArm] = []


def _before_fork() -> None:
    for arm in _ARMS:
        arm.before_fork()


def _after_fork_in_parent() -> None:
    for arm in _ARMS:
        arm.after_fork_in_parent()


def _after_fork_in_child() -> None:
    _ARMS.clear()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


_USER_OWNS = [False]  # the program called dump_traceback_later (or its cancel) itself, since this module was imported


def _watch_user_calls(arm: FaulthandlerArm) -> None:
    """Make `arm` the one the fork hooks and the wrappers below know about."""
    _ARMS[:] = [arm]


def _wrap_faulthandler() -> None:
    """Wrap the module's functions at import (before most programs arm their own), so a program's own dump wins for good."""
    if getattr(faulthandler.dump_traceback_later, "_otel_titan", False):
        return

    def dump_traceback_later(*args: Any, **kwargs: Any) -> Any:
        _USER_OWNS[0] = True
        for owner in _ARMS:
            owner.armed = False
        return _ORIGINAL[0](*args, **kwargs)

    def cancel_dump_traceback_later() -> Any:
        _USER_OWNS[0] = True
        for owner in _ARMS:
            owner.armed = False
        return _ORIGINAL[1]()

    dump_traceback_later._otel_titan = True  # type: ignore[attr-defined]
    dump_traceback_later.__doc__ = _ORIGINAL[0].__doc__
    cancel_dump_traceback_later.__doc__ = _ORIGINAL[1].__doc__
    faulthandler.dump_traceback_later = dump_traceback_later  # type: ignore[assignment]
    faulthandler.cancel_dump_traceback_later = cancel_dump_traceback_later  # type: ignore[assignment]


_wrap_faulthandler()


def open_span_rows(spans: Sequence[Any], now_ns: int, thread_name: Any) -> list[dict[str, Any]]:
    """Open spans (TitanSpans, oldest first) as black-box rows with how long each has been open."""
    rows = []
    for span in spans:
        context = span.context
        rows.append(
            {
                "name": span.name,
                "span_id": f"{context.span_id:016x}" if context is not None else None,
                "tid": span.thread_id,
                "thread_name": thread_name(span.thread_id),
                "task_name": span.task_name,
                "step": span.step,
                "caller": f"{span.code_file}:{span.code_line}:{span.code_function}",
                "open_s": round(max(now_ns - (span.start_time or now_ns), 0) / 1e9, 3),
            }
        )
    return rows
