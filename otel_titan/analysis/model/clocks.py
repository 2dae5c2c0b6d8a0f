"""Clock alignment across hosts: each host's clock offset, from events that are simultaneous by
construction.

Why: every record's time is its host's wall clock, and hosts disagree (NTP
leaves milliseconds; merged timelines have been seen seconds apart). Who
arrived last at a collective, or whose phase started late, is then a
question about clocks rather than ranks. In synchronous training every rank
leaves the step-closing collective together (an all-reduce, a barrier), so
the end of the last top-level span of each step is one moment seen through
every host's clock: the differences are the offsets.

The estimate (`estimate_offsets`): per step, the median end time over all
ranks; each rank's difference from it; per host, the median of its ranks'
differences over every step (robust to a straggler, a missing step, a rank
that hung); offsets are relative to the median host (only differences between
clocks can be known). The anchor is the step-closing span name whose ends,
once aligned, agree best (residual p95); it is used only on evidence that it
is a collective (`collective_evidence`): its ends agree within
`MAX_RESIDUAL_US` over at least `MIN_STEPS` steps, *and* its length varies
inversely with arrival (from step to step, a rank that arrives later waits
less: its ends vary at most `MAX_END_TO_ARRIVAL` times as much as its
starts). Ends that agree are not enough: a per-host offset absorbs any
constant lateness (a rank whose ``optimizer`` always ends 6 ms after the
others' looks, alone on its host or its clock, like a clock 6 ms ahead), and
a p95 over every rank ignores one rank in twenty; a local span (the README's
``optimizer`` after a backward whose all-reduce has no span of its own) starts
together on every rank and ends when each is done, so its ends vary as much
as its length, never less than its starts. No alignment is better than a
wrong one. Ranks without a host name form their own host; ranks on one host
share its clock: their ends are compared as written, no offset fitted.

Clocks drift (NTP leaves milliseconds over a long run): when one offset per
host does not fit, the run is cut into windows of consecutive steps (2, 4,
8, … of at least `MIN_STEPS` steps each), each window gets its own offsets,
and a host's offset at a moment is interpolated between the windows' middles
(`ClockAlignment.offset_at`); the fewest windows that fit are used. Only when
no window size fits is alignment refused, and then the anchor is not taken
for simultaneous (`ClockAlignment.simultaneous`): evidence measured from it is
withheld rather than risked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from otel_titan.analysis.model.rules import attempt_step
from otel_titan.analysis.model.timeline import OpenSpan, TimelineVisitor
from otel_titan.schema import StepCloser

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "ClockAlignment",
    "ClosingSpans",
    "ClosingVisitor",
    "estimate_offsets",
    "MAX_RESIDUAL_US",
    "MIN_STEPS",
    "MAX_WINDOWS",
    "MAX_END_TO_ARRIVAL",
    "collective_evidence",
]

#: The anchor's aligned ends must agree within this (µs, p95 over ranks and steps) to be used.
MAX_RESIDUAL_US = 1000.0
#: ... over at least this many steps.
MIN_STEPS = 3
#: Piecewise alignment (drifting clocks) tries up to this many windows of consecutive steps.
MAX_WINDOWS = 64
#: A collective's ends vary from step to step at most this share of how much its starts (arrivals)
#: vary: whoever arrives later waits less. A local span's ends vary at least as much as its starts.
MAX_END_TO_ARRIVAL = 0.5


@dataclass
class ClosingSpans:
    """One process's step-closing spans: per step, the last top-level span that ended in it (name,
    start, end µs)."""

    host: str
    key: object  # what the offsets are applied to (a process label)
    steps: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    def add(self, step: int, name: str, start_us: int, end_us: int) -> None:
        self.steps.append(step)
        self.names.append(name)
        self.starts.append(start_us)
        self.ends.append(end_us)


class ClosingVisitor(TimelineVisitor):
    """A walk's step-closing spans and nothing else: per process, the last top-level span that ended
    in each step.

    What clock alignment reads (`estimate_offsets`). The summary's collector
    (`model.collect._Collector`) gathers the same, by the same rule, inline
    with everything else it keeps (one pass; tests/analysis/model/test_clocks.py
    checks that both find the same spans); the export's alignment from the
    files' tails (`export.checks.tail_alignment`) walks them with this alone.

    Example:
        >>> from otel_titan.analysis.model.timeline import walk_process
        >>> visitor = ClosingVisitor()
        >>> visitor.begin("node-0", "rank 0", None)
        >>> _ = walk_process([
        ...     {"log_type": "event", "log_type_name": "fwd_start", "time_us": 10, "step": 1, "span_id": "a"},
        ...     {"log_type": "event", "log_type_name": "fwd_end", "time_us": 30, "step": 1, "span_id": "a", "parent_span_id": None},
        ...     {"log_type": "event", "log_type_name": "fwd_start", "time_us": 40, "step": 2, "span_id": "b"},
        ... ], visitor)
        >>> spans = visitor.closing[0]; spans.steps, spans.names, spans.starts, spans.ends
        ([1], ['fwd'], [10], [30])
    """

    def __init__(self) -> None:
        self.closing: list[ClosingSpans] = []
        self._closer = StepCloser()
        self._spans = ClosingSpans(host="", key=None)
        self._attempt: int | None = None

    def begin(self, host: str, key: object, attempt: int | None) -> None:
        """The next records are one process's: `host` (whose clock they are on), `key` (its label),
        its `attempt`."""
        self._spans = ClosingSpans(host=host, key=key)
        self.closing.append(self._spans)
        self._closer, self._attempt = StepCloser(), attempt

    def span(
        self,
        span: OpenSpan,
        end: dict[str, Any] | None,
        end_us: int,
        dur_us: float,
        incomplete: bool,
    ) -> None:
        if incomplete:
            return
        first = span.start if span.start is not None else end
        step = first.get("step") if first is not None else None
        # the step-closing span's rule: schema.StepCloser, as the collector and the writer's rollups
        if type(step) is int:
            self._closer.span_ended(
                step,
                span.name,
                span.start_us,
                end_us,
                first.get("parent_span_id") is None,  # type: ignore[union-attr]  # a span that ended has its first record
            )

    def step(self, step: int, begin_us: int, end_us: int, first: dict[str, Any]) -> None:
        top = self._closer.closing(step)
        if top is not None:
            # Steps of a restart replay the first attempt's numbers: the attempt keeps them apart.
            self._spans.add(attempt_step(self._attempt, step), *top)


@dataclass
class ClockAlignment:
    """Per-host offsets (µs, subtract from a host's times to align them), and how they were found.

    `applied` is False when no simultaneous event was found (`reason` says why)
    or alignment was turned off; `offsets_us` is then empty.
    """

    applied: bool
    reason: str
    anchor: str | None = None
    hosts: int = 0
    steps: int = 0
    offsets_us: dict[str, float] = field(default_factory=dict)
    residual_p95_us: float | None = None
    #: Every rank leaves `anchor` at one moment (its ends agree within `MAX_RESIDUAL_US` once
    #: aligned, or on one clock): its end is then a reference on each rank's own clock, and evidence
    #: measured from it needs no shared clock.
    simultaneous: bool = False
    #: Piecewise alignment (drifting clocks): per window of steps its middle (µs, median raw end)
    #: and offsets; empty: one offset per host.
    windows: list[dict] = field(default_factory=list)
    #: Per host, how far its offset moved from the first window to the last, relative to the median
    #: host's move (µs); empty without windows.
    drift_us: dict[str, float] = field(default_factory=dict)
    #: The anchor's evidence of being a collective (`collective_evidence`): how much its ends vary
    #: from step to step against its starts (near 0: whoever arrives later waits less; 1 or more: a
    #: local span); None when not measured.
    end_to_arrival: float | None = None
    #: Hosts whose own residual p95 stays above `MAX_RESIDUAL_US` under the fit (µs): left
    #: unaligned, their times as written.
    unaligned_us: dict[str, float] = field(default_factory=dict)
    #: Per host left unaligned, how far its times as written may be from the aligned clock (µs):
    #: the largest offset the fit gave it plus its residual p95. Two hosts' events closer than
    #: their errors added up are in no known order (`model.ending.failed_first`).
    written_error_us: dict[str, float] = field(default_factory=dict)

    def error_us(self, host: str | None) -> float:
        """How far a time of `host` may be from the aligned clock (µs, `written_error_us`): 0 on a
        host the fit holds for, or when nothing is aligned (every time as written: no claim).

        Example:
            >>> a = ClockAlignment(True, "", offsets_us={"h0": 5.0}, written_error_us={"h7": 6500.0})
            >>> a.error_us("h0"), a.error_us("h7"), ClockAlignment(False, "").error_us("h7")
            (0.0, 6500.0, 0.0)
        """
        return self.written_error_us.get(host or "", 0.0) if self.applied else 0.0

    def offset(self, host: str | None) -> float:
        """The offset of `host` in µs (0 when unknown or not applied); with windows, the median over
        the run."""
        return self.offsets_us.get(host or "", 0.0) if self.applied else 0.0

    def offset_at(self, host: str | None, time_us: float) -> float:
        """The offset of `host` at `time_us` (its own clock): interpolated between windows when the
        clocks drift, else `offset`.

        Example:
            >>> a = ClockAlignment(True, "", windows=[{"center_us": 0, "offsets_us": {"h": 0.0}}, {"center_us": 100, "offsets_us": {"h": 50.0}}], offsets_us={"h": 25.0})
            >>> a.offset_at("h", 50), a.offset_at("h", 500), a.offset("h")
            (25.0, 50.0, 25.0)
        """
        if not self.applied or not self.windows:
            return self.offset(host)
        points = [
            (w["center_us"], w["offsets_us"][host])
            for w in self.windows
            if (host or "") in w["offsets_us"]
        ]
        if not points:
            return self.offset(host)
        if time_us <= points[0][0]:
            return points[0][1]
        for (t0, o0), (t1, o1) in zip(points, points[1:]):
            if time_us <= t1:
                return o0 + (o1 - o0) * (time_us - t0) / (t1 - t0) if t1 > t0 else o1
        return points[-1][1]

    @property
    def spread_us(self) -> float:
        """Largest minus smallest offset."""
        return (
            max(self.offsets_us.values()) - min(self.offsets_us.values())
            if self.offsets_us
            else 0.0
        )

    def largest(self, count: int = 3) -> list[tuple[str, float]]:
        """The `count` hosts furthest from the median clock, furthest first."""
        return sorted(self.offsets_us.items(), key=lambda item: -abs(item[1]))[:count]

    def describe(self) -> str:
        """One line: ``aligned on all_reduce_end over 199 steps: 128 hosts, offsets spread 9.9 ms
        (largest node-007 +4.9 ms, …); residual p95 0.01 ms``."""
        if not self.applied:
            return f"not aligned: {self.reason}"
        return self._fitted() + self._left_out()

    def _left_out(self) -> str:
        if not self.unaligned_us:
            return ""
        worst = sorted(self.unaligned_us.items(), key=lambda item: -item[1])
        named = ", ".join(
            f"{host} (residual p95 {p95 / 1000:.2f} ms)" for host, p95 in worst[:5]
        ) + (f" and {len(worst) - 5} more" if len(worst) > 5 else "")
        return f"; {len(worst)} host{'s' if len(worst) != 1 else ''} left unaligned, no fit holds for {'them' if len(worst) != 1 else 'it'}: {named}: times shown as written"

    def _fitted(self) -> str:
        largest = ", ".join(f"{host} {offset / 1000:+.2f} ms" for host, offset in self.largest())
        if self.windows:
            drifting = sorted(self.drift_us.items(), key=lambda item: -abs(item[1]))[:3]
            return (
                f"aligned piecewise on the end of {self.anchor} (all ranks leave it together; one "
                f"offset per host did not fit: the clocks drift) over {self.steps} steps "
                f"in {len(self.windows)} windows: {self.hosts} hosts, largest drift from the "
                "first window to the last (against the median host) "
                + ", ".join(f"{host} {drift / 1000:+.2f} ms" for host, drift in drifting)
                + f"; offsets spread {self.spread_us / 1000:.2f} ms; residual p95 {(self.residual_p95_us or 0) / 1000:.3f} ms"
            )
        return (
            f"aligned on the end of {self.anchor} (all ranks leave it together) over {self.steps} "
            f"steps: {self.hosts} hosts, "
            f"offsets spread {self.spread_us / 1000:.2f} ms (largest {largest}); residual p95 "
            f"{(self.residual_p95_us or 0) / 1000:.3f} ms"
        )


def estimate_offsets(processes: Iterable[ClosingSpans]) -> ClockAlignment:
    """Per-host clock offsets from the ends of step-closing spans (see the module docstring).

    Example:
        >>> a = ClosingSpans("h1", 0, [1, 2, 3, 4], ["ar"] * 4, [0, 50, 170, 280], [100, 200, 300, 400])
        >>> b = ClosingSpans("h2", 1, [1, 2, 3, 4], ["ar"] * 4, [80, 160, 240, 350], [150, 250, 350, 450])
        >>> c = ClosingSpans("h2", 2, [1, 2, 3, 4], ["ar"] * 4, [60, 190, 220, 310], [150, 250, 350, 450])
        >>> alignment = estimate_offsets([a, b, c])
        >>> alignment.anchor, alignment.offsets_us
        ('ar', {'h1': -25.0, 'h2': 25.0})
    """
    processes = [p for p in processes if p.steps]
    hosts = sorted({p.host for p in processes})
    if not hosts:
        return ClockAlignment(False, "no step-closing spans")
    one_clock = len(hosts) < 2
    candidates = [
        c
        for c in (
            _estimate(processes, name, hosts, one_clock=one_clock)
            for name in sorted({n for p in processes for n in set(p.names)})
        )
        if c is not None
    ]
    candidates.sort(key=lambda c: c.residual_p95_us)  # type: ignore[arg-type,return-value]  # candidates are estimates that have a residual
    refused: str | None = (
        None  # why the best fit is no collective on evidence (said when nothing else is found)
    )
    for candidate in candidates:
        fitted: ClockAlignment | None = candidate
        if candidate.residual_p95_us > MAX_RESIDUAL_US:  # type: ignore[operator]  # candidates are estimates that have a residual
            fitted = (
                None if one_clock else _estimate(processes, candidate.anchor, hosts, piecewise=True)  # type: ignore[arg-type]  # the candidates' anchor is a span name
            )
            if fitted is None:
                continue
        elif candidate.unaligned_us:
            # The run fits, some hosts do not: their clocks drift (the fit is judged per host,
            # `_unaligned`).
            piecewise = _estimate(processes, candidate.anchor, hosts, piecewise=True)  # type: ignore[arg-type]  # the candidates' anchor is a span name
            if piecewise is not None and len(piecewise.unaligned_us) < len(candidate.unaligned_us):
                fitted = piecewise
        fitted = _left_unaligned(fitted)  # type: ignore[arg-type]  # a fit is found by now: _estimate returned one above
        judged = _judged(fitted)
        if judged.simultaneous:
            if one_clock:
                # One clock: nothing to align, but which span is the collective is still worth
                # knowing (arrival order).
                return ClockAlignment(
                    False,
                    "all ranks on one host (one clock)",
                    anchor=judged.anchor,
                    hosts=1,
                    steps=judged.steps,
                    residual_p95_us=judged.residual_p95_us,
                    simultaneous=True,
                    end_to_arrival=judged.end_to_arrival,
                )
            return judged
        refused = refused or judged.reason
    if one_clock:
        return ClockAlignment(
            False,
            "all ranks on one host (one clock)" + (f"; {refused}" if refused else ""),
            hosts=1,
        )
    if refused is not None:
        return ClockAlignment(False, refused, hosts=len(hosts))
    if not candidates:
        return ClockAlignment(
            False,
            f"no step-closing span seen on two or more hosts in {MIN_STEPS} steps or more",
            hosts=len(hosts),
        )
    best = candidates[0]
    return ClockAlignment(
        False,
        f"no step-closing span ends at the same moment on every rank (best: {best.anchor}, residual p95 {best.residual_p95_us / 1000:.2f} ms > {MAX_RESIDUAL_US / 1000:g} ms)",  # type: ignore[operator]  # candidates are estimates that have a residual
        anchor=best.anchor,
        hosts=len(hosts),
        residual_p95_us=best.residual_p95_us,
    )


def collective_evidence(
    proc: np.ndarray, step: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> float | None:
    """How much a span's ends vary from step to step against how much its starts do (ends / starts);
    None without variation to judge.

    A collective is left together: whoever arrives later waits less, so its
    ends vary far less than its starts (a ratio near 0). A local span ends
    when each rank is done: its ends vary as much as its starts and its length
    together (a ratio of 1 or more). `proc` and `step` are ids per row (one
    span of one process in one step); `starts` and `ends` (µs) on each
    process's own clock or aligned: what is constant per process (a clock
    offset, a rank always late) and per step (the step's moment) is taken out
    first (two-way means per step and per process), so no clock is compared
    with another and a straggler's constant lateness is no
    evidence either way.

    Example:
        >>> import numpy as np
        >>> proc, step = np.repeat(np.arange(3), 4), np.tile(np.arange(4), 3)
        >>> arrive = np.array([0, 5, 2, 7, 3, 1, 6, 0, 4, 4, 0, 2], dtype=float)
        >>> round(collective_evidence(proc, step, step * 100 + arrive, step * 100 + 10.0), 2)  # everyone leaves at +10
        0.0
        >>> collective_evidence(proc, step, step * 100.0, step * 100 + arrive) is None  # arrivals never vary: no evidence
        True
    """
    import numpy as np

    start_res, end_res = _double_residuals(proc, step, starts), _double_residuals(proc, step, ends)
    start_spread = _spread(start_res)
    if not start_spread > 0.5:  # µs: timestamps are whole µs, a smaller variation is their rounding
        return None
    return float(_spread(end_res) / start_spread) if np.isfinite(start_spread) else None


def _double_residuals(proc: np.ndarray, step: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`values` less what is constant per step and per process (two-way means, a few passes: steps a
    rank missed are allowed).

    Means, not medians: with three ranks a median per step leaves one
    residual in three at exactly 0, and the spread of what remains is noise.
    """

    _, step_ids = _ids(step)
    _, proc_ids = _ids(proc)
    residual = values - values.mean()
    for _ in range(3):
        residual = residual - _group_mean(step_ids, residual)[step_ids]
        residual = residual - _group_mean(proc_ids, residual)[proc_ids]
    return residual


def _group_mean(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    import numpy as np

    counts = np.bincount(groups)
    return np.bincount(groups, weights=values) / np.maximum(counts, 1)


def _ids(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    return np.unique(values, return_inverse=True)


def _spread(values: np.ndarray) -> float:
    """1.4826 × the median absolute residual (0 for none): a standard deviation's estimate that a
    few bad rows (one host's jumping clock, a rank's hiccup) do not move."""
    import numpy as np

    return float(1.4826 * np.median(np.abs(values))) if values.size else 0.0


def _estimate(
    processes: list[ClosingSpans],
    name: str,
    hosts: list[str],
    piecewise: bool = False,
    one_clock: bool = False,
) -> ClockAlignment | None:
    """One offset per host from the ends of `name` (or, `piecewise`, offsets per window of steps
    that fit within `MAX_RESIDUAL_US`).

    `one_clock`: every process writes on one clock: no offset is fitted, the
    ends are compared as written. The result's `simultaneous` says whether
    `name` is a collective on evidence (`collective_evidence`); when it is not,
    `reason` says why.
    """
    import numpy as np  # only when there is something to align (keeps `summarize --tail` quick to start)

    host_index = {h: i for i, h in enumerate(hosts)}
    rows: list[np.ndarray] = []
    for index, p in enumerate(processes):
        mask = np.fromiter((n == name for n in p.names), dtype=bool, count=len(p.names))
        if not mask.any():
            continue
        steps = np.asarray(p.steps, dtype=np.int64)[mask]
        starts = np.asarray(p.starts, dtype=np.float64)[mask]
        ends = np.asarray(p.ends, dtype=np.float64)[mask]
        rows.append(
            np.column_stack(
                [
                    np.full(len(steps), index),
                    np.full(len(steps), host_index[p.host]),
                    steps,
                    ends,
                    starts,
                ]
            )
        )
    if not rows:
        return None
    data = np.concatenate(rows)
    proc, host, step, end, start = (
        data[:, 0].astype(np.int64),
        data[:, 1].astype(np.int64),
        data[:, 2].astype(np.int64),
        data[:, 3],
        data[:, 4],
    )
    # Steps seen by at least half the processes that have this anchor: a median over them is
    # meaningful.
    uniq_steps, step_idx, counts = np.unique(step, return_inverse=True, return_counts=True)
    keep = counts[step_idx] >= max(2, len(np.unique(proc)) // 2)
    if (
        np.unique(step[keep]).size < MIN_STEPS
        or np.unique((proc if one_clock else host)[keep]).size < 2
    ):
        return None
    proc, host, step_idx, end, start = (
        proc[keep],
        host[keep],
        step_idx[keep],
        end[keep],
        start[keep],
    )
    present = np.unique(host)
    if not piecewise:
        offsets = np.zeros(len(hosts)) if one_clock else _fit(host, step_idx, end, len(hosts))
        if not one_clock:
            offsets -= np.median(offsets[present])
        p95 = _residual_p95(host, step_idx, end, offsets[host])
        found = ClockAlignment(
            True,
            "",
            simultaneous=True,
            anchor=name,
            hosts=int(present.size),
            steps=int(np.unique(step_idx).size),
            offsets_us={}
            if one_clock
            else {hosts[h]: round(float(offsets[h]), 3) for h in present},
            residual_p95_us=round(p95, 3),
        )
        found.end_to_arrival = _rounded(
            collective_evidence(proc, step_idx, start - offsets[host], end - offsets[host])
        )
        if not one_clock:
            found.unaligned_us = _unaligned(host, step_idx, end, offsets[host], hosts)
        return found
    kept_steps = np.unique(step_idx)
    windows = 2
    # The fewest windows that fit every host; failing that, the fewest that fit the run as a whole
    # (its unfit hosts named).
    fallback: tuple[tuple[np.ndarray, list[dict], float], dict[str, float]] | None = None
    chosen = None
    while windows <= MAX_WINDOWS and kept_steps.size // windows >= MIN_STEPS:
        fitted = _fit_windows(host, step_idx, end, kept_steps, windows, hosts, present)
        if fitted is not None:
            unfit = _unaligned(host, step_idx, end, fitted[0], hosts)
            if not unfit:
                chosen = (fitted, unfit)
                break
            if fallback is None or len(unfit) < len(fallback[1]):
                fallback = (fitted, unfit)
        windows *= 2
    chosen = chosen or fallback
    if chosen is not None:
        fitted, unfit = chosen
        offsets_at, table, p95 = fitted
        every = np.array([[w["offsets_us"][hosts[h]] for w in table] for h in present])
        found = ClockAlignment(
            True,
            "",
            simultaneous=True,
            anchor=name,
            hosts=int(present.size),
            steps=int(kept_steps.size),
            offsets_us={
                hosts[h]: round(float(np.median(row)), 3) for h, row in zip(present, every)
            },
            residual_p95_us=round(p95, 3),
            windows=table,
            # Relative to the median host's drift: only differences between clocks can be known.
            drift_us={
                hosts[h]: round(float(moved - np.median(every[:, -1] - every[:, 0])), 3)
                for h, moved in zip(present, every[:, -1] - every[:, 0])
            },
        )
        found.end_to_arrival = _rounded(
            collective_evidence(proc, step_idx, start - offsets_at, end - offsets_at)
        )
        found.unaligned_us = unfit
        return found
    return None


def _unaligned(
    host: np.ndarray,
    step_idx: np.ndarray,
    end: np.ndarray,
    offset_of_row: np.ndarray,
    hosts: list[str],
) -> dict[str, float]:
    """Hosts whose own residual p95 exceeds `MAX_RESIDUAL_US` under these offsets (host → µs).

    Why per host: one p95 over every rank hides a few hosts (under one in
    twenty ranks) that no offset fits: a run reported "residual p95 8 µs"
    while two drifting hosts stayed ±2 ms off.
    """
    import numpy as np

    aligned = end - offset_of_row
    residual = np.abs(aligned - _group_median(step_idx, aligned)[step_idx])
    order = np.argsort(host, kind="stable")
    bounds = np.searchsorted(host[order], np.arange(len(hosts) + 1))
    out = {}
    for h in range(len(hosts)):
        rows = order[bounds[h] : bounds[h + 1]]
        if rows.size:
            p95 = float(np.percentile(residual[rows], 95))
            if p95 > MAX_RESIDUAL_US:
                out[hosts[h]] = round(p95, 3)
    return out


def _left_unaligned(found: ClockAlignment) -> ClockAlignment:
    """`found` without offsets for its unaligned hosts: their times stay as written (a wrong shift
    is worse than none)."""
    if not found.unaligned_us:
        return found
    drop = found.unaligned_us
    fitted = {
        h: max(
            [abs(found.offsets_us.get(h, 0.0))]
            + [abs(w["offsets_us"][h]) for w in found.windows if h in w["offsets_us"]]
        )
        for h in drop
    }
    windows = [
        {**w, "offsets_us": {h: o for h, o in w["offsets_us"].items() if h not in drop}}
        for w in found.windows
    ]
    return dataclasses.replace(
        found,
        offsets_us={h: o for h, o in found.offsets_us.items() if h not in drop},
        windows=windows,
        drift_us={h: d for h, d in found.drift_us.items() if h not in drop},
        written_error_us={h: round(fitted[h] + p95, 3) for h, p95 in drop.items()},
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _judged(found: ClockAlignment) -> ClockAlignment:
    """`found`, unless its anchor is no collective on evidence (`collective_evidence`): then neither
    applied nor simultaneous, and why."""
    ratio = found.end_to_arrival
    if ratio is not None and ratio <= MAX_END_TO_ARRIVAL:
        return found
    why = (
        f"{found.anchor} is no collective on evidence: from step to step its ends vary "
        f"{ratio:.2f} × as much as its starts (a collective's at most {MAX_END_TO_ARRIVAL:g} ×: "
        "whoever arrives later waits less); it ends when each rank is done"
        if ratio is not None
        else f"{found.anchor} is no collective on evidence: its starts never vary, so whether a later arrival waits less cannot be seen"
    )
    return dataclasses.replace(
        found, applied=False, simultaneous=False, reason=why, offsets_us={}, windows=[], drift_us={}
    )


def _fit(host: np.ndarray, step_idx: np.ndarray, end: np.ndarray, size: int) -> np.ndarray:
    """Per host, the median of its ranks' differences from each step's median end (two passes: the
    second on aligned clocks)."""
    import numpy as np

    offsets = np.zeros(size)
    for _ in range(2):
        aligned = end - offsets[host]
        diff = end - _group_median(step_idx, aligned)[step_idx]
        offsets = _group_median(host, diff, size)
    return offsets


def _residual_p95(
    host: np.ndarray, step_idx: np.ndarray, end: np.ndarray, offset_of_row: np.ndarray
) -> float:
    import numpy as np

    aligned = end - offset_of_row
    residual = aligned - _group_median(step_idx, aligned)[step_idx]
    return float(np.percentile(np.abs(residual), 95))


def _fit_windows(
    host: np.ndarray,
    step_idx: np.ndarray,
    end: np.ndarray,
    kept_steps: np.ndarray,
    windows: int,
    hosts: list[str],
    present: np.ndarray,
) -> tuple[np.ndarray, list[dict], float] | None:
    """Offsets per window of consecutive steps, interpolated between the windows' middles; None when
    a window lacks a host or the fit is off."""
    import numpy as np

    table: list[dict] = []
    centers, per_window = [], []
    for chunk in np.array_split(kept_steps, windows):
        rows = np.isin(step_idx, chunk)
        if np.unique(host[rows]).size != present.size:
            return None  # a host missing from a window: its drift there is unknown
        offsets = _fit(host[rows], step_idx[rows], end[rows], len(hosts))
        offsets -= np.median(offsets[present])
        center = float(np.median(end[rows]))
        centers.append(center)
        per_window.append(offsets)
        table.append(
            {
                "from_step_index": int(chunk[0]),
                "to_step_index": int(chunk[-1]),
                "center_us": round(center, 1),
                "offsets_us": {hosts[h]: round(float(offsets[h]), 3) for h in present},
            }
        )
    grid = np.array(per_window)  # window × host
    offset_of_row = np.empty(len(end))
    for h in present:
        rows = host == h
        offset_of_row[rows] = np.interp(end[rows], centers, grid[:, h])
    p95 = _residual_p95(host, step_idx, end, offset_of_row)
    if p95 > MAX_RESIDUAL_US:
        return None
    return offset_of_row, table, p95


def _group_median(groups: np.ndarray, values: np.ndarray, size: int | None = None) -> np.ndarray:
    """Median of `values` per group id (0..size-1); groups without values get 0."""
    import numpy as np

    size = int(groups.max()) + 1 if size is None else size
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    bounds = np.searchsorted(g, np.arange(size + 1))
    out = np.zeros(size)
    for i in range(size):
        lo, hi = bounds[i], bounds[i + 1]
        if hi > lo:
            mid = (lo + hi) // 2
            out[i] = v[mid] if (hi - lo) % 2 else (v[mid - 1] + v[mid]) / 2
    return out
