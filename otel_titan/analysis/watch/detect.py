"""The live detector: records in, a frame and alerts out; a pure function of what was read and when.

`Detector.observe` feeds it the records one refresh brought (with the
watcher's time of reading); `Detector.evaluate(now)` says, from those alone,
what every process is doing and which alerts hold. Nothing here reads a file
or a clock, so a run can be replayed faster than real time (`replay`) and a
false alarm counted, and the live `watch` gives the same answers.

The rules (docs/watch.md says them for users):

* **hang** (per source): no process of the current attempt made progress
  (ended a span, began a step) for ``hang_after = max(hang_floor_s,
  hang_steps × median step time)``. The culprit, in this order: a rank of
  ``world_size`` with no file (missing, once the run is ``missing_grace_s``
  old); a process with no record since init while the others wait in a
  collective (silent); a process that is *not* waiting in a collective while
  the others are (in another span, or between spans: the others wait for
  it); a process behind the others' step. Those waiting in the collective are
  the victims, never named. A culprit in a span it has finished before must
  have been in it longer than ``3 ×`` its longest finished duration; in a span
  never seen to finish, at least ``unknown_span_s``; between spans, ``3 ×``
  its longest gap between records. When every process is in the same place,
  the flight recorders of their black boxes may name a minority behind on the
  default process group; otherwise nobody is blamed: after ``3 ×`` that
  span's learned duration (``shared_pause_s`` when never seen) the alert says
  the job is stuck there and that the culprit cannot be told from the records.
  Confirmed on a second evaluation, or at once by the culprit's black box.
* **slow**: a rank (or a whole host, as one unit) whose phase time over the
  last ``window`` steps rose by ``0.75 × slow_pct`` % against both its own
  earlier steps and its peers' (ranks with the same mesh coordinates but data
  parallel), at least 3.5 × the peers' spread and 1 % of the step, for
  ``sustain_steps`` steps; or one that arrives last at the step-closing
  collective by as much of the step (lateness on each rank's own clock: the
  others' wait minus its own). Its cost: what every rank waits for it per
  step, in ms and % of the step, and seconds so far.
* **job_slow** (per source): the step time (per token where logged) over
  twice the window ``0.75 × slow_pct`` % above its own earlier steps and 3.5 ×
  their spread, sustained, with the phase that grew on most ranks.
* **crashed** (a torn last line that stays, or stopped silent while the others
  were sent SIGTERM), **terminated** (SIGTERM received), **missing** (ranks of
  ``world_size`` with no file after ``missing_grace_s``).

To unify with the after-the-fact rules (issue 19's ``model/``): the step
definition (first record of step N to first record of step N + 1, as
`model.collect`), the step-closing collective (the last top-level span of a step,
as `model.clocks`), the collective names (`state.is_collective`; `model.collect`
has no such list), the straggler thresholds (`model.stragglers.MIN_EFFECT`,
`MIN_Z`, `MIN_STEP_SHARE` here re-expressed for a sliding window) and the
hang culprit order (`hang.py`). The mesh grouping is already shared: the
``mesh`` field read by `read.records.read_mesh`, peers by `model.stragglers.peer_key`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable

from otel_titan.analysis.model.headline import compress as compress_ranks
from otel_titan.analysis.watch.alerts import Alert, AlertBook
from otel_titan.analysis.watch.state import ProcessState, StepFacts, is_collective
from otel_titan.analysis.model.rules import MAD_TO_SD as _MAD_TO_SD, MEDIAN_SE
from otel_titan.analysis.model.stragglers import peer_key

__all__ = ["Detector", "Rules"]



@dataclass
class Rules:
    """The detector's thresholds (docs/watch.md); the defaults are those of the issue's targets."""

    hang_floor_s: float = 8.0
    hang_steps: float = 2.0
    unknown_span_s: float = 30.0
    shared_pause_s: float = 300.0
    stall_floor_s: float = 3.0
    confirm_evaluations: int = 2
    crash_after_s: float = 5.0
    missing_grace_s: float = 30.0
    slow_pct: float = 10.0
    slow_min_z: float = 3.5
    slow_min_step_share: float = 0.01
    window: int = 10
    baseline: int = 32
    sustain_steps: int = 5


@dataclass
class _Suspect:
    key: tuple
    seen: int
    first: float


@dataclass
class _Held:
    since_step: int
    since_time: float
    excess_ms: float = 0.0
    raised: bool = False


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
        self.first_arrival: float | None = None
        #: Set when a hang is first suspected: the caller asks the ranks for their black box (trigger file) once.
        self.want_black_box = False
        self._asked_for: dict[Any, tuple] = {}
        #: A hang suspected at the last evaluation and not confirmed yet (one line), else None.
        self.suspected: str | None = None

    # -- input ---------------------------------------------------------------------------------
    def observe(self, key: str, identity: dict[str, Any], records: Iterable[dict[str, Any]], arrival: float) -> ProcessState:
        """Apply the records of process `key` read at watcher time `arrival`; `identity`: label, source, rank, attempt, … (first seen)."""
        process = self.processes.get(key)
        if process is None:
            process = self.processes[key] = ProcessState(key, **{k: identity.get(k) for k in ("label", "source", "rank", "attempt", "run_id", "host", "world_size", "pid")})
            process.first_arrival = arrival
            process.progress_arrival = arrival
        if self.first_arrival is None:
            self.first_arrival = arrival
        for record in records:
            process.apply(record, arrival)
        return process

    def file_facts(self, key: str, *, torn_since: float | None, gone: bool) -> None:
        """What the follower knows of a process's file and its records do not say."""
        process = self.processes.get(key)
        if process is not None:
            process.torn_since, process.gone = torn_since, gone

    # -- output --------------------------------------------------------------------------------
    def current(self) -> list[ProcessState]:
        """The processes of the run being watched: the latest run id, and per source its latest attempt."""
        if not self.processes:
            return []
        runs: dict[Any, float] = {}
        for p in self.processes.values():
            runs[p.run_id] = min(runs.get(p.run_id, p.first_arrival or 0.0), p.first_arrival or 0.0)
        run = max(runs, key=lambda r: runs[r])
        latest: dict[str, int] = {}
        for p in self.processes.values():
            if p.run_id == run:
                latest[p.source] = max(latest.get(p.source, -1), p.attempt or 0)
        return [p for p in self.processes.values() if p.run_id == run and (p.attempt or 0) == latest[p.source]]

    def evaluate(self, now: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(the frame, the alert / resolved events) at watcher time `now`."""
        procs = self.current()
        rules = self.rules
        step_ms = self._median_step_ms(procs)
        hang_after = max(rules.hang_floor_s, rules.hang_steps * step_ms / 1000.0 if step_ms else 0.0)
        alerts: list[Alert] = []
        ended = self._ended(procs, now)
        live = [p for p in procs if ended.get(p.key) is None]
        alerts.extend(self._ended_alerts(procs, ended, now))
        missing = self._missing(procs)
        if missing and self.first_arrival is not None and now - self.first_arrival >= rules.missing_grace_s:
            for source, attempt, ranks, world in missing:
                alerts.append(Alert("missing", ("missing", source, attempt), f"{source}: {len(ranks)} of {world} ranks have no file ({compress_ranks(ranks)})",
                                    ranks=ranks, source=source, attempt=attempt, detected=now, since=self.first_arrival,
                                    cost={"ranks": len(ranks)}, evidence=["world_size"]))
        # A crash explains the stop that follows it: the crashed alert names the rank, no hang is raised on top.
        # Each source (trainer, rollouter, reward, …) is judged on its own: a rollouter idle between spans is
        # not the culprit of trainers waiting in their all_reduce.
        hung_keys: set[str] = set()
        self.suspected = None
        suspected = []
        for source in sorted({p.source for p in procs}):
            members = [p for p in procs if p.source == source]
            if any(ended.get(p.key) == "crashed" for p in members):
                self._suspects.pop(source, None)
                continue
            source_live = [p for p in live if p.source == source]
            source_step = self._median_step_ms(members)
            source_after = max(rules.hang_floor_s, rules.hang_steps * source_step / 1000.0 if source_step else 0.0)
            hang = self._hang(source_live, missing, now, source_after)
            if self.suspected:
                suspected.append(self.suspected)
            if hang is not None:
                alerts.append(hang)
                hung = {p.key for p in source_live if p.rank in hang.ranks} if hang.ranks else {p.key for p in source_live}
                hung_keys |= hung
        self.suspected = "; ".join(suspected) or None
        slow_ran = self._slow(live, now, step_ms)
        alerts.extend(self._slow_alerts)
        keep = set() if slow_ran else {k for k in self.book.active if k[0] in ("slow", "job_slow")}
        raised, resolved = self.book.update(alerts, now, keep_keys=keep)
        events = [a.to_json("alert") for a in raised] + [a.to_json("update") for a in self.book.updated] + [a.to_json("resolved") for a in resolved]
        frame = self._frame(procs, ended, hung_keys, missing, now, step_ms, hang_after)
        return frame, events

    # -- states --------------------------------------------------------------------------------
    def _ended(self, procs: list[ProcessState], now: float) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        terminated_at = [p.signal_arrival for p in procs if p.signal is not None and p.signal_arrival is not None]
        first_term = min(terminated_at) if terminated_at else None
        for p in procs:
            state = p.ended()
            if state == "crashed" and now - (p.torn_since or now) < self.rules.crash_after_s:
                state = None  # a partial line is a write in progress until it has sat there a while
            if state is None and first_term is not None and (p.last_arrival or 0.0) <= first_term:
                # Others were sent SIGTERM (torchrun's agent does so when a worker dies); this one wrote nothing
                # since, not even its SIGTERM record: it is the one that died.
                if first_term is not None and now - first_term >= 2.0:
                    state = "crashed"
            out[p.key] = state
        return out

    def _ended_alerts(self, procs: list[ProcessState], ended: dict[str, str | None], now: float) -> list[Alert]:
        alerts = []
        for kind in ("crashed", "terminated"):
            members = [p for p in procs if ended.get(p.key) == kind]
            if not members:
                continue
            by_source: dict[tuple, list[ProcessState]] = {}
            for p in members:
                by_source.setdefault((p.source, p.attempt), []).append(p)
            for (source, attempt), group in by_source.items():
                ranks = sorted(p.rank for p in group if p.rank is not None)
                last = max(group, key=lambda p: p.last_arrival or 0.0)
                since = min((p.torn_since if kind == "crashed" and p.torn_since else (p.signal_arrival if kind == "terminated" else p.last_arrival)) or now for p in group)
                where = last.innermost().name if last.innermost() else None
                alerts.append(Alert(kind, (kind, source, attempt), f"{source} {'rank' if len(ranks) == 1 else 'ranks'} {compress_ranks(ranks)} {kind}"
                                    + (f" at step {last.step}" if last.step is not None else "") + (f" in {where}" if where else ""),
                                    ranks=ranks, source=source, attempt=attempt, step=last.step, phase=where, detected=now, since=since,
                                    cost={"ranks": len(ranks)}, evidence=["torn last line" if kind == "crashed" and last.torn_since else "records"]))
        return alerts

    def _missing(self, procs: list[ProcessState]) -> list[tuple[str, int | None, list[int], int]]:
        out = []
        groups: dict[tuple, list[ProcessState]] = {}
        for p in procs:
            groups.setdefault((p.source, p.attempt), []).append(p)
        for (source, attempt), group in groups.items():
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
        values = [s.duration_ms for p in procs for s in list(p.steps)[-self.rules.window:] if s.duration_ms is not None]
        return statistics.median(values) if values else None

    # -- hang ----------------------------------------------------------------------------------
    def _hang(self, live: list[ProcessState], missing: list, now: float, hang_after: float) -> Alert | None:
        rules = self.rules
        self.suspected = None
        if not live:
            return None
        source = live[0].source
        last_progress = max(p.progress_arrival or 0.0 for p in live)
        quiet = now - last_progress
        if quiet < hang_after:
            self._suspects.pop(source, None)
            return None
        candidate = self._culprits(live, missing, now, hang_after)
        if candidate is None:
            self._suspects.pop(source, None)
            return None
        culprits, where, reason, since, phase, step, line, evidence = candidate
        key = ("hang", live[0].source, live[0].attempt)
        ident = (key, tuple(culprits))
        suspect = self._suspects.get(source)
        if suspect is None or suspect.key != ident:
            suspect = self._suspects[source] = _Suspect(ident, 0, now)
        suspect.seen += 1
        if self._asked_for.get(source) != ident:
            self._asked_for[source] = ident
            self.want_black_box = True
        backed = "black box" in evidence or "flight recorder" in evidence
        confirmed = suspect.seen >= rules.confirm_evaluations or backed
        if not confirmed and key not in self.book.active:
            # Shown in the frame (a `--once` sees it), raised as an alert on the next refresh.
            who = f"{live[0].source} {'rank' if len(culprits) == 1 else 'ranks'} {compress_ranks(culprits)}" if culprits else "every process"
            self.suspected = f"{who} {where} (no progress for {quiet:,.0f} s; confirming at the next refresh)"
            return None
        if suspect.seen >= rules.confirm_evaluations:
            evidence = ["no progress on 2 refreshes", *evidence]
        victims = sorted(p.rank for p in live if p.rank is not None and p.rank not in culprits)
        waiting = len(victims) if culprits else len(live)
        quiet_culprit = now - since if since is not None else quiet
        label = compress_ranks(culprits) if culprits else None
        if culprits:
            message = f"hang: {live[0].source} {'rank' if len(culprits) == 1 else 'ranks'} {label} {where}" + (f" at {line}" if line else "") + (
                f"; {len(victims)} ranks wait for {'it' if len(culprits) == 1 else 'them'}" if victims else "")
        else:
            message = f"hang: every process {where}; the culprit cannot be told from the records ({reason})"
        return Alert("hang", key, message, ranks=culprits, source=live[0].source, attempt=live[0].attempt, step=step, phase=phase, where=where,
                     line=line, since=since, detected=now, victims=victims, evidence=evidence,
                     cost={"stopped_s": round(quiet_culprit, 1), "ranks_waiting": waiting, "rank_seconds_lost": round(waiting * quiet, 1)})

    def _culprits(self, live: list[ProcessState], missing: list, now: float, hang_after: float):
        """(culprit ranks, where, reason, since, phase, step, line, evidence) or None when not (yet) a hang."""
        rules = self.rules
        source_missing = [m for m in missing if m[0] == live[0].source]
        if source_missing:
            # A rank slow to start (imports, a checkpoint read before init) is not missing at once.
            if self.first_arrival is None or now - self.first_arrival < rules.missing_grace_s:
                return None
            ranks = source_missing[0][2]
            return ranks, "has no file (never reached init_structured_logger)", "missing", self.first_arrival, None, None, None, ["world_size"]
        talking = [p for p in live if not p.silent]
        silent = [p for p in live if p.silent]
        # Silent since init is a culprit only while the others wait for it in a collective: at start-up rank 0
        # often logs while the others are still building the model, and that is no hang.
        if silent and any(is_collective(_inner(p)) for p in talking):
            ranks = sorted(p.rank for p in silent if p.rank is not None)
            bb = _box_line(silent)
            return ranks, "has written no record since init", "silent", min(p.first_arrival or now for p in silent), None, None, bb[0], bb[1]
        top_step = max((p.step for p in live if p.step is not None), default=None)
        waiting = [p for p in live if is_collective(_inner(p))]
        others = [p for p in live if not is_collective(_inner(p))]
        if waiting and others:
            culprits = others
        elif top_step is not None:
            behind = [p for p in live if p.step is not None and p.step < top_step]
            culprits = behind if behind and len(behind) < len(live) / 2 else []
        else:
            culprits = []
        if culprits:
            # Each culprit must have been where it is longer than it ever took there before.
            for p in culprits:
                inner = p.innermost()
                stuck = now - (p.progress_arrival or now)
                if inner is None:
                    need = max(hang_after, 3.0 * p.gap_max_ms / 1000.0)
                elif inner.name in p.span_max_ms or any(inner.name in q.span_max_ms for q in live[:64]):
                    learned = max([p.span_max_ms.get(inner.name, 0.0)] + [q.span_max_ms.get(inner.name, 0.0) for q in live[:64]])
                    need = max(hang_after, 3.0 * learned / 1000.0)
                else:
                    need = max(hang_after, rules.unknown_span_s)
                if stuck < need:
                    return None
            ranks = sorted(p.rank for p in culprits if p.rank is not None)
            first = culprits[0]
            inner = first.innermost()
            if inner is not None:
                where = f"in {inner.name}" + (f" (step {inner.step})" if inner.step is not None else "")
                phase = inner.name
            else:
                where = "between spans" + (f", after {first.last_end}" if first.last_end else "") + (f" (step {first.step})" if first.step is not None else "")
                phase = "between spans"
            if first.step is not None and top_step is not None and first.step < top_step:
                where += f", behind the others' step {top_step}"
            line, evidence = _box_line(culprits)
            if line is None and inner is not None:
                line = inner.caller
                evidence = evidence + ["span start"]
            return ranks, where, "outside the collective the others wait in", min(p.progress_arrival or now for p in culprits), phase, first.step, line, evidence
        # Every process in the same place: a shared pause, or a collective that never completes. The flight
        # recorder can still tell: on the default process group (every rank is a member, so ranks compare by
        # sequence number without knowing the group layout) the rank that enqueued fewer collectives is behind.
        behind = _behind_in_default_group(live)
        if behind:
            ranks, low, high = behind
            members = [p for p in live if p.rank in ranks]
            line, evidence = _box_line(members)
            where = f"behind in process group 0 (its last collective is #{low}, the others' #{high})"
            return ranks, where, "behind in a process group", min(p.progress_arrival or now for p in members), _inner(members[0]), members[0].step, line, ["flight recorder", *evidence]
        names = {(_inner(p)) for p in live}
        name = next(iter(names)) if len(names) == 1 else None
        learned = max((p.span_max_ms.get(name, 0.0) for p in live[:64]), default=0.0) if name else 0.0
        need = max(hang_after, 3.0 * learned / 1000.0) if learned else max(hang_after, rules.shared_pause_s)
        if now - max(p.progress_arrival or now for p in live) < need:
            return None
        where = f"waits in {name}" if name else "is stopped in different places"
        evidence = ["black box"] if any(p.black_box is not None and p.black_box.arrival >= (p.progress_arrival or 0.0) for p in live) else []
        return [], where, "no process stands out: look at the network, the collective library, or the black boxes", max(p.progress_arrival or now for p in live), name, top_step, None, evidence

    # -- slow ----------------------------------------------------------------------------------
    def _slow(self, live: list[ProcessState], now: float, step_ms: float | None) -> bool:
        """Update `_slow_alerts` when a peer group finished a new step; False when nothing new was computed."""
        rules = self.rules
        groups: dict[tuple, list[ProcessState]] = {}
        for p in live:
            if p.steps:
                groups.setdefault((p.source, p.attempt, peer_key(p.coords)), []).append(p)
        ran = False
        alerts: list[Alert] = []
        for gkey, group in groups.items():
            last = min(p.steps[-1].step for p in group)
            if self._last_slow_step.get(gkey) == last:
                alerts.extend(a for a in self._slow_alerts if a.key[1] == gkey)
                continue
            self._last_slow_step[gkey] = last
            ran = True
            alerts.extend(self._slow_group(gkey, group, last, now))
        for source in sorted({p.source for p in live}):
            job = self._job_slow([p for p in live if p.source == source], now)
            if job is not None:
                alerts.append(job)
        self._slow_alerts = alerts
        return True

    def _slow_group(self, gkey: tuple, group: list[ProcessState], last: int, now: float) -> list[Alert]:
        """Slow ranks and hosts of one peer group at its newest common step `last`."""
        rules = self.rules
        if len(group) < 3:
            return []  # with fewer than 3 ranks there is no majority to call one abnormal
        window, baseline = rules.window, rules.baseline
        series: dict[str, dict[str, list[float]]] = {}
        by_step: dict[int, dict[str, StepFacts]] = {}
        step_times: list[float] = []
        top_names: set[str] = set()
        for p in group:
            for s in list(p.steps)[-window:]:
                if s.step > last:
                    continue
                by_step.setdefault(s.step, {})[p.key] = s
                top_names |= s.top
                if s.duration_ms is not None:
                    step_times.append(s.duration_ms)
            # The phases' series end at the rank's newest step; `last` is at most a step or two behind it.
            series[p.key] = {name: list(values)[-(window + baseline):] for name, values in p.series.items()}
        if not step_times:
            return []
        step_med = statistics.median(step_times)
        # Arrival lateness per step, on each rank's own clock: the others' median wait minus its own.
        for step, facts in by_step.items():
            waits = [f.closing_ms for f in facts.values() if f.closing_ms is not None]
            if len(waits) < 3:
                continue
            mid = statistics.median(waits)
            for key, f in facts.items():
                if f.closing_ms is not None:
                    series[key].setdefault("arrival", []).append(mid - f.closing_ms)
        hosts: dict[Any, list[ProcessState]] = {}
        for p in group:
            hosts.setdefault(p.host, []).append(p)
        whole_hosts = {h: members for h, members in hosts.items() if h is not None and len(members) >= 2} if len([h for h in hosts if h is not None]) >= 3 else {}
        names = {name for per in series.values() for name in per}
        findings: list[tuple[str, Any, list[ProcessState], str, float]] = []  # (unit kind, unit, members, phase, excess)
        host_flagged: set = set()
        for name in sorted(names, key=lambda n: n == "arrival"):
            recent: dict[str, float] = {}
            past: dict[str, float] = {}
            need = max(3, window // 2) if name == "arrival" else window
            for p in group:
                values = series.get(p.key, {}).get(name)
                if not values or len(values) < need:
                    continue
                recent[p.key] = statistics.median(values[-window:])
                if len(values) >= 2 * window:
                    past[p.key] = statistics.median(values[:-window])
            if len(recent) < 3:
                continue
            if whole_hosts:
                # A host as one unit: its ranks' median against the other hosts'.
                h_recent = {h: statistics.median(recent[p.key] for p in m if p.key in recent) for h, m in whole_hosts.items() if any(p.key in recent for p in m)}
                h_past = {h: statistics.median(past[p.key] for p in m if p.key in past) for h, m in whole_hosts.items() if any(p.key in past for p in m)}
                for host, excess in self._judge(("host", gkey), h_recent, h_past, name, step_med, last, now):
                    findings.append(("host", host, whole_hosts[host], name, excess))
                    host_flagged.add(host)
            for key, excess in self._judge(("rank", gkey), recent, past, name, step_med, last, now):
                findings.append(("rank", key, [self.processes[key]], name, excess))
        # A host slow as a whole is one finding: its ranks are not named one by one besides.
        findings = [f for f in findings if f[0] == "host" or f[2][0].host not in host_flagged]
        # One alert per unit: the one already raised (stable), else the innermost phase (fwd, not the fwd_bwd
        # around it), else the largest; a rank's arrival only when no phase of its own explains it.
        best: dict[tuple, tuple] = {}
        for kind, unit, members, name, excess in findings:
            ukey = (kind, unit)
            active = self._alert_key(gkey, kind, unit, members, name) in self.book.active
            order = (active, name != "arrival", name not in top_names, excess)
            if ukey not in best or order > best[ukey][0]:
                best[ukey] = (order, kind, unit, members, name, excess)
        alerts = []
        for _, kind, unit, members, name, excess in best.values():
            alerts.append(self._slow_alert(gkey, kind, unit, members, name, excess, step_med, last, now))
        return alerts

    def _judge(self, scope: tuple, recent: dict[Any, float], past: dict[Any, float], name: str, step_med: float, last: int, now: float) -> list[tuple[Any, float]]:
        """Units (ranks or hosts) slow in `name`, held for `sustain_steps` (or already raised): [(unit, excess ms)].

        Raise: ``0.75 × slow_pct`` above both its own past and the peers' median (a median of a few noisy steps
        understates a +10 % rise half the time), at least ``slow_min_z`` × the peers' spread and
        ``slow_min_step_share`` of the step. Keep while ``0.5 × slow_pct`` above the peers.
        """
        rules = self.rules
        ordered = sorted(recent.values())
        peers = statistics.median(ordered)
        spread = _MAD_TO_SD * statistics.median(abs(v - peers) for v in ordered)
        arrival = name == "arrival"
        # Lateness is ~0 for everyone but the late one: its yardstick is the step, not the peers' lateness.
        yardstick = step_med if arrival else peers
        raise_at = 0.75 * rules.slow_pct / 100.0 * yardstick
        out = []
        for unit, r in recent.items():
            excess = r - peers
            hkey = (scope, unit, name)
            held = self._held.get(hkey)
            if held is not None and held.raised:
                hold = excess >= 0.5 * rules.slow_pct / 100.0 * yardstick
            else:
                # Its own past is asked only to start: once the rise is seen, the slow steps entering its past must not undo it.
                own = past.get(unit)
                rose = held is not None or (own is not None and (r - own >= raise_at if arrival else r >= own + raise_at))
                hold = (yardstick > 0 and rose and excess >= raise_at and excess >= rules.slow_min_z * max(spread, 0.005 * yardstick)
                        and excess >= rules.slow_min_step_share * step_med)
            if not hold:
                self._held.pop(hkey, None)
                continue
            if held is None:
                held = self._held[hkey] = _Held(last, now)
            held.excess_ms = excess
            if held.raised or last - held.since_step >= rules.sustain_steps:
                held.raised = True
                out.append((unit, excess))
        return out

    @staticmethod
    def _alert_key(gkey: tuple, kind: str, unit: Any, members: list[ProcessState], name: str) -> tuple:
        return ("slow", gkey, unit if kind == "host" else members[0].rank, name)

    def _slow_alert(self, gkey: tuple, kind: str, unit: Any, members: list[ProcessState], name: str, excess: float, step_med: float, last: int, now: float) -> Alert:
        held = self._held.get((("host" if kind == "host" else "rank", gkey), unit, name))
        since_step = held.since_step - self.rules.window // 2 if held else last
        steps = max(1, last - since_step)
        p = members[0]
        ranks = sorted(m.rank for m in members if m.rank is not None)
        what = f"host {unit} (ranks {compress_ranks(ranks)})" if kind == "host" else f"{p.source} rank {p.rank}" + (f" on {p.host}" if p.host else "")
        phase = "arrives last at the step-closing collective" if name == "arrival" else name
        pct = 100.0 * excess / step_med if step_med else 0.0
        message = f"slow: {what}: {phase} +{excess:,.1f} ms a step ({pct:.1f}% of the step; every rank waits for it)"
        return Alert("slow", self._alert_key(gkey, kind, unit, members, name), message, ranks=ranks, source=p.source, attempt=p.attempt,
                     host=unit if kind == "host" else p.host, step=last, phase=name, where=phase, since=held.since_time if held else now, detected=now,
                     evidence=["collective wait (own clock)" if name == "arrival" else "phase times"],
                     cost={"ms_per_step": round(excess, 3), "pct_of_step": round(pct, 2), "seconds_so_far": round(excess * steps / 1000.0, 2), "steps": steps})

    def _job_slow(self, live: list[ProcessState], now: float) -> Alert | None:
        rules = self.rules
        if len(live) < 2:
            return None
        # Per step, the median over ranks of its time (per token where logged): computed once, when every rank finished it.
        done = min(p.steps[-1].step for p in live if p.steps) if all(p.steps for p in live) else None
        if done is None:
            return None
        source = live[0].source
        cache = self._job_steps_by.setdefault(source, {})
        if cache and next(iter(cache.values()))[1] != live[0].attempt:
            cache.clear()
        newest = max(cache) if cache else None
        by_step: dict[int, list[StepFacts]] = {}
        for p in live:
            for s in reversed(p.steps):
                if newest is not None and s.step <= newest:
                    break
                if s.step <= done and s.duration_ms is not None:
                    by_step.setdefault(s.step, []).append(s)
        for k in sorted(by_step):
            values = [s.duration_ms / s.tokens if s.tokens else s.duration_ms for s in by_step[k]]  # type: ignore[operator]
            cache[k] = (statistics.median(values), live[0].attempt, bool(by_step[k][0].tokens))
        while len(cache) > 4 * (2 * rules.window + rules.baseline):
            del cache[min(cache)]
        steps = sorted(cache)
        medians = [cache[k][0] for k in steps]
        window = 2 * rules.window  # the job's own past is the only yardstick: a longer window, less noise
        if len(medians) < window + rules.baseline // 2:
            return None
        recent = statistics.median(medians[-window:])
        past = medians[-(window + rules.baseline):-window]
        base = statistics.median(past)
        # Steps vary together (sequence lengths, rollouts): the rise must stand out of the job's own step-to-step spread.
        noise = _MAD_TO_SD * statistics.median(abs(v - base) for v in past) * MEDIAN_SE / window ** 0.5
        active = ("job_slow", source, live[0].attempt) in self.book.active
        grew = recent >= base * (1 + (0.5 if active else 0.75) * rules.slow_pct / 100.0) and (active or recent - base >= rules.slow_min_z * noise)
        if grew and not active:
            # Every rank slower: not one straggler that everyone waits for (that is a `slow` alert).
            if any(a.kind == "slow" and a.source == source for a in self.book.active.values()):
                grew = False
        if not grew:
            self._job_held_by.pop(source, None)
            return None
        last = steps[-1]
        held = self._job_held_by.get(source)
        if held is None:
            held = self._job_held_by[source] = _Held(last, now)
        if last - held.since_step < rules.sustain_steps and not active:
            return None
        # The phase that grew on most ranks: the median over ranks of each rank's own growth.
        by_step = {}
        for p in live:
            for s in p.steps:
                by_step.setdefault(s.step, []).append(s)
        recent_steps = [k for k in steps[-window:] if k in by_step]
        past_steps = [k for k in steps[-(window + rules.baseline):-window] if k in by_step]
        growth: dict[str, float] = {}
        names = {n for k in recent_steps for s in by_step[k] for n in s.phases}
        for name in names:
            if is_collective(name):
                # A collective grows on every rank when one rank is late: count only its floor, the last arrival's wait.
                r = [min(s.phases.get(name, 0.0) for s in by_step[k]) for k in recent_steps]
                b = [min(s.phases.get(name, 0.0) for s in by_step[k]) for k in past_steps]
            else:
                r = [s.phases.get(name, 0.0) for k in recent_steps for s in by_step[k]]
                b = [s.phases.get(name, 0.0) for k in past_steps for s in by_step[k]]
            if r and b:
                growth[name] = statistics.median(r) - statistics.median(b)
        phase = max(growth, key=growth.__getitem__) if growth else None
        if phase is not None and growth[phase] <= 0:
            phase = None
        excess = recent - base
        pct = 100.0 * excess / base if base else 0.0
        steps_so_far = max(1, last - held.since_step + window // 2)
        message = f"job slower: step time +{pct:.0f}% ({base:,.1f} → {recent:,.1f} ms{' per token' if cache[last][2] else ''})" + (f"; {phase} grew most (+{growth[phase]:,.1f} ms)" if phase else "")
        return Alert("job_slow", ("job_slow", live[0].source, live[0].attempt), message, ranks=[], source=live[0].source, attempt=live[0].attempt, step=last,
                     phase=phase, since=held.since_time, detected=now, evidence=["step times"],
                     cost={"ms_per_step": round(excess, 3), "pct_of_step": round(pct, 2), "seconds_so_far": round(excess * steps_so_far / 1000.0, 2)})

    # -- the frame -----------------------------------------------------------------------------
    def _frame(self, procs: list[ProcessState], ended: dict[str, str | None], hung: set[str], missing: list, now: float, step_ms: float | None, hang_after: float) -> dict[str, Any]:
        rules = self.rules
        stall_s = max(rules.stall_floor_s, 1.5 * step_ms / 1000.0 if step_ms else 0.0)
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
        steps = sorted(p.step for p in procs if p.step is not None)
        world = max((p.world_size or 0 for p in procs), default=0) or None
        recent = [s for p in procs for s in list(p.steps)[-rules.window:]]
        phases: dict[str, list[float]] = {}
        for s in recent:
            for name, ms in s.phases.items():
                if name in s.top:
                    phases.setdefault(name, []).append(ms)
        phase_rows = sorted(({"name": n, "ms": round(statistics.median(v), 3), "share_pct": round(100.0 * statistics.median(v) / step_ms, 1) if step_ms else None} for n, v in phases.items()), key=lambda r: -r["ms"])
        last_arrivals = self._last_arrivals(procs)
        first = min((p.first_arrival or now for p in procs), default=now)
        rate = None
        if step_ms:
            rate = round(60_000.0 / step_ms, 1)
        run_id = procs[0].run_id if procs else None
        return {
            "type": "frame",
            "time_utc": _utc(now),
            "run_id": run_id,
            "attempt": procs[0].attempt if procs else None,
            "age_s": round(now - first, 1),
            "processes": len(procs),
            "world_size": world,
            "states": dict(sorted(states.items(), key=lambda kv: _STATE_ORDER.get(kv[0], 99))),
            "ranks_by_state": {k: compress_ranks(sorted(v)) for k, v in rank_states.items() if k != "running"},
            "steps": {"min": steps[0], "median": steps[len(steps) // 2], "max": steps[-1]} if steps else None,
            "step_ms": None if step_ms is None else round(step_ms, 3),
            "steps_per_min": rate,
            "phases": phase_rows[:8],
            "last_arrivals": last_arrivals,
            "hang_after_s": round(hang_after, 1),
            "suspected_hang": self.suspected,
            "alerts": [a.to_json("alert") for a in self.book.newest_first()],
            "resolved": [a.to_json("resolved") for a in reversed(self.book.history[-5:])],
        }

    def _last_arrivals(self, procs: list[ProcessState]) -> list[dict[str, Any]]:
        """The ranks that arrived last at the step-closing collective in the newest step all of them finished."""
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
        return [{"rank": p.rank, "host": p.host, "step": step, "late_ms": round(longest - w, 3)} for w, p in waits[:3]]


_STATE_ORDER = {"running": 0, "stalled": 1, "hung": 2, "crashed": 3, "terminated": 4, "closed": 5, "missing": 6}


def _inner(p: ProcessState) -> str | None:
    inner = p.innermost()
    return inner.name if inner is not None else None


def _behind_in_default_group(live: list[ProcessState]) -> tuple[list[int], int, int] | None:
    """(ranks behind, their last collective's sequence number, the others') from black boxes written since each one's last progress.

    Only when every live process has such a box with a flight recorder (one missing could be the one behind),
    and the ones behind are fewer than half (a minority cannot have run ahead of everyone else).
    """
    seqs = {}
    for p in live:
        box = p.black_box
        if box is None or box.default_pg_enqueued is None or box.arrival < (p.progress_arrival or 0.0) or p.rank is None:
            return None
        seqs[p.rank] = box.default_pg_enqueued
    if len(seqs) < 2:
        return None
    low, high = min(seqs.values()), max(seqs.values())
    ranks = sorted(r for r, s in seqs.items() if s == low)
    if low == high or len(ranks) >= len(seqs) / 2:
        return None
    return ranks, low, high


def _box_line(culprits: list[ProcessState]) -> tuple[str | None, list[str]]:
    """The culprit's line of code from a black box written since its last progress, and the evidence named."""
    for p in culprits:
        box = p.black_box
        if box is not None and box.arrival >= (p.progress_arrival or 0.0) and box.frame:
            return box.frame, ["black box"] + (["flight recorder"] if box.flight_recorder else [])
    return None, []


def _utc(seconds: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
