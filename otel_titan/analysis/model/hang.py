"""The Hang section of `otel-titan summarize`: which rank, which frame, which collective; or "cannot
tell", and why.

Read from what each process left (docs/hangs.md): its latest *live* ``stall``
record (the black box: open spans, or where it stopped between spans; every
thread's stack; torch's flight recorder), the faulthandler side file
(``<file>.stacks``, `side_file_of`: the stacks of a process whose
interpreter lock was held by a C call), torch's own
flight-recorder dump files where present (`model.flight_recorder`), and the
summary's own facts (closed or not, open spans, the spans it entered in its
last step, which ranks of the world wrote no file at all).

A stall record followed by progress (any later record of the program) is
history: the process resumed. It is listed as such, never as where the
process hangs, and a process that then closed cleanly is not in the section.

Suspects, strongest evidence first; a rule names a rank only on its own evidence:

* **missing**: the records say world_size N and rank k wrote no file (it never
  reached ``init_structured_logger``);
* **crashed** (failed first): per source and attempt, the process whose
  uncaught exception (or silent kill: `model.ending`) came first; the others,
  which waited, failed in their collective or were terminated after it, are
  its victims (the crash causes the hang that follows);
* **behind in a group**: per process group (compared by torch's group name and
  membership, never by ``pg_id``), members wait in collective seq S while a
  member's last is below S: it never entered it;
* **desync**: members of a group at the same seq in different ops, sizes or
  dtypes (a strict minority is named; an even split is reported, no one named);
* **p2p**: a rank waits in a recv from (a send to) a peer that has no send to
  (recv from) it in flight: the peer never sent (posted the receive), unless
  the peer itself waits with a third rank (a pipeline's chain of receives);
* **no collective on record**: the members of a group wait in one and this
  member could not write a black box (its faulthandler dump: interpreter lock held);
* **crashed** (torn): its file ends mid-line while every other process was then
  terminated by a signal (not a whole job SIGKILLed: that tears files at random;
  `model.ending` now names such a file first, as a silent kill);
* **behind in the step**: without a flight recorder, a stuck rank at an earlier
  step, or at the same step having entered a strict subset of the spans the
  others entered (between spans, it entered none of the step's: it never
  reached the ``all_reduce`` the others wait in); where the ranks run
  different programs (`model.ending.programs_differ`: a pipeline's stages),
  only one that got less far than every other;
* **nothing logged** since its file was created;
* the odd ones out of a strict majority in one (span, frame); where the
  ranks' last steps differ, only one alone, with every process stuck.

A rank is named only for what *stuck* ranks wait on (a stall record or a
heartbeat since their last record, a faulthandler or torch dump: never a
missing closing record alone, which a healthy job killed mid-step also
leaves), and only when it is stuck itself, went quiet before they wrote
their stall records, or is crawling (still writing after them, from no later
step than theirs: `_held_back`). Where no rule holds, the verdict is "cannot tell", with
the reason (no flight recorder on the ranks that matter, an even split, no
evidence that anyone is stuck).

Only digests are kept per process (`digest_black_box`): a few frames, per
process group its last collectives; never a whole record, so 1,000 ranks cost
little memory.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from otel_titan.analysis.model.ending import (
    End,
    describe_crash,
    failed_because_of_a_peer,
    failed_first,
    held_back_by,
    is_interrupt,
    order_unknown,
    programs_differ,
)
from otel_titan.analysis.model.flight_recorder import (
    COMPARED_SIZES,
    DEFAULT_GROUP,
    digest_recorder,
    group_label,
)
from otel_titan.analysis.model.frames import program_frame as _program_frame
from otel_titan.analysis.model.frames import program_line
from otel_titan.analysis.model.frames import where as _where
from otel_titan.analysis.model.headline import compress
from otel_titan.analysis.model.wording import plural
from otel_titan.schema import MetaEvent, stacks_file_name

__all__ = [
    "HEARTBEAT_S",
    "PAUSE_ALLOWANCE_S",
    "program_line",
    "digest_black_box",
    "read_faulthandler_stacks",
    "build_hang",
    "name_suspects",
    "own_work",
    "waited_for_in_own_work",
    "place_in_step",
    "flag_missing_that_ran",
    "format_hang",
    "format_history",
    "stall_history",
    "HangReport",
    "HangGroup",
    "Suspect",
    "RankPlace",
    "stuck_reason",
    "seen_alive",
    "QUIET",
    "SILENT",
    "ALIVE_HERE",
]

#: The writer's heartbeat interval where its opening record does not say one (older files, other
#: writers; `core.options`): also how long a process alive on this host must be quiet to count as
#: stuck (`stuck_reason`).
HEARTBEAT_S = 10.0

#: Groups listed in the text (all are in --json); suspects listed in the text.
GROUPS_SHOWN = 4
SUSPECTS_SHOWN = 5
#: Bytes read from the end of a faulthandler side file.
SIDE_FILE_TAIL = 256 << 10


def digest_black_box(record: dict[str, Any]) -> dict[str, Any]:
    """What the Hang section needs from one ``stall`` record (small: kept per process)."""
    threads = record.get("threads") or []
    main = next((t for t in threads if t.get("main")), None)
    frames = (main or {}).get("frames") or []
    recorder = record.get("flight_recorder")
    open_spans = record.get("open_spans") or []
    step = _step_of(record, open_spans)
    return {
        "reason": record.get("reason"),
        "time_us": record.get("time_us"),
        "stalled_s": record.get("stalled_s"),
        "frame": _program_frame(frames),
        "top_frame": frames[0] if frames else None,
        "thread_frames": [
            (t.get("thread_name"), _where(_program_frame(t.get("frames") or [])))
            for t in threads[:8]
        ],
        "fr": digest_recorder(recorder, _world(record.get("world_size"))),
        # Innermost open span: the last row (the writer lists them oldest first, parents before
        # children).
        "span": open_spans[-1].get("name") if open_spans else None,
        "between_spans": _between_spans(record, open_spans, step),
        "last_span": _last_span(record),
        "step": step,
        "recorder": _recorder_state(recorder),
    }


def _step_of(record: dict[str, Any], open_spans: list[dict[str, Any]]) -> Any:
    """A black box's step: its own field, else that of the innermost open span that has one (None
    without)."""
    step = record.get("step")
    if type(step) is not int:
        step = next(
            (s.get("step") for s in reversed(open_spans) if type(s.get("step")) is int), None
        )
    return step


def _between_spans(record: dict[str, Any], open_spans: list[dict[str, Any]], step: Any) -> bool:
    """Whether the process stopped between spans: the record says so (``where``), or, from a writer
    that wrote no ``where``, no span is open in a known step."""
    return record.get("where") == "between_spans" or (
        not open_spans and record.get("where") is None and step is not None
    )


def _last_span(record: dict[str, Any]) -> dict[str, Any] | None:
    """The span it ended last (its name, how long before the black box), when the record has one:
    where it was before it stopped between spans."""
    last_span = record.get("last_span") if isinstance(record.get("last_span"), dict) else None
    return (
        {"name": last_span.get("name"), "ended_s_ago": last_span.get("ended_s_ago")}
        if last_span
        else None
    )


def _recorder_state(recorder: Any) -> str:
    """``on`` (the flight recorder's entries are there), ``error`` (reading it failed: ``{"error":
    ...}``) or ``off``."""
    return (
        "on"
        if isinstance(recorder, dict) and "entries" in recorder
        else ("error" if isinstance(recorder, dict) else "off")
    )


_THREADS_NOTE = re.compile(r"^# otel-titan threads \(pid \d+, main (0x[0-9a-f]+)\): (.*)$")
_ARMED_NOTE = re.compile(r"^# otel-titan armed at (\d+) us, fires at (\d+) us")
_NAME = re.compile(r"(0x[0-9a-f]+)='((?:[^'\\]|\\.)*)'")
_THREAD = re.compile(
    r"^(?:Current thread|Thread) (0x[0-9a-f]+)(?: \[(.*?)\])? \(most recent call first\):"
)
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_OUR_CODE = re.compile(r"(^|/)otel_titan/")
_THREADING = re.compile(r"(^|/)threading\.py$")


def _ours(name: Any, frames: Sequence[dict[str, Any]]) -> bool:
    """otel-titan's own thread (its writer, its signal watcher): by name, or, unnamed, by what it
    runs.

    The outermost frame past `threading`'s bootstrap is the thread's target:
    in otel_titan, it is one of ours (a program's thread may call into
    otel-titan, but never has it as its target).
    """
    if isinstance(name, str) and name.startswith("otel-titan-"):
        return True
    outer = [f for f in frames if not _THREADING.search(str(f.get("file", "")))]
    return (
        bool(outer)
        and len(outer) < len(frames)
        and bool(_OUR_CODE.search(str(outer[-1].get("file", ""))))
    )


def read_faulthandler_stacks(path: str) -> dict[str, Any] | None:
    """The last faulthandler dump in a ``.stacks`` side file, or None.

    Returns ``{"reason": "faulthandler", "time_us", "armed_us", "threads"}``:
    `time_us` is when the dump fired (the ``fires at`` of the note the writer
    put before arming it; for files without one, older runs, the file's
    modification time, which is never earlier), so a caller can tell a dump
    of a stall the process recovered from (records after it) from one of the
    end. `threads`: every thread's frames (innermost first), the main one
    marked, otel-titan's own threads left out.
    """
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            handle.seek(max(0, info.st_size - SIDE_FILE_TAIL))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    start = text.rfind("Timeout (")
    if start < 0:
        return None
    main_ident, names = None, {}
    time_us, armed_us = info.st_mtime_ns // 1000, None
    for line in text[:start].splitlines():
        note = _THREADS_NOTE.match(line)
        if note:
            main_ident = note.group(1)
            names = dict(_NAME.findall(note.group(2)))
            continue
        armed = _ARMED_NOTE.match(line)
        if armed:
            armed_us, time_us = int(armed.group(1)), int(armed.group(2))
    threads: list[dict[str, Any]] = []
    for line in text[start:].splitlines():
        head = _THREAD.match(line)
        if head:
            ident = head.group(1)
            threads.append(
                {
                    "thread_id": ident,
                    "thread_name": names.get(ident, head.group(2)),
                    "main": ident == main_ident,
                    "frames": [],
                }
            )
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1]["frames"].append(
                {
                    "file": _short(frame.group(1)),
                    "line": int(frame.group(2)),
                    "function": frame.group(3),
                }
            )
    threads = [t for t in threads if t["main"] or not _ours(t["thread_name"], t["frames"])]
    if not threads:
        return None
    return {"reason": "faulthandler", "time_us": time_us, "armed_us": armed_us, "threads": threads}


def side_file_of(base: str, oldest: str | None = None) -> str:
    """The faulthandler side file of the process whose active JSONL file is `base`.

    Named by the ``stacks_file`` field of its opening record (the first line of
    its oldest segment still on disk); else by `stacks_file_name` (the opening
    record rotated away); else ``<base>.stacks``, the name older runs used (named
    like a rotated segment, which ``*.jsonl*`` globs took for one).
    `oldest`: that segment, when the caller knows it (the reader listed the
    folder once: listing it again per process is O(ranks²) at 1,000 ranks).
    """
    folder = os.path.dirname(base)
    if oldest is None:
        oldest = max(
            glob.glob(glob.escape(base) + ".[0-9]*"),
            key=lambda p: int(p.rsplit(".", 1)[1]) if p.rsplit(".", 1)[1].isdigit() else -1,
            default=base,
        )
    try:
        with open(oldest, "rb") as handle:
            first = json.loads(handle.readline(64 << 10) or b"{}")
    except (OSError, ValueError):
        first = {}
    named = (
        first.get("stacks_file")
        if isinstance(first, dict) and first.get("log_type_name") == MetaEvent.OPENED
        else None
    )
    candidates = (
        [os.path.join(folder, os.path.basename(named))] if isinstance(named, str) and named else []
    )
    candidates += [os.path.join(folder, stacks_file_name(os.path.basename(base))), base + ".stacks"]
    return next((c for c in candidates if os.path.exists(c)), candidates[0])


def _short(path: str) -> str:
    cwd = os.getcwd()
    return path[len(cwd) + 1 :] if path.startswith(cwd + os.sep) else path


@dataclass
class RankPlace:
    """Where one process is: its state, innermost open span (or between spans), frame, collectives,
    progress in its step."""

    label: str
    source: str
    rank: int | None
    attempt: int | None
    status: str
    span: str | None
    where: str | None
    evidence: str
    collective: dict[str, Any] | None = None
    threads: list[Any] = field(default_factory=list)
    step: int | None = None
    between_spans: bool = False
    last_span: dict[str, Any] | None = None
    #: Names of the spans it started in `step`, in order; `entered_complete` False when the step's
    #: start was not read (a file tail).
    entered: list[str] = field(default_factory=list)
    entered_complete: bool = True
    stuck: bool = False
    #: When it was last seen alive where it stopped (its latest black box, or its file's last record
    #: when that is a heartbeat or another record a heartbeat interval after its progress), and its
    #: last program record (µs): who was quiet before whom.
    alive_us: int | None = None
    last_event_us: int | None = None
    #: When it failed itself (its crash, or its silent kill: `model.ending`), and how, in words;
    #: None when it did not.
    failed_us: int | None = None
    failure: str | None = None
    #: Its flight-recorder digest (`model.flight_recorder.digest_recorder`): compared, never printed
    #: nor in --json.
    fr: ClassVar[dict[str, Any] | None] = None
    #: Names of the spans it was ever seen to finish (None: not known): what it does, so that a span
    #: it never runs (rank 0's checkpoint) is not one it "never entered" (`own_work`). Set per
    #: instance, as `fr`: never in --json.
    seen: ClassVar[frozenset[str] | None] = None
    #: Its crash facts (`model.ending.crash_of`) when it failed itself: compared, never in --json
    #: (`failure` says it).
    crash: ClassVar[dict[str, Any] | None] = None
    #: Its host and how far its times may be off the aligned clock (µs, `build_hang`'s
    #: `clock_error_us`): which of two hosts' failures came first (`model.ending.failed_first`).
    #: Per instance, as `fr`: never in --json.
    clock: ClassVar[tuple[str | None, float]] = (None, 0.0)
    #: How many steps its records began (None: not known): whether it has finished one, so that its
    #: spans say what its steps run (`waited_for_in_own_work`). Per instance, as `fr`.
    steps_begun: ClassVar[int | None] = None
    #: Whether `seen` is from its whole file (not a tail's spans only). Per instance, as `fr`.
    seen_whole: ClassVar[bool] = False


@dataclass
class HangGroup:
    """Processes in the same place."""

    count: int
    ranks: list[int]
    labels: list[str]
    span: str | None
    where: str | None
    collective: dict[str, Any] | None
    role: str
    between_spans: bool = False
    step: int | None = None


@dataclass
class Suspect:
    """A process the evidence points at, and why (`rule`: missing, behind, desync, p2p, no
    collective, behind in step, nothing logged, odd one out)."""

    source: str
    rank: int | None
    label: str
    where: str | None
    span: str | None
    why: str
    rule: str = ""


@dataclass
class HangReport:
    """The Hang section: `groups` (largest first), `suspects` (missing ranks first), per-process
    places (in --json only).

    `verdict`: "named" (suspects on evidence) or "cannot tell" (`notes` say why); `notes` also
    hold each desync found; `history`: stalls that progress ended (not hangs).
    """

    affected: int
    processes: int
    headline: str
    groups: list[HangGroup]
    suspects: list[Suspect]
    places: list[RankPlace]
    missing: list[dict[str, Any]] = field(default_factory=list)
    verdict: str = "cannot tell"
    notes: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)


def _status(
    process: Any, box: dict[str, Any] | None, now_us: float, open_worlds: set[tuple[str, Any]]
) -> str | None:
    if getattr(process, "crash", None) is not None:
        # crashed or interrupted: the closing record the exit hook wrote after it is no clean end
        return process.state(now_us)
    if process.closed_cleanly is True:
        return None  # it ended well: any earlier stall is history
    if (
        process.closed_cleanly is None
        and box is None
        and not process.hang_suspect
        and (process.source, process.attempt) not in open_worlds
    ):
        return None  # torchtitan's and pimm's files have no closing record: a run whose spans all ended says nothing
    return process.state(now_us)


def build_hang(
    processes: Sequence[Any],
    facts: dict[str, dict[str, Any]],
    bases: dict[str, str],
    missing: Sequence[dict[str, Any]] = (),
    dumps: dict[int, tuple[str, dict[str, Any]]] | None = None,
    now_us: float | None = None,
    clock_error_us: Mapping[str, float] | None = None,
) -> HangReport | None:
    """The Hang section, or None when every process closed cleanly (and no rank of a stuck world is
    missing).

    `facts`: label → what `model.hang_facts.HangTracker` gathered (``box``: the digest of its latest
    live black box or None; ``history``: stalls that progress ended; ``step``, ``entered``,
    ``entered_complete``: its last step and the spans it started there; ``stalled``, ``quiet``: a
    stall record or a heartbeat since its last program record; ``world_size``); `bases`: label → its
    JSONL base path (for the faulthandler side file); `missing`: ranks with no file (``{"source",
    "attempt", "world_size", "ranks"}``); `dumps`: global rank → torch's flight-recorder dump;
    `clock_error_us`: host → how far its times may be off the aligned clock (µs: the hosts no clock
    fit holds for, `model.clocks.ClockAlignment.written_error_us`).
    """
    now_us = time.time() * 1e6 if now_us is None else now_us
    current, earlier = _current_attempt(processes)
    open_worlds = _open_worlds(processes, now_us)
    places = [
        place
        for p in current
        if (
            place := _place(
                p, facts.get(p.label) or {}, bases.get(p.label), dumps, now_us, open_worlds
            )
        )
        is not None
    ]
    by_label = {p.label: p for p in current}
    for place in places:
        host = getattr(by_label[place.label], "host_name", None)
        place.clock = (host, (clock_error_us or {}).get(host or "", 0.0))  # type: ignore[misc]  # per instance, as `fr`
    missing = _missing_here(missing, places, current, facts)
    if _no_hang(places, missing):
        return None
    suspects, notes = _suspects(places, current, missing)
    suspects = _pauses(suspects, places, current, notes)
    groups = _groups(places, {s.label for s in suspects})
    headline = _headline(places, current, missing)
    if not suspects and not any(p.stuck for p in places):
        notes.extend(_why_no_one_is_named(places))
    return HangReport(
        affected=len(places),
        processes=len(current),
        headline=headline,
        groups=groups,
        suspects=suspects,
        places=places,
        missing=list(missing),
        verdict="named" if suspects else "cannot tell",
        notes=notes + _restarted(earlier),
        history=stall_history(processes, facts),
    )


def _current_attempt(processes: Sequence[Any]) -> tuple[list[Any], int]:
    """The processes of each source's latest attempt (the run), and how many of the earlier ones did
    not finish.

    A restart ended the earlier attempts (their ranks were stopped to start
    again): the latest one is the run.
    """
    latest = _latest_attempts(processes)
    earlier = sum(p.closed_cleanly is not True for p in processes if _of_earlier_attempt(p, latest))
    return [p for p in processes if not _of_earlier_attempt(p, latest)], earlier


def _latest_attempts(processes: Sequence[Any]) -> dict[str, int]:
    """Per source, its latest attempt (`_current_attempt`)."""
    latest: dict[str, int] = {}
    for process in processes:
        if process.attempt is not None:
            latest[process.source] = max(
                latest.get(process.source, process.attempt), process.attempt
            )
    return latest


def _of_earlier_attempt(process: Any, latest: dict[str, int]) -> bool:
    """Whether a restart stopped `process`: it belongs to an attempt before its source's latest
    (`_latest_attempts`)."""
    return process.attempt is not None and process.attempt < latest[process.source]


def _open_worlds(processes: Sequence[Any], now_us: float) -> set[tuple[str, Any]]:
    """(source, attempt) where files with no closing record to expect (torchtitan's, pimm's) stopped
    inside spans, quiet for a minute.

    Their end is unknown, so they are placed as ours are. Never stuck on that
    alone: a job killed mid-step leaves the same files (``stalled``: its process
    still alive on this host, `stuck_reason`).
    """
    return {
        (p.source, p.attempt)
        for p in processes
        if p.closed_cleanly is None
        and p.open_span_count
        and p.state(now_us) in ("stopped", "stalled")
    }


def _place(
    process: Any,
    fact: dict[str, Any],
    base: str | None,
    dumps: dict[int, tuple[str, dict[str, Any]]] | None,
    now_us: float,
    open_worlds: set[tuple[str, Any]],
) -> RankPlace | None:
    """Where one process of the current attempt is, on all its evidence (black box, faulthandler
    dump, torch's dump, records); None when it ended well or says nothing (`_status`)."""
    box = fact.get("box")
    status = _status(process, box, now_us, open_worlds)
    if status is None:
        return None
    dump = _faulthandler_dump(process, box, base)
    frame, threads, evidence, status = _stacks(dump, box, status)
    fr = (box or {}).get("fr")
    torch_dump = (dumps or {}).get(process.rank) if process.rank is not None else None
    if torch_dump is not None:
        fr = digest_recorder(torch_dump[1], _world(fact.get("world_size"))) or fr
        evidence += f"; torch flight-recorder dump {os.path.basename(torch_dump[0])}"
    span = process.last_phase or (box or {}).get("span")
    between, step, entered, complete = place_in_step(
        box,
        fact.get("step"),
        list(fact.get("entered") or []),
        bool(fact.get("entered_complete", True)),
        bool(process.open_spans),
    )
    quiet = bool(fact.get("stalled") or fact.get("quiet"))
    last = process.last_us if process.last_us is not None else process.created_us
    why = stuck_reason(
        quiet=quiet or dump is not None or torch_dump is not None,
        silent=status == "hung before first record",
        alive_here=getattr(process, "alive_here", None),
        quiet_s=None if last is None else (now_us - last) / 1e6,
    )
    if why == ALIVE_HERE:
        evidence += f"; its process (pid {process.pid}) still alive on this host"
    place = RankPlace(
        process.label,
        process.source,
        process.rank,
        process.attempt,
        status,
        None if between else span,
        _where(frame),
        evidence,
        _shown_collective(fr),
        [list(t) for t in threads],
        step,
        between,
        (box or {}).get("last_span") if between else None,
        entered,
        complete,
        why is not None,
        seen_alive(quiet=quiet, box_us=(box or {}).get("time_us"), last_us=process.last_us),
        process.last_event_us,
    )
    _keep_compared(place, fr, fact)
    _mark_failure(place, getattr(process, "crash", None))
    return place


def _faulthandler_dump(
    process: Any, box: dict[str, Any] | None, base: str | None
) -> dict[str, Any] | None:
    """Its faulthandler dump (`read_faulthandler_stacks`), when no black box followed its last
    event: the interpreter lock was held."""
    if not base or not (
        box is None or (process.last_event_us and (box.get("time_us") or 0) < process.last_event_us)
    ):
        return None
    # a ProcessSummary's segments, oldest first (names only)
    files = getattr(process, "files", None)
    dump = read_faulthandler_stacks(
        side_file_of(base, os.path.join(os.path.dirname(base), files[0]) if files else None)
    )
    if (
        dump is not None
        and type(dump.get("time_us")) in (int, float)
        and (process.last_us or 0) > dump["time_us"]
    ):
        return None  # written before the process's last record: a stall it recovered from, not where it is
    return dump


def _stacks(
    dump: dict[str, Any] | None, box: dict[str, Any] | None, status: str
) -> tuple[Any, list[Any], str, str]:
    """(main thread's frame, every thread's, evidence, status): from the faulthandler dump (the
    interpreter lock held), else the black box, else none.

    The dump comes first: where there is one, no black box followed the last
    event, so the black box, if any, is of an earlier stall.
    """
    if dump is not None:
        main = next((t for t in dump["threads"] if t["main"]), None)
        frame = _program_frame((main or {}).get("frames") or [])
        threads = [
            (t["thread_name"], _where(_program_frame(t["frames"])))
            for t in dump["threads"]
            if not str(t.get("thread_name") or "").startswith("otel-titan-")
        ][:8]
        return (
            frame,
            threads,
            "faulthandler (interpreter lock held)",
            f"{status}, interpreter lock held",
        )
    if box is not None:
        return (
            box.get("frame"),
            box.get("thread_frames") or [],
            f"black box ({box.get('reason')})",
            status,
        )
    return None, [], "records only", status


def _world(world_size: Any) -> tuple[int, ...] | None:
    """The global ranks of a world of `world_size` (None for a value no record of a real job holds):
    what `digest_recorder` maps group ranks onto."""
    return (
        tuple(range(world_size)) if type(world_size) is int and 0 < world_size <= 1 << 20 else None
    )


#: Why a stopped process counts as stuck (`stuck_reason`).
QUIET, SILENT, ALIVE_HERE = "quiet", "silent", "alive here"


def stuck_reason(
    *, quiet: bool, silent: bool, alive_here: bool | None, quiet_s: float | None
) -> str | None:
    """Why a stopped process counts as stuck, on evidence: the one rule `summarize` and `watch`
    place a hang's processes by; None: nothing tells it from one killed mid-step.

    `QUIET`: it said it is alive where it stopped (a stall record or live black
    box, a heartbeat, a record a heartbeat interval after its progress, a
    faulthandler dump, torch's timeout dump); `SILENT`: it logged nothing since
    init; `ALIVE_HERE`: its process is still in this host's process table
    (`alive_here`; None: cannot be told) and its file has been quiet for
    `quiet_s` ≥ `HEARTBEAT_S` seconds (what a heartbeat would say: torchtitan's
    files, ours between spans).

    A process killed mid-step (SIGKILL, a scheduler's cancel) is none of these:
    it was running, so a job killed whole has no culprit.

    Example:
        >>> stuck_reason(quiet=False, silent=False, alive_here=True, quiet_s=12.0)
        'alive here'
        >>> stuck_reason(quiet=False, silent=False, alive_here=None, quiet_s=600.0) is None
        True
    """
    if quiet:
        return QUIET
    if silent:
        return SILENT
    if alive_here is True and quiet_s is not None and quiet_s >= HEARTBEAT_S:
        return ALIVE_HERE
    return None


def seen_alive(*, quiet: bool, box_us: int | None, last_us: int | None) -> int | None:
    """When its records last showed it alive where it stopped (µs, its own clock): its file's last
    record `last_us` when it is `quiet` (`stuck_reason`'s evidence), else its live black box's
    `box_us`; None without either.

    A rank stopped between spans writes no heartbeat, so the others' heartbeats are what date
    their wait after its last record (`_held_back`).

    Example:
        >>> seen_alive(quiet=True, box_us=5, last_us=9), seen_alive(quiet=False, box_us=None, last_us=9)
        (9, None)
    """
    times = [t for t in (box_us, last_us if quiet else None) if type(t) is int]
    return max(times, default=None)


def _keep_compared(place: RankPlace, fr: dict[str, Any] | None, fact: dict[str, Any]) -> None:
    """Set what the rules compare but --json never shows: its flight-recorder digest, the spans it
    was ever seen to finish."""
    place.fr = fr  # type: ignore[misc]  # per instance, outside the dataclass fields (asdict, --json)
    if fact.get("seen") is not None:
        place.seen = frozenset(fact["seen"])  # type: ignore[misc]  # per instance, as `fr`
        place.seen_whole = bool(fact.get("seen_whole"))  # type: ignore[misc]  # as `fr`
    if type(fact.get("steps_seen")) is int:
        place.steps_begun = fact["steps_seen"]  # type: ignore[misc]  # per instance, as `fr`


def _mark_failure(place: RankPlace, crash: dict[str, Any] | None) -> None:
    """When and how it failed itself (its crash, or its silent kill: `model.ending`); an interrupt
    (Ctrl-C) is no failure of its own."""
    if crash is not None and not is_interrupt(crash) and type(crash.get("time_us")) is int:
        place.failed_us, place.failure = crash["time_us"], describe_crash(crash)
        place.crash = crash  # type: ignore[misc]  # per instance, as `fr`


def _steps_seen(
    current: Sequence[Any], facts: dict[str, dict[str, Any]]
) -> dict[tuple[str, Any], int]:
    """(source, attempt) → the most steps any of its processes began (`flag_missing_that_ran`).

    A rank with no file that the others ran steps with (a step begun after
    another: in synchronous training every step's collective needs every rank)
    got past init: its logs are elsewhere (one node's folder) or it logs
    nothing. It stays listed, marked so, and is never the one that "never
    reached init_structured_logger".
    """
    steps_seen: dict[tuple[str, Any], int] = {}
    for p in current:
        key = (p.source, p.attempt)
        steps_seen[key] = max(
            steps_seen.get(key, 0), (facts.get(p.label) or {}).get("steps_seen") or 0
        )
    return steps_seen


def _missing_here(
    missing: Sequence[dict[str, Any]],
    places: list[RankPlace],
    current: Sequence[Any],
    facts: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """The missing ranks of the runs placed here (a world that ended well has none to report), each
    flagged when it took part in the steps."""
    present = {(p.source, p.attempt) for p in places}
    return flag_missing_that_ran(
        [m for m in missing if (m["source"], m["attempt"]) in present], _steps_seen(current, facts)
    )


def _no_hang(places: list[RankPlace], missing: Sequence[dict[str, Any]]) -> bool:
    """No Hang section: no rank missing, and every process ended well (none placed) or is a live run
    making progress, as far as any record says."""
    return not missing and all(p.status == "running" and not p.stuck for p in places)


def _restarted(earlier: int) -> list[str]:
    """The note on processes of earlier attempts that did not finish (none when all did)."""
    return (
        [
            f"{plural(earlier, 'process')} of earlier attempts did not finish: a restart stopped "
            "them (the headline's groups show where)"
        ]
        if earlier
        else []
    )


def _why_no_one_is_named(places: list[RankPlace]) -> list[str]:
    """The notes of a section with no suspect and no stuck process: why no one is named."""
    notes = []
    if any(p.status == "stopped" for p in places):
        notes.append(
            "files with no heartbeat or black box (torchtitan's, pimm's) cannot tell a stuck "
            "process from one killed mid-step: "
            "no one is named; `otel-titan watch`, beside the live job, can"
        )
    notes.append(
        "no process is stuck on the evidence (a live run, or killed before its watchdog wrote): "
        "no one is named"
    )
    return notes


def place_in_step(
    box: dict[str, Any] | None,
    step: int | None,
    entered: list[str],
    complete: bool,
    has_open_spans: bool,
) -> tuple[bool, int | None, list[str], bool]:
    """(between spans, step, spans entered in it, whether its start was read) of a process, its
    black box considered.

    Why: a process stopped between spans has no open span to say where it is;
    its black box does (``where: between_spans``), and its ``step`` field may be
    a step set (``set_step``) with nothing started in it yet, which its records
    do not show: it is then at that step with nothing entered, behind the
    ranks that entered that step's collective. The one rule for `summarize`
    (`build_hang`) and `watch`.

    Example:
        >>> place_in_step({"between_spans": True, "step": 8}, 7, ["fwd", "all_reduce"], True, False)
        (True, 8, [], True)
        >>> place_in_step({"between_spans": True, "step": 8}, 8, ["fwd"], True, True)  # a span is open: not between spans
        (False, 8, ['fwd'], True)
    """
    between = bool(box and box.get("between_spans") and not has_open_spans)
    box_step = box.get("step") if box else None
    if between and type(box_step) is int and (step is None or box_step > step):
        step, entered, complete = box_step, [], True  # a step set, nothing started in it yet
    return between, step, entered, complete


def flag_missing_that_ran(
    missing: Sequence[dict[str, Any]], steps_seen: dict[tuple[str, Any], int]
) -> list[dict[str, Any]]:
    """`missing` (ranks of ``world_size`` with no file), each marked ``ran_with_others`` when its
    source and attempt began 2 steps or more.

    Why: in synchronous training every step's collective needs every rank, so
    a rank the others ran steps with got past init: its logs are elsewhere (one
    node's folder) or it logs nothing. It is then never "the rank that never
    reached init_structured_logger". `steps_seen`: (source, attempt) → the most
    steps any of its processes began.

    Example:
        >>> flag_missing_that_ran([{"source": "training", "attempt": 0, "world_size": 4, "ranks": [3]}], {("training", 0): 1})[0]["ran_with_others"]
        False
    """
    return [
        {**m, "ran_with_others": steps_seen.get((m["source"], m["attempt"]), 0) >= 2}
        for m in missing
    ]


def name_suspects(
    places: Sequence[RankPlace], processes: Sequence[Any], missing: Sequence[dict[str, Any]] = ()
) -> tuple[list[Suspect], list[str]]:
    """The Hang section's rules alone (the module docstring's list): the processes the evidence
    names, and the notes; shared by `summarize` and `watch`.

    `places`: where each stopped process is (`RankPlace`, with its
    flight-recorder digest in ``fr`` where it has one); `processes`: every
    process of the run's current attempt (anything with ``source`` and
    ``attempt``: a rank closed, or not placed, makes the step comparison of
    its world refuse, as it could be what the others wait for); `missing`: as
    `flag_missing_that_ran` returns. `watch` builds its places from the records
    read so far, so it names the culprit `summarize` names from the same records.
    """
    return _suspects(list(places), processes, missing)


def stall_history(
    processes: Sequence[Any], facts: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Stalls that progress ended, per process in order: history, not hangs (`format_history` prints
    them)."""
    out = []
    for process in processes:
        for past in (facts.get(process.label) or {}).get("history") or []:
            out.append(
                {"label": process.label, "rank": process.rank, "source": process.source, **past}
            )
    return out


def _headline(
    places: list[RankPlace], processes: Sequence[Any], missing: Sequence[dict[str, Any]]
) -> str:
    """One vocabulary with the summary's headline (its states), then where the evidence came
    from."""
    states = Counter(p.status.split(",")[0] for p in places)
    boxes = sum(1 for p in places if p.evidence.startswith(("black box", "faulthandler")))
    missing_count = sum(len(m["ranks"]) for m in missing)
    parts = ([f"{missing_count} missing (no file)"] if missing_count else []) + [
        f"{n} {state}" for state, n in states.most_common()
    ]
    text = (
        f"{len(places) + missing_count} of {len(processes) + missing_count} processes did not "
        "finish: " + ", ".join(parts)
    )
    if places:
        text += f"; black box from {boxes} of {len(places)}"
        if not boxes:
            text += " (still running, or killed before a stall was detected: places from the records only)"
    return text


def _shown_collective(fr: dict[str, Any] | None) -> dict[str, Any] | None:
    """The collective to show for a process: one it waits in (the latest such), else its latest;
    over all groups."""
    if not fr:
        return None
    best = None
    for group in fr["groups"].values():
        last = group.get("last")
        if last is None:
            continue
        shown = {
            "pg": group["name"] if group["name"] is not None else group["pg_id"],
            "pg_id": group["pg_id"],
            "ranks": list(group["ranks"]) if group.get("ranks") else None,
            **last,
        }
        waiting = last.get("state") != "completed"
        rank = (waiting, group["name"] != DEFAULT_GROUP)
        if best is None or rank > best[0]:
            best = (rank, shown)
    for group in fr["groups"].values():
        for op in group.get("p2p", []):
            if op["state"] != "completed" and op["op"] in ("send", "recv"):
                ranks = group.get("ranks")
                peer = (
                    ranks[op["peer"]]
                    if ranks and type(op["peer"]) is int and 0 <= op["peer"] < len(ranks)
                    else None
                )
                name = (
                    f"{op['op']} {'from' if op['op'] == 'recv' else 'to'} rank {peer}"
                    if peer is not None
                    else op["op"]
                )
                shown = {
                    "pg": group["name"] if group["name"] is not None else group["pg_id"],
                    "pg_id": group["pg_id"],
                    "ranks": list(ranks) if ranks else None,
                    "seq": op["seq"],
                    "op": name,
                    "state": op["state"],
                    "p2p": True,
                }
                best = ((True, True), shown)
    return best[1] if best else None


def _key(place: RankPlace) -> tuple[Any, ...]:
    c = place.collective or {}
    return (
        place.source,
        place.span,
        place.between_spans,
        place.where,
        c.get("pg"),
        c.get("seq"),
        c.get("op"),
        c.get("state"),
    )


def _groups(places: list[RankPlace], suspect_labels: set[str]) -> list[HangGroup]:
    by_key: dict[tuple[Any, ...], list[RankPlace]] = {}
    for place in places:
        by_key.setdefault(_key(place), []).append(place)
    # Suspects' groups first among equals: the culprit is never listed below its victims for want of
    # size.
    ordered = sorted(
        by_key.values(), key=lambda g: (-len(g), not any(m.label in suspect_labels for m in g))
    )
    out = []
    for members in ordered:
        first = members[0]
        role = (
            "suspect"
            if any(m.label in suspect_labels for m in members)
            else ("victims" if suspect_labels else "other")
        )
        out.append(
            HangGroup(
                count=len(members),
                ranks=sorted(m.rank for m in members if m.rank is not None),
                labels=[m.label for m in members],
                span=first.span,
                where=first.where,
                collective=first.collective,
                role=role,
                between_spans=first.between_spans,
                step=first.step,
            )
        )
    return out


class _Verdicts:
    """Suspects in the order found (missing first), one per process, with the first rule that named
    it."""

    def __init__(self) -> None:
        self.by_label: dict[str, Suspect] = {}
        self.notes: list[str] = []

    def add(self, place: RankPlace, why: str, rule: str) -> None:
        if place.label not in self.by_label:
            self.by_label[place.label] = Suspect(
                place.source, place.rank, place.label, place.where, place.span, why, rule
            )

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _suspects(
    places: list[RankPlace], processes: Sequence[Any], missing: Sequence[dict[str, Any]]
) -> tuple[list[Suspect], list[str]]:
    verdicts = _Verdicts()
    missing_suspects = []
    for m in missing:
        if m.get("ran_with_others"):
            verdicts.note(
                f"{m['source']}: {_named(m['ranks'])} of world_size {m['world_size']} wrote no "
                "file here but took part in the steps (the others began later steps with them): "
                "their logs are elsewhere or they log nothing; the ranks here are not compared "
                "without them"
            )
            continue
        for rank in m["ranks"]:
            missing_suspects.append(
                Suspect(
                    m["source"],
                    rank,
                    f"{m['source']} rank {rank}",
                    None,
                    None,
                    "no file: never reached init_structured_logger (world_size "
                    f"{m['world_size']}), or its logs are not in this folder",
                    "missing",
                )
            )
    waiting = _collectives(places, verdicts)
    # A crash explains what follows it (the survivors wait, fail in their collective, are
    # terminated), unless the flight recorders of stuck ranks already named one behind in a group (a
    # crash after a hang began is its consequence).
    if not verdicts.by_label:
        _failed_first(places, verdicts)
    if not verdicts.by_label:
        _crashed(places, verdicts)
    if not verdicts.by_label:
        _step_progress(places, processes, missing, waiting, verdicts)
    for place in places:
        if place.status == "hung before first record":
            verdicts.add(place, "logged nothing since its file was created", "nothing logged")
    # Not with ranks missing, even ones that ran: the odd one out may be waiting for one of them (in
    # a sub-group).
    if not verdicts.by_label and not missing:
        _odd_ones_out(places, verdicts)
    if (
        not verdicts.by_label
        and not missing
        and len(processes) == 1
        and places
        and places[0].stuck
        and places[0].evidence != "records only"
    ):
        place = places[0]
        verdicts.add(
            place,
            "the only process, stuck "
            f"{'between spans' if place.between_spans else 'in span ' + str(place.span)}",
            "alone",
        )
    named = sorted(
        verdicts.by_label.values(),
        key=lambda s: (s.rank is None, s.rank if s.rank is not None else 0, s.label),
    )
    return missing_suspects + named, verdicts.notes


def _label(group: dict[str, Any]) -> str:
    return group_label(group["name"], group["pg_id"], group.get("ranks"), compress)


def _collectives(places: list[RankPlace], verdicts: _Verdicts) -> set[tuple[str, Any, int]]:
    """The flight-recorder rules: per group by identity, who is behind, who desynced, who never
    sent.

    Returns the ranks that wait in a collective or send/recv of some group (`_waits_somewhere`).
    """
    by_rank, tables = _group_tables(places)
    waits_somewhere = _waits_somewhere(places)
    for (source, attempt, _name), table in tables.items():
        members = table["members"] or tuple(sorted(table["ranks"]))
        label = _label({**table["any"], "ranks": table["members"]})
        known, unknown = _recorders_of(source, attempt, members, table, by_rank)
        _behind_in_group(source, attempt, label, known, unknown, by_rank, waits_somewhere, verdicts)
        _desync(source, attempt, label, known, by_rank, verdicts)
        _p2p(
            source,
            attempt,
            members if table["members"] else None,
            label,
            known,
            by_rank,
            waits_somewhere,
            verdicts,
        )
    return waits_somewhere


def _group_tables(
    places: list[RankPlace],
) -> tuple[dict[tuple[str, Any, int], RankPlace], dict[tuple[str, Any, Any], dict[str, Any]]]:
    """Each ranked place by (source, attempt, rank); and per process group by identity (source,
    attempt, torch's group name), its members (``None`` until a digest lists them), each rank's
    digest of it, and ``any`` one of them (for its label)."""
    by_rank: dict[tuple[str, Any, int], RankPlace] = {}
    tables: dict[tuple[str, Any, Any], dict[str, Any]] = {}
    for place in places:
        if place.rank is None:
            continue
        by_rank[(place.source, place.attempt, place.rank)] = place
        if place.fr:
            _add_to_tables(tables, place)
    return by_rank, tables


def _add_to_tables(tables: dict[tuple[str, Any, Any], dict[str, Any]], place: RankPlace) -> None:
    """Add one rank's digest of each of its groups to `tables` (`_group_tables`)."""
    for group in place.fr["groups"].values():  # type: ignore[index]  # the caller's `if place.fr`
        if group["name"] is None:
            continue  # an older black box: a sub-group whose identity is unknown is never compared
        table = tables.setdefault(
            (place.source, place.attempt, group["name"]),
            {"members": None, "ranks": {}, "any": group},
        )
        if group.get("ranks"):
            table["members"] = tuple(group["ranks"])
        table["ranks"][place.rank] = group


def _waits_somewhere(places: list[RankPlace]) -> set[tuple[str, Any, int]]:
    """(source, attempt, rank) of the ranks whose flight recorder shows them waiting in a collective
    or a send/recv of some group.

    A rank that waits in a collective or a send/recv of some group is held there by someone else:
    behind elsewhere because of it (a tensor-parallel peer of the culprit waits in their sub-group,
    so it never reaches the default group's all_reduce): a victim, never "behind".
    """
    return {
        (place.source, place.attempt, place.rank)
        for place in places
        if place.fr
        and place.rank is not None
        and any(_group_waits(g) for g in place.fr["groups"].values())
    }


def _group_waits(group: dict[str, Any]) -> bool:
    """Whether a rank's digest of a group shows it waiting there: its last collective not completed,
    or a send/recv in flight."""
    return bool(
        (group.get("last") and group["last"].get("state") != "completed")
        or any(o["state"] != "completed" for o in group.get("p2p", []))
    )


def _recorders_of(
    source: str,
    attempt: Any,
    members: tuple[int, ...],
    table: dict[str, Any],
    by_rank: dict[tuple[str, Any, int], RankPlace],
) -> tuple[dict[int, dict[str, Any] | None], list[int]]:
    """Per member of a group, its digest of the group (``known``), and the members whose part is not
    known (no recorder, or a part of it).

    A member whose whole recorder is here and has no digest of the group is
    known to have called none of its collectives (None).
    """
    known: dict[int, dict[str, Any] | None] = {}
    unknown: list[int] = []
    for rank in members:
        place = by_rank.get((source, attempt, rank))
        group = table["ranks"].get(rank)
        if place is None or not place.fr:
            unknown.append(rank)
        elif group is not None:
            known[rank] = group
        elif place.fr["complete"]:
            known[rank] = (
                None  # its whole recorder is here: it never called a collective of this group
            )
        else:
            unknown.append(rank)
    return known, unknown


def _behind_in_group(
    source: str,
    attempt: Any,
    label: str,
    known: dict[int, dict[str, Any] | None],
    unknown: list[int],
    by_rank: dict[tuple[str, Any, int], RankPlace],
    waits_somewhere: set[tuple[str, Any, int]],
    verdicts: _Verdicts,
) -> None:
    """Members wait in collective seq S while a member's last is below S: it never entered it.

    Only for what stuck members wait in (a live snapshot is no evidence); with
    no member behind, one that could not write its recorder (`_no_collective_on_record`).
    """
    lasts = {rank: (g["last"] if g else None) for rank, g in known.items()}
    seqs = {rank: (last["seq"] if last else 0) for rank, last in lasts.items()}
    if not seqs:
        return
    top = max(seqs.values())
    waiting = _waiting_in(lasts, top)
    held = [by_rank[(source, attempt, r)] for r in waiting if by_rank[(source, attempt, r)].stuck]
    if waiting and not held:
        verdicts.note(
            f"{label}: {_named(waiting)} in seq {top} but none stuck on the evidence (a snapshot "
            "of a live run, or killed mid-step): no one is named"
        )
    if not held:
        return
    op = Counter(lasts[r]["op"] for r in waiting).most_common(1)[0][0]  # type: ignore[index]  # the waiting have a last
    behind = [
        r
        for r, seq in seqs.items()
        if seq < top and _may_be_behind(by_rank[(source, attempt, r)], waits_somewhere, held)
    ]
    for rank in behind:
        verdicts.add(
            by_rank[(source, attempt, rank)],
            f"behind in {label}: never entered seq {top} {op}, which "
            f"{_count(len(waiting), 'wait')} in ({_its_last(lasts[rank])})",
            "behind",
        )
    if not behind and not any(seq < top for seq in seqs.values()):
        _no_collective_on_record(
            source, attempt, label, f"seq {top} {op}", len(waiting), unknown, by_rank, verdicts
        )


def _waiting_in(lasts: dict[int, dict[str, Any] | None], top: int) -> list[int]:
    """The members whose last collective of the group is seq `top` (the highest), not completed:
    they wait in it."""
    return [
        r
        for r, last in lasts.items()
        if last and last["seq"] == top and last.get("state") != "completed"
    ]


def _may_be_behind(
    place: RankPlace, waits_somewhere: set[tuple[str, Any, int]], held: list[RankPlace]
) -> bool:
    """Whether a member below the top seq may be named behind: not waiting in some group itself
    (`_waits_somewhere`), and `_held_back`."""
    return (place.source, place.attempt, place.rank) not in waits_somewhere and _held_back(
        place, held
    )


def _its_last(last: dict[str, Any] | None) -> str:
    """A rank's last collective in a group, in words, for why it is behind there."""
    return (
        f"its last there: seq {last['seq']} {last['op']}, {last['state']}"
        if last
        else "it has no collective of this group on record"
    )


def _no_collective_on_record(
    source: str,
    attempt: Any,
    label: str,
    awaited: str,
    waiting: int,
    unknown: list[int],
    by_rank: dict[tuple[str, Any, int], RankPlace],
    verdicts: _Verdicts,
) -> None:
    """No member behind, all at the top: a stuck member with no recorder part, for its faulthandler
    dump (interpreter lock held), is the one.

    `awaited`: ``seq S op``, what `waiting` members wait in. Otherwise a note
    says who is not known.
    """
    for rank in unknown:
        place = by_rank.get((source, attempt, rank))
        if place is not None and place.stuck and place.evidence.startswith("faulthandler"):
            verdicts.add(
                place,
                f"the others wait in {awaited} ({label}); it has no collective on record "
                f"({place.evidence})",
                "no collective",
            )
    if unknown and not any(
        by_rank.get((source, attempt, r)) is not None
        and by_rank[(source, attempt, r)].label in verdicts.by_label
        for r in unknown
    ):
        verdicts.note(
            f"{label}: {_count(waiting, 'wait')} in {awaited}; cannot tell who is behind: no "
            f"flight recorder from {_named(unknown)}"
        )


def _signature(entry: tuple[Any, Any, Any]) -> tuple[Any, ...]:
    op, sizes, dtypes = entry
    return (op, sizes, dtypes) if op in COMPARED_SIZES else (op,)


def _desync(
    source: str,
    attempt: Any,
    label: str,
    known: dict[int, dict[str, Any] | None],
    by_rank: dict[tuple[str, Any, int], RankPlace],
    verdicts: _Verdicts,
) -> None:
    """Members at one sequence number in different ops (or sizes, dtypes): torch's fr_trace calls it
    a mismatch."""
    at: dict[int, dict[int, tuple[Any, ...]]] = {}
    for rank, group in known.items():
        for seq, entry in (group or {}).get("recent", {}).items():
            at.setdefault(seq, {})[rank] = _signature(entry)
    for seq in sorted(at):
        calls = at[seq]
        if len(calls) < 2 or len(set(calls.values())) < 2:
            continue
        counts = Counter(calls.values())
        ((common, n),) = counts.most_common(1)
        described = "; ".join(
            f"rank{'s' if c > 1 else ''} {compress([r for r, s in calls.items() if s == sig])}: "
            f"{_describe(sig)}"
            for sig, c in counts.most_common()
        )
        majority = [
            by_rank[(source, attempt, r)]
            for r, sig in calls.items()
            if sig == common and by_rank[(source, attempt, r)].stuck
        ]
        if n > len(calls) / 2 and n >= 2 and majority:
            for rank, sig in calls.items():
                if sig != common and _held_back(by_rank[(source, attempt, rank)], majority):
                    verdicts.add(
                        by_rank[(source, attempt, rank)],
                        f"desync in {label} seq {seq}: called {_describe(sig)} while "
                        f"{plural(n, 'rank')} called {_describe(common)}",
                        "desync",
                    )
        else:
            verdicts.note(
                f"desync in {label} seq {seq} ({described}): no majority, cannot tell which side "
                "is wrong"
            )
        return


def _describe(sig: tuple[Any, ...]) -> str:
    """``all_reduce [[16]] Float``: the op, its input sizes and dtypes as torch's flight recorder
    gives them."""
    if len(sig) == 1:
        return str(sig[0])
    op, sizes, dtypes = sig
    parts = [str(op)]
    if sizes is not None:
        parts.append(str(_plain(sizes)).replace(" ", ""))
    if dtypes:
        parts.append(",".join(map(str, dtypes)) if isinstance(dtypes, tuple) else str(dtypes))
    return " ".join(parts)


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def _p2p(
    source: str,
    attempt: Any,
    members: tuple[int, ...] | None,
    label: str,
    known: dict[int, dict[str, Any] | None],
    by_rank: dict[tuple[str, Any, int], RankPlace],
    waits_somewhere: set[tuple[str, Any, int]],
    verdicts: _Verdicts,
) -> None:
    """A rank waiting in a recv (send) whose peer has no send to (recv from) it in flight: the peer
    is the one, unless it waits itself (`_waits_somewhere`) for a third (a pipeline's stages: each
    waits in its receive from the next, back to the one stuck in its own work)."""
    if members is None:
        return
    local = {rank: index for index, rank in enumerate(members)}
    for rank, group in known.items():
        for op in (group or {}).get("p2p", []):
            if not _in_flight_with_member(op, members):
                continue
            waiter = by_rank[(source, attempt, rank)]
            if not waiter.stuck:
                continue  # a send/recv in flight in a live snapshot is no evidence
            peer = members[op["peer"]]
            if (source, attempt, peer) in waits_somewhere and not _waits_for(
                known.get(peer), local[rank]
            ):
                continue  # held there by another: its own wait names who
            _unmatched_peer(waiter, op, peer, local, label, known, by_rank, verdicts)


def _waits_for(group: dict[str, Any] | None, local_rank: int) -> bool:
    """Whether a rank's digest of a group has a send or recv in flight with `local_rank` (two ranks
    that both send first: each waits for the other, both are named)."""
    return any(
        o["state"] != "completed" and o["peer"] == local_rank for o in (group or {}).get("p2p", [])
    )


def _in_flight_with_member(op: dict[str, Any], members: tuple[int, ...]) -> bool:
    """Whether `op` is a send or recv not completed, with a peer that is a member of the group (its
    local rank there)."""
    return (
        op["state"] != "completed"
        and op["op"] in ("send", "recv")
        and type(op["peer"]) is int
        and 0 <= op["peer"] < len(members)
    )


def _unmatched_peer(
    waiter: RankPlace,
    op: dict[str, Any],
    peer: int,
    local: dict[int, int],
    label: str,
    known: dict[int, dict[str, Any] | None],
    by_rank: dict[tuple[str, Any, int], RankPlace],
    verdicts: _Verdicts,
) -> None:
    """Name `peer` (a global rank) when it has no op in flight matching the stuck `waiter`'s `op`:
    it never sent (posted the receive).

    Without the peer's flight recorder, a note says so. `local`: global rank → its rank in the
    group.
    """
    rank = waiter.rank
    if rank is None:
        return  # a process with no rank has no place in a group's send/recv
    wanted = "send" if op["op"] == "recv" else "recv"
    peer_place = by_rank.get((waiter.source, waiter.attempt, peer))
    if peer not in known or peer_place is None:
        verdicts.note(
            f"rank {rank} waits in {op['op']} {'from' if op['op'] == 'recv' else 'to'} rank "
            f"{peer} ({label}); cannot tell more: no flight recorder from rank {peer}"
        )
        return
    pending = [
        o
        for o in (known[peer] or {}).get("p2p", [])
        if o["op"] == wanted and o["peer"] == local[rank] and o["state"] != "completed"
    ]
    if not pending and _held_back(peer_place, [waiter]):
        what = "never sent what" if wanted == "send" else "never posted the receive for what"
        verdicts.add(
            peer_place,
            f"{what} rank {rank} waits to {op['op']} ({label}, p2p seq {op['seq']}): it has no "
            f"{wanted} {'to' if wanted == 'send' else 'from'} rank {rank} in flight",
            "p2p",
        )


def _failed_first(places: list[RankPlace], verdicts: _Verdicts) -> None:
    """Per source and attempt, the processes that failed first (`model.ending.failed_first`): the
    others stopped after them, their victims.

    NCCL fails no collective when a peer dies: the others wait until the
    timeout, then the launcher terminates them; gloo fails their collective at
    once. Either way the rank that crashed (or was killed) first is the one.
    """
    for members in _runs(places).values():
        failed_at: dict[Hashable, int | None] = {p.label: p.failed_us for p in members}
        clocks: dict[Hashable, tuple[str | None, float]] = {p.label: p.clock for p in members}
        culprits, victims, _ = failed_first(
            failed_at,
            {
                place.label
                for place in members
                if failed_because_of_a_peer(getattr(place, "crash", None))
            },
            clocks,
        )
        # what the crashes waited for went quiet before the first of them, whatever its cause
        first = min((p.failed_us for p in members if p.failed_us is not None), default=None)
        if first is not None and _crashes_waited_for(members, first, verdicts):
            continue
        _name_failed_first(
            members, culprits, victims, verdicts, order_unknown(culprits, failed_at, clocks)
        )


def _crashes_waited_for(members: list[RankPlace], first: int, verdicts: _Verdicts) -> bool:
    """Whether the crashes of one run waited for others (`model.ending.held_back_by`: a collective
    that timed out), who are then named.

    They are the one, the crashed are their victims.
    """
    ends = [
        End(
            p.label,
            closed=False,
            last_us=p.last_event_us,
            step=p.step,
            entered=p.entered,
            crash=p.crash,
            wrote=p.status != "hung before first record",
        )
        for p in members
    ]
    held = held_back_by(ends, first)
    if not held:
        return False
    crashed = [p for p in members if p.failed_us is not None]
    span, step = (crashed[0].crash or {}).get("span"), (crashed[0].crash or {}).get("step")
    for place in members:
        if place.label in held:
            verdicts.add(
                place,
                f"behind in the step: {plural(len(crashed), 'other process')} crashed after its "
                f"last record, in {span or 'a span'} at step {step}, "
                f"which it never reached: they waited for it ({crashed[0].failure})",
                "behind in step",
            )
    return True


def _name_failed_first(
    members: list[RankPlace],
    culprits: Collection[Hashable],
    victims: Collection[Hashable],
    verdicts: _Verdicts,
    unordered: str = "",
) -> None:
    """Name the processes of one run that failed first, with their error and the victims that
    stopped after them; `unordered` (`model.ending.order_unknown`): why several may each have been
    first."""
    ranks = [place.rank for place in members if place.label in victims and place.rank is not None]
    who = _named(ranks) if len(ranks) == len(victims) else plural(len(victims), "other process")
    after = (
        f"; {who} stopped after it ({'its victim' if len(victims) == 1 else 'its victims'})"
        if victims
        else ""
    )
    first = f"one of the first to fail ({unordered})" if unordered else "failed first"
    for place in members:
        if place.label in culprits:
            verdicts.add(place, f"{first}: {place.failure}{after}", "crashed")


def _crashed(places: list[RankPlace], verdicts: _Verdicts) -> None:
    """Files that end mid-line while every other process received a terminating signal: they died
    first, the launcher stopped the rest.

    Not when the others were not signalled: a SIGKILL of the whole job tears whichever files were
    being written.
    """
    crashed = [p for p in places if p.status == "crashed"]
    others = [p for p in places if p.status != "crashed"]
    if crashed and others and all(p.status.startswith("terminated") for p in others):
        for place in crashed:
            verdicts.add(
                place,
                "crashed: its file ends mid-line (killed or died while writing) while the "
                f"{plural(len(others), 'other')} {'was' if len(others) == 1 else 'were'} then "
                "terminated by a signal",
                "crashed",
            )


def _held_back(place: RankPlace, waiting: Sequence[RankPlace]) -> bool:
    """Whether `place` may be named for what the stuck `waiting` wait on: stuck itself, quiet since
    before they were last seen alive waiting (their stall records, their heartbeats), or crawling.

    Crawling: still writing after the others' watchdogs fired, but in no later
    step than theirs. The callers name only a rank that got less far than the
    ones waiting (an earlier step, fewer spans entered, a lower collective
    sequence number), so a rank that keeps writing from inside its ``bwd``
    while they wait in the step's all-reduce is slow, not done: its slowness
    is what they wait for. One that wrote from a later step moved on, and is
    not named on this evidence.
    """
    if place.stuck:
        return True
    times = [w.alive_us for w in waiting if w.stuck and w.alive_us is not None]
    if not times or place.last_event_us is None:
        return False
    if place.last_event_us <= min(times):
        return True
    steps = [w.step for w in waiting if w.stuck and w.step is not None]
    return place.step is not None and bool(steps) and place.step <= min(steps)


def _progress(place: RankPlace) -> tuple[int, frozenset[str]] | None:
    return None if place.step is None else (place.step, frozenset(place.entered))


def _before(a: RankPlace, b: RankPlace) -> bool:
    """Whether `a` got strictly less far than `b` in the run: an earlier step, or the same step with
    a strict subset of b's spans entered."""
    pa, pb = _progress(a), _progress(b)
    if pa is None or pb is None:
        return False
    if pa[0] != pb[0]:
        return pa[0] < pb[0]
    return a.entered_complete and pa[1] < pb[1]


#: How long the others may wait for one rank in a span only it runs (rank 0's checkpoint, eval)
#: before it is a hang (s): `watch`'s ``--pause-after`` default
#: (`watch.detect.Rules.shared_pause_s`) and `summarize`'s (`_pauses`).
PAUSE_ALLOWANCE_S = 300.0
#: Rules a pause does not excuse: what never completes (a desync), a crash, a rank with no file or
#: no record.
_NOT_PAUSES = ("desync", "crashed", "missing", "nothing logged", "alone")


def _pauses(
    suspects: list[Suspect],
    places: list[RankPlace],
    processes: Sequence[Any],
    notes: list[str],
    allowance_s: float = PAUSE_ALLOWANCE_S,
) -> list[Suspect]:
    """``if rank == 0: save(); dist.barrier()``: a suspect in its own work (`own_work`) while every
    other rank of its world waits (in a collective, or between spans) is a pause, not a hang, until
    it has been there `allowance_s`; the same rule as `watch`'s.

    Its time there: how long its innermost open span had been open at its file's last record.
    """
    if not suspects or any(s.rule in _NOT_PAUSES for s in suspects):
        return suspects
    by_label = {p.label: p for p in places}
    process_of = {getattr(p, "label", None): p for p in processes}
    kept, paused = [], []
    for suspect in suspects:
        pause = _pause(
            suspect, by_label.get(suspect.label), process_of.get(suspect.label), places, allowance_s
        )
        if pause is None:
            kept.append(suspect)
        else:
            paused.append(pause)
    notes.extend(paused)
    return kept


def _pause(
    suspect: Suspect,
    place: RankPlace | None,
    process: Any,
    places: list[RankPlace],
    allowance_s: float,
) -> str | None:
    """The note that says `suspect` is in a pause (`_pauses`), or None when it is not: it is then
    named."""
    others = [
        q
        for q in places
        if place is not None
        and q is not place
        and (q.source, q.attempt) == (place.source, place.attempt)
    ]
    if (
        place is None
        or process is None
        or not others
        or place.span is None
        or place.between_spans
        or not place.seen
    ):
        return None
    if not waited_for_in_own_work(place, others):
        return None
    open_s = _open_for(process, place.span)
    if open_s is None or open_s >= allowance_s:
        return None
    return (
        f"a pause, not a hang: {suspect.label} in {place.span}, a span only it runs, for "
        f"{open_s:,.0f} s; "
        f"{plural(len(others), 'rank')} wait for it (a hang after {allowance_s:,.0f} s)"
    )


def waited_for_in_own_work(place: RankPlace, others: Sequence[RankPlace]) -> bool:
    """Whether `place` is in its own work (`own_work`) and the `others` of its world wait for it:
    `summarize`'s pause and `watch`'s (`watch.detect.Detector._need` gives it ``--pause-after``),
    one rule.

    The others wait for it: between spans (an unspanned barrier), or all in one span it has not
    reached this step. Only once each of them has finished a step (`_finished_a_step`): before,
    the spans they never ran are not yet what their steps run (a pipeline's last stage, waiting in
    its first receive, has not run the ``fwd`` the first stage is stuck in).
    """
    waits = {q.span for q in others if not (q.between_spans or q.span is None)}
    return (
        all(_finished_a_step(q) for q in others)
        and own_work(place.span, ([*(q.seen or ()), *q.entered] for q in others))
        and len(waits) <= 1
        and not (waits & {place.span, *place.entered})
    )


def _finished_a_step(place: RankPlace) -> bool:
    """Whether `place` finished a step: it began a second one, or it is between spans after its
    first (True when its steps are not known)."""
    begun = place.steps_begun
    return begun is None or begun >= 2 or (begun == 1 and (place.between_spans or not place.span))


def _open_for(process: Any, span: str) -> float | None:
    """How long `process`'s innermost open span named `span` had been open at its file's last record
    (s), or None."""
    inner = next((o for o in reversed(process.open_spans) if o.name == span), None)
    return inner.open_s if inner is not None else None


def own_work(span: str | None, others_seen: Iterable[Collection[str]]) -> bool:
    """Whether `span` is one process's own work: no other process of its world was ever seen in it
    (rank 0's checkpoint, eval, logging).

    ``if rank == 0: save(); dist.barrier()``: the others wait for rank 0's
    ``checkpoint``, a span they never run. That is a pause, not a hang, and
    they are not "behind" for never entering it (`_step_progress`); `watch`
    gives such a span the patience of a pause (`watch.detect.Rules.shared_pause_s`).

    Example:
        >>> own_work("checkpoint", [{"data_fetch", "all_reduce"}, {"data_fetch", "all_reduce", "barrier"}]), own_work("all_reduce", [{"all_reduce"}])
        (True, False)
    """
    return span is not None and not any(span in seen for seen in others_seen)


def _waits_for_own_work(
    place: RankPlace, leaders: list[tuple[RankPlace, int]], own_size: int, across: bool = False
) -> bool:
    """Whether every rank `place` is "before" is in its own work: spans `place` never ran
    (`own_work`), in the same step or in the next one begun with them alone (``if rank == 0: save();
    dist.barrier()`` at a step's start: its records say the next step, the others' not yet).

    Spans a rank never ran are its own work only if it could have: the leaders are fewer (the many
    wait for the few), or `place` has finished every span they ever finished (in a first step, the
    spans `place` has not reached yet are not another's own).
    """
    if not place.seen or not leaders:
        return False
    for leader, count in leaders:
        if leader.step == place.step:
            missed = set(leader.entered) - set(place.entered)
        elif (
            leader.step is not None
            and place.step is not None
            and leader.step == place.step + 1
            and leader.entered_complete
        ):
            missed = set(leader.entered)
        else:
            return False
        if not missed or any(name in place.seen for name in missed):
            return False
        if across:
            # Different programs (pipeline stages) never run the same spans: the spans another
            # stage entered are its program, not work of its own that one stuck in its own span
            # waits for. One between spans (an untraced barrier: rank 0's checkpoint at a step's
            # start) waits for it, once it finished a step of its own.
            if place.span or not _finished_a_step(place):
                return False
        elif count >= own_size and not (leader.seen or frozenset()) <= place.seen:
            return False
    return True


def _step_progress(
    places: list[RankPlace],
    processes: Sequence[Any],
    missing: Sequence[dict[str, Any]],
    waiting: set[tuple[str, Any, int]],
    verdicts: _Verdicts,
) -> None:
    """No flight-recorder verdict: among the stuck ranks of one source and attempt, the least
    advanced are behind the others.

    Only when every rank of that world is here and stuck: a rank with no file, or one that closed,
    can be what the least advanced waits for (in a sub-group's collective), so it would be blamed
    wrongly. A rank the flight recorder shows waiting in a collective or send/recv is never
    "behind".
    """
    absent = {(m["source"], m["attempt"]) for m in missing}
    counts = Counter((p.source, p.attempt) for p in processes)
    for key, members in _runs(p for p in places if p.rank is not None).items():
        if len(members) < 2 or not any(m.stuck for m in members):
            continue
        if key in absent or len(members) < counts[key]:
            verdicts.note(
                f"{key[0]}: not every rank is here (missing, or closed): how far each got in the "
                "step is not compared"
            )
            continue
        _behind_in_run(key[0], members, waiting, verdicts, _run_programs_differ(members))


def _run_programs_differ(members: Sequence[RankPlace]) -> bool:
    """`model.ending.programs_differ` over the spans each place entered in its last step, or over
    the spans each was seen to run in its whole file (`RankPlace.seen_whole`: a tail may have cut
    a span another's holds)."""
    return programs_differ(p.entered for p in members) or programs_differ(
        p.seen for p in members if p.seen is not None and p.seen_whole
    )


def _runs(places: Iterable[RankPlace]) -> dict[tuple[str, Any], list[RankPlace]]:
    """The places per run (source, attempt), in the order first seen: the ranks that wait for one
    another."""
    by_run: dict[tuple[str, Any], list[RankPlace]] = {}
    for place in places:
        by_run.setdefault((place.source, place.attempt), []).append(place)
    return by_run


def _progress_class(place: RankPlace) -> tuple[Any, ...]:
    """How far a rank got, as `_before` compares it: its step, the spans it entered there, whether
    the step's start was read."""
    return (place.step, frozenset(place.entered), place.entered_complete)


def _behind_in_run(
    source: str,
    members: list[RankPlace],
    waiting: set[tuple[str, Any, int]],
    verdicts: _Verdicts,
    programs_differ: bool = False,
) -> None:
    """In one run whose every rank is here: the least advanced ranks are behind, when the most
    advanced are all stuck (they wait for them).

    Where the ranks run different programs (`_run_programs_differ`: a pipeline's stages), only
    ranks that got less far than every other: of two that got least far in different spans (the
    stage stuck in its ``fwd``, the next waiting in its receive), each may wait for the other, and
    a stage waiting in its receive got less far than its own stage's peers, never than the stage it
    waits for.
    """
    classes = _progress_classes(members)
    reps = [group[0] for group in classes.values()]
    size = {id(group[0]): len(group) for group in classes.values()}
    ahead = [b for b in reps if not any(_before(b, c) for c in reps)]
    leaders = [m for b in ahead for m in classes[_progress_class(b)]]
    if not all(m.stuck for m in leaders):
        verdicts.note(
            f"{source}: the most advanced ranks are not all stuck on the evidence (no stall "
            "record or heartbeat): how far each got is not compared"
        )
        return
    lowest = _lowest(reps, ahead)
    if programs_differ:
        # across programs only one behind every other rank: a stage waiting in its receive got less
        # far than its own stage's peers, never less far than the stage it waits for
        lowest = [a for a in lowest if all(_before(a, c) for c in reps if c is not a)]
        if not lowest:
            verdicts.note(
                f"{source}: the ranks run different programs (pipeline stages: each entered spans "
                "another did not) and none got less far than every other: how far each got is not "
                "compared; the flight recorder's send/recv on every rank would tell who the others "
                "wait for"
            )
            return
    behind = _least_advanced(classes, lowest, leaders, waiting)
    behind = _not_waiting_for_own_work(
        source, behind, ahead, classes, size, verdicts, programs_differ
    )
    for place in behind:
        verdicts.add(place, _behind_in_step(place, ahead, classes, size), "behind in step")


def _progress_classes(members: list[RankPlace]) -> dict[tuple[Any, ...], list[RankPlace]]:
    """The ranks per distinct progress (`_progress_class`), in the order first seen.

    Compared per distinct progress (a few kinds at 1,000 ranks), not per pair of ranks.
    """
    classes: dict[tuple[Any, ...], list[RankPlace]] = {}
    for m in members:
        classes.setdefault(_progress_class(m), []).append(m)
    return classes


def _lowest(reps: list[RankPlace], ahead: list[RankPlace]) -> list[RankPlace]:
    """The lowest classes (their representatives, `reps`): before one `ahead`, after none."""
    return [
        a
        for a in reps
        if any(_before(a, b) for b in ahead) and not any(_before(c, a) for c in reps)
    ]


def _least_advanced(
    classes: dict[tuple[Any, ...], list[RankPlace]],
    lowest: list[RankPlace],
    leaders: list[RankPlace],
    waiting: set[tuple[str, Any, int]],
) -> list[RankPlace]:
    """The ranks of the `lowest` classes (`_lowest`) that may be named for the stuck `leaders`'
    wait (`_held_back`).

    Not one the flight recorder shows waiting in a collective or send/recv
    (`waiting`): someone else holds it there.
    """
    return [
        m
        for a in lowest
        for m in classes[_progress_class(a)]
        if (m.source, m.attempt, m.rank) not in waiting and _held_back(m, leaders)
    ]


def _not_waiting_for_own_work(
    source: str,
    behind: list[RankPlace],
    ahead: list[RankPlace],
    classes: dict[tuple[Any, ...], list[RankPlace]],
    size: dict[int, int],
    verdicts: _Verdicts,
    across: bool = False,
) -> list[RankPlace]:
    """`behind` less the ranks that only wait for others' own work (`_waits_for_own_work`), which a
    note names.

    Rank 0's checkpoint: the many never entered a span only the few run, and never do. They wait for
    it; not behind.
    """
    excused = [
        m
        for m in behind
        if _waits_for_own_work(
            m,
            [(b, size[id(b)]) for b in ahead if _before(m, b)],
            len(classes[_progress_class(m)]),
            across,
        )
    ]
    if not excused:
        return behind
    verdicts.note(
        f"{source}: {_named([m.rank for m in excused if m.rank is not None])} wait for work of "
        "the others' own, in spans they never run "
        f"({', '.join(_own_work_spans(ahead, excused))}): not behind"
    )
    return [m for m in behind if all(m is not e for e in excused)]


def _own_work_spans(ahead: list[RankPlace], excused: list[RankPlace]) -> list[str]:
    """The spans the ranks ahead entered that the `excused` never ran nor entered: the others' own
    work they wait for, sorted."""
    return sorted(
        {n for b in ahead for n in b.entered if not any(n in (m.seen or ()) for m in excused)}
        - {n for m in excused for n in m.entered}
    )


def _behind_in_step(
    place: RankPlace,
    ahead: list[RankPlace],
    classes: dict[tuple[Any, ...], list[RankPlace]],
    size: dict[int, int],
) -> str:
    """Why a rank is behind in the step: where it is, what it never entered, and how many wait where
    (after the most advanced, largest class ahead of it)."""
    leader = max(
        (b for b in ahead if _before(place, b)), key=lambda b: (len(b.entered), size[id(b)])
    )
    inside = f"in {leader.span}" if leader.span else "between spans"
    waits = [m for b in ahead if _before(place, b) for m in classes[_progress_class(b)]]
    missed = (
        [name for name in leader.entered if name not in place.entered]
        if leader.step == place.step
        else []
    )
    never = (
        f"never entered {', '.join(missed)} of step {leader.step}"
        if missed
        else f"never reached step {leader.step}"
    )
    return f"behind in the step: {_at_in_step(place)}; {never}, where {plural(len(waits), 'other rank')} {'is' if len(waits) == 1 else 'are'} ({inside})"


def _at_in_step(place: RankPlace) -> str:
    """Where a rank behind in the step is: between spans (after which span), in a span, or after its
    last record (no record says where)."""
    if place.between_spans:
        last = place.last_span or {}
        return f"between spans at step {place.step}" + (
            f" (after {last.get('name')}, ended {last.get('ended_s_ago')} s before its black box)"
            if last.get("name")
            else ""
        )
    if place.span:
        return f"in {place.span} at step {place.step}"
    return f"after its last record at step {place.step} ({place.evidence}: dead, or stuck where no record says)"


def _odd_ones_out(places: list[RankPlace], verdicts: _Verdicts) -> None:
    """Without anything else: the stuck processes outside a strict majority's (span, frame) (at
    least 3 stuck)."""
    stuck = [p for p in places if p.stuck]
    if len(stuck) < 3 or not _one_program_or_one_odd(places, stuck):
        return
    counts = Counter((p.span, p.where) for p in stuck)
    ((common, n),) = counts.most_common(1)
    if n >= 2 and n > len(stuck) / 2 and any(common):
        where = " at ".join(
            part
            for part in (f"in {common[0]}" if common[0] else "between spans", common[1])
            if part
        )
        for place in stuck:
            if (place.span, place.where) != common:
                verdicts.add(place, f"elsewhere than the {n} others ({where})", "odd one out")


def _one_program_or_one_odd(places: list[RankPlace], stuck: list[RankPlace]) -> bool:
    """Whether the odd ones out may be named: every run runs one program, or its ranks stopped in
    spans of different branches (`model.ending.programs_differ` on their last steps) with nothing
    that shows a pipeline (a send/recv on any flight recorder), every process stuck, and one alone
    elsewhere.

    A pipeline's stages stop in different places by design: the one stuck in its own work, and one
    waiting in its receive per other stage, are all elsewhere than the many in the data-parallel
    all-reduce; and where the stuck stage shows no evidence of being stuck (a call holding the
    interpreter lock), the one waiting for it would be alone elsewhere.
    """
    if not any(programs_differ(p.entered for p in run) for run in _runs(places).values()):
        return True
    if len(stuck) < len(places) or any(
        g.get("p2p") for p in places if p.fr for g in p.fr["groups"].values()
    ):
        return False
    counts = Counter((p.span, p.where) for p in stuck)
    return len(stuck) - counts.most_common(1)[0][1] == 1


def _named(ranks: Sequence[int]) -> str:
    """``rank 3`` or ``ranks 1,3-5``: the ranks with their noun, singular for one."""
    return f"rank{'s' if len(set(ranks)) != 1 else ''} {compress(list(ranks))}"


def _count(count: int, verb: str) -> str:
    """``1 rank waits`` or ``3 ranks wait``: a count of ranks and the verb agreeing with it."""
    return f"{plural(count, 'rank')} {verb}{'s' if count == 1 else ''}"


def _ranks(ranks: Sequence[int]) -> str:
    text = compress(list(ranks))
    return text if len(text) <= 60 else text[:57] + "..."


def _collective(c: dict[str, Any] | None) -> str:
    if not c:
        return ""
    pg = c.get("pg")
    group = (
        group_label(pg, c.get("pg_id"), tuple(c["ranks"]) if c.get("ranks") else None, compress)
        if pg is not None
        else f"pg id {c.get('pg_id')}"
    )
    return f"{c.get('op')} ({group}, {'p2p seq' if c.get('p2p') else 'seq'} {c.get('seq')}, {c.get('state')})"


def format_hang(report: HangReport | None) -> list[str]:
    """The Hang section as text lines (empty when there was no hang); printed before everything
    else."""
    if report is None:
        return []
    place_by_label = {p.label: p for p in report.places}
    lines = [f"Hang: {report.headline}"]
    lines += [_missing_line(m) for m in report.missing]
    lines += [_group_line(group) for group in report.groups[:GROUPS_SHOWN]]
    if len(report.groups) > GROUPS_SHOWN:
        lines.append(f"   … {len(report.groups) - GROUPS_SHOWN} more groups (--json)")
    lines += _suspect_lines(report, place_by_label)
    lines += [f"  note: {note}" for note in _shown_notes(report)[:3]]
    lines += _thread_lines(report.suspects[:2], place_by_label)
    lines += format_history(report.history)
    lines.append("")
    return lines


def _missing_line(m: dict[str, Any]) -> str:
    """One line per missing entry: marked ▶ as a suspect unless it took part in the steps (its logs
    are elsewhere)."""
    mark, why = (
        (" ", "no file here, took part in the steps")
        if m.get("ran_with_others")
        else ("▶", "no file")
    )
    return f" {mark} {len(m['ranks'])} × {m['source']} rank{'s' if len(m['ranks']) != 1 else ''} {_ranks(m['ranks'])}: missing: {why} (world_size {m['world_size']})"


def _group_line(group: HangGroup) -> str:
    """One line per group of processes in the same place: ▶ for the suspects' group, ``(victims)``
    for the others once a suspect is named."""
    who = (
        f"rank{'s' if len(group.ranks) != 1 else ''} {_ranks(group.ranks)}"
        if group.ranks
        else ", ".join(group.labels[:3])
    )
    mark = "▶" if group.role == "suspect" else " "
    return (
        f" {mark} {group.count} × {who}: {'; '.join(_group_where(group)) or 'no location recorded'}"
        + ("   (victims)" if group.role == "victims" else "")
    )


def _group_where(group: HangGroup) -> list[str]:
    """Where a group is, most telling first: its collective, its span (or between spans), its main
    thread's frame."""
    where = [_in_collective(group)] if group.collective else []
    if group.between_spans:
        where.append(
            f"between spans at step {group.step}" if group.step is not None else "between spans"
        )
    elif group.span:
        where.append(f"span {group.span}")
    if group.where:
        where.append(f"main thread at {group.where}")
    return where


def _in_collective(group: HangGroup) -> str:
    """A group's collective: the one it waits in, or, completed, the last it ran."""
    if (group.collective or {}).get("state") == "completed":
        return f"last collective {_collective(group.collective)}"
    return f"{'waits' if group.count == 1 else 'wait'} in {_collective(group.collective)}"


def _suspect_lines(report: HangReport, place_by_label: dict[str, RankPlace]) -> list[str]:
    """The suspects, the first `SUSPECTS_SHOWN` (all in --json); or "cannot tell", with the first
    note saying why."""
    if not report.suspects:
        return [
            "Suspects: cannot tell"
            + (
                f": {report.notes[0]}"
                if report.notes
                else ": every stuck process is in the same place and no record shows one behind"
            )
        ]
    lines = ["Suspects:"] + [
        _suspect_line(suspect, place_by_label.get(suspect.label))
        for suspect in report.suspects[:SUSPECTS_SHOWN]
    ]
    if len(report.suspects) > SUSPECTS_SHOWN:
        lines.append(f"  … {len(report.suspects) - SUSPECTS_SHOWN} more (--json)")
    return lines


def _suspect_line(suspect: Suspect, place: RankPlace | None) -> str:
    """One suspect: its rank, its frame, its span (or between spans at which step), and why it is
    named."""
    rank = f"rank {suspect.rank}" if suspect.rank is not None else suspect.label
    at = suspect.where or ("no stack" if suspect.rule == "missing" else "frame unknown")
    inside = (
        f" in span {suspect.span}"
        if suspect.span
        else (
            f" between spans at step {place.step}"
            if place is not None and place.between_spans
            else ""
        )
    )
    return f"  {rank} ({suspect.source}): {at}{inside}: {suspect.why}"


def _shown_notes(report: HangReport) -> list[str]:
    """The notes printed after the suspects: each desync when a suspect is named; else those after
    the first (the "cannot tell" line's)."""
    return (
        [n for n in report.notes if n.startswith("desync")] if report.suspects else report.notes[1:]
    )


def _thread_lines(suspects: Sequence[Suspect], place_by_label: dict[str, RankPlace]) -> list[str]:
    """Every thread of each of `suspects` with more than one: what its other threads (a data loader,
    a checkpoint writer) were doing."""
    lines = []
    for suspect in suspects:
        place = place_by_label.get(suspect.label)
        if place and len(place.threads) > 1:
            lines.append(
                f"  threads of {suspect.label}: "
                + "; ".join(f"{name}: {where}" for name, where in place.threads[:4])
            )
    return lines


def format_history(history: Sequence[dict[str, Any]], shown: int = 3) -> list[str]:
    """Stalls that progress ended: history, not a hang (one line each, the first `shown`)."""
    if not history:
        return []
    lines = [f"Stalls that ended (the process resumed: history, not a hang): {len(history)}"]
    for past in history[:shown]:
        lines.append(
            f"  {past['label']}: no span ended for {past.get('stalled_s')} s"
            + (f" in {past['span']}" if past.get("span") else "")
            + (f" at step {past['step']}" if past.get("step") is not None else "")
            + f", then resumed ({past.get('reason')} record)"
        )
    if len(history) > shown:
        lines.append(f"  … {len(history) - shown} more (--json)")
    return lines


def bases_of(processes: Iterable[Any]) -> dict[str, str]:
    """label → base JSONL path of each `ProcessLog`."""
    return {p.label: p.base for p in processes}
