"""The hang black box: what a process that stopped making progress writes about where it is.

A stalled rank is usually not where its last record says: it is inside a
collective, a data loader, a lock, a C call. So when the watchdog (the
processor thread, `processor.py`) sees no span end for ``stall_after_s`` while
spans are open (or while none is, in the middle of a step: `TrainingLane`), or
an operator asks (a signal, a trigger file), or the launcher
sends SIGTERM, this module collects, with the interpreter lock (from Python):

* every open span on every thread and task, with how long it has been open;
* every thread's Python stack, innermost frame first, with its `threading` name;
* when ``torch.distributed`` is initialised and its flight recorder is on
  (``TORCH_FR_BUFFER_SIZE`` or ``TORCH_NCCL_TRACE_BUFFER_SIZE``), its most recent
  entries (``torch._C._distributed_c10d._dump_fr_trace_json``): process group,
  ``collective_seq_id``, op, sizes, state and times. torch is never imported
  here: only used when the program already did.

Everything is bounded: frames per thread, threads, flight-recorder entries,
bytes per record (`MAX_RECORD_BYTES`), records and bytes per run in three pools
(`BlackBoxBudget`: healthy pauses never spend what the real hang and SIGTERM need;
`MAX_RUN_BYTES` in all), so a black box stays under 1 MB per rank with the
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
* a dump says neither which thread is which nor when it was written, so a
  dump of a C call the process came back from reads like the end: before
  each arming a note gives the threads' names and when it was armed and
  will fire (wall clock), rewritten in place while nothing was dumped after
  it (`FaulthandlerArm._write_note`);
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
from collections.abc import Sequence
from typing import Any

from otel_titan.environment_variables import OTEL_TITAN_FAULTHANDLER, OTEL_TITAN_STALL_MIN_S, flag

__all__ = [
    "MAX_FRAMES",
    "MAX_THREADS",
    "MAX_FR_ENTRIES",
    "MAX_RECORD_BYTES",
    "MAX_RUN_BYTES",
    "MAX_RECORDS",
    "MAX_SHARED_BYTES",
    "LIVE_RECORDS",
    "LIVE_RECORD_BYTES",
    "FINAL_RECORD_BYTES",
    "MAX_SIDE_FILE_BYTES",
    "DEFAULT_MIN_STALL_S",
    "STALL_FACTOR",
    "thread_stacks",
    "exception_frames",
    "EXCEPTION_FRAMES",
    "flight_recorder",
    "BlackBoxBudget",
    "FaulthandlerArm",
    "stall_threshold",
    "open_side_file",
    "TrainingLane",
]

#: Frames kept per thread (the innermost), threads per record, flight-recorder entries (the latest).
MAX_FRAMES = 48
MAX_THREADS = 128
MAX_FR_ENTRIES = 64
#: One black-box record at most (trimmed down to it), all records of a run at most.
MAX_RECORD_BYTES = 192 * 1024
MAX_RUN_BYTES = 640 * 1024
#: The budget's pools (`BlackBoxBudget`): SIGTERM's own record; the live reserve, for a stall longer
#: than every one the run recovered from; the shared rest (stalls, dump signal, trigger) and its
#: records.
FINAL_RECORD_BYTES = 192 * 1024
LIVE_RECORDS = 3
LIVE_RECORD_BYTES = 64 * 1024
MAX_SHARED_BYTES = MAX_RUN_BYTES - FINAL_RECORD_BYTES - LIVE_RECORDS * LIVE_RECORD_BYTES
MAX_RECORDS = 8
#: A pool with less room than this takes no record (a record trimmed to nothing says nothing).
MIN_RECORD_BYTES = 8 * 1024
#: faulthandler's side file: no arming once it is this large (a dump of 100 × 100 frames is ~300 KB
#: more at worst).
MAX_SIDE_FILE_BYTES = 64 * 1024
#: The default threshold: the larger of this and `STALL_FACTOR` × the longest gap between progress
#: seen so far.
DEFAULT_MIN_STALL_S = 120.0
STALL_FACTOR = 10.0

_OUR_THREADS = ("otel-titan-",)
#: Modules whose frames on top of a thread's stack are our signal handler interrupting it, not the
#: thread's own work: Python runs the handler on the main thread between two bytecodes, so a SIGTERM
#: or dump signal landing while the watcher collects stacks would otherwise put the handler where the
#: training loop's line belongs (seen once in CI: ``sigterm.py:480`` for the script's line 7).
#: Named as strings: `core` imports nothing from `structured_logger`.
_SIGNAL_HANDLER_MODULES = frozenset({"otel_titan.structured_logger.sigterm"})
_CWD = os.getcwd()


def min_stall_s() -> float:
    """The automatic threshold's floor: ``OTEL_TITAN_STALL_MIN_S`` (for short jobs and tests), else
    120 s."""
    try:
        value = float(os.environ.get(OTEL_TITAN_STALL_MIN_S, "") or DEFAULT_MIN_STALL_S)
    except ValueError:
        raise ValueError(
            f"{OTEL_TITAN_STALL_MIN_S} must be a number of seconds, got "
            f"{os.environ.get(OTEL_TITAN_STALL_MIN_S)!r}"
        ) from None
    return value if value > 0 else DEFAULT_MIN_STALL_S


def stall_threshold(
    configured: float | None,
    slowest_gap_s: float,
    gaps_seen: bool = True,
    floor: float | None = None,
) -> float:
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


#: Frames an ``uncaught_exception`` record keeps of its traceback (the innermost ones: where it was
#: raised).
EXCEPTION_FRAMES = 16


def exception_frames(tb: Any, max_frames: int = EXCEPTION_FRAMES) -> list[str]:
    """Where an exception was raised: its traceback's frames as ``path:line:function``, innermost
    first, the innermost `max_frames`.

    Spelled as the records' ``caller`` (paths relative to the working directory
    when under it), strings so that they are a valid OpenTelemetry attribute
    too; the reader picks the program's own line from them by the black box's
    rule. Never reads a source file.

    Example:
        >>> try:
        ...     {}["missing"]
        ... except KeyError as error:
        ...     exception_frames(error.__traceback__)[0].rsplit(":", 1)[1]
        '<module>'
    """
    frames: list[str] = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append(f"{_short(code.co_filename)}:{tb.tb_lineno}:{code.co_name}")
        tb = tb.tb_next
    return frames[::-1][:max_frames]


def thread_stacks(
    max_threads: int = MAX_THREADS, max_frames: int = MAX_FRAMES
) -> list[dict[str, Any]]:
    """Every thread's Python stack (innermost frame first), main thread first; otel-titan's own
    threads left out.

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
        f: Any = _below_our_signal_handler(frame)
        while f is not None:
            if total < max_frames:
                code = f.f_code
                stack.append(
                    {"file": _short(code.co_filename), "line": f.f_lineno, "function": code.co_name}
                )
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


def _below_our_signal_handler(frame: Any) -> Any:
    """The innermost frame that is not our signal handler's (the frame it interrupted)."""
    while frame is not None and frame.f_globals.get("__name__") in _SIGNAL_HANDLER_MODULES:
        frame = frame.f_back
    return frame


def flight_recorder(max_entries: int = MAX_FR_ENTRIES) -> dict[str, Any] | None:
    """torch's flight-recorder entries (the latest `max_entries`) and per-group status, or None when
    off.

    None unless torch is already imported, ``torch.distributed`` is initialised and
    ``TORCH_FR_BUFFER_SIZE`` / ``TORCH_NCCL_TRACE_BUFFER_SIZE`` is set; an error becomes ``{"error":
    ...}``.
    """
    if not (
        os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
    ):
        return None
    dist = sys.modules.get("torch.distributed")
    torch = sys.modules.get("torch")
    if dist is None or torch is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        raw = torch._C._distributed_c10d._dump_fr_trace_json(
            includeCollectives=True, onlyActive=False
        )
        data = json.loads(raw)
    except Exception as error:  # noqa: BLE001 - an old torch, a backend without it: say so, write the rest
        return {"error": f"{type(error).__name__}: {error}"[:300]}
    entries = []
    for entry in (data.get("entries") or [])[-max_entries:]:
        pg = entry.get("process_group")
        entries.append(
            {
                "pg_id": entry.get("pg_id"),
                # torch's group name: the same on every member (pg_id is not: it counts this rank's
                # groups).
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
    return {
        "version": data.get("version"),
        "pg_status": data.get("pg_status"),
        "pg_config": _group_members(dist, data.get("pg_config")),
        "entries": entries,
    }


#: Sub-groups whose members the black box lists (the default group's are implied by world_size).
MAX_GROUPS_LISTED = 64


def _group_members(dist: Any, torch_config: Any) -> dict[str, Any]:
    """Group name → {"desc", "ranks"} of this rank's groups: torch's ``pg_config`` when it has
    members, else asked of torch.

    torch 2.13 leaves ``pg_config`` empty for gloo; the analysis compares ranks by group membership,
    never by pg_id.
    """
    if isinstance(torch_config, dict) and any(
        isinstance(v, dict) and v.get("ranks") not in (None, "", "[]")
        for v in torch_config.values()
    ):
        return {str(k): v for k, v in list(torch_config.items())[:MAX_GROUPS_LISTED]}
    out: dict[str, Any] = {}
    try:
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        for group, name in list(getattr(getattr(c10d, "_world", None), "pg_names", {}).items())[
            : MAX_GROUPS_LISTED + 1
        ]:
            if str(name) == "0":
                continue
            out[str(name)] = {
                "desc": getattr(group, "group_desc", None),
                "ranks": list(dist.get_process_group_ranks(group)),
            }
    except Exception:  # noqa: BLE001 - a torch without these: the analysis infers members from the entries
        return out
    return out


def _encoded_size(record: dict[str, Any]) -> int:
    return len(json.dumps(record, separators=(",", ":"), default=str))


class _Pool:
    """Records and bytes one kind of black box may still take."""

    __slots__ = ("records_left", "bytes_left", "record_bytes")

    def __init__(self, records: int, total_bytes: int, record_bytes: int) -> None:
        self.records_left, self.bytes_left, self.record_bytes = records, total_bytes, record_bytes

    def take(self, record: dict[str, Any]) -> bool:
        """Trim `record` until it fits this pool (fewer frames, entries, threads) and charge it;
        False when it cannot."""
        limit = min(self.record_bytes, self.bytes_left)
        if self.records_left <= 0 or limit < MIN_RECORD_BYTES:
            return False
        size = _encoded_size(record)
        for frames, entries, threads in (
            (16, 32, 64),
            (8, 16, 16),
            (4, 8, 4),
            (2, 4, 1),
            (0, 0, 0),
        ):
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
            return False
        self.records_left -= 1
        self.bytes_left -= size
        return True


class BlackBoxBudget:
    """How many black-box records and bytes this run may still write, in three pools; trims a record
    to fit.

    A healthy pause longer than the threshold (an eval, a checkpoint) writes a
    stall record too, and then progress ends it. If those spent the budget,
    the real hang that comes later would write nothing. So:

    * the *shared* pool (`max_records`, `max_bytes`) takes stalls, the dump
      signal and the trigger file while it lasts;
    * the *live* reserve (`live_records` of `live_record_bytes` each) takes
      only a stall that has lasted longer than `ESCALATION` × the longest
      stall the run recovered from (`stall_ended`): once the shared pool is
      spent, nine 1.6 s evals write nothing more, and a hang is written when
      it passes 3.2 s. Each stall from this reserve that then ends doubles
      the bar, so it lasts for pauses growing 2, 4, 8 times;
    * the *final* reserve (one record of `final_record_bytes`) is SIGTERM's:
      whatever came before, the launcher's SIGTERM gets its black box.

    Example:
        >>> budget = BlackBoxBudget(max_records=1, live_records=1)
        >>> budget.fit({"threads": [], "open_spans": []}) is not None, budget.fit({"threads": []})
        (True, None)
        >>> budget.stall_ended(1.6); budget.stall_bar_s(1.0)
        3.2
        >>> budget.fit_stall({"threads": []}, 3.3) is not None, budget.fit_final({"threads": []}) is not None
        (True, True)
    """

    #: A stall from the live reserve must last this many times the longest stall that ended.
    ESCALATION = 2.0

    def __init__(
        self,
        max_records: int = MAX_RECORDS,
        max_bytes: int = MAX_SHARED_BYTES,
        max_record_bytes: int = MAX_RECORD_BYTES,
        live_records: int = LIVE_RECORDS,
        live_record_bytes: int = LIVE_RECORD_BYTES,
        final_record_bytes: int = FINAL_RECORD_BYTES,
    ) -> None:
        self._shared = _Pool(max_records, max_bytes, max_record_bytes)
        self._live = _Pool(live_records, live_records * live_record_bytes, live_record_bytes)
        self._final = _Pool(1, final_record_bytes, final_record_bytes)
        #: Stalls that progress ended, and the longest of them (seconds).
        self.stalls_ended = 0
        self.longest_ended_s = 0.0

    @property
    def records_left(self) -> int:
        """Records the shared pool can still take."""
        return self._shared.records_left

    def stall_ended(self, lasted_s: float) -> None:
        """A stall (written or not) ended after `lasted_s`: the run recovers from pauses that
        long."""
        self.stalls_ended += 1
        self.longest_ended_s = max(self.longest_ended_s, lasted_s)

    def stall_bar_s(self, threshold_s: float) -> float:
        """How long the current stall must last before its record is written (inf: no room left)."""
        shared = self._shared
        if (
            shared.records_left > 0
            and min(shared.bytes_left, shared.record_bytes) >= MIN_RECORD_BYTES
        ):
            return threshold_s
        if self._live.records_left > 0:
            return max(threshold_s, self.ESCALATION * self.longest_ended_s)
        return float("inf")

    def fit(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """`record` (the dump signal, the trigger), trimmed into the shared pool, or None when it is
        spent."""
        return record if self._shared.take(record) else None

    def fit_stall(self, record: dict[str, Any], stalled_s: float) -> dict[str, Any] | None:
        """A stall's record: the shared pool, else the live reserve if it lasted past the bar; else
        None."""
        if self._shared.take(record):
            return record
        if stalled_s >= self.ESCALATION * self.longest_ended_s and self._live.take(record):
            return record
        return None

    def fit_final(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """SIGTERM's record: its own reserve (the first), else the shared pool."""
        if self._final.take(record) or self._shared.take(record):
            return record
        return None


def open_side_file(path: str) -> Any:
    """Open (create) faulthandler's side file at `path` for `FaulthandlerArm`: unbuffered bytes, at
    its end.

    Not in append mode: `FaulthandlerArm` rewrites its own note in place when
    no dump followed it, so the file grows only by dumps.
    """
    with open(path, "ab"):
        pass
    handle = open(path, "r+b", buffering=0)  # lives as long as the exporter
    handle.seek(0, os.SEEK_END)
    return handle


class FaulthandlerArm:
    """Keeps ``faulthandler.dump_traceback_later`` armed past the stall threshold, writing to
    `file`.

    Used from the processor thread only (see the module docstring for why and
    for the traps). `rearm` is cheap and rate-limited; `cancel` when the Python
    black box ran, or when the process is idle (no span open).
    """

    REARM_EVERY_S = 1.0

    @property
    def user_owns(self) -> bool:
        """The program armed or cancelled its own dump (since otel-titan was imported): never touch
        it again."""
        return _USER_OWNS[0]

    def __init__(self, file: Any) -> None:
        self.file = file
        self.armed = False
        self._armed_at = 0.0
        # Where our note (threads, armed at, fires at) begins and ends in the file: a dump lands
        # after it.
        self._note_start = self._note_end = -1
        self._lock = threading.RLock()
        self._timeout_s = 0.0
        self._rearm_after_fork = False
        self.enabled = flag(OTEL_TITAN_FAULTHANDLER, True)
        if self.enabled:
            _watch_user_calls(self)

    def _room(self) -> bool:
        try:
            return os.fstat(self.file.fileno()).st_size < MAX_SIDE_FILE_BYTES
        except (OSError, ValueError):
            return False

    def rearm(self, timeout_s: float, now: float | None = None) -> None:
        """Progress was seen: push the dump `timeout_s` into the future (at most once per
        `REARM_EVERY_S`)."""
        if not self.enabled or self.user_owns or timeout_s <= 0:
            return
        now = time.monotonic() if now is None else now
        if self.armed and now - self._armed_at < self.REARM_EVERY_S:
            return
        # the processor thread, and a forking thread re-arming after fork: one note at a time
        with self._lock:
            if not self._room():
                self.cancel()
                return
            if self.armed:
                _ORIGINAL[1]()  # first: a dump firing now finishes before the note moves
                self.armed = False
            self._write_note(timeout_s)
            try:
                _ORIGINAL[0](timeout_s, repeat=False, file=self.file)
            except (OSError, ValueError, RuntimeError):
                return
            self.armed, self._armed_at, self._timeout_s = True, now, timeout_s

    def _write_note(self, timeout_s: float) -> None:
        """Write, just before where a dump would land, the threads' names and when it was armed and
        will fire.

        faulthandler names threads by ident only and never says when it wrote:
        the note does both, so a reader can name the threads and tell a dump of
        an old stall from one of the end (wall clock, µs). When nothing was
        dumped after the previous note, the note replaces it, in place: the file
        grows by dumps only, not by one line per second of a days-long run.
        """
        threads = " ".join(
            f"{t.ident:#018x}={t.name!r}" for t in threading.enumerate() if t.ident is not None
        )
        main = threading.main_thread().ident or 0
        armed_us = time.time_ns() // 1000
        note = (
            f"# otel-titan threads (pid {os.getpid()}, main {main:#018x}): {threads}\n"
            f"# otel-titan armed at {armed_us} us, fires at {armed_us + round(timeout_s * 1e6)} "
            f"us (wall clock; pid {os.getpid()})\n"
        ).encode()
        try:
            end = os.fstat(self.file.fileno()).st_size
            # bytes after our note: a dump, kept
            start = self._note_start if self._note_end == end else end
            self.file.seek(start)
            self.file.write(note)
            # a longer note before (threads that ended) leaves no tail
            self.file.truncate(start + len(note))
            self._note_start, self._note_end = start, start + len(note)
        except (OSError, ValueError):
            self._note_start = self._note_end = -1

    def cancel(self) -> None:
        """Disarm (the Python black box ran, or nothing is open)."""
        with self._lock:
            if self.armed and not self.user_owns:
                _ORIGINAL[1]()
            self.armed = False

    def before_fork(self) -> None:
        """A child must not inherit an armed dump: its watchdog thread does not survive fork, and
        the child's exit would then wait forever in faulthandler's cancel. Disarmed here, re-armed
        in the parent."""
        with self._lock:
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


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


# the program called dump_traceback_later (or its cancel) itself, since this module was imported
_USER_OWNS = [False]


def _watch_user_calls(arm: FaulthandlerArm) -> None:
    """Make `arm` the one the fork hooks and the wrappers below know about."""
    _ARMS[:] = [arm]


def _wrap_faulthandler() -> None:
    """Wrap the module's functions at import (before most programs arm their own), so a program's
    own dump wins for good."""
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

    dump_traceback_later._otel_titan = True  # type: ignore[attr-defined]  # a marker on the wrapper, to know it is ours
    dump_traceback_later.__doc__ = _ORIGINAL[0].__doc__
    cancel_dump_traceback_later.__doc__ = _ORIGINAL[1].__doc__
    faulthandler.dump_traceback_later = dump_traceback_later
    faulthandler.cancel_dump_traceback_later = cancel_dump_traceback_later


_wrap_faulthandler()


class TrainingLane:
    """What the training loop's thread did last, to tell *stuck between two spans of a step* from
    *idle*.

    A rank blocked before its ``data_fetch`` opens (a data loader outside any
    span) has no span open, exactly like a server between requests or a loop
    that finished: the watchdog must write a black box for the first and not
    for the others. Fed, on the processor thread, with the starts and ends of
    the training loop's thread only (``step_context.training_loop_thread``), it
    learns the shape of a step as the run goes:

    * *closers*: the name of the last span that ended in each finished step
      (``optimizer``, ``all_reduce``): after one of them the process is at a
      step boundary, where waiting is idle (the loop ended, or the next step
      has not been asked for);
    * *followed*: names after which another span of the same step began.

    `between_spans` is then True when a step is set and either it changed
    since the last span of the loop (``set_step`` ran, none of the new step's
    spans began) or the last span is one a step always went on after (in
    *followed*, never a closer). Without a step, at a closer, or when the name
    is both (cannot tell), it is False: an idle process is never reported.

    Example:
        >>> lane = TrainingLane()
        >>> for step in (1, 2):
        ...     for name in ("data_fetch", "all_reduce"):
        ...         lane.started(name, step); lane.ended(name, step, 0)
        >>> lane.between_spans(2), lane.between_spans(3), lane.between_spans(None)
        (False, True, False)
        >>> lane.started("data_fetch", 3); lane.ended("data_fetch", 3, 0); lane.between_spans(3)
        True
    """

    #: Names remembered per set (span names are few per loop; dynamic ones stop being learned).
    MAX_NAMES = 64

    __slots__ = ("last_name", "last_end_ns", "last_step", "last_was_end", "closers", "followed")

    def __init__(self) -> None:
        self.last_name: str | None = None  # the last span of the loop that ended
        self.last_end_ns = 0  # its end (perf_counter_ns)
        self.last_step: Any = None  # the step of the loop's last start or end
        self.last_was_end = False
        self.closers: set[str] = set()
        self.followed: set[str] = set()

    def _step_changed(self, step: Any) -> None:
        if (
            step != self.last_step
            and self.last_was_end
            and self.last_name is not None
            and len(self.closers) < self.MAX_NAMES
        ):
            self.closers.add(self.last_name)  # the last span of the step that just finished

    def started(self, name: str, step: Any) -> None:
        """A span of the training loop began."""
        if step != self.last_step:
            self._step_changed(step)
        elif (
            self.last_was_end and self.last_name is not None and len(self.followed) < self.MAX_NAMES
        ):
            self.followed.add(self.last_name)
        self.last_step, self.last_was_end = step, False

    def ended(self, name: str, step: Any, end_ns: int) -> None:
        """A span of the training loop ended (`step`: the step it began in)."""
        if step != self.last_step:
            self._step_changed(step)
        self.last_name, self.last_end_ns, self.last_step, self.last_was_end = (
            name,
            end_ns,
            step,
            True,
        )

    def between_spans(self, step: Any) -> bool:
        """Whether a process with no span open is stuck inside `step` (the loop's current step), not
        idle."""
        if step is None:
            return False
        if step != self.last_step or self.last_name is None:
            return True  # the step moved on (or began) and none of its spans started yet
        return (
            self.last_was_end
            and self.last_name in self.followed
            and self.last_name not in self.closers
        )

    def last_span(self, now_ns: int) -> dict[str, Any] | None:
        """``{"name", "ended_s_ago"}`` of the loop's last span that ended, or None."""
        if self.last_name is None:
            return None
        return {
            "name": self.last_name,
            "ended_s_ago": round(max(now_ns - self.last_end_ns, 0) / 1e9, 3),
        }


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
