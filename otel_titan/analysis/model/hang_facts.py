"""What the Hang section needs from one process's records, gathered during the summary's single
pass.

Why a separate tracker: the summary's collector (`model.collect._Collector`) feeds
it from the timeline's callbacks, and it keeps, per process, a few fields:

* the latest *live* black box: a ``stall`` record not followed by progress
  (any later record of the program: a span start or end, an instant, a
  scalar). One followed by progress is *history*: the process resumed, so it
  is kept apart (at most `HISTORY_KEPT`) and never shown as where it hangs;
* the spans it entered in its last step (ended or still open; what the
  others entered that it did not is the evidence against a rank stuck
  between spans), and whether that step's start was read (a file tail may
  begin mid-step).
* when it last made progress (a span began or ended, a step began, an
  exception), and whether a record written a heartbeat interval after it, with
  spans still open, shows it alive and stopped: what a heartbeat says (a rank
  crawling in a hang, one Ctrl-C or SIGTERM found stuck).

File order decides "later", never timestamps.
"""

from __future__ import annotations

from typing import Any

from otel_titan.analysis.model.hang import HEARTBEAT_S, digest_black_box
from otel_titan.schema import Field

__all__ = ["HangTracker", "HISTORY_KEPT", "ENTERED_KEPT", "HEARTBEAT_S", "HEARTBEAT_S_MAX"]

#: Past stalls kept per process (the writer writes at most 8 black boxes per run).
HISTORY_KEPT = 8
#: Span names kept per step (distinct, in the order first started).
ENTERED_KEPT = 64
#: Black-box reasons that describe a stall; a ``signal`` or ``trigger`` dump of a live process
#: followed by progress is simply dropped.
_STALLS = ("stall",)
#: The longest interval an opening record is believed for: a forged one (the files are a team's)
#: must not hide a stuck process.
HEARTBEAT_S_MAX = 300.0


def heartbeat_interval(opened: dict[str, Any]) -> float | None:
    """The heartbeat interval (s) an opening record says, at most `HEARTBEAT_S_MAX`; None where it
    says none (or 0: heartbeats off).

    >>> heartbeat_interval({"heartbeat_interval_s": 10.0}), heartbeat_interval({}), heartbeat_interval({"heartbeat_interval_s": 1e9})
    (10.0, None, 300.0)
    """
    interval = opened.get(Field.HEARTBEAT_INTERVAL_S)
    if not isinstance(interval, (int, float)) or isinstance(interval, bool) or not interval > 0:
        return None
    return min(float(interval), HEARTBEAT_S_MAX)


class HangTracker:
    """One process at a time: `begin`, then the callbacks in file order, then `end` → its facts."""

    def __init__(self) -> None:
        self.facts: dict[str, dict[str, Any]] = {}
        self.begin("", partial=False)

    def begin(self, label: str, partial: bool, world_size: int | None = None) -> None:
        """A new process; `partial`: its records are a file's tail (its first step may be cut)."""
        self.label = label
        self.world_size = world_size
        self.box: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []
        self.step: int | None = None
        self.entered: list[str] = []
        self.entered_set: set[str] = set()
        self.complete = True
        self.partial = partial
        self.steps_seen = 0
        # Evidence that it stopped making progress while alive: a stall record, or a heartbeat (10 s
        # of quiet with spans open), since its last program record. A process killed mid-step has
        # neither.
        self.stalled = False
        self.quiet = False
        # Spans Ctrl-C ended are the process's last records so far (`_Collector.interrupted`): still
        # where it is.
        self.interrupted = False
        # When it last made progress (µs, own clock; -1: not seen, as in a tail), and its writer's
        # heartbeat interval (`alive_after`).
        self.progress_us = -1
        self.heartbeat_s = HEARTBEAT_S

    def opened(self, record: dict[str, Any]) -> None:
        """Its opening record: the heartbeat interval it says."""
        self.heartbeat_s = heartbeat_interval(record) or HEARTBEAT_S

    def stall(self, record: dict[str, Any]) -> None:
        """A black-box record: the live one now (a newer one replaces it: no progress came
        between)."""
        if record.get("reason") in _STALLS:
            self.stalled = True
        try:
            self.box = digest_black_box(record)
        except Exception:  # noqa: BLE001 - a malformed black box (hand-edited, another writer): the records still place the process
            self.box = None

    def heartbeat(self) -> None:
        """The logger's heartbeat: quiet with spans open for its interval."""
        self.quiet = True

    def progress(self) -> None:
        """A program record after the black box: the stall ended (called for nearly every record:
        the usual case returns at once)."""
        self.interrupted = False
        box = self.box
        if box is None:
            if self.stalled or self.quiet:
                self.stalled = self.quiet = False
            return
        self.stalled = self.quiet = False
        self.box = None
        if box.get("reason") in _STALLS and len(self.history) < HISTORY_KEPT:
            self.history.append(
                {
                    "time_us": box.get("time_us"),
                    "stalled_s": box.get("stalled_s"),
                    "span": box.get("span"),
                    "step": box.get("step"),
                    "reason": box.get("reason"),
                    "between_spans": box.get("between_spans"),
                }
            )

    def step_begun(self, step: int, begin_us: int | None = None) -> None:
        self.step, self.entered, self.entered_set = step, [], set()
        if begin_us is not None and begin_us > self.progress_us:
            self.progress_us = begin_us
        self.complete = not (self.partial and self.steps_seen == 0)
        self.steps_seen += 1

    def span_begun(self, span: Any) -> None:
        """A span began (`timeline.OpenSpan`): progress, and the end of a stall."""
        if span.start_us > self.progress_us:
            self.progress_us = span.start_us
        if self.box is not None or self.stalled or self.quiet or self.interrupted:
            self.progress()

    def alive_after(self, last_us: int | None, spans_open: bool, signal_us: int | None) -> None:
        """At its end: what its heartbeat would say, said by another record written a heartbeat
        interval after its last progress.

        With spans open, a record of any kind (a program's instant: a rank crawling in a hang;
        Ctrl-C's unwinding; a signal's black box); between spans, where no heartbeat is written, a
        signal it received (torchrun's agent stopping a hung job). Either way it was alive and
        stopped, not killed mid-step: a healthy job stopped from outside is stopped within a step of
        its last progress.
        """
        if self.progress_us < 0:
            return
        after_us = 1e6 * self.heartbeat_s
        if (spans_open and last_us is not None and last_us - self.progress_us >= after_us) or (
            signal_us is not None and signal_us - self.progress_us >= after_us
        ):
            self.quiet = True

    def progress_at(self, *_: Any) -> None:
        """`progress` with the timeline's callback arguments (a span start, an instant, a scalar),
        bound straight to them."""
        if self.box is not None or self.stalled or self.quiet or self.interrupted:
            self.progress()

    def entered_span(self, name: str, step: Any) -> None:
        """A span that started in `step` ended, or is still open at the end: the step's spans, in
        the order they ended."""
        if step == self.step and name not in self.entered_set and len(self.entered) < ENTERED_KEPT:
            self.entered.append(name)
            self.entered_set.add(name)

    def end(self, seen: list[str] | None = None) -> None:
        """Its facts; `seen`: the names of the spans it was ever seen to finish (what it does: rank
        0's checkpoint is not the others')."""
        self.facts[self.label] = {
            "box": self.box,
            "history": self.history,
            "step": self.step,
            "entered": self.entered,
            "entered_complete": self.complete,
            "stalled": self.stalled,
            "quiet": self.quiet,
            "world_size": self.world_size,
            "steps_seen": self.steps_seen,
            "seen": seen,
            # a tail's spans are not all the process ran (`model.hang._run_programs_differ`)
            "seen_whole": not self.partial,
        }
