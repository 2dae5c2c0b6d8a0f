"""How a process ended, from what it wrote: the rules `summarize`, `report` and `watch` share.

Why one place: the most common end of a training process is an exception
nothing caught (a CUDA out-of-memory, a NCCL error raised by the next call),
and its survivors then wait, fail in their collective, or are terminated by
the launcher. Told apart here, once:

* an ``uncaught_exception`` record (``fatal``: the main thread's) makes the
  process **crashed**, whatever follows it (the exit hook still writes the
  closing record); one of type ``KeyboardInterrupt`` makes it **interrupted**
  (Ctrl-C: the operator, not the program, ended it);
* a process with no closing, signal or crash record, stopped *behind* peers
  that then failed in a span it never reached (an exception in their
  collective, or all of them terminated after its last record), is
  **crashed** too: killed without a word (SIGKILL, the kernel's OOM killer, a
  node agent) or dead before it could write;
* of the processes of one source and attempt that failed, the one that
  failed **first** is the culprit (`failed_first`): those that stopped,
  failed or were terminated after it are its victims, never culprits;
* unless the crashes waited for a process still stuck before them (a
  collective that timed out: `held_back_by`): that one is the culprit; not
  where the processes run different programs (`programs_differ`: a
  pipeline's stages), whose progress is not comparable;
* failures on two hosts closer together than the hosts' clocks can be told
  apart (a host no clock fit holds for: `model.clocks`) are in no known
  order: each may have been first (`order_unknown` says why).

Everything here takes plain values (times in µs, step numbers, span names),
so that `summarize`'s `ProcessSummary` and `watch`'s `ProcessState` ask the
same functions.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from otel_titan.analysis.model.frames import parse_frames, program_frame
from otel_titan.schema import Field, MetaEvent

__all__ = [
    "UNCAUGHT",
    "INTERRUPT",
    "crash_of",
    "is_interrupt",
    "crash_state",
    "describe_crash",
    "End",
    "kill_evidence",
    "killed_silently",
    "killed_crash",
    "PEER_FAILURE",
    "failed_because_of_a_peer",
    "failed_first",
    "order_unknown",
    "held_back_by",
    "programs_differ",
]

#: The record that says so (`schema.MetaEvent.UNCAUGHT_EXCEPTION`).
UNCAUGHT = MetaEvent.UNCAUGHT_EXCEPTION
#: The exception Ctrl-C raises: an interruption, not a crash.
INTERRUPT = "KeyboardInterrupt"
#: Characters of an exception's message shown in a line (the whole message is in ``--json``).
MESSAGE_SHOWN = 120


def crash_of(record: dict[str, Any]) -> dict[str, Any]:
    """The facts of an ``uncaught_exception`` record: type, message, the program's line, step, time,
    whether it ended the program.

    ``span`` is None here: the reader fills it in from the ``_error`` records
    the exception left as it unwound the spans (the innermost one).

    Example:
        >>> crash = crash_of({"time_us": 5, "step": 8, "error_type": "RuntimeError", "error_message": "CUDA out of memory",
        ...                   "error_frames": ["/venv/lib/python3.11/site-packages/torch/x.py:3:f", "train.py:88:fwd_bwd"], "fatal": True})
        >>> crash["type"], crash["file"], crash["line"], crash["function"], crash["step"], crash["fatal"]
        ('RuntimeError', 'train.py', 88, 'fwd_bwd', 8, True)
    """
    frame = program_frame(parse_frames(record.get(Field.ERROR_FRAMES))) or {}
    error_type, message, step = (
        record.get(Field.ERROR_TYPE),
        record.get(Field.ERROR_MESSAGE),
        record.get(Field.STEP),
    )
    return {
        "type": error_type if isinstance(error_type, str) and error_type else "exception",
        "message": message if isinstance(message, str) else "",
        "file": frame.get("file"),
        "line": frame.get("line"),
        "function": frame.get("function"),
        "span": None,
        "step": step if type(step) is int else None,
        "time_us": record.get(Field.TIME_US),
        "fatal": record.get(Field.FATAL) is not False,
    }


def is_interrupt(crash: dict[str, Any] | None) -> bool:
    """Whether the exception that ended the process was Ctrl-C's (``KeyboardInterrupt``)."""
    return crash is not None and str(crash.get("type", "")).rsplit(".", 1)[-1] == INTERRUPT


def crash_state(crash: dict[str, Any]) -> str:
    """``interrupted`` for Ctrl-C, else ``crashed``: the state an uncaught exception gives its
    process."""
    return "interrupted" if is_interrupt(crash) else "crashed"


def describe_crash(crash: dict[str, Any], *, step: bool = True) -> str:
    """``RuntimeError: CUDA out of memory … at train.py:88 in fwd_bwd, inside span fwd_bwd, step
    8``: one line, the message cut.

    Example:
        >>> describe_crash({"type": "RuntimeError", "message": "CUDA out of memory. Tried to allocate 2.00 GiB", "file": "/job/train.py", "line": 88,
        ...                 "function": "oom", "span": "fwd_bwd", "step": 8})
        'RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB at train.py:88 in oom, inside span fwd_bwd, step 8'
        >>> describe_crash({"type": "killed", "message": "", "why": "no closing record", "step": 3}, step=False)
        'killed (no closing record)'
    """
    if crash.get("type") == "killed":
        text = f"killed ({crash.get('why')})" if crash.get("why") else "killed"
    else:
        message = " ".join(str(crash.get("message") or "").split())
        if len(message) > MESSAGE_SHOWN:
            message = message[: MESSAGE_SHOWN - 1] + "…"
        text = f"{crash.get('type')}: {message}" if message else str(crash.get("type"))
        if crash.get("file"):
            text += f" at {os.path.basename(str(crash['file']))}:{crash.get('line')}" + (
                f" in {crash['function']}" if crash.get("function") else ""
            )
    if crash.get("span"):
        text += f", inside span {crash['span']}"
    if step and crash.get("step") is not None:
        text += f", step {crash['step']}"
    return text


@dataclass
class End:
    """What one process's records say of its end, for the rules below (from a `ProcessSummary` or a
    watched `ProcessState`).

    `last_us`: its last record of any kind for `kill_evidence` (on the aligned clock where there is
    one), its last program record for `held_back_by`; `step` and `entered`: its last step and the
    spans it started there; `crash`: its fatal `crash_of` facts (with ``span``), or None;
    `signal_us`: when it recorded a terminating signal, or None.
    """

    key: Hashable
    closed: bool
    last_us: int | None
    step: int | None
    entered: Sequence[str] = ()
    crash: dict[str, Any] | None = None
    signal_us: int | None = None
    #: Any record of its own after its file was created (a process that logged nothing is
    #: `hang_suspect`'s, not this).
    wrote: bool = True

    @property
    def failed_us(self) -> int | None:
        """When it crashed (not interrupted): its uncaught exception's time (a silent kill's: its
        last record)."""
        crash = self.crash
        if crash is None or is_interrupt(crash) or type(crash.get("time_us")) is not int:
            return None
        return crash["time_us"]

    @property
    def silent_end(self) -> bool:
        """No closing, signal or crash record: its end is unknown from its own records."""
        return not self.closed and self.signal_us is None and self.crash is None


def _never_reached(end: End, peer: End) -> bool:
    """Whether `peer` failed where `end` never got: a later step, the same step's span it had not
    started, or, failing between spans (a collective with no span of its own), after spans of that
    step it had not started.

    Example:
        >>> dead = End("r1", closed=False, last_us=100, step=1, entered=["data_fetch", "fwd_bwd", "fwd"])
        >>> _never_reached(dead, End("r0", closed=True, last_us=300, step=1, entered=["data_fetch", "fwd_bwd", "fwd", "bwd"],
        ...                          crash={"type": "RuntimeError", "time_us": 200, "step": 1, "span": None}))
        True
        >>> _never_reached(dead, End("r0", closed=True, last_us=300, step=1, entered=["data_fetch", "fwd_bwd"], crash={"type": "RuntimeError", "time_us": 200, "step": 1}))
        False
    """
    crash = peer.crash or {}
    if end.step is None or crash.get("step") is None:
        return False
    if crash["step"] != end.step:
        return crash["step"] > end.step
    if crash.get("span") is not None:
        return crash["span"] not in end.entered
    return peer.step == end.step and bool(set(peer.entered) - set(end.entered))


def kill_evidence(end: End, peers: Sequence[End], differ: bool | None = None) -> str | None:
    """Why a process with no end on record was killed (SIGKILL, the OOM killer) before peers that
    then failed because of it; None when it was not.

    Its own records say nothing (no closing, signal or crash record); its
    peers (the other processes of its source and attempt) say it: after its
    last record, peers crashed in a span it never reached (their collective,
    failing because it was gone), or every other process was terminated by
    a signal (the launcher stopping the rest once a worker died; not a
    whole job stopped at once: it would have been signalled too). A peer
    that crashed where it was too is no evidence (it may have failed first).
    Where the processes run different programs (`programs_differ`; `differ`
    when the caller judged it once for all of `peers`), a span one never
    reached says nothing: the peers' errors must say a peer went away.

    Example:
        >>> dead = End("r1", closed=False, last_us=100, step=8, entered=["fwd_bwd"])
        >>> peer = End("r0", closed=True, last_us=300, step=8, crash={"type": "RuntimeError", "time_us": 200, "step": 8, "span": "all_reduce"})
        >>> kill_evidence(dead, [peer])
        'its peers failed after its last record, in what it never reached'
        >>> kill_evidence(dead, [End("r0", closed=True, last_us=300, step=8, crash={"type": "RuntimeError", "time_us": 200, "step": 8, "span": "fwd_bwd"})])
    """
    if not end.silent_end or not end.wrote or end.last_us is None:
        return None
    others = [p for p in peers if p.key != end.key]
    crashed_after = [p for p in others if p.failed_us is not None and p.failed_us > end.last_us]
    # A pipeline's stages never reach one another's spans: there only an error that says a peer
    # went away (`failed_because_of_a_peer`) speaks of this one.
    if crashed_after and differ is None:
        differ = programs_differ(e.entered for e in (end, *others))
    comparable = not differ
    if (
        crashed_after
        and all(
            _never_reached(end, p) if comparable else failed_because_of_a_peer(p.crash)
            for p in crashed_after
        )
        and not any(p.failed_us is not None and p.failed_us <= end.last_us for p in others)
    ):
        return "its peers failed after its last record, in what it never reached"
    if others and all(p.signal_us is not None and p.signal_us > end.last_us for p in others):
        return "the others were terminated by a signal after its last record"
    return None


def killed_silently(end: End, peers: Sequence[End]) -> bool:
    """Whether `kill_evidence` holds: the process was killed without a word."""
    return kill_evidence(end, peers) is not None


def killed_crash(
    end: End, evidence: str, open_span: str | None = None, torn: bool = False
) -> dict[str, Any]:
    """The crash facts (`crash_of`'s shape, type ``killed``) of a process `kill_evidence` says was
    killed (`evidence`): at its last record.

    `torn`: its file ends mid-line (killed while it wrote), said first.
    """
    why = ("its file ends mid-line; " if torn else "") + f"no closing or signal record; {evidence}"
    return {
        "type": "killed",
        "message": "",
        "why": why,
        "file": None,
        "line": None,
        "function": None,
        "span": open_span,
        "step": end.step,
        "time_us": end.last_us,
        "fatal": True,
    }


#: What a rank's error says when a peer failed first: its collective's connection closed or reset
#: (gloo's ``Connection closed by peer``, the sockets of NCCL's ``ncclRemoteError``: "remote process
#: exited or there was a network error"), a broken pipe, a communicator aborted, a collective's
#: watchdog timeout. Such a crash is the consequence of another rank's failure.
PEER_FAILURE = re.compile(
    r"connection (?:closed|reset) by (?:remote )?peer|broken pipe|remote process exited"
    r"|ncclRemoteError|communicator (?:was )?aborted|watchdog caught collective operation timeout"
    r"|peer (?:closed|died|exited)",
    re.IGNORECASE,
)


def failed_because_of_a_peer(crash: dict[str, Any] | None) -> bool:
    """Whether `crash` (a `crash_of` record) says a peer failed first (`PEER_FAILURE`).

    Example:
        >>> failed_because_of_a_peer({"type": "RuntimeError", "message": "[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:41234"})
        True
        >>> failed_because_of_a_peer({"type": "OutOfMemoryError", "message": "CUDA out of memory. Tried to allocate 2.00 GiB"})
        False
    """
    if not crash:
        return False
    return PEER_FAILURE.search(f"{crash.get('type')}: {crash.get('message')}") is not None


def failed_first(
    failed_at: dict[Hashable, int | None],
    because_of_a_peer: Collection[Hashable] = (),
    clocks: Mapping[Hashable, tuple[str | None, float]] | None = None,
) -> tuple[list[Hashable], list[Hashable], int | None]:
    """(the processes that failed first, the others: their victims, when) among one source and
    attempt.

    `failed_at`: every process of it that did not close cleanly → when it
    failed itself (its crash's time, a silent kill's last record: `End.failed_us`),
    or None when it did not fail itself (it was terminated, is waiting, was
    interrupted). `because_of_a_peer`: those whose error says a peer failed
    first (`failed_because_of_a_peer`): where another failed of a cause of
    its own, they are its victims whatever their clocks say (gloo fails the
    peers' collective within milliseconds, as far apart as two hosts' clocks
    may be). `clocks`: per process, its host and how far its times may be
    off the aligned clock (µs, `model.clocks.ClockAlignment.error_us`): a
    process is first unless another failed before it by more than their two
    hosts' errors (on one host, one clock: any earlier time counts). Those
    that may have failed first are the culprits (all of them on a tie to the
    µs, or closer than their clocks tell); every other process there is a
    victim, whatever it did after (waited, failed in its collective, was
    terminated). ``([], [], None)`` when nothing failed.

    Example:
        >>> failed_first({"rank 1": 100, "rank 0": 250, "rank 2": None})
        (['rank 1'], ['rank 0', 'rank 2'], 100)
        >>> failed_first({"rank 1": 300, "rank 0": 250}, because_of_a_peer={"rank 0"})
        (['rank 1'], ['rank 0'], 300)
        >>> failed_first({"rank 1": 100, "rank 9": 900}, clocks={"rank 9": ("h7", 6000.0)})
        (['rank 1', 'rank 9'], [], 100)
    """
    times = {key: at for key, at in failed_at.items() if at is not None}
    if not times:
        return [], [], None
    own = {key: at for key, at in times.items() if key not in because_of_a_peer} or times
    clocks = clocks or {}

    def before(other: Hashable, key: Hashable) -> bool:
        """Whether `other` failed before `key` by more than their clocks can blur."""
        (host_o, error_o), (host_k, error_k) = (
            clocks.get(other, (None, 0.0)),
            clocks.get(key, (None, 0.0)),
        )
        margin = 0.0 if host_o == host_k else error_o + error_k
        return own[other] < own[key] - margin

    culprits = [key for key in own if not any(before(other, key) for other in own)]
    return culprits, [key for key in failed_at if key not in culprits], min(own.values())


def order_unknown(
    culprits: Sequence[Hashable],
    failed_at: Mapping[Hashable, int | None],
    clocks: Mapping[Hashable, tuple[str | None, float]] | None,
) -> str:
    """Why `failed_first` named several `culprits` that did not fail at the same µs: their hosts'
    clocks cannot order them (``which failed first cannot be told: …``); "" otherwise.

    Example:
        >>> order_unknown(["r1", "r9"], {"r1": 100, "r9": 900}, {"r9": ("h7", 6000.0)})
        'which failed first cannot be told: 0.80 ms apart, closer than the clock of h7 (±6.00 ms) can tell (no clock fit holds for it)'
        >>> order_unknown(["r1", "r2"], {"r1": 100, "r2": 100}, None)
        ''
    """
    times = [at for key in culprits if (at := failed_at.get(key)) is not None]
    if len(set(times)) < 2:
        return ""
    unsure = sorted(
        {
            clock
            for key in culprits
            if (clock := (clocks or {}).get(key)) is not None and clock[1] > 0 and clock[0]
        }
    )
    hosts = ", ".join(f"{host} (±{error / 1000:.2f} ms)" for host, error in unsure)
    spread = (max(times) - min(times)) / 1000
    return (
        f"which failed first cannot be told: {spread:.2f} ms apart, closer than the clock"
        f"{'s' if len(unsure) != 1 else ''} of {hosts or 'their hosts'} can tell (no clock fit "
        f"holds for {'it' if len(unsure) == 1 else 'them'})"
    )


def programs_differ(entered: Iterable[Collection[str]]) -> bool:
    """Whether the processes of one run run different programs: two of them each entered a span in
    its last step (`entered`) the other did not.

    A pipeline's stages do: the first fetches data and sends activations, the
    last receives them. How far each got in its step is then not comparable: a
    stage waiting in its receive never reached the ``fwd`` the stage before it
    is stuck in, and is its victim, not behind it. Ranks of one program stop
    at different points of the same sequence, each having entered a subset of
    the spans of the one that got furthest; a span only a few ranks run (rank
    0's checkpoint) keeps it so. The last step only, not every span a process
    was seen to run: a file's tail (``summarize --tail``) may have cut a span
    another's holds. Compared per distinct set (a few, at 1,000 ranks).

    Example:
        >>> programs_differ([{"data_fetch", "fwd", "send"}, {"recv", "fwd"}]), programs_differ([{"fwd", "checkpoint"}, {"fwd"}, {"fwd"}])
        (True, False)
    """
    kinds = {frozenset(spans) for spans in entered}
    return any(not (a <= b or b <= a) for a, b in itertools.combinations(kinds, 2))


def held_back_by(ends: Sequence[End], first_us: int) -> list[Hashable]:
    """The processes the crashes waited for: alive (or unknown), behind every process that crashed,
    quiet before the first crash.

    Why: a crash is not always first in cause. A collective that times out
    (gloo, NCCL's error handling) raises in the ranks that waited, while the
    rank they waited for is still stuck, alive, before the span they failed
    in. Such a rank (no crash, no closing record: terminated after, or still there; its last program
    record, `End.last_us` here, before `first_us`; never in the span of the
    step where each crashed peer failed) is the one; the crashed are then
    its victims. None where the processes run different programs
    (`programs_differ`): a pipeline stage that waits in its receive never
    reached the span its crashed neighbour failed in, and is its victim.

    Example:
        >>> stuck = End("r1", closed=False, last_us=100, step=8, entered=["data_fetch"])
        >>> timed_out = End("r0", closed=True, last_us=900, step=8, crash={"type": "RuntimeError", "time_us": 800, "step": 8, "span": "all_reduce"})
        >>> held_back_by([stuck, timed_out], 800)
        ['r1']
    """
    crashed = [e for e in ends if e.failed_us is not None]
    if not crashed or programs_differ(e.entered for e in ends):
        return []
    return [
        e.key
        for e in ends
        if e.crash is None
        and not e.closed
        and e.wrote
        and e.last_us is not None
        and e.last_us < first_us
        and all(_never_reached(e, c) for c in crashed)
    ]
