"""What one process is doing, as its records say: updated record by record, bounded in memory.

`ProcessState.apply_records` (and `apply`, for one) is the only way records
change it, and it looks at nothing but the records and the time the watcher
read them (`arrival`, seconds on the watcher's clock): a process's state is a
pure function of what it wrote, so a run replayed from its files gives the
states it gave live.

The records go through the model's own walk (`model.timeline.walk_process`,
resumed where the last batch stopped: its `WalkState`): spans are paired, nested,
timed and assigned to steps by the rules `summarize` reads a file with
(by span id, else last-in-first-out per thread or task and name; durations
from the timestamps unless the wall clock jumped; a step begun by the first
``_start``, instant or scalar stamped with it). `ProcessState` is the visitor
that keeps what a live view needs of them.

Two clocks, each for what it is good at. Durations (a step, a phase, the wait
inside the step-closing collective) come from the process's own timestamps:
differences on one clock, untouched by host clock offsets and drift.
Liveness ("nothing new for 20 s") comes from `arrival`: the watcher's clock
alone, so a host whose clock is off by a minute does not look hung.

Memory: the last `STEPS_KEPT` steps' facts, each phase's times and ends
over the last `WINDOW_STEPS` steps (the straggler rule's window), the spans open now, and one
learned longest duration per span name (at most `NAMES_KEPT` names), the
names of the spans entered in the current step (at most
`model.hang_facts.ENTERED_KEPT`), and the digest of the newest black box (a
few frames, per process group its last collectives: `model.hang.digest_black_box`).
"""

from __future__ import annotations

import bisect
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice, repeat
from typing import Any

from otel_titan.analysis.model.ending import INTERRUPT, UNCAUGHT, crash_of, crash_state
from otel_titan.analysis.model.hang import digest_black_box, program_line
from otel_titan.analysis.model.hang_facts import ENTERED_KEPT, HEARTBEAT_S_MAX
from otel_titan.analysis.model.job_speed import TOKEN_SCALARS
from otel_titan.analysis.model.timeline import (
    OpenSpan,
    TimelineVisitor,
    WalkState,
    error_details,
    walk_process,
)
from otel_titan.analysis.read.records import read_mesh
from otel_titan.schema import META_EVENTS, Field, MetaEvent

__all__ = [
    "ProcessState",
    "StepFacts",
    "LiveSpan",
    "BlackBox",
    "is_collective",
    "mesh_coordinates",
    "STEPS_KEPT",
    "WINDOW_STEPS",
]

#: Steps whose facts are kept per process (the detectors look at most this far back).
STEPS_KEPT = 96
#: Finished steps whose phase times the straggler rule's window holds (`detect.Rules.slow_window` is
#: at most this).
WINDOW_STEPS = 40
#: Span names whose longest duration is learned, per process (a run logging a new name per step
#: stays bounded).
NAMES_KEPT = 256

#: Names of spans that wait for other ranks (torch.distributed's collectives and point-to-point, and
#: the usual wrappers). A rank waiting in one is a victim of a hang, not its cause.
_COLLECTIVE = re.compile(
    r"(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|barrier|\breduce\b|^reduce|scatter|gather|"
    r"send|recv|isend|irecv|p2p|collective|allreduce|sync|wait|nccl|gloo)",
    re.IGNORECASE,
)


def is_collective(name: str | None) -> bool:
    """Whether a span's name says it waits for other ranks (``all_reduce``, ``barrier``, ``recv``,
    …).

    Example:
        >>> is_collective("all_reduce"), is_collective("grad_sync"), is_collective("data_fetch"), is_collective(None)
        (True, True, False, False)
    """
    if not name:
        return False
    known = _COLLECTIVE_NAMES.get(name)
    if known is None:
        known = _COLLECTIVE.search(name) is not None
        # a run with a new span name per step must not grow it without bound
        if len(_COLLECTIVE_NAMES) < 4096:
            _COLLECTIVE_NAMES[name] = known
    return known


#: Span name → is_collective (a refresh at 1,024 ranks asks it a quarter of a million times).
_COLLECTIVE_NAMES: dict[str, bool] = {}


def mesh_coordinates(record: dict[str, Any]) -> dict[str, int]:
    """A process's mesh coordinates from its opening record's ``mesh`` field (docs/schema.md); empty
    without one.

    Every dimension the job declared is kept, whatever its name (``pp``,
    ``dp_shard``, ``cp``, ``tp``, ``ep``, or one of the job's own): dropping a
    name the watcher does not know would put ranks that do different work in
    one peer group. Read as the reader reads it (`read.records`), so `watch` and
    `summarize` group the same ranks; a malformed field counts as no mesh.

    Example:
        >>> mesh_coordinates({"mesh": {"pp": 1, "dp_shard": 3, "stage": 0}}), mesh_coordinates({"mesh": {"pp": "1"}}), mesh_coordinates({})
        ({'pp': 1, 'dp_shard': 3, 'stage': 0}, {}, {})
    """
    return read_mesh(record.get(Field.MESH)) or {}


@dataclass
class LiveSpan:
    """A span open now: started, not ended."""

    name: str
    span_id: Any
    parent: Any
    start_us: int
    step: int | None
    caller: str | None
    #: Order of its start among this process's records (nesting follows parent ids, then this order;
    #: never timestamps).
    order: int
    arrival: float


@dataclass
class StepFacts:
    """One finished step of one process, on its own clock."""

    step: int
    begin_us: int
    duration_ms: float | None = None
    #: Phase name → total ms in this step (spans that ended in it); and the names that were top
    #: level.
    phases: dict[str, float] = field(default_factory=dict)
    top: set = field(default_factory=set)
    #: The step's last top-level span (the step-closing collective, if the evidence says it is one:
    #: `detect`), the ms spent in it and when it ended (µs, own clock).
    closing: str | None = None
    closing_ms: float | None = None
    closing_end_us: int | None = None
    tokens: float | None = None
    #: Phase name → when its last span in this step ended (µs, own clock): wait or work
    #: (`model.stragglers.lateness`).
    ends: dict[str, int] = field(default_factory=dict)


@dataclass
class BlackBox:
    """The newest black box (``stall`` record) of a process: why it was written and where the
    process was."""

    arrival: float
    time_us: int
    reason: str | None
    where: str | None
    frame: str | None
    open_spans: list[str]
    flight_recorder: bool
    #: What `summarize`'s Hang section keeps of the same record (`model.hang.digest_black_box`): its
    #: flight recorder per process group (compared by name and members), whether it stopped between
    #: spans, its step.
    digest: dict[str, Any] | None = None


class ProcessState:
    """One process as its records describe it (see the module docstring).

    Example:
        >>> p = ProcessState("x.jsonl", label="training rank 0", source="training", rank=0)
        >>> p.apply({"log_type_name": "fwd_start", "log_type": "event", "span_id": "a", "time_us": 10, "step": 1}, arrival=1.0)
        >>> p.innermost().name, p.step
        ('fwd', 1)
        >>> p.apply({"log_type_name": "fwd_end", "log_type": "event", "span_id": "a", "time_us": 30, "value": 0.02, "step": 1}, arrival=1.1)
        >>> p.innermost() is None, p.progress_arrival
        (True, 1.1)
    """

    def __init__(
        self,
        key: str,
        *,
        label: str,
        source: str,
        rank: int | None,
        attempt: int | None = None,
        run_id: str | None = None,
        host: str | None = None,
        world_size: int | None = None,
        pid: int | None = None,
    ) -> None:
        self.key, self.label, self.source, self.rank = key, label, source, rank
        self.attempt, self.run_id, self.host, self.world_size, self.pid = (
            attempt,
            run_id,
            host,
            world_size,
            pid,
        )
        self.coords: dict[str, int] = {}
        self.first_arrival: float | None = None
        self.last_arrival: float | None = None
        #: Watcher time of the last progress: a span that ended, a new step, a program instant
        #: outside any open span.
        self.progress_arrival: float | None = None
        #: ... and on the writer's clock (µs).
        self.progress_us: int | None = None
        #: Whether it said it is alive since its last progress: a heartbeat, a black box, a stack
        #: dump, or a record written a heartbeat's interval after it (a rank crawling in a hang). A
        #: process killed says nothing more.
        self.alive_since_progress = False
        #: Whether its process is still in this host's process table (the follower asks:
        #: `read.processes_here.alive_here`); None: it ran elsewhere, or that cannot be told.
        self.alive_here: bool | None = None
        #: Its logger's heartbeat interval (the opening record's; None: not said, as in older or
        #: other writers' files).
        self.heartbeat_s: float | None = None
        self.opened_us: int | None = None
        #: Its first record's time and its latest (µs, its own clock).
        self.first_us: int | None = None
        self.last_us: int | None = None
        self.program_records = 0
        self.records = 0
        self.step: int | None = None
        self.steps: deque[StepFacts] = deque(maxlen=STEPS_KEPT)
        self._current: StepFacts | None = None
        #: Phase → step → ms (and → its end, µs own clock) over the last `WINDOW_STEPS` finished
        #: steps, oldest first.
        self.window_times: dict[str, dict[int, float]] = {}
        self.window_ends: dict[str, dict[int, int]] = {}
        #: ... and the same times sorted (its median at a glance: `window_median`).
        self.window_sorted: dict[str, list[float]] = {}
        self._last_top: tuple[str, float, int] | None = None
        #: Longest duration seen per span name (ms), and the longest gap between two program records
        #: (ms).
        self.span_max_ms: dict[str, float] = {}
        self.gap_max_ms = 0.0
        self.last_program_us: int | None = None
        self.closed = False
        self.signal: str | None = None
        self.signal_arrival: float | None = None
        self.black_box: BlackBox | None = None
        #: Whether `black_box` still says where the process is: no program record came after it
        #: (file order, as `model.hang_facts`: a stall the process recovered from is history, not
        #: where it hangs).
        self.box_live = False
        #: Span ids Ctrl-C unwound since the black box (`_unwinding`).
        self._unwound: set[Any] = set()
        #: Spans started in the current step (distinct names, in order): how far it got in the step,
        #: against its peers.
        self.entered: list[str] = []
        self._entered_set: set[str] = set()
        self.steps_seen = 0
        self.last_end: str | None = None
        #: Facts the follower adds (not from records): since when its last line sits torn, whether
        #: its file vanished.
        self.torn_since: float | None = None
        self.gone = False
        #: Its program's uncaught exception (`model.ending.crash_of`, with the innermost span it
        #: unwound), or None.
        self.crash: dict[str, Any] | None = None
        self.crash_arrival: float | None = None
        self.signal_us: int | None = None
        #: The innermost span the latest exception failed: (name, step, start µs, error type), as
        #: `summarize` keeps it.
        self._failed: tuple[str, int | None, int, str] | None = None
        #: The model's walk over its records, where the last batch left it; the spans open in it
        #: (`model.timeline.OpenSpan`, in start order) → when each start was read. `open` shows
        #: them as `LiveSpan`s, made when asked (most spans end in the batch they began in).
        self._walk = WalkState()
        self._opened: dict[OpenSpan, float] = {}
        #: Spans Ctrl-C failed (`_on_error`): over for the walk, kept open here.
        self._kept: dict[Any, LiveSpan] = {}
        self._open_view: dict[Any, LiveSpan] | None = None
        #: The watcher time of the record being walked.
        self._arrival = 0.0
        self._visitor = _Visitor(self)

    # -- reading records -----------------------------------------------------------------------
    def apply(self, record: dict[str, Any], arrival: float) -> None:
        """Update from one record read at watcher time `arrival` (seconds)."""
        self.apply_records((record,), arrival)

    def apply_records(
        self,
        records: Iterable[dict[str, Any]],
        arrival: float,
        arrivals: Iterable[float] | None = None,
    ) -> None:
        """Update from `records` (in file order) read at watcher time `arrival`; `arrivals`: one
        time per record instead."""
        taken = self._taken(records, repeat(arrival) if arrivals is None else arrivals)
        walk_process(taken, self._visitor, self._walk, finish=False)

    def _taken(
        self, records: Iterable[dict[str, Any]], arrivals: Iterable[float]
    ) -> Iterator[dict[str, Any]]:
        """The records on their way to the walk, each first taken note of: when it came, and, for
        the program's own, that the process is alive and how long it went quiet."""
        for record, arrival in zip(records, arrivals):
            self._arrival = arrival
            self.records += 1
            if self.first_arrival is None:
                self.first_arrival = arrival
            self.last_arrival = arrival
            time_us = record["time_us"]
            if self.last_us is None or time_us > self.last_us:
                self.last_us = time_us
                if self.first_us is None:
                    self.first_us = time_us
            if record["log_type_name"] not in META_EVENTS:
                self.program_records += 1
                if not (self.box_live and self._unwinding(record)):
                    self.box_live = False
                if (
                    not self.alive_since_progress
                    and self.progress_us is not None
                    and time_us - self.progress_us >= 1e6 * (self.heartbeat_s or 10.0)
                ):
                    self.alive_since_progress = True
                last = self.last_program_us
                if last is not None and (time_us - last) / 1000.0 > self.gap_max_ms:
                    self.gap_max_ms = (time_us - last) / 1000.0
                self.last_program_us = time_us
            yield record

    def _unwinding(self, record: dict[str, Any]) -> bool:
        """Whether `record` is Ctrl-C unwinding a span (its ``_error`` of type
        ``KeyboardInterrupt``, then its ``_end``): no progress, so the black box still says where
        the process was, as `model.hang_facts` keeps it (the interrupted span is kept open:
        `_on_span`)."""
        name = record["log_type_name"]
        if name.endswith("_error") and error_details(record)[0].rsplit(".", 1)[-1] == INTERRUPT:
            self._unwound.add(record.get("span_id"))
            return True
        return name.endswith("_end") and record.get("span_id") in self._unwound

    # -- what the walk finds (`_Visitor` hands it here) -------------------------------------------
    def _on_meta(self, record: dict[str, Any]) -> None:
        """One of the logger's own records."""
        self._meta(record["log_type_name"], record, self._arrival)

    def _on_step_begun(self, step: int, begin_us: int) -> None:
        """The model's step boundary: a new step is progress."""
        self._new_step(step, begin_us)
        self._progress(self._arrival, begin_us)

    def _on_span_begun(self, span: OpenSpan) -> None:
        """A ``_start``: the span is open now, and counts as entered in its step."""
        self._opened[span] = self._arrival
        self._open_view = None
        step = span.start.get("step") if span.start is not None else None
        entered = self._entered_set
        if (
            type(step) is int
            and span.name not in entered
            and step == self.step
            and len(entered) < ENTERED_KEPT
        ):
            self.entered.append(span.name)
            entered.add(span.name)

    def _on_instant(self, record: dict[str, Any], track: Any) -> None:
        """A program instant: progress when no span is open."""
        self._outside(record)

    def _on_scalar(self, record: dict[str, Any], track: Any) -> None:
        """A scalar: progress when no span is open; a token count is the step's."""
        self._outside(record)
        if self._current is not None and record.get("event_name") in TOKEN_SCALARS:
            value: Any = record.get("value")
            if type(value) in (int, float):
                self._current.tokens = float(value)

    def _outside(self, record: dict[str, Any]) -> None:
        if not self._opened and not self._kept:
            # An instant (a scalar) from inside an open span is no progress out of it: a rank
            # crawling in a hang (a record every 20 s from inside `bwd`) stays the hang's culprit,
            # raised once, not again at each write.
            self._progress(self._arrival, record["time_us"])

    def _progress(self, arrival: float, time_us: int) -> None:
        self.progress_arrival, self.progress_us = arrival, time_us
        self.alive_since_progress = False

    def apply_stacks(self, dump: dict[str, Any], arrival: float) -> bool:
        """Take a faulthandler dump of its side file (`hang.read_faulthandler_stacks`) as its black
        box; True when taken.

        The side file is the black box of a process whose C call held the
        interpreter lock past the threshold, so that no ``stall`` record could
        be written. Taken only when dumped after the process's last record and
        after any black box already held (same host, same wall clock): a dump
        of a stall it recovered from is not where it is now.
        """
        time_us = dump.get("time_us")
        if type(time_us) is not int or (self.last_us is not None and time_us <= self.last_us):
            return False
        if self.black_box is not None and self.black_box.time_us >= time_us:
            return False
        self.black_box = _black_box(
            {
                "time_us": time_us,
                "reason": "faulthandler",
                "threads": dump.get("threads"),
                "open_spans": [],
                "flight_recorder": None,
            },
            arrival,
        )
        self.box_live = True
        self.alive_since_progress = True
        return True

    def _meta(self, name: str, record: dict[str, Any], arrival: float) -> None:
        if name == MetaEvent.OPENED:
            self.opened_us = record["time_us"]
            self.coords = mesh_coordinates(record) or self.coords
            if type(record.get("world_size")) is int:
                self.world_size = record["world_size"]
            interval: Any = record.get(Field.HEARTBEAT_INTERVAL_S)
            if type(interval) in (int, float) and interval >= 0:
                # Capped as summarize caps it: a forged interval must not hold back the verdict on a
                # job killed whole.
                self.heartbeat_s = min(float(interval), HEARTBEAT_S_MAX)
        elif name == MetaEvent.MESH_FOUND:
            # a DeviceMesh found after init, as summarize reads it
            self.coords = self.coords or mesh_coordinates(record)
        elif name == MetaEvent.CLOSED:
            self.closed = True
        elif name == MetaEvent.SIGNAL_RECEIVED:
            self.signal = (
                record.get("signal") if isinstance(record.get("signal"), str) else "signal"
            )
            self.signal_arrival = arrival
            self.signal_us = record["time_us"]
        elif name == UNCAUGHT and record.get(Field.FATAL) is not False:
            crash = crash_of(record)
            failed = self._failed
            if failed is not None and failed[3] == crash["type"] and failed[1] == crash["step"]:
                crash["span"] = failed[0]
            self.crash, self.crash_arrival = crash, arrival
        elif name == MetaEvent.STALL:
            self.black_box = _black_box(record, arrival)
            self.box_live = True
            self.alive_since_progress = True
        elif name == MetaEvent.HEARTBEAT:
            self.alive_since_progress = True

    def _on_error(self, record: dict[str, Any], span: OpenSpan | None, track: Any) -> None:
        """A span failed: the innermost one of an exception unwinding nested spans is the one
        started last.

        One Ctrl-C failed (``KeyboardInterrupt``) stays open: it ended only because the process was
        interrupted, so it says where the process was, as `summarize` keeps it (a hung job stopped
        with Ctrl-C still names its culprit).
        """
        opened = span if span is not None and span in self._opened else None
        start = opened.start_us if opened is not None else record["time_us"]
        error_type = error_details(record)[0]
        if self._failed is None or start >= self._failed[2]:
            step = (
                opened.start.get("step")
                if opened is not None and opened.start is not None
                else record.get("step")
            )
            name = span.name if span is not None else record["log_type_name"][: -len("_error")]
            self._failed = (name, step if type(step) is int else None, start, error_type)

    def _on_span(
        self,
        span: OpenSpan,
        end: dict[str, Any] | None,
        end_us: int,
        dur_us: float,
        incomplete: bool,
    ) -> None:
        """A span ended (`end`), timed by the model's rule: progress, the step's phase time."""
        arrival = self._opened.pop(span, None)
        if end is None:
            return  # still open when a walk finishes: watch never finishes one
        if arrival is not None:
            self._open_view = None
            if (
                span.error is not None
                and error_details(span.error)[0].rsplit(".", 1)[-1] == INTERRUPT
            ):
                # Ctrl-C ended it: still where the process was (kept open), and no progress.
                live = _live_span(span, arrival)
                self._kept[live.span_id] = live
                return
        name = span.name
        self._progress(self._arrival, end["time_us"])
        self.last_end = name
        ms = dur_us / 1000.0
        if ms != ms:
            return
        if name in self.span_max_ms or len(self.span_max_ms) < NAMES_KEPT:
            if ms > self.span_max_ms.get(name, 0.0):
                self.span_max_ms[name] = ms
        current = self._current
        if current is not None and end.get("step") == current.step:
            current.phases[name] = current.phases.get(name, 0.0) + ms
            current.ends[name] = end["time_us"]
            # Top level: nested in nothing (a span whose start was never seen: as its record says).
            if span.parent is None and (
                span.start is not None or end.get("parent_span_id") is None
            ):
                current.top.add(name)
                self._last_top = (name, ms, end["time_us"])

    def _new_step(self, step: int, time_us: int) -> None:
        current = self._current
        if current is not None:
            current.duration_ms = (time_us - current.begin_us) / 1000.0
            if self._last_top is not None:
                current.closing, current.closing_ms, current.closing_end_us = self._last_top
            self.steps.append(current)
            # Per phase, its time and end in each of the last `WINDOW_STEPS` finished steps that had
            # it (rank's own clock): the model's straggler rule takes them as they are
            # (`model.stragglers.judge_phase`), not rebuilt per refresh.
            oldest = current.step - WINDOW_STEPS
            for name, ms in current.phases.items():
                times = self.window_times.get(name)
                if times is None:
                    if len(self.window_times) >= NAMES_KEPT:
                        continue
                    times = self.window_times[name] = {}
                    self.window_ends[name] = {}
                times[current.step] = ms
                bisect.insort(self.window_sorted.setdefault(name, []), ms)
                if name in current.ends:
                    self.window_ends[name][current.step] = current.ends[name]
            for name in list(self.window_times):
                times, ordered = self.window_times[name], self.window_sorted[name]
                while times and next(iter(times)) <= oldest:
                    del ordered[bisect.bisect_left(ordered, times.pop(next(iter(times))))]
                ends = self.window_ends[name]
                while ends and next(iter(ends)) <= oldest:
                    del ends[next(iter(ends))]
                if not times:
                    # a phase the last steps no longer run
                    del (
                        self.window_times[name],
                        self.window_ends[name],
                        self.window_sorted[name],
                    )
        self.step = step
        self.steps_seen += 1
        self.entered, self._entered_set = [], set()
        self._current = StepFacts(step=step, begin_us=time_us)
        self._last_top = None

    # -- questions -----------------------------------------------------------------------------
    @property
    def open(self) -> dict[Any, LiveSpan]:
        """The spans open now, by span id (else (name, place in the file)), in start order (those a
        Ctrl-C failed included)."""
        view = self._open_view
        if view is None:
            view = {live.span_id: live for live in self._kept.values()}
            for span, arrival in self._opened.items():
                live = _live_span(span, arrival)
                view[live.span_id] = live
            self._open_view = view
        return view

    @property
    def quiet_since_progress(self) -> bool:
        """Whether it said it is alive since its last progress (`alive_since_progress`) or its black
        box still says where it is: the `quiet` that `model.hang.stuck_reason` and `seen_alive` take."""
        return self.box_live or self.alive_since_progress

    def last_steps(self, n: int) -> Iterator[StepFacts]:
        """The last `n` finished steps, oldest first, without copying the `STEPS_KEPT` kept."""
        steps = self.steps
        return islice(steps, max(0, len(steps) - n), None)

    def window_median(self, name: str) -> float | None:
        """The median of phase `name`'s times over its window (`window_times`), None without one."""
        ordered = self.window_sorted.get(name)
        if not ordered:
            return None
        n = len(ordered)
        return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2

    def innermost(self) -> LiveSpan | None:
        """The innermost open span: one no other open span names as parent, the latest started of
        those."""
        if not self.open:
            return None
        parents = {s.parent for s in self.open.values()}
        leaves = [s for s in self.open.values() if s.span_id not in parents]
        return max(leaves or self.open.values(), key=lambda s: s.order)

    def open_names(self) -> list[str]:
        """Open spans, outermost first (by start order)."""
        return [s.name for s in sorted(self.open.values(), key=lambda s: s.order)]

    @property
    def silent(self) -> bool:
        """Nothing but the logger's own records so far: it has done nothing since init."""
        return self.program_records == 0

    def ended(self) -> str | None:
        """``crashed``, ``interrupted``, ``closed``, ``terminated`` once the process is known to be
        over, else None.

        An uncaught exception decides before the closing record that the exit hook writes after it
        (`model.ending`).
        """
        if self.crash is not None:
            return crash_state(self.crash)
        if self.closed:
            return "closed"
        if self.signal is not None:
            return "terminated"
        if self.torn_since is not None:
            return "crashed"
        return None


class _Visitor(TimelineVisitor):
    """The walk's visitor for one `ProcessState`: its callbacks are the state's own methods (bound
    once: no call in between)."""

    def __init__(self, state: ProcessState) -> None:
        self.meta = state._on_meta  # type: ignore[method-assign]  # the visitor's hooks, bound once
        self.step_begun = state._on_step_begun  # type: ignore[method-assign]  # as above
        self.span_begun = state._on_span_begun  # type: ignore[method-assign]  # as above
        self.instant = state._on_instant  # type: ignore[method-assign]  # as above
        self.scalar = state._on_scalar  # type: ignore[method-assign]  # as above
        self.error = state._on_error  # type: ignore[method-assign]  # as above
        self.span = state._on_span  # type: ignore[method-assign]  # as above


def _live_span(span: OpenSpan, arrival: float) -> LiveSpan:
    """What watch shows of a span open in the walk, its start read at watcher time `arrival`."""
    start = span.start or {}
    step = start.get("step")
    caller = start.get("caller")
    return LiveSpan(
        span.name,
        _key(span),
        # its parent in the walk, else the one its record names (not seen yet: another thread's
        # record can come first)
        start.get("parent_span_id") if span.parent is None else _key(span.parent),
        span.start_us,
        step if type(step) is int else None,
        caller if isinstance(caller, str) else None,
        span.order,
        arrival,
    )


def _key(span: OpenSpan) -> Any:
    """The `LiveSpan.span_id` of an open span: its record's span id, else (name, its place in the
    file)."""
    start = span.start
    span_id = start.get("span_id") if start is not None else None
    return span_id if span_id else (span.name, span.order)


def _black_box(record: dict[str, Any], arrival: float) -> BlackBox:
    """The facts of a stall record that `watch` shows: the main thread's innermost frame of the
    program's code, the open spans."""
    frame = where = None
    threads = record.get("threads")
    if isinstance(threads, list):
        main = next((t for t in threads if isinstance(t, dict) and t.get("main")), None) or next(
            (t for t in threads if isinstance(t, dict)), None
        )
        frames = main.get("frames") if isinstance(main, dict) else None
        if isinstance(frames, list) and frames:
            frame = program_line([f for f in frames if isinstance(f, dict)])
    spans = record.get("open_spans")
    names: list[str] = (
        [s["name"] for s in spans if isinstance(s, dict) and isinstance(s.get("name"), str)]
        if isinstance(spans, list)
        else []
    )
    where = record.get("where") if isinstance(record.get("where"), str) else None
    fr = record.get("flight_recorder")
    try:
        digest = digest_black_box(record)
    except Exception:  # noqa: BLE001 - a malformed black box (hand-edited, another writer): the records still place the process
        digest = None
    return BlackBox(
        arrival=arrival,
        time_us=record["time_us"],
        reason=record.get("reason") if isinstance(record.get("reason"), str) else None,
        where=where,
        frame=frame,
        open_spans=names,
        flight_recorder=isinstance(fr, dict) and "error" not in fr,
        digest=digest,
    )
