"""The live detector: records in, a frame and alerts out; a pure function of what was read and when.

`Detector.observe` feeds it the records one refresh brought (with the
watcher's time of reading); `Detector.evaluate(now)` says, from those alone,
what every process is doing and which alerts hold. Nothing here reads a file
or a clock, so a run can be replayed faster than real time (`replay`) and a
false alarm counted, and the live `watch` gives the same answers.

The rules (docs/watch.md says them for users):

* **hang** (per source): no process of the current attempt made progress
  (ended a span, began a step) for ``hang_after = max(hang_floor_s,
  hang_steps × median step time)``. The culprit is named by `summarize`'s
  rules (`model.hang.name_suspects`), on places built from the records read
  so far (`_place`: the innermost open span, or between spans; the step and
  the spans entered in it; the live black box's frame, its flight recorder's
  digest and, between spans, the step it set): a rank of ``world_size`` with
  no file (once the run is ``missing_grace_s`` old, and not when the others
  ran steps with it: its logs are elsewhere); per process group, compared by
  torch's group name and members (never ``pg_id``), a member that never
  entered the collective the others wait in, a desync, a peer that never
  sent; a rank behind in the step (an earlier step, or a strict subset of the
  spans the others entered: between spans, it never reached their
  collective); one with no record since init while the others wait in a
  collective; the odd ones out of a strict majority's place. Those waiting
  are the victims, never named. `watch` adds only *when*: a culprit in a span
  it has finished before must have been in it longer than ``3 ×`` its longest
  finished duration; in a span never seen to finish, at least
  ``unknown_span_s``; between spans, ``3 ×`` its longest gap between records.
  When the rules name nobody, after ``3 ×`` the shared span's learned duration
  (``shared_pause_s`` when never seen) the alert says the job is stuck there
  and that the culprit cannot be told from the records. Confirmed on a second
  evaluation, or at once by the culprit's black box. Where every process ran
  on this host and the follower found each gone from the process table
  (`ProcessState.alive_here`), the job was stopped, not stuck: nobody is
  named (rule ``gone``).
* **slow**: a rank (or a whole host, as one unit) that `summarize`'s
  straggler rule names over the last ``slow_window`` steps: the model's own
  function, the one `summarize` calls over the whole run
  (`model.stragglers.judge_phase` per phase, `judge_arrival` at the
  step-closing collective: `compare_ranks` / `stands_out`, the change
  windows, wait or work on each rank's own clock, the cost and "Look first
  at"), on the per-rank, per-phase step figures `StepFacts` hold. A finding
  raises when it is a ``straggler`` that reaches "Look first at"; the
  step-closing collective is the one every rank of the source leaves at one
  moment, by `summarize`'s rule (`_run_anchor`: `model.clocks.estimate_offsets`
  on the window's steps), never by its name. The clock is
  `watch`'s: raised once found on ``sustain_steps`` steps running, kept while
  its excess stays at least half the rule's bar. Peers: ranks with the same
  mesh coordinates but data parallel (`model.stragglers.peer_key`). Its cost:
  what every rank waits for it per step, in ms and % of the step, and seconds
  so far.
* **job_slow** (per source): every rank slower than the job's own past, by
  `summarize`'s rule (`model.job_speed.judge`: the last 20 steps' median
  step time, per token where logged, against the 32 before, with the phase
  that grew on most ranks). The clock is `watch`'s: raised once held
  ``sustain_steps`` steps running, then judged against the past it was
  raised on (its split) until the steps are fast again.
* **crashed** (a torn last line that stays, or stopped silent while the others
  were sent SIGTERM), **terminated** (SIGTERM received), **missing** (ranks of
  ``world_size`` with no file after ``missing_grace_s``).

Shared with `summarize` (``model/``): the hang rules (`model.hang.name_suspects`,
`place_in_step`, `flag_missing_that_ran`), the flight-recorder digest
(`model.hang.digest_black_box`, `model.flight_recorder`), the program's line
(`model.hang.program_line`), how a process ended (`model.ending`), the
straggler rule itself (`model.stragglers.judge_phase`, `judge_arrival`, peer
groups), the job's own slowdown (`model.job_speed`) and the step-closing moment (`model.clocks.estimate_offsets`),
the mesh (`read.records.read_mesh`), and the walk that pairs, nests and times
spans and finds the steps (`model.timeline.walk_process`, resumed batch by
batch: `state.ProcessState` is its visitor). The parameters that differ: the window
(`Rules.slow_window`, the last 40 steps, against the whole run) and the
clock (``sustain_steps``; hang after ``hang_after`` seconds). Still
`watch`'s own, because they judge records still arriving: *when* a stop is
a hang (the learned durations above) and the collective names (`state.is_collective`: only to tell a start-up, where
rank 0 logs while the others still build the model, from a hang on a rank
silent since init). The own-work pause is the model's rule
(`model.hang.waited_for_in_own_work`) with ``--pause-after``.
"""

from __future__ import annotations

import bisect
import dataclasses
import statistics
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_titan.analysis.model import job_speed
from otel_titan.analysis.model.clocks import ClockAlignment, ClosingSpans, estimate_offsets
from otel_titan.analysis.model.ending import (
    End,
    describe_crash,
    failed_because_of_a_peer,
    failed_first,
    held_back_by,
    is_interrupt,
    kill_evidence,
    killed_crash,
    order_unknown,
    programs_differ,
)
from otel_titan.analysis.model.facts import JobSlowdown
from otel_titan.analysis.model.hang import (
    PAUSE_ALLOWANCE_S,
    RankPlace,
    flag_missing_that_ran,
    name_suspects,
    place_in_step,
    seen_alive,
    stuck_reason,
    waited_for_in_own_work,
)
from otel_titan.analysis.model.headline import compress as compress_ranks
from otel_titan.analysis.model.stragglers import (
    MIN_MAJORITY,
    effect_bar,
    judge_arrival,
    judge_phase,
    peer_key,
)
from otel_titan.analysis.watch.alerts import Alert, AlertBook
from otel_titan.analysis.watch.state import WINDOW_STEPS, ProcessState, StepFacts, is_collective

__all__ = ["Detector", "Rules", "takes_over"]


@dataclass
class Rules:
    """The detector's thresholds (docs/watch.md); the defaults are those of the issue's targets."""

    hang_floor_s: float = 8.0
    hang_steps: float = 2.0
    unknown_span_s: float = 30.0
    shared_pause_s: float = PAUSE_ALLOWANCE_S
    stall_floor_s: float = 3.0
    confirm_evaluations: int = 2
    crash_after_s: float = 5.0
    missing_grace_s: float = 30.0
    #: The straggler rule's thresholds are `summarize`'s (`model.stragglers`), and so is the
    #: job-wide slowdown's (`model.job_speed`): one definition of "slow". The steps the median step
    #: time (the hang's patience) is taken over.
    window: int = 10
    #: The straggler rule's window: `summarize`'s rule (`model.stragglers.judge_phase`) over the
    #: last this many steps (at most `state.WINDOW_STEPS`, what each process keeps).
    slow_window: int = WINDOW_STEPS
    sustain_steps: int = 5


@dataclass
class _Suspect:
    key: tuple
    seen: int
    first: float


@dataclass
class _Verdict:
    """A hang's culprits and where they are (`Detector._culprits`); `rule` and `why`: the model's
    rule that named them, in its words."""

    ranks: list[int]
    where: str
    why: str
    rule: str
    since: float | None
    phase: str | None
    step: int | None
    line: str | None
    evidence: list[str]
    #: How long the culprits (or, nobody named, every process) had to be stopped for this to be a
    #: hang (s).
    need: float = 0.0


@dataclass
class _Held:
    since_step: int
    since_time: float
    excess_ms: float = 0.0
    raised: bool = False


_NO_RUN = object()


def takes_over(newer: list[ProcessState], watched: list[ProcessState]) -> bool:
    """Whether a later run replaces the watched one on the screen: it made progress (a record of the
    program, not only its opening), and it has as many processes as the watched run, or the watched
    run is over (every process closed, crashed or terminated). A run that never progressed, or a few
    strays beside a live job, never does."""
    if not any(not p.silent for p in newer):
        return False
    return len(newer) >= len(watched) or all(p.ended() is not None for p in watched)


class Detector:
    """Live processes → frame and alerts (see the module docstring).

    Example:
        >>> d = Detector()
        >>> _ = d.observe("a", {"label": "training rank 0", "source": "training", "rank": 0, "world_size": 1},
        ...               [{"log_type_name": "structured_logger_opened", "log_type": "instant", "time_us": 0}], arrival=0.0)
        >>> frame, events = d.evaluate(1.0)
        >>> frame["states"], events
        ({'running': 1}, [])
    """

    def __init__(self, rules: Rules | None = None) -> None:
        self.rules = rules or Rules()
        self.processes: dict[str, ProcessState] = {}
        self.book = AlertBook()
        self._suspects: dict[Any, _Suspect] = {}
        self._held: dict[tuple, _Held] = {}
        self._last_slow_step: dict[tuple, int] = {}
        self._slow_alerts: list[Alert] = []
        self._job_held_by: dict[Any, _Held | None] = {}
        self._job_steps_by: dict[Any, dict[int, tuple[float, Any, bool]]] = {}
        self._job_raised_by: dict[Any, JobSlowdown] = {}
        #: (source, attempt) → (the step it was found at, the step-closing moment: `_anchor_of`).
        self._anchors: dict[tuple, tuple[int, str | None]] = {}
        #: (source, attempt) → (its newest step when fitted, its clock fit: `_failure_clocks`).
        self._clocks: dict[tuple, tuple[int | None, ClockAlignment | None]] = {}
        self.first_arrival: float | None = None
        #: Set when a hang is first suspected: the caller asks the ranks for their black box
        #: (trigger file) once.
        self.want_black_box = False
        self._asked_for: dict[Any, tuple] = {}
        #: A hang suspected at the last evaluation and not confirmed yet (one line), else None.
        self.suspected: str | None = None
        #: Pauses at the last evaluation: one rank's own work the others wait for, not a hang yet
        #: (one line each).
        self.pauses: list[str] = []
        #: Processes killed without a word, judged from their peers
        #: (`model.ending.killed_silently`): key → crash facts.
        self.killed: dict[str, dict[str, Any]] = {}

    # -- input ---------------------------------------------------------------------------------
    def observe(
        self,
        key: str,
        identity: dict[str, Any],
        records: Iterable[dict[str, Any]],
        arrival: float,
        arrivals: Iterable[float] | None = None,
    ) -> ProcessState:
        """Apply the records of process `key` read at watcher time `arrival`; `identity`: label,
        source, rank, attempt, … (first seen).

        `arrivals`: one watcher time per record instead (what a first read found was written before
        `watch` started, each at its time).
        """
        process = self.processes.get(key)
        if process is None:
            process = self.processes[key] = ProcessState(
                key,
                **{  # type: ignore[arg-type]  # the follower's identity: label and source always set
                    k: identity.get(k)
                    for k in (
                        "label",
                        "source",
                        "rank",
                        "attempt",
                        "run_id",
                        "host",
                        "world_size",
                        "pid",
                    )
                },
            )
            process.first_arrival = arrival
            process.progress_arrival = arrival
        if arrivals is not None:
            arrivals = list(arrivals)
            if arrivals and (self.first_arrival is None or min(arrivals) < self.first_arrival):
                self.first_arrival = min(arrivals)
            process.apply_records(records, arrival, arrivals)
            return process
        if self.first_arrival is None:
            self.first_arrival = arrival
        process.apply_records(records, arrival)
        return process

    def file_facts(
        self, key: str, *, torn_since: float | None, gone: bool, alive: bool | None = None
    ) -> None:
        """What the follower knows of a process's file and its records do not say; `alive`: its
        process on this host's process table (`read.processes_here.alive_here`), None: not here."""
        process = self.processes.get(key)
        if process is not None:
            process.torn_since, process.gone, process.alive_here = torn_since, gone, alive

    # -- output --------------------------------------------------------------------------------
    def current(self) -> list[ProcessState]:
        """The processes of the run being watched (`watched_run`), and per source its latest
        attempt."""
        run = self.watched_run()
        if run is _NO_RUN:
            return []
        latest: dict[str, int] = {}
        for p in self.processes.values():
            if p.run_id == run:
                latest[p.source] = max(latest.get(p.source, -1), p.attempt or 0)
        return [
            p
            for p in self.processes.values()
            if p.run_id == run and (p.attempt or 0) == latest[p.source]
        ]

    def runs(self) -> dict[Any, list[ProcessState]]:
        """Every run id seen, with its processes, in the order the runs first arrived."""
        runs: dict[Any, list[ProcessState]] = {}
        # Files found already written arrive together (their modification times): then the run that
        # opened first comes first.
        for p in sorted(
            self.processes.values(), key=lambda p: (p.first_arrival or 0.0, p.opened_us or 0)
        ):
            runs.setdefault(p.run_id, []).append(p)
        return runs

    def watched_run(self) -> Any:
        """The run id being judged: the first run seen, replaced by a later one only when that one
        `takes_over`.

        Why not simply the newest: one process of another run (a test, a
        leftover with the endpoint or folder of this job) would take the
        screen and the verdicts with it, hide this job's real hang, and then
        raise "missing" for its own absent ranks (which ``--exit-on`` acts on).
        """
        watched: Any = _NO_RUN
        for run, members in self.runs().items():
            if watched is _NO_RUN or takes_over(members, self._members(watched)):
                watched = run
        return watched

    def _members(self, run: Any) -> list[ProcessState]:
        return [p for p in self.processes.values() if p.run_id == run]

    def earlier_attempts(self) -> list[ProcessState]:
        """The processes of the watched run's attempts before its latest, per source (a restart
        replaced them)."""
        current = {p.key for p in self.current()}
        run = next((p.run_id for p in self.processes.values() if p.key in current), None)
        return [p for p in self.processes.values() if p.run_id == run and p.key not in current]

    def evaluate(
        self, now: float, *, with_frame: bool = True
    ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """(the frame, the alert / resolved events) at watcher time `now`; `with_frame` False: no
        frame (None), the same events."""
        procs = self.current()
        step_ms = self._median_step_ms(procs)
        hang_after = self._hang_after(step_ms)
        ended = self._ended(procs, now)
        live = [p for p in procs if ended.get(p.key) is None]
        alerts = self._ended_alerts(procs, ended, now)
        alerts.extend(self._earlier_crashes(now))
        missing = self._missing(procs)
        alerts.extend(self._missing_alerts(missing, now))
        hangs, hung_keys = self._hangs(procs, live, ended, missing, now)
        alerts.extend(hangs)
        self._slow(live, now)
        alerts.extend(self._slow_alerts)
        raised, resolved = self.book.update(alerts, now)
        events = (
            [a.to_json("alert") for a in raised]
            + [a.to_json("update") for a in self.book.updated]
            + [a.to_json("resolved") for a in resolved]
        )
        frame = (
            self._frame(procs, ended, hung_keys, missing, now, step_ms, hang_after)
            if with_frame
            else None
        )
        return frame, events

    def _hang_after(self, step_ms: float | None) -> float:
        """How long with no progress is a hang: ``max(hang_floor_s, hang_steps × the median step)``
        (s)."""
        rules = self.rules
        return max(rules.hang_floor_s, rules.hang_steps * step_ms / 1000.0 if step_ms else 0.0)

    def _earlier_crashes(self, now: float) -> list[Alert]:
        """An earlier attempt's crash stays shown after a restart (`--max-restarts`) replaced its
        processes."""
        earlier = self.earlier_attempts()
        if not earlier:
            return []
        return [
            a
            for a in self._ended_alerts(earlier, self._ended(earlier, now), now, show_attempt=True)
            if a.kind == "crashed"
        ]

    def _missing_due(self, now: float) -> bool:
        """Whether the run is ``missing_grace_s`` old: a rank slow to start (imports, a checkpoint
        read before init) is not missing at once."""
        return (
            self.first_arrival is not None
            and now - self.first_arrival >= self.rules.missing_grace_s
        )

    def _missing_alerts(
        self, missing: list[tuple[str, int | None, list[int], int]], now: float
    ) -> list[Alert]:
        """``missing``: per source and attempt, the ranks of ``world_size`` with no file, once the
        run is old enough."""
        if not missing or not self._missing_due(now):
            return []
        return [
            Alert(
                "missing",
                ("missing", source, attempt),
                f"{source}: {len(ranks)} of {world} ranks have no file ({compress_ranks(ranks)})",
                ranks=ranks,
                source=source,
                attempt=attempt,
                detected=now,
                since=self.first_arrival,
                cost={"ranks": len(ranks)},
                evidence=["world_size"],
            )
            for source, attempt, ranks, world in missing
        ]

    def _hangs(
        self,
        procs: list[ProcessState],
        live: list[ProcessState],
        ended: dict[str, str | None],
        missing: list,
        now: float,
    ) -> tuple[list[Alert], set[str]]:
        """The hang alerts, one per source at most, and the keys of the processes they hold; sets
        `suspected` and `pauses`.

        A crash explains the stop that follows it: the crashed alert names the rank, no hang is
        raised on top. Each source (trainer, rollouter, reward, …) is judged on its own: a rollouter
        idle between spans is not the culprit of trainers waiting in their all_reduce.
        """
        alerts: list[Alert] = []
        hung_keys: set[str] = set()
        self.suspected = None
        self.pauses = []
        suspected: list[str] = []
        for source in sorted({p.source for p in procs}):
            members = [p for p in procs if p.source == source]
            if any(ended.get(p.key) == "crashed" for p in members):
                self._suspects.pop(source, None)
                continue
            hang_after = self._hang_after(self._median_step_ms(members))
            judged = _judged_for_hang(
                members, [p for p in live if p.source == source], ended, hang_after
            )
            hang = self._hang(judged, members, missing, now, hang_after)
            if self.suspected:
                suspected.append(self.suspected)
            if hang is not None:
                alerts.append(hang)
                hung_keys |= (
                    {p.key for p in judged if p.rank in hang.ranks}
                    if hang.ranks
                    else {p.key for p in judged}
                )
        self.suspected = "; ".join(suspected) or None
        return alerts, hung_keys

    # -- states --------------------------------------------------------------------------------
    def _ended(self, procs: list[ProcessState], now: float) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        terminated_at = [
            p.signal_arrival for p in procs if p.signal is not None and p.signal_arrival is not None
        ]
        first_term = min(terminated_at) if terminated_at else None
        for p in procs:
            state = p.ended()
            if (
                state == "crashed"
                and p.crash is None
                and now - (p.torn_since or now) < self.rules.crash_after_s
            ):
                state = None  # a partial line is a write in progress until it has sat there a while
            if state is None and first_term is not None and (p.last_arrival or 0.0) <= first_term:
                # Others were sent SIGTERM (torchrun's agent does so when a worker dies); this one
                # wrote nothing since, not even its SIGTERM record: it is the one that died.
                if first_term is not None and now - first_term >= 2.0:
                    state = "crashed"
            out[p.key] = state
        self._find_killed(procs, out)
        return out

    def _find_killed(self, procs: list[ProcessState], ended: dict[str, str | None]) -> None:
        """Processes killed without a word (SIGKILL, the OOM killer): `summarize`'s rule
        (`model.ending.killed_silently`)."""
        by_run: dict[tuple, list[tuple[ProcessState, End]]] = {}
        for p in procs:
            end = End(
                p.key,
                closed=p.closed,
                last_us=p.last_us,
                step=p.step,
                entered=p.entered,
                crash=p.crash,
                signal_us=p.signal_us,
                wrote=not p.silent,
            )
            by_run.setdefault((p.source, p.attempt), []).append((p, end))
        for members in by_run.values():
            ends = [end for _, end in members]
            if not any(end.failed_us is not None or end.signal_us is not None for end in ends):
                continue
            differ = programs_differ(end.entered for end in ends)  # once per run: 1,000 ranks
            for p, end in members:
                # judged again at every evaluation: a later record of its own clears it
                self.killed.pop(p.key, None)
                # No end of its own on record (no crash, closing or signal record), as summarize
                # judges it: also one `_ended` already called crashed for its torn last line or for
                # writing nothing since the others' SIGTERM. Else the others' failures read as the
                # first (CI stop 34: rank 1 SIGKILLed, torchrun's SIGTERM reached ranks 0,2 as they
                # failed, and --once named them, held back by rank 1).
                unjudged = ended.get(p.key) is None or (
                    ended.get(p.key) == "crashed" and p.crash is None
                )
                evidence = kill_evidence(end, ends, differ) if unjudged else None
                if evidence is not None:
                    ended[p.key] = "crashed"
                    self.killed[p.key] = killed_crash(
                        end, evidence, _inner(p), torn=p.torn_since is not None
                    )

    def _crash_of(self, p: ProcessState) -> dict[str, Any] | None:
        """Its crash (an uncaught exception) or its silent kill, as `model.ending` describes them;
        None for Ctrl-C or no crash."""
        crash = (
            p.crash if p.crash is not None and not is_interrupt(p.crash) else self.killed.get(p.key)
        )
        return crash

    def _ended_alerts(
        self,
        procs: list[ProcessState],
        ended: dict[str, str | None],
        now: float,
        show_attempt: bool = False,
    ) -> list[Alert]:
        """``crashed`` and ``terminated``, one alert of each per source and attempt: a crash on
        record names the process that failed first (`_crashed_alert`); else the processes that ended
        so, where they were."""
        alerts = []
        for kind in ("crashed", "terminated"):
            for (source, attempt), group in _by_attempt(
                [p for p in procs if ended.get(p.key) == kind]
            ).items():
                if kind == "crashed":
                    first = self._crashed_alert(
                        source,
                        attempt,
                        [p for p in procs if (p.source, p.attempt) == (source, attempt)],
                        ended,
                        now,
                        show_attempt or bool(attempt),
                    )
                    if first is not None:
                        alerts.append(first)
                        continue
                alerts.append(self._ended_alert(kind, source, attempt, group, procs, now))
        return alerts

    def _ended_alert(
        self,
        kind: str,
        source: str,
        attempt: int | None,
        group: list[ProcessState],
        procs: list[ProcessState],
        now: float,
    ) -> Alert:
        """``crashed`` with no crash on record (a torn last line that stays, a silent stop while the
        others were sent SIGTERM) or ``terminated``: which ranks, at which step and in which span;
        terminated after a crash: its victims."""
        ranks = sorted(p.rank for p in group if p.rank is not None)
        after = self._after_crashed(source, attempt, procs) if kind == "terminated" else ""
        last = max(group, key=lambda p: p.last_arrival or 0.0)
        since = min(_stop_arrival(p, kind) or now for p in group)
        inner = last.innermost()
        where = inner.name if inner is not None else None
        return Alert(
            kind,
            (kind, source, attempt),
            f"{source} {_ranks(ranks)} {kind}"
            + (f" at step {last.step}" if last.step is not None else "")
            + (f" in {where}" if where else "")
            + after,
            ranks=ranks,
            source=source,
            attempt=attempt,
            step=last.step,
            phase=where,
            detected=now,
            since=since,
            cost={"ranks": len(ranks)},
            evidence=["torn last line" if kind == "crashed" and last.torn_since else "records"],
        )

    def _after_crashed(self, source: str, attempt: int | None, procs: list[ProcessState]) -> str:
        """The terminated ones' note naming the ranks of their source and attempt that crashed (they
        are its victims), or ""."""
        crashed = sorted(
            q.rank
            for q in procs
            if (q.source, q.attempt) == (source, attempt)
            and q.rank is not None
            and self._crash_of(q) is not None
        )
        return f", after {_ranks(crashed)} crashed (victims)" if crashed else ""

    def _crashed_alert(
        self,
        source: str,
        attempt: int | None,
        members: list[ProcessState],
        ended: dict[str, str | None],
        now: float,
        show_attempt: bool,
    ) -> Alert | None:
        """``crashed``: the process that failed first, with its error, and the others, its victims
        (`model.ending.failed_first`); None without a crash on record."""
        unclean = [p for p in members if not (ended.get(p.key) == "closed")]
        crashes = {p.key: self._crash_of(p) for p in unclean}
        failed_at: dict[Hashable, int | None] = {
            key: (crash or {}).get("time_us") for key, crash in crashes.items()
        }
        clocks = self._failure_clocks(source, attempt, members, unclean, failed_at)
        culprits, victims, first_us = failed_first(
            failed_at,
            {key for key, crash in crashes.items() if failed_because_of_a_peer(crash)},
            clocks,
        )
        if not culprits:
            return None
        # failed_first's keys are these
        by_key: dict[Any, ProcessState] = {p.key: p for p in members}
        ends = [
            End(
                p.key,
                closed=False,
                last_us=p.last_program_us,
                step=p.step,
                entered=p.entered,
                crash=crashes[p.key],
                wrote=not p.silent,
            )
            for p in unclean
        ]
        # what the crashes waited for went quiet before the first of them, whatever its cause
        earliest = min(
            (c["time_us"] for c in crashes.values() if c and type(c.get("time_us")) is int),
            default=first_us,
        )
        held = held_back_by(ends, earliest)  # type: ignore[arg-type]  # a time whenever it names culprits
        if held:  # they crashed waiting for it (a collective that timed out): the crashes name it, not themselves
            return _held_back_alert(
                source,
                attempt,
                [p for p in unclean if crashes[p.key] is not None],
                [by_key[k] for k in held],
                crashes,
                now,
            )
        return _failed_first_alert(
            source,
            attempt,
            [by_key[k] for k in culprits],
            [by_key[k] for k in victims],
            crashes,
            now,
            show_attempt,
            order_unknown(culprits, failed_at, clocks),
        )

    def _failure_clocks(
        self,
        source: str,
        attempt: int | None,
        members: list[ProcessState],
        unclean: list[ProcessState],
        failed_at: dict[Hashable, int | None],
    ) -> dict[Hashable, tuple[str | None, float]] | None:
        """Failures on several hosts put on `summarize`'s aligned clock (`failed_at` changed in
        place: each host's offset taken out, `model.clocks.estimate_offsets` over the steps the
        processes keep), and each one's host and error (`ClockAlignment.error_us`), for
        `model.ending.failed_first`; None when they are on one host (one clock: nothing to align).

        Refit only when the run's newest step moved: a crashed run keeps its last fit.
        """
        hosts = {p.host for p in unclean if type(failed_at.get(p.key)) is int}
        if len(hosts) < 2:
            return None
        newest = max((p.steps[-1].step for p in members if p.steps), default=None)
        kept = self._clocks.get((source, attempt))
        if kept is None or kept[0] != newest:
            fit = _fit([p for p in members if p.steps], -(1 << 62))
            kept = self._clocks[(source, attempt)] = (newest, fit)
            while len(self._clocks) > 64:  # runs and attempts come and go over days
                del self._clocks[next(iter(self._clocks))]
        fit = kept[1]
        if fit is None or not fit.applied:
            return None
        for p in unclean:
            at = failed_at.get(p.key)
            if type(at) is int:
                failed_at[p.key] = at - int(round(fit.offset_at(p.host, at)))
        return {p.key: (p.host, fit.error_us(p.host)) for p in unclean}

    def _missing(self, procs: list[ProcessState]) -> list[tuple[str, int | None, list[int], int]]:
        out = []
        for (source, attempt), group in _by_attempt(procs).items():
            worlds = [p.world_size for p in group if p.world_size]
            if not worlds:
                continue
            world = max(worlds)
            seen = {p.rank for p in group}
            ranks = [r for r in range(world) if r not in seen]
            if ranks:
                out.append((source, attempt, ranks, world))
        return out

    def _median_step_ms(self, procs: list[ProcessState]) -> float | None:
        values = [
            s.duration_ms
            for p in procs
            for s in p.last_steps(self.rules.window)
            if s.duration_ms is not None
        ]
        return statistics.median(values) if values else None

    # -- hang ----------------------------------------------------------------------------------
    def _hang(
        self,
        live: list[ProcessState],
        members: list[ProcessState],
        missing: list,
        now: float,
        hang_after: float,
    ) -> Alert | None:
        """``hang`` for one source: no progress for `hang_after`, a verdict (`_culprits`),
        confirmed; else None, with `suspected` set while it waits for its confirmation."""
        self.suspected = None
        if not live:
            return None
        source = live[0].source
        last_progress = max(p.progress_arrival or 0.0 for p in live)
        quiet = now - last_progress
        verdict = (
            self._culprits(live, members, missing, now, hang_after) if quiet >= hang_after else None
        )
        if verdict is None:
            self._suspects.pop(source, None)
            return None
        key = ("hang", source, live[0].attempt)
        ident = (key, tuple(verdict.ranks))
        suspect = self._seen_again(source, ident, now)
        self._ask_black_box(source, ident)
        backed = "black box" in verdict.evidence or "flight recorder" in verdict.evidence
        # A second refresh guards against one that caught the files between two writes; files
        # already still for twice the time a hang needs (a `--once` from cron, a watch started on a
        # stuck job) have said it already.
        need = max(hang_after, verdict.need)
        proven = now - (verdict.since if verdict.since is not None else last_progress) >= 2.0 * need
        twice = suspect.seen >= self.rules.confirm_evaluations
        if not (twice or backed or proven) and key not in self.book.active:
            # Shown in the frame (a `--once` sees it), raised as an alert on the next refresh.
            self.suspected = _suspected_line(source, verdict, quiet)
            return None
        return _hang_alert(
            key, live, verdict, _confirmation(twice, proven, need) + verdict.evidence, now, quiet
        )

    def _seen_again(self, source: str, ident: tuple, now: float) -> _Suspect:
        """The source's suspect `ident` (the hang's key and culprits), seen once more; a new one
        replaces another."""
        suspect = self._suspects.get(source)
        if suspect is None or suspect.key != ident:
            suspect = self._suspects[source] = _Suspect(ident, 0, now)
        suspect.seen += 1
        return suspect

    def _ask_black_box(self, source: str, ident: tuple) -> None:
        """Ask the ranks for their black box (`want_black_box`), once per suspect `ident` of the
        source."""
        if self._asked_for.get(source) != ident:
            self._asked_for[source] = ident
            self.want_black_box = True

    def _culprits(
        self,
        live: list[ProcessState],
        members: list[ProcessState],
        missing: list,
        now: float,
        hang_after: float,
    ) -> _Verdict | None:
        """Who the evidence names, by `summarize`'s rules (`model.hang.name_suspects`), or None when
        it is not (yet) a hang.

        The places are built from the records read so far (`_place`): every live
        process is stuck on `watch`'s evidence (no progress for `hang_after`), so
        the model's rules run as they do on a run that ended in a hang, and the
        culprit named live is the one `summarize` names at the end.
        """
        source, attempt = live[0].source, live[0].attempt
        source_missing = [m for m in missing if m[0] == source]
        if source_missing and not self._missing_due(now):
            return None  # a rank slow to start (imports, a checkpoint read before init) is not missing at once
        if all(p.alive_here is False for p in live):
            # Every process ran on this host and is gone: stopped together, not stuck, whatever the
            # files say (torchtitan's write no heartbeat that would tell).
            last = max(p.progress_arrival or now for p in live)
            return _gone_together(live, now, last)
        due = _heartbeat_due(live)
        # all silent since their progress, though one alive with spans open writes heartbeats
        if due is not None:
            last = max(p.progress_arrival or now for p in live)
            return _stopped_at_once(live, now, last, due) if now - last >= due else None
        placed, places = _places(live, now)
        steps_seen = {(source, attempt): max((p.steps_seen for p in members), default=0)}
        missing_rows = flag_missing_that_ran(
            [
                {"source": s, "attempt": a, "world_size": w, "ranks": list(r)}
                for s, a, r, w in source_missing
            ],
            steps_seen,
        )
        suspects, notes = name_suspects(list(places.values()), members, missing_rows)
        if not suspects:
            return self._nobody_named(live, notes, now, hang_after)
        # Ask for the black boxes now, not once the culprit has been where it is long enough: their
        # flight recorder can prove a hang at once (a desync never completes), or name another rank.
        self._ask_black_box(
            source,
            (
                ("hang", source, attempt),
                tuple(sorted({s.rank for s in suspects if s.rank is not None})),
            ),
        )
        return self._named(suspects, {p.label: p for p in placed}, places, live, now, hang_after)

    def _nobody_named(
        self, live: list[ProcessState], notes: list[str], now: float, hang_after: float
    ) -> _Verdict | None:
        """The verdict when the rules name nobody, once every process has been stopped long enough;
        else None.

        Nobody named: every process in the same place (a shared pause, or a collective that never
        completes), or places the rules cannot order. After 3 × that span's learned duration it is a
        hang nobody can be blamed for.
        """
        names = {(_inner(p)) for p in live}
        name = next(iter(names)) if len(names) == 1 else None
        need = self._shared_need(live, name, hang_after)
        last = max(p.progress_arrival or now for p in live)
        if now - last < need:
            return None
        top_step = max((p.step for p in live if p.step is not None), default=None)
        where = f"waits in {name}" if name else "is stopped in different places"
        evidence = ["black box"] if any(p.box_live for p in live) else []
        why = (
            "no process stands out: look at the network, the collective library, or the black boxes"
            + (f" ({notes[0]})" if notes else "")
        )
        return _Verdict([], where, why, "cannot tell", last, name, top_step, None, evidence, need)

    def _shared_need(self, live: list[ProcessState], name: str | None, hang_after: float) -> float:
        """How long every process must be stopped in the span `name` they share (None: in different
        places) to be a hang: 3 × its learned duration, ``shared_pause_s`` when never seen."""
        learned = (
            max((p.span_max_ms.get(name, 0.0) for p in live[:64]), default=0.0) if name else 0.0
        )
        return (
            max(hang_after, 3.0 * learned / 1000.0)
            if learned
            else max(hang_after, self.rules.shared_pause_s)
        )

    def _named(
        self,
        suspects: list,
        by_label: dict[str, ProcessState],
        places: dict[str, RankPlace],
        live: list[ProcessState],
        now: float,
        hang_after: float,
    ) -> _Verdict | None:
        """The alert's facts for the suspects the model named; None while a culprit has not been
        where it is long enough."""
        culprits = [by_label[s.label] for s in suspects if s.label in by_label]
        # A desync (one sequence number, different collectives: the flight recorder's) can never
        # complete: no need to wait for the culprit's span to outlast its past, even one never seen
        # to finish (a barrier only it entered).
        needed = self._stopped_long_enough(
            culprits, suspects[0].rule == "desync", live, places, now, hang_after
        )
        if needed is None:
            return None
        ranks = sorted({s.rank for s in suspects if s.rank is not None})
        first = suspects[0]
        if first.rule == "missing":
            return _Verdict(
                ranks,
                "has no file (never reached init_structured_logger)",
                first.why,
                first.rule,
                self.first_arrival,
                None,
                None,
                None,
                ["world_size"],
                max(needed, self.rules.missing_grace_s),
            )
        if first.rule == "nothing logged":
            line, evidence = _box_line(culprits)
            return _Verdict(
                ranks,
                "has written no record since init",
                first.why,
                first.rule,
                min(p.first_arrival or now for p in culprits),
                None,
                None,
                line,
                evidence,
                needed,
            )
        return _located_verdict(
            first, by_label[first.label], places[first.label], culprits, live, ranks, now, needed
        )

    def _stopped_long_enough(
        self,
        culprits: list[ProcessState],
        proven: bool,
        live: list[ProcessState],
        places: dict[str, RankPlace],
        now: float,
        hang_after: float,
    ) -> float | None:
        """How long the culprits had to be stopped (s), once each was; None while one has not been
        where it is long enough.

        Each culprit must have been where it is longer than it ever took there before (the model
        judges where the ranks stopped; `watch` must also judge *that* they stopped, while records
        still arrive). `proven` (a desync): no waiting.
        """
        needed = hang_after
        for p in culprits:
            if p.silent or proven:
                continue
            stuck = now - (p.progress_arrival or now)
            need = self._need(p, stuck, live, places, hang_after)
            if stuck < need:
                return None
            needed = max(needed, need)
        return needed

    def _need(
        self,
        p: ProcessState,
        stuck: float,
        live: list[ProcessState],
        places: dict[str, RankPlace],
        hang_after: float,
    ) -> float:
        """How long culprit `p`, `stuck` seconds where it is, must stay there to be hung: 3 × its
        longest gap between records (between spans), 3 × the span's longest finished duration,
        ``shared_pause_s`` in a span only it runs that the others wait for (noted in `pauses`
        meanwhile), ``unknown_span_s`` in a span never seen to finish."""
        rules = self.rules
        inner = p.innermost()
        if inner is None:
            return max(hang_after, 3.0 * p.gap_max_ms / 1000.0)
        if inner.name in p.span_max_ms or any(inner.name in q.span_max_ms for q in live[:64]):
            learned = max(
                [p.span_max_ms.get(inner.name, 0.0)]
                + [q.span_max_ms.get(inner.name, 0.0) for q in live[:64]]
            )
            return max(hang_after, 3.0 * learned / 1000.0)
        place = places.get(p.label)
        if place is not None and waited_for_in_own_work(
            place, [places[q.label] for q in live if q is not p and q.label in places]
        ):
            # rank 0's first checkpoint: a pause, until it lasts longer than allowed
            need = max(hang_after, rules.shared_pause_s)
            if stuck < need:
                self.pauses.append(
                    f"{p.label} in {inner.name}, a span only it runs, for {stuck:,.0f} s; "
                    f"{len(live) - 1} ranks wait for it "
                    f"(a hang after {need:,.0f} s: --pause-after)"
                )
            return need
        return max(hang_after, rules.unknown_span_s)

    # -- slow ----------------------------------------------------------------------------------
    def _slow(self, live: list[ProcessState], now: float) -> None:
        """Recompute `_slow_alerts`, the slow alerts that hold now: per peer group, its verdicts
        when it finished a new step, else the ones it had; the job-wide slowdown at every refresh.

        Nothing needs keeping for a rule that did not run (`AlertBook.update`'s `keep_keys`): a
        group without a new step gives its alerts again, and those of a group no longer live (its
        processes ended) resolve.
        """
        groups: dict[tuple, list[ProcessState]] = {}
        for p in live:
            if p.steps:
                groups.setdefault((p.source, p.attempt, peer_key(p.coords)), []).append(p)
        alerts: list[Alert] = []
        # The step-closing collective is judged over every rank of a source and attempt, as
        # `summarize` judges it over the run's (`model.clocks.estimate_offsets`), not per peer group.
        anchors: dict[tuple, str | None] = {}
        for gkey, group in groups.items():
            last = min(p.steps[-1].step for p in group)
            if self._last_slow_step.get(gkey) == last:
                alerts.extend(a for a in self._slow_alerts if a.key[1] == gkey)
                continue
            self._last_slow_step[gkey] = last
            run = gkey[:2]
            if run not in anchors:
                anchors[run] = self._anchor_of(run, live, last)
            alerts.extend(self._slow_group(gkey, group, last, now, anchors[run]))
        for source in sorted({p.source for p in live}):
            job = self._job_slow([p for p in live if p.source == source], now)
            if job is not None:
                alerts.append(job)
        self._slow_alerts = alerts

    def _anchor_of(self, run: tuple, live: list[ProcessState], last: int) -> str | None:
        """The step-closing moment of one source and attempt (`_run_anchor`), found again every
        `ANCHOR_EVERY_STEPS` steps: what a loop's last span is changes rarely, and finding it
        costs a clock fit over every rank (some 50 ms a refresh at 1,024 ranks)."""
        kept = self._anchors.get(run)
        if kept is None or last - kept[0] >= ANCHOR_EVERY_STEPS or last < kept[0]:
            anchor = _run_anchor(
                [p for p in live if (p.source, p.attempt) == run and p.steps],
                last - min(self.rules.slow_window, WINDOW_STEPS) + 1,
            )
            kept = self._anchors[run] = (last, anchor)
            while len(self._anchors) > 64:  # runs and attempts come and go over days
                del self._anchors[next(iter(self._anchors))]
        return kept[1]

    def _slow_group(
        self, gkey: tuple, group: list[ProcessState], last: int, now: float, anchor: str | None
    ) -> list[Alert]:
        """Slow ranks and hosts of one peer group at its newest common step `last`: `summarize`'s
        verdicts on the window.

        The per-rank, per-phase step figures of the last ``slow_window`` steps
        (`StepFacts`, each rank's own clock) go to the model's rule, the one
        `summarize` applies to the whole run (`model.stragglers.judge_phase`,
        `judge_arrival`: `compare_ranks` / `stands_out`, the change windows,
        wait or work, the cost and "Look first at"). A rank is slow where a
        finding of it is a ``straggler`` that reaches "Look first at"; `watch`
        adds only the clock: found on ``sustain_steps`` steps running before it
        is raised, and kept while its excess stays at least half the bar.
        """
        rules = self.rules
        if len(group) < MIN_MAJORITY:
            return []  # with fewer than 3 ranks there is no majority to call one abnormal
        window = _Window.of(
            group,
            last - min(rules.slow_window, WINDOW_STEPS) + 1,
            last,
            whole=rules.slow_window >= WINDOW_STEPS,
        )
        if not window.step_times:
            return []
        step_med = statistics.median(window.step_times)
        # `anchor`: the step-closing collective every rank leaves at one moment (`_run_anchor`), its
        # end each rank's own-clock reference.
        anchors = window.arrivals_at(anchor) if anchor is not None else {}
        common = dict(
            source=group[0].source,
            attempt=group[0].attempt,
            step_ms=step_med,
            peers=sorted(window.by_rank),
            group=gkey[2],
        )
        found, excess, bars = self._judge_phases(gkey, group, window, anchors, last, common)
        if anchor is not None and len(anchors) >= MIN_MAJORITY:
            found.update(_arrival_stragglers(anchor, anchors, common))
        # A host slow as a whole is one unit (its ranks not named one by one): at least half its
        # ranks, two or more, found in one phase, among three hosts or more.
        whole_hosts = _whole_hosts(window.by_rank)
        units = _units(found, whole_hosts)
        # The clock: a unit found on `sustain_steps` steps running is raised; a raised one stays
        # while its excess (the median over its ranks) stays at least half the bar.
        self._keep_raised(("slow", gkey), units, excess, bars, whole_hosts)
        raised = self._sustained(("slow", gkey), _named_once(units), last, now)
        return [
            self._slow_alert(gkey, kind, unit, members, name, cost, step_med, last, now)
            for kind, unit, members, name, cost in self._one_per_unit(gkey, raised, window)
        ]

    def _judge_phases(
        self,
        gkey: tuple,
        group: list[ProcessState],
        window: _Window,
        anchors: dict[int, dict[int, tuple[int, int]]],
        last: int,
        common: dict[str, Any],
    ) -> tuple[dict[tuple[int, str], float], dict[tuple[int, str], float], dict[str, float]]:
        """`model.stragglers.judge_phase` on every phase of the window: (found, excess, bars).

        found: (rank, phase) → excess ms of the findings that name a rank (a ``straggler`` that
        reaches "Look first at"); excess: every rank's excess per phase, and bars: each phase's bar
        (to keep a raised alert).
        """
        exits = {
            rank: {step: end for step, (_, end) in own.items()} for rank, own in anchors.items()
        } or None
        one_clock = len({p.host for p in group}) == 1
        found: dict[tuple[int, str], float] = {}
        excess: dict[tuple[int, str], float] = {}
        bars: dict[str, float] = {}
        raised_phases = {
            k[3] for k, held in self._held.items() if k[0] == ("slow", gkey) and held.raised
        }
        for name, per_rank in window.times.items():
            if name not in raised_phases and not _may_stand_out(
                [p.window_median(name) for p in group]
            ):
                continue  # no rank's median is near the rule's bar: nothing the model's rule could name (a shortcut, not a rule)
            findings, _, slowness = judge_phase(
                name,
                per_rank,
                window.ends.get(name, {}),
                exits,
                one_clock=one_clock,
                last_step=last,
                change_points=False,
                **common,
            )
            for slow in slowness:
                excess[(slow.rank, name)] = slow.median_excess_ms
                bars[name] = effect_bar(slow.others_median_ms)
            for f in _headline_stragglers(findings):
                found[(f.rank, name)] = max(found.get((f.rank, name), 0.0), f.cost_per_step_ms)
        return found, excess, bars

    def _keep_raised(
        self,
        scope: tuple,
        units: dict[tuple, tuple[list[int], float]],
        excess: dict[tuple[int, str], float],
        bars: dict[str, float],
        whole_hosts: dict[Any, list[int]],
    ) -> None:
        """The clock's second half: a raised unit no longer found stays (added to `units`) while its
        excess (the median over its ranks) stays at least half the bar; any other unit no longer
        found is forgotten."""
        for hkey in [k for k in self._held if k[0] == scope and (k[1], k[2], k[3]) not in units]:
            _, kind, unit, name = hkey
            ranks = whole_hosts.get(unit, []) if kind == "host" else [unit]
            kept = _still_over_half_the_bar(self._held[hkey], ranks, name, excess, bars)
            if kept is not None:
                units[(kind, unit, name)] = (ranks, kept)
            else:
                del self._held[hkey]

    def _sustained(
        self, scope: tuple, units: dict[tuple, tuple[list[int], float]], last: int, now: float
    ) -> list[tuple[str, Any, list[int], str, float]]:
        """The clock's first half: the units found on `sustain_steps` steps running, or raised
        already: (kind, unit, ranks, phase, excess).

        A rank's late arrival waits while a phase of its own is found (its cause, named instead once
        it is sustained).
        """
        raised: list[tuple[str, Any, list[int], str, float]] = []
        with_phase = {(kind, unit) for (kind, unit, name) in units if name != "arrival"}
        for (kind, unit, name), (ranks, cost) in units.items():
            hkey = (scope, kind, unit, name)
            held = self._held.get(hkey)
            if held is None:
                held = self._held[hkey] = _Held(last, now)
            held.excess_ms = cost
            if name == "arrival" and not held.raised and (kind, unit) in with_phase:
                continue
            if held.raised or last - held.since_step >= self.rules.sustain_steps:
                held.raised = True
                raised.append((kind, unit, ranks, name, cost))
        return raised

    def _one_per_unit(
        self, gkey: tuple, raised: list[tuple[str, Any, list[int], str, float]], window: _Window
    ) -> list[tuple[str, Any, list[ProcessState], str, float]]:
        """One alert per unit: the one already raised (stable), else the innermost phase (fwd, not
        the fwd_bwd around it), else the largest; a rank's arrival only when no phase of its own
        explains it. (kind, unit, processes, phase, excess)."""
        best: dict[tuple, tuple] = {}
        for kind, unit, ranks, name, cost in raised:
            members = [window.by_rank[r] for r in ranks if r in window.by_rank]
            active = self._alert_key(gkey, kind, unit, members, name) in self.book.active
            order = (active, name != "arrival", name not in window.top_names, cost)
            if (kind, unit) not in best or order > best[(kind, unit)][0]:
                best[(kind, unit)] = (order, kind, unit, members, name, cost)
        return [
            (kind, unit, members, name, cost)
            for _, kind, unit, members, name, cost in best.values()
        ]

    @staticmethod
    def _alert_key(
        gkey: tuple, kind: str, unit: Any, members: list[ProcessState], name: str
    ) -> tuple:
        return ("slow", gkey, unit if kind == "host" else members[0].rank, name)

    def _slow_alert(
        self,
        gkey: tuple,
        kind: str,
        unit: Any,
        members: list[ProcessState],
        name: str,
        excess: float,
        step_med: float,
        last: int,
        now: float,
    ) -> Alert:
        held = self._held.get((("slow", gkey), kind, unit, name))
        since_step = held.since_step - self.rules.sustain_steps if held else last
        steps = max(1, last - since_step)
        p = members[0]
        ranks = sorted(m.rank for m in members if m.rank is not None)
        what = (
            f"host {unit} (ranks {compress_ranks(ranks)})"
            if kind == "host"
            else f"{p.source} rank {p.rank}" + (f" on {p.host}" if p.host else "")
        )
        phase = "arrives last at the step-closing collective" if name == "arrival" else name
        pct = 100.0 * excess / step_med if step_med else 0.0
        message = f"slow: {what}: {phase} +{excess:,.1f} ms a step ({pct:.1f}% of the step; every rank waits for it)"
        return Alert(
            "slow",
            self._alert_key(gkey, kind, unit, members, name),
            message,
            ranks=ranks,
            source=p.source,
            attempt=p.attempt,
            host=unit if kind == "host" else p.host,
            step=last,
            phase=name,
            where=phase,
            since=held.since_time if held else now,
            detected=now,
            evidence=["collective wait (own clock)" if name == "arrival" else "phase times"],
            cost={
                "ms_per_step": round(excess, 3),
                "pct_of_step": round(pct, 2),
                "seconds_so_far": round(excess * steps / 1000.0, 2),
                "steps": steps,
            },
        )

    def _job_slow(self, live: list[ProcessState], now: float) -> Alert | None:
        """``job_slow`` for one source: the model's rule (`model.job_speed.judge`) on the steps
        every rank finished, raised once it held `sustain_steps` steps running (watch's clock)."""
        if len(live) < 2 or not all(p.steps for p in live):
            return None
        source, attempt = live[0].source, live[0].attempt
        key = ("job_slow", source, attempt)
        active = key in self.book.active
        # Once seen (held for `sustain_steps`, then raised), it is judged against the past it was
        # first seen on (the steps before its split), kept by the cache however long it lasts: a
        # baseline sliding into the slow steps would lose it before it is raised.
        first = self._job_raised_by.get(source)
        split = None if first is None else first.split_step
        cache = self._job_step_medians(live, min(p.steps[-1].step for p in live), split)
        values = {step: entry[0] for step, entry in cache.items()}
        found = None
        if job_speed.rising(values, split, raised=active) is not None:
            # The rise first (cheap, from the medians kept); the phases only once it holds.
            found = job_speed.judge(
                values,
                *_job_evidence(live),
                split=split,
                per_token=cache[max(cache)][2],
                raised=active,
                straggler=any(
                    a.kind == "slow" and a.source == source for a in self.book.active.values()
                ),
            )
        if found is None:
            self._job_held_by.pop(source, None)
            self._job_raised_by.pop(source, None)
            return None
        if first is not None and found.phase is None:
            # The phases of its past are no longer kept per process: the phase it was raised with.
            found = dataclasses.replace(
                found, phase=first.phase, phase_grown_ms=first.phase_grown_ms
            )
        self._job_raised_by.setdefault(source, found)
        held = self._job_held_by.get(source)
        if held is None:
            held = self._job_held_by[source] = _Held(found.last_step, now)
        if found.last_step - held.since_step < self.rules.sustain_steps and not active:
            return None
        excess = found.recent_ms - found.base_ms
        steps_so_far = max(1, found.last_step - found.since_step + 1)
        return Alert(
            "job_slow",
            key,
            found.describe(),
            ranks=[],
            source=source,
            attempt=attempt,
            step=found.last_step,
            phase=found.phase,
            since=held.since_time,
            detected=now,
            evidence=["step times"],
            cost={
                "ms_per_step": round(excess, 3),
                "pct_of_step": round(found.pct, 2),
                "seconds_so_far": round(excess * steps_so_far / 1000.0, 2),
            },
        )

    def _job_step_medians(
        self, live: list[ProcessState], done: int, split: int | None = None
    ) -> dict[int, tuple[float, Any, bool]]:
        """Per step, its time for the job (`model.job_speed.step_value`): computed once, when every
        rank finished it.

        The cache (step → (time, attempt, per token)) is the source's, cleared when a new attempt
        begins, and bounded: it keeps the steps the rule judges after the processes dropped them,
        and the baseline before `split` (the raised slowdown's) however old.
        """
        cache = self._job_steps_by.setdefault(live[0].source, {})
        if cache and next(iter(cache.values()))[1] != live[0].attempt:
            cache.clear()
        by_step = _steps_finished_since(live, max(cache) if cache else None, done)
        for k in sorted(by_step):
            durations = [s.duration_ms or 0.0 for s in by_step[k]]  # finished: duration set
            tokens = [s.tokens for s in by_step[k] if s.tokens]
            cache[k] = (job_speed.step_value(durations, tokens), live[0].attempt, bool(tokens))
        bound = 4 * job_speed.MIN_STEPS
        if len(cache) > bound:
            steps = sorted(cache)
            at = len(steps) if split is None else bisect.bisect_left(steps, split)
            kept = set(steps[max(0, at - job_speed.BASELINE) : at])
            for step in steps:
                if len(cache) <= bound:
                    break
                if step not in kept:
                    del cache[step]
        return cache

    # -- the frame -----------------------------------------------------------------------------
    def _frame(
        self,
        procs: list[ProcessState],
        ended: dict[str, str | None],
        hung: set[str],
        missing: list,
        now: float,
        step_ms: float | None,
        hang_after: float,
    ) -> dict[str, Any]:
        """What the screen shows (and ``--json`` writes) at watcher time `now`: the processes by
        state, the steps, where the time goes, the alerts."""
        states, rank_states = self._states(procs, ended, hung, now, step_ms, missing)
        phase_rows, rate = _time_of_last_steps(
            [s for p in procs for s in p.last_steps(self.rules.window)]
        )
        first = min((p.first_arrival or now for p in procs), default=now)
        run_id = procs[0].run_id if procs else None
        return {
            "type": "frame",
            "time_utc": _utc(now),
            "run_id": run_id,
            "attempt": procs[0].attempt if procs else None,
            "age_s": round(now - first, 1),
            "processes": len(procs),
            "world_size": max((p.world_size or 0 for p in procs), default=0) or None,
            "states": dict(sorted(states.items(), key=lambda kv: _STATE_ORDER.get(kv[0], 99))),
            "ranks_by_state": {
                k: compress_ranks(sorted(v)) for k, v in rank_states.items() if k != "running"
            },
            "steps": _step_spread(procs),
            "step_ms": None if step_ms is None else round(step_ms, 3),
            "steps_per_min": rate,
            "phases": phase_rows[:8],
            "last_arrivals": self._last_arrivals(procs),
            "hang_after_s": round(hang_after, 1),
            "suspected_hang": self.suspected,
            "pause": "; ".join(self.pauses) or None,
            "alerts": [a.to_json("alert") for a in self.book.newest_first()],
            "resolved": [a.to_json("resolved") for a in reversed(self.book.history[-5:])],
            "other_runs": self._other_runs(run_id) if procs else [],
        }

    def _states(
        self,
        procs: list[ProcessState],
        ended: dict[str, str | None],
        hung: set[str],
        now: float,
        step_ms: float | None,
        missing: list,
    ) -> tuple[dict[str, int], dict[str, list[int]]]:
        """(state → how many processes, state → their ranks): how each ended, else hung (held by an
        active hang alert), stalled (no progress for ``max(stall_floor_s, 1.5 steps)``) or running;
        and the missing ranks."""
        stall_s = max(self.rules.stall_floor_s, 1.5 * step_ms / 1000.0 if step_ms else 0.0)
        states: dict[str, int] = {}
        rank_states: dict[str, list[int]] = {}
        for p in procs:
            state = ended.get(p.key)
            if state is None:
                if p.key in hung and ("hang", p.source, p.attempt) in self.book.active:
                    state = "hung"
                elif now - (p.progress_arrival or now) >= stall_s:
                    state = "stalled"
                else:
                    state = "running"
            states[state] = states.get(state, 0) + 1
            if p.rank is not None:
                rank_states.setdefault(state, []).append(p.rank)
        n_missing = sum(len(m[2]) for m in missing)
        if n_missing:
            states["missing"] = n_missing
            rank_states["missing"] = [r for m in missing for r in m[2]]
        return states, rank_states

    def _other_runs(self, run_id: Any) -> list[dict[str, Any]]:
        """The runs seen beside the watched one (the last five), with how many processes each."""
        return [{"run_id": r, "processes": len(m)} for r, m in self.runs().items() if r != run_id][
            -5:
        ]

    def _last_arrivals(self, procs: list[ProcessState]) -> list[dict[str, Any]]:
        """The ranks that arrived last at the step-closing collective in the newest step all of them
        finished."""
        done = [p.steps[-1].step for p in procs if p.steps]
        if len(done) < 2:
            return []
        step = min(done)
        waits = []
        for p in procs:
            for s in reversed(p.steps):
                if s.step == step:
                    if s.closing_ms is not None:
                        waits.append((s.closing_ms, p))
                    break
                if s.step < step:
                    break
        if len(waits) < 2:
            return []
        longest = max(w for w, _ in waits)
        waits.sort(key=lambda item: item[0])
        return [
            {"rank": p.rank, "host": p.host, "step": step, "late_ms": round(longest - w, 3)}
            for w, p in waits[:3]
        ]


def _one_or_many(ranks: list[int], one: str, many: str) -> str:
    return one if len(ranks) == 1 else many


def _ranks(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0-2,5``: the words an alert names ranks in."""
    return f"{_one_or_many(ranks, 'rank', 'ranks')} {compress_ranks(ranks)}"


def _by_attempt(procs: list[ProcessState]) -> dict[tuple, list[ProcessState]]:
    """(source, attempt) → its processes, in their order."""
    groups: dict[tuple, list[ProcessState]] = {}
    for p in procs:
        groups.setdefault((p.source, p.attempt), []).append(p)
    return groups


def _stop_arrival(p: ProcessState, kind: str) -> float | None:
    """When a ``kind`` process stopped (watcher time): its torn last line's, its SIGTERM's, else its
    last record's."""
    if kind == "crashed" and p.torn_since:
        return p.torn_since
    return p.signal_arrival if kind == "terminated" else p.last_arrival


def _held_back_alert(
    source: str,
    attempt: int | None,
    crashed: list[ProcessState],
    waited_for: list[ProcessState],
    crashes: dict[str, Any],
    now: float,
) -> Alert:
    """``crashed`` where the crashes name another process (`model.ending.held_back_by`): they
    crashed waiting for it (a collective that timed out), and it, which never reached their span, is
    the one to look at first."""
    crash = crashes[crashed[0].key] or {}
    ranks = sorted(p.rank for p in crashed if p.rank is not None)
    waited = sorted(p.rank for p in waited_for if p.rank is not None)
    message = (
        f"{source} {_ranks(ranks)} crashed: {describe_crash(crash)}; "
        f"{_one_or_many(ranks, 'it', 'they')} waited for {_ranks(waited)}, "
        f"which never reached {crash.get('span') or 'that span'} at step {crash.get('step')}: "
        f"look at {_one_or_many(waited, 'it', 'them')} first"
    )
    return Alert(
        "crashed",
        ("crashed", source, attempt),
        message,
        ranks=ranks,
        source=source,
        attempt=attempt,
        step=crash.get("step"),
        phase=crash.get("span"),
        detected=now,
        since=min(p.crash_arrival or now for p in crashed),
        rule="held back",
        why=message,
        cost={"ranks": len(ranks)},
        evidence=["uncaught exception", f"waited for rank {compress_ranks(waited)}"],
    )


def _failed_first_alert(
    source: str,
    attempt: int | None,
    culprits: list[ProcessState],
    victims: list[ProcessState],
    crashes: dict[str, Any],
    now: float,
    show_attempt: bool,
    unordered: str = "",
) -> Alert:
    """``crashed``: the processes that failed first (`model.ending.failed_first`), with the first
    one's error and line, and the ones that stopped after it, its victims; `unordered`
    (`model.ending.order_unknown`): why several may each have been first."""
    crash = crashes[culprits[0].key] or {}
    ranks = sorted(p.rank for p in culprits if p.rank is not None)
    victim_ranks = sorted(p.rank for p in victims if p.rank is not None)
    who = f"{source} {_ranks(ranks)}" + (
        f" (attempt {attempt})" if show_attempt and attempt is not None else ""
    )
    after = f"; {_ranks(victim_ranks)} stopped after it (victims)" if victim_ranks else ""
    if unordered:
        after = f" ({unordered}){after}"
    since = min((p.crash_arrival or p.last_arrival or now) for p in culprits)
    return Alert(
        "crashed",
        ("crashed", source, attempt),
        f"{who} crashed: {describe_crash(crash)}{after}",
        ranks=ranks,
        source=source,
        attempt=attempt,
        step=crash.get("step"),
        phase=crash.get("span"),
        line=f"{crash['file']}:{crash['line']} {crash.get('function')}"
        if crash.get("file")
        else None,
        detected=now,
        since=since,
        victims=victim_ranks,
        rule="crashed",
        why=describe_crash(crash),
        cost={"ranks": len(ranks), "ranks_stopped_after": len(victim_ranks)},
        evidence=[
            "uncaught exception"
            if crash.get("type") != "killed"
            else "no end on record; its peers failed after it"
        ],
    )


def _judged_for_hang(
    members: list[ProcessState],
    live: list[ProcessState],
    ended: dict[str, str | None],
    hang_after: float,
) -> list[ProcessState]:
    """The processes of one source the hang rules judge: the live ones, and those stopped while
    stuck.

    A hang stopped from outside (torchrun's SIGTERM after the watchdog's timeout, Ctrl-C): processes
    stopped after no progress for as long as a hang needs are placed where they were stuck, as
    `summarize` places them; those stopped at once (a healthy job cancelled) are not. Ctrl-C's spans
    stay open (`ProcessState._error`).
    """
    stopped_stuck = [
        p
        for p in members
        if ended.get(p.key) in ("terminated", "interrupted") and _stopped_stuck(p, hang_after)
    ]
    if live:
        live += [
            p
            for p in members
            if ended.get(p.key) == "interrupted" and p.open and p not in stopped_stuck
        ]
    live += stopped_stuck
    return live


def _suspected_line(source: str, verdict: _Verdict, quiet: float) -> str:
    """The frame's line for a hang suspected and not confirmed yet."""
    who = f"{source} {_ranks(verdict.ranks)}" if verdict.ranks else "every process"
    return f"{who} {verdict.where} (no progress for {quiet:,.0f} s; confirming at the next refresh)"


def _confirmation(twice: bool, proven: bool, need: float) -> list[str]:
    """The evidence that confirmed a hang before its rule's own: a second refresh, or files still
    for long enough."""
    if twice:
        return ["no progress on 2 refreshes"]
    if proven:
        return [f"files still for over twice the {need:,.0f} s a hang needs"]
    return []


def _hang_alert(
    key: tuple,
    live: list[ProcessState],
    verdict: _Verdict,
    evidence: list[str],
    now: float,
    quiet: float,
) -> Alert:
    """The ``hang`` alert of a confirmed verdict; those waiting are its victims, and its cost is
    their time lost."""
    culprits = verdict.ranks
    victims = sorted(p.rank for p in live if p.rank is not None and p.rank not in culprits)
    waiting = len(victims) if culprits else len(live)
    quiet_culprit = now - verdict.since if verdict.since is not None else quiet
    return Alert(
        "hang",
        key,
        _hang_message(live[0].source, verdict, victims),
        ranks=culprits,
        source=live[0].source,
        attempt=live[0].attempt,
        step=verdict.step,
        phase=verdict.phase,
        where=verdict.where,
        line=verdict.line,
        since=verdict.since,
        detected=now,
        victims=victims,
        evidence=evidence,
        rule=verdict.rule,
        why=verdict.why,
        cost={
            "stopped_s": round(quiet_culprit, 1),
            "ranks_waiting": waiting,
            "rank_seconds_lost": round(waiting * quiet, 1),
        },
    )


def _hang_message(source: str, verdict: _Verdict, victims: list[int]) -> str:
    """The hang alert's line: the culprits, where, by which rule, at which line, and who waits; or
    that nobody can be told."""
    culprits, where, line = verdict.ranks, verdict.where, verdict.line
    if not culprits:
        return f"hang: every process {where}; the culprit cannot be told from the records ({verdict.why})"
    # The rule's name first (the model's wording: "behind in the step", "behind in pg 1 (ranks
    # 0-3)", …), its details in `why`.
    rule = verdict.why.split(": ", 1)[0]
    return (
        f"hang: {source} {_ranks(culprits)} {where}"
        + (f", {rule}" if rule and rule not in where else "")
        + (f" at {line}" if line else "")
        + (
            f"; {len(victims)} ranks wait for {_one_or_many(culprits, 'it', 'them')}"
            if victims
            else ""
        )
    )


def _places(
    live: list[ProcessState], now: float
) -> tuple[list[ProcessState], dict[str, RankPlace]]:
    """The processes the hang rules place, and their places (label → `_place`) at watcher time
    `now`."""
    talking = [p for p in live if not p.silent]
    # Silent since init is a culprit only while the others wait for it in a collective: at start-up
    # rank 0 often logs while the others are still building the model, and that is no hang.
    placed = live if any(is_collective(_inner(p)) for p in talking) else talking
    places = {p.label: _place(p, now) for p in placed}
    if len({place.where is None for place in places.values()}) > 1:
        # Black boxes arrive rank by rank after the trigger: a rank whose box has not come yet
        # differs from the others in having no frame, not in where it is. Frames are compared only
        # once every one is in.
        for place in places.values():
            place.where = None
    return placed, places


def _located_verdict(
    first: Any,
    p: ProcessState,
    place: RankPlace,
    culprits: list[ProcessState],
    live: list[ProcessState],
    ranks: list[int],
    now: float,
    needed: float,
) -> _Verdict:
    """The verdict on culprits the rules placed (`first`, the model's first suspect, is `p`): where,
    at which line, on what evidence."""
    where, phase, step = _where_stuck(p, place, live)
    line, evidence = _box_line(culprits)
    inner = p.innermost()
    if line is None and inner is not None:
        line = inner.caller
        evidence = evidence + ["span start"]
    if first.rule in ("behind", "desync", "p2p", "no collective"):
        evidence = ["flight recorder", *[e for e in evidence if e != "flight recorder"]]
    return _Verdict(
        ranks,
        where,
        first.why,
        first.rule,
        min(q.progress_arrival or now for q in culprits),
        phase,
        step,
        line,
        evidence,
        needed,
    )


def _where_stuck(
    p: ProcessState, place: RankPlace, live: list[ProcessState]
) -> tuple[str, str, int | None]:
    """(where `p` is, in the alert's words; its phase: the span, or "between spans"; its step), and
    behind the others' step."""
    top_step = max((q.step for q in live if q.step is not None), default=None)
    inner = p.innermost()
    step = place.step if place.step is not None else p.step
    if inner is not None:
        where = f"in {inner.name}" + (f" (step {inner.step})" if inner.step is not None else "")
        phase = inner.name
    else:
        after = p.last_end or (place.last_span or {}).get("name")
        where = (
            "between spans"
            + (f", after {after}" if after else "")
            + (f" (step {step})" if step is not None else "")
        )
        phase = "between spans"
    if step is not None and top_step is not None and step < top_step:
        where += f", behind the others' step {top_step}"
    return where, phase, step


def _step_spread(procs: list[ProcessState]) -> dict[str, int] | None:
    """The steps the processes are in: {min, median, max}; None before any step."""
    steps = sorted(p.step for p in procs if p.step is not None)
    return {"min": steps[0], "median": steps[len(steps) // 2], "max": steps[-1]} if steps else None


def _time_of_last_steps(steps: list[StepFacts]) -> tuple[list[dict[str, Any]], float | None]:
    """Where the time of `steps` went, and the rate they ran at: ([{name, ms, share_pct}] of the
    top-level phases, steps/min).

    Both are of the time the steps took, on each rank's own clock: a phase's
    ``ms`` is its total over the steps divided by their number (a 260 ms
    ``gc_collect`` every 10th step is 26 ms a step), its ``share_pct`` that
    total over the steps' total (never over 100 %); the rate is the steps
    over their total time, so a pause every few steps slows it as it slows
    the job. A median of the steps that had a phase, over the median step,
    read 5,778 % for such a span, and a rate of 1 / the median step ran
    seventeen times faster than the job.

    Example:
        >>> quick = [StepFacts(step=k, begin_us=0, duration_ms=5.0, phases={"fwd": 4.0}, top={"fwd"}) for k in range(9)]
        >>> slow = StepFacts(step=9, begin_us=0, duration_ms=255.0, phases={"fwd": 4.0, "gc_collect": 250.0}, top={"fwd", "gc_collect"})
        >>> _time_of_last_steps(quick + [slow])
        ([{'name': 'gc_collect', 'ms': 25.0, 'share_pct': 83.3}, {'name': 'fwd', 'ms': 4.0, 'share_pct': 13.3}], 2000.0)
    """
    timed = [s for s in steps if s.duration_ms is not None and s.duration_ms > 0]
    total_ms = sum(s.duration_ms for s in timed)  # type: ignore[misc]  # timed: durations set
    if not timed or total_ms <= 0:
        return [], None
    phases: dict[str, float] = {}
    for s in timed:
        for name, ms in s.phases.items():
            if name in s.top:
                phases[name] = phases.get(name, 0.0) + ms
    rows = [
        {
            "name": name,
            "ms": round(ms / len(timed), 3),
            "share_pct": round(min(100.0, 100.0 * ms / total_ms), 1),
        }
        for name, ms in phases.items()
    ]
    return sorted(rows, key=lambda r: -r["ms"]), round(60_000.0 * len(timed) / total_ms, 1)


_STATE_ORDER = {
    "running": 0,
    "stalled": 1,
    "hung": 2,
    "crashed": 3,
    "interrupted": 4,
    "terminated": 5,
    "closed": 6,
    "missing": 7,
}


def _inner(p: ProcessState) -> str | None:
    inner = p.innermost()
    return inner.name if inner is not None else None


def _may_stand_out(medians: list[float | None]) -> bool:
    """Whether any rank's median could pass `model.stragglers.stands_out` against the others': a
    shortcut that skips a phase.

    The others' median, leaving any one rank out, is at least the lower
    middle value of every rank's; a rank must be `effect_bar` above it. With
    a margin (0.8 × the bar: the rule compares medians over the steps ranks
    share, a step or two fewer than each one's own), a phase where even the
    slowest rank's median is under that cannot name anybody.

    Example:
        >>> _may_stand_out([30.0] * 31 + [32.0]), _may_stand_out([30.0] * 31 + [31.0]), _may_stand_out([30.0, 40.0])
        (True, False, False)
    """
    values = sorted(m for m in medians if m is not None)
    if len(values) < MIN_MAJORITY:
        return False
    floor = values[(len(values) - 2) // 2]
    return floor <= 0 or values[-1] - floor >= 0.8 * effect_bar(floor)


def _run_anchor(procs: list[ProcessState], first: int) -> str | None:
    """`_anchor` over every process of one source and attempt, on their steps from `first` on."""
    fit = _fit(procs, first)
    return fit.anchor if fit is not None and fit.simultaneous else None


def _fit(procs: list[ProcessState], first: int) -> ClockAlignment | None:
    """`_clock_fit` over every process of one source and attempt, on their steps from `first` on."""
    by_step: dict[int, dict[str, StepFacts]] = {}
    for p in procs:
        for s in p.steps:
            if s.step >= first:
                by_step.setdefault(s.step, {})[p.key] = s
    return _clock_fit(by_step, {p.key: p.host for p in procs})


def _anchor(by_step: dict[int, dict[str, StepFacts]], hosts: dict[str, str | None]) -> str | None:
    """The step-closing collective every rank leaves at one moment, by `summarize`'s rule
    (`model.clocks.estimate_offsets`: a collective on evidence whose ends, each host's offset taken
    out, agree within `MAX_RESIDUAL_US`), or None.

    `by_step`: step → process key → its facts; `hosts`: process key → its host. A span whose ends
    agree only within milliseconds is no moment every rank shares: measured from it, a rank's
    wait would read as its work (`summarize` then withholds the verdict, and so does `watch`).
    """
    fit = _clock_fit(by_step, hosts)
    return fit.anchor if fit is not None and fit.simultaneous else None


def _clock_fit(
    by_step: dict[int, dict[str, StepFacts]], hosts: dict[str, str | None]
) -> ClockAlignment | None:
    """`model.clocks.estimate_offsets` of the step-closing spans in `by_step` (as `_anchor`), or
    None with fewer than 3 processes that closed a step."""
    spans: dict[str, ClosingSpans] = {}
    for step in sorted(by_step):
        for key, f in by_step[step].items():
            if f.closing is None or f.closing_ms is None or f.closing_end_us is None:
                continue
            own = spans.get(key)
            if own is None:
                own = spans[key] = ClosingSpans(hosts.get(key) or key, key)
            own.add(
                step, f.closing, int(f.closing_end_us - 1000.0 * f.closing_ms), f.closing_end_us
            )
    if len(spans) < 3:
        return None
    return estimate_offsets(spans.values())


@dataclass
class _Window:
    """A peer group's steps in the straggler rule's window, as `model.stragglers`' rule takes them
    (`Detector._slow_group`)."""

    #: rank (without one: -1 - its index in the group) → its process.
    by_rank: dict[int, ProcessState] = field(default_factory=dict)
    #: phase → rank → step → ms, and the same for the phase's end (µs, the rank's own clock): each
    #: rank's own window.
    times: dict[str, dict[int, dict[int, float]]] = field(default_factory=dict)
    ends: dict[str, dict[int, dict[int, int]]] = field(default_factory=dict)
    #: step → process key → its facts, for the steps of the window; their durations (ms); their
    #: top-level spans' names.
    by_step: dict[int, dict[str, StepFacts]] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    top_names: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, group: list[ProcessState], first: int, last: int, *, whole: bool) -> _Window:
        """The window from step `first` to `last` of `group`; `whole`: the rule's window is all each
        process keeps."""
        window = cls()
        ranks = [p.rank if p.rank is not None else -1 - index for index, p in enumerate(group)]
        window.by_rank = dict(zip(ranks, group))
        window._add_steps(group, first, last)
        window._add_own_windows(zip(ranks, group), first, whole)
        return window

    def _add_steps(self, group: list[ProcessState], first: int, last: int) -> None:
        """The step facts from `first` to `last`: newest first, so each process's walk stops at its
        first older step."""
        for p in group:
            for s in reversed(p.steps):
                if s.step < first:
                    break
                if s.step > last:
                    continue
                self.by_step.setdefault(s.step, {})[p.key] = s
                self.top_names |= s.top
                if s.duration_ms is not None:
                    self.step_times.append(s.duration_ms)

    def _add_own_windows(
        self, ranked: Iterable[tuple[int, ProcessState]], first: int, whole: bool
    ) -> None:
        """Each rank's own window (`ProcessState.window_times`: its last finished steps), taken as
        it is: a rank a step or two ahead of the slowest adds the steps only those ranks share."""
        for rank, p in ranked:
            for name, own in p.window_times.items():
                self.times.setdefault(name, {})[rank] = (
                    own if whole else {k: v for k, v in own.items() if k >= first}
                )
                own_ends = p.window_ends.get(name)
                if own_ends:
                    self.ends.setdefault(name, {})[rank] = (
                        own_ends if whole else {k: v for k, v in own_ends.items() if k >= first}
                    )

    def arrivals_at(self, anchor: str) -> dict[int, dict[int, tuple[int, int]]]:
        """Per rank, per step, when it entered and left the step-closing collective `anchor` (µs,
        its own clock)."""
        anchors: dict[int, dict[int, tuple[int, int]]] = {}
        for rank, p in self.by_rank.items():
            own = {
                step: (int(f.closing_end_us - 1000.0 * f.closing_ms), f.closing_end_us)
                for step, facts in self.by_step.items()
                for f in (facts.get(p.key),)
                if f is not None
                and f.closing == anchor
                and f.closing_end_us is not None
                and f.closing_ms is not None
            }
            if own:
                anchors[rank] = own
        return anchors


def _headline_stragglers(findings: Iterable[Any]) -> list[Any]:
    """The findings that raise: a ``straggler`` that reaches "Look first at" (the model's
    headline)."""
    return [f for f in findings if f.verdict == "straggler" and f.headline]


def _arrival_stragglers(
    anchor: str, anchors: dict[int, dict[int, tuple[int, int]]], common: dict[str, Any]
) -> dict[tuple[int, str], float]:
    """`model.stragglers.judge_arrival` at the step-closing collective: (rank, "arrival") → excess
    ms of the ranks it names."""
    findings, _ = judge_arrival(anchor, anchors, **common)
    return {(f.rank, "arrival"): f.cost_per_step_ms for f in _headline_stragglers(findings)}


def _whole_hosts(by_rank: dict[int, ProcessState]) -> dict[Any, list[int]]:
    """The hosts that may be slow as a whole (host → its ranks): two ranks or more on it, among
    three hosts or more."""
    hosts: dict[Any, list[int]] = {}
    for rank, p in by_rank.items():
        hosts.setdefault(p.host, []).append(rank)
    if len([h for h in hosts if h is not None]) < 3:
        return {}
    return {h: sorted(m) for h, m in hosts.items() if h is not None and len(m) >= 2}


def _units(
    found: dict[tuple[int, str], float], whole_hosts: dict[Any, list[int]]
) -> dict[tuple, tuple[list[int], float]]:
    """What is slow, (kind, unit, phase) → (ranks, excess): a host slow as a whole is one unit (its
    ranks not named one by one): at least half its ranks, two or more, found in one phase; every
    other rank found is a unit of its own."""
    units: dict[tuple, tuple[list[int], float]] = {}
    on_slow_host: set[int] = set()
    for host, members in whole_hosts.items():
        for name in {name for (_, name) in found}:
            hit = [r for r in members if (r, name) in found]
            if len(hit) >= 2 and 2 * len(hit) >= len(members):
                units[("host", host, name)] = (
                    members,
                    statistics.median(found[(r, name)] for r in hit),
                )
                on_slow_host |= set(members)
    for (rank, name), cost in found.items():
        # a slow host's ranks are named as the host, in whichever phase
        if rank not in on_slow_host:
            units[("rank", rank, name)] = ([rank], cost)
    return units


def _still_over_half_the_bar(
    held: _Held,
    ranks: list[int],
    name: str,
    excess: dict[tuple[int, str], float],
    bars: dict[str, float],
) -> float | None:
    """A raised unit's excess now (the median over its ranks) while it stays at least half the bar
    of its phase, else None."""
    kept = [excess[(r, name)] for r in ranks if (r, name) in excess]
    if held.raised and name in bars and kept and statistics.median(kept) >= 0.5 * bars[name]:
        return statistics.median(kept)
    return None


def _named_once(
    units: dict[tuple, tuple[list[int], float]],
) -> dict[tuple, tuple[list[int], float]]:
    """`units` less the ranks of a slow host (a kept alert of one of them included): the host names
    them."""
    hosted = {r for (kind, _, _), (ranks, _) in units.items() if kind == "host" for r in ranks}
    return {key: value for key, value in units.items() if key[0] == "host" or key[1] not in hosted}


def _steps_finished_since(
    live: list[ProcessState], newest: int | None, done: int
) -> dict[int, list[StepFacts]]:
    """Step → its facts on every rank, for the timed steps after `newest` (None: all kept) up to
    `done`, which every rank finished."""
    by_step: dict[int, list[StepFacts]] = {}
    for p in live:
        for s in reversed(p.steps):
            if newest is not None and s.step <= newest:
                break
            if s.step <= done and s.duration_ms is not None:
                by_step.setdefault(s.step, []).append(s)
    return by_step


def _job_evidence(
    live: list[ProcessState],
) -> tuple[dict[int, dict[int, float]], dict[str, dict[int, dict[int, float]]], str | None]:
    """What `model.job_speed.judge` reads besides the step times, from the steps the processes
    keep: rank → step → ms, phase → rank → step → ms, and the step-closing collective on evidence
    (`_anchor`, summarize's rule), never by its name."""
    per_rank: dict[int, dict[int, float]] = {}
    phases: dict[str, dict[int, dict[int, float]]] = {}
    keyed: dict[int, dict[str, StepFacts]] = {}
    for index, p in enumerate(live):
        mine = per_rank[index] = {}
        for s in p.steps:
            keyed.setdefault(s.step, {})[p.key] = s
            if s.duration_ms is not None:
                mine[s.step] = s.duration_ms
            for name, ms in s.phases.items():
                phases.setdefault(name, {}).setdefault(index, {})[s.step] = ms
    return per_rank, phases, _anchor(keyed, {p.key: p.host for p in live})


#: The step-closing moment of a run is found again after this many steps (`Detector._anchor_of`).
ANCHOR_EVERY_STEPS = 10
#: How long past its logger's heartbeat interval a heartbeat may take to reach the file: a factor
#: (the processor's next pass) and seconds (the write, the follower's next read).
HEARTBEAT_SLACK, HEARTBEAT_SLACK_S = 1.5, 2.0


def _heartbeat_due(live: list[ProcessState]) -> float | None:
    """Seconds after the last progress by which a heartbeat must have come, when none has: None
    where the rule does not apply, or someone spoke.

    A stuck process still speaks (heartbeats with spans open, its watchdog's
    black box, a stack dump); a job SIGKILLed whole (a scheduler's hard kill,
    a node agent, its hosts gone) says nothing more, and the least advanced
    rank is then only where the kill found it. Judged only where every file
    says its heartbeat interval (the opening record's; older files and other
    writers' do not) and one with spans open has a heartbeat on: between spans
    no heartbeat is written (a stall record comes, much later).
    """
    if any(p.heartbeat_s is None or p.alive_since_progress for p in live):
        return None
    due = [p.heartbeat_s for p in live if p.open and p.heartbeat_s]
    return HEARTBEAT_SLACK * max(due) + HEARTBEAT_SLACK_S if due else None


def _gone_together(live: list[ProcessState], now: float, last: float) -> _Verdict:
    """The verdict on a job whose every process ran on this host and is gone from its process
    table: nobody is named (a job killed mid-step leaves the least advanced rank only where the
    kill found it)."""
    pids = ", ".join(str(p.pid) for p in live[:4]) + (" …" if len(live) > 4 else "")
    why = (
        f"every process of the job ran on this host and none is running any more (pid {pids}); "
        f"its files stopped {now - last:,.0f} s ago without a closing record: stopped together "
        "(killed, or died at once), not stuck; nobody is named"
    )
    return _stopped_together(
        live, "stopped: its processes are gone", why, "gone", "process table", last
    )


def _stopped_at_once(live: list[ProcessState], now: float, last: float, due: float) -> _Verdict:
    """The verdict on a job whose every process fell silent at once, at watcher time `last`
    (`_heartbeat_due`): nobody is named, as `summarize` names no one (no process stuck on the
    evidence)."""
    interval = max(p.heartbeat_s or 0.0 for p in live if p.open)
    why = (
        f"no process wrote a heartbeat, a black box or any record in the {now - last:,.0f} s "
        "since its last progress, though "
        f"{sum(1 for p in live if p.open)} had spans open and write a heartbeat every "
        f"{interval:g} s while alive: stopped together "
        f"(a hard kill of the whole job, its hosts gone), not stuck; nobody is named"
    )
    return _stopped_together(
        live, "stopped writing at once", why, "stopped at once", "no heartbeat", last, due
    )


def _stopped_together(
    live: list[ProcessState],
    headline: str,
    why: str,
    rule: str,
    evidence: str,
    last: float,
    due: float = 0.0,
) -> _Verdict:
    """A verdict naming nobody on a job whose processes stopped together at watcher time `last`
    (`rule`, and the `evidence` that tells it: the process table (``gone``) or the heartbeats none
    wrote (``stopped at once``); `due`: when the latter were due), at the furthest step any
    reached."""
    top_step = max((p.step for p in live if p.step is not None), default=None)
    return _Verdict([], headline, why, rule, last, None, top_step, None, [evidence], due)


def _stopped_stuck(p: ProcessState, hang_after: float) -> bool:
    """Whether a terminated or interrupted process had made no progress for `hang_after` seconds
    when it was stopped (watcher time)."""
    end = p.signal_arrival if p.signal is not None else p.crash_arrival
    return (
        end is not None
        and p.progress_arrival is not None
        and end - p.progress_arrival >= hang_after
    )


def _stuck(p: ProcessState, now: float) -> bool:
    """Stuck on evidence, by `summarize`'s rule (`model.hang.stuck_reason`) on what the records
    read so far say at watcher time `now`: its file quiet since its last record.

    A process killed mid-step leaves the same files as a hung one, less this evidence: torchtitan's
    and pimm's files write no heartbeat, so a job killed whole is not a hang with a culprit.
    """
    last = p.last_arrival
    return (
        stuck_reason(
            quiet=p.quiet_since_progress,
            silent=p.silent,
            alive_here=p.alive_here,
            quiet_s=None if last is None else now - last,
        )
        is not None
    )


def _place(p: ProcessState, now: float) -> RankPlace:
    """Where a stopped process is, as `summarize`'s Hang section places it (`model.hang.RankPlace`),
    from the records read so far at watcher time `now`.

    Stuck only on evidence (`_stuck`), as `summarize` places it. Its live
    black box (no program record after it) gives the frame, the flight
    recorder's digest and, between spans, the step it set.
    """
    box = p.black_box if p.box_live else None
    digest = box.digest if box is not None else None
    inner = p.innermost()
    between, step, entered, complete = place_in_step(
        digest, p.step, list(p.entered), True, bool(p.open)
    )
    if box is None:
        evidence = "records only"
    elif box.reason == "faulthandler":
        evidence = "faulthandler (interpreter lock held)"
    else:
        evidence = f"black box ({box.reason})"
    span = inner.name if inner is not None else (digest or {}).get("span")
    place = RankPlace(
        p.label,
        p.source,
        p.rank,
        p.attempt,
        "hung before first record" if p.silent else "stalled",
        None if between else span,
        box.frame if box is not None else None,
        evidence,
        None,
        [],
        step,
        between,
        (digest or {}).get("last_span") if between else None,
        entered,
        complete,
        _stuck(p, now),
        seen_alive(
            quiet=p.quiet_since_progress,
            box_us=box.time_us if box is not None else None,
            last_us=p.last_us,
        ),
        p.last_program_us,
    )
    place.fr = (digest or {}).get("fr")  # type: ignore[misc]  # per instance, as `model.hang.build_hang` sets it
    place.seen = frozenset(p.span_max_ms)  # type: ignore[misc]  # the spans it ran: rank 0's own work is not one it missed
    place.steps_begun = p.steps_seen  # type: ignore[misc]  # per instance, as `fr`
    place.seen_whole = True  # type: ignore[misc]  # followed from its first record
    return place


def _box_line(culprits: list[ProcessState]) -> tuple[str | None, list[str]]:
    """The culprit's line of code from a black box written since its last progress, and the evidence
    named.

    A box without a frame of the program's own (the watchdog's, with no
    stacks) still backs the verdict: the process itself says it is stalled, and where.
    """
    boxed = [p for p in culprits if p.black_box is not None and p.box_live]
    for p in boxed:
        box = p.black_box
        if box is not None and box.frame:
            return box.frame, ["black box"] + (["flight recorder"] if box.flight_recorder else [])
    if boxed:
        return None, ["black box"] + (
            ["flight recorder"]
            if any(p.black_box.flight_recorder for p in boxed if p.black_box)
            else []
        )
    return None, []


def _utc(seconds: float) -> str:
    import datetime

    return (
        datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )
