"""A slow step next to a memory peak or a busy host: the per-step figures, read back for the
summary.

The logger writes ``memory/…`` and ``process/…`` scalars for every step of
every rank, and ``host/…`` pressure and throttling scalars for every step of
local rank 0 of each host (docs/schema.md). `StepFigures` keeps, in the
summary's one streaming pass, only the few figures that explain a slow step,
and `StepFigures.notes` says, for the slowest steps of the run, what was
unusual at that moment:

* the rank's resident (or CUDA) memory reached a new high-water mark in that
  step, by at least `MIN_PEAK_GROWTH` and 64 MiB;
* its host's CPU, memory or I/O pressure stood at `MIN_PRESSURE_PCT` or more
  (tasks of the host waiting for CPU, memory or I/O), and `MIN_PRESSURE_RISE`
  points above the host's usual pressure in the run (a host that is always
  that busy slows every step: it explains the run's pace, not this step);
* its cgroup was throttled during the step.

A slow step with none of these gets no note: the figures say nothing about
it, and nothing is guessed. A step is *slow* when it took at least
`MIN_SLOW_FACTOR` times the median step of the run (same source and attempt).

Example:
    >>> figures = StepFigures()
    >>> for step in range(1, 9):
    ...     figures.observe({"event_name": "memory/rss_peak_bytes", "value": (4 << 30) + (step == 5) * (2 << 30), "step": step}, "training", 0, 1, "n1")
    >>> step_ms = {("training", 0): {1: {s: 100.0 + 900 * (s == 5) for s in range(1, 9)}}}
    >>> figures.notes(step_ms)
    ['training rank 1, step 5: 1,000 ms (median 100 ms); its resident memory reached a new peak of 6.0 GiB (+2.0 GiB)']
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = [
    "StepFigures",
    "MIN_SLOW_FACTOR",
    "MIN_PEAK_GROWTH",
    "MIN_PRESSURE_PCT",
    "MIN_PRESSURE_RISE",
    "NOTES_SHOWN",
]

#: A step at least this many times the run's median step is slow ...
MIN_SLOW_FACTOR = 1.5
#: ... a memory peak counts when it grew by at least this fraction (and 64 MiB) in the step ...
MIN_PEAK_GROWTH = 0.10
_MIN_PEAK_BYTES = 64 << 20
#: ... and a host is busy at this pressure (% of the last 10 s with tasks waiting).
MIN_PRESSURE_PCT = 20.0
#: ... and at least this many points above its usual (median) pressure in the run.
MIN_PRESSURE_RISE = 10.0
#: Slow steps looked at, slowest first.
NOTES_SHOWN = 5

_PEAKS = {
    "memory/rss_peak_bytes": "resident memory",
    "memory/cuda_peak_allocated_bytes": "CUDA memory",
    "memory/cuda_step_peak_allocated_bytes": "CUDA memory",
}
_PRESSURES = {
    "host/cpu_pressure_some_pct": "CPU",
    "host/memory_pressure_some_pct": "memory",
    "host/io_pressure_some_pct": "I/O",
}
_THROTTLE = "host/cgroup_throttled_s"
_KEPT = frozenset(_PEAKS) | frozenset(_PRESSURES) | {_THROTTLE}


def _gib(value: float) -> str:
    return f"{value / (1 << 30):.1f} GiB"


class StepFigures:
    """The explaining figures per rank and step, and per host and step (a few numbers per step: no
    records kept)."""

    def __init__(self) -> None:
        # (source, attempt) → rank → step → {name: value}
        self.ranks: dict[tuple[str, int | None], dict[int, dict[int, dict[str, float]]]] = {}
        # (source, attempt) → host → step → {name: value}
        self.hosts: dict[tuple[str, int | None], dict[str, dict[int, dict[str, float]]]] = {}
        # (source, attempt) → rank → host
        self.host_of: dict[tuple[str, int | None], dict[int, str]] = {}

    def observe(
        self,
        record: dict[str, Any],
        source: str,
        attempt: int | None,
        rank: int | None,
        host: str | None,
    ) -> None:
        """Take one ``metric_value`` record of `rank` (others are ignored after one set lookup)."""
        name = record.get("event_name")
        # any record may be malformed
        if type(name) is not str or name not in _KEPT or rank is None:
            return
        step, value = record.get("step"), record.get("value")
        if type(step) is not int or not isinstance(value, (int, float)):
            return
        key = (source, attempt)
        if host is not None:
            self.host_of.setdefault(key, {})[rank] = host
        if name.startswith("host/"):
            self.hosts.setdefault(key, {}).setdefault(host or f"rank {rank}", {}).setdefault(
                step, {}
            )[name] = float(value)
        else:
            self.ranks.setdefault(key, {}).setdefault(rank, {}).setdefault(step, {})[name] = float(
                value
            )

    def state(self) -> dict[str, Any]:
        """For a worker process to send back (`model.parallel`)."""
        return {"ranks": self.ranks, "hosts": self.hosts, "host_of": self.host_of}

    def merge(self, state: dict[str, Any]) -> None:
        """Add another worker's figures (disjoint processes)."""
        for name in ("ranks", "hosts", "host_of"):
            target = getattr(self, name)
            for key, inner in state.get(name, {}).items():
                mine = target.setdefault(key, {})
                for k, v in inner.items():
                    if isinstance(v, dict) and isinstance(mine.get(k), dict):
                        mine[k].update(v)
                    else:
                        mine[k] = v

    def notes(
        self, step_ms: dict[tuple[str, int | None], dict[int, dict[int, float]]]
    ) -> list[str]:
        """One line per slow step the figures explain, slowest first (at most `NOTES_SHOWN` slow
        steps looked at)."""
        out: list[str] = []
        for key, per_rank in sorted(
            step_ms.items(), key=lambda item: (item[0][0], -1 if item[0][1] is None else item[0][1])
        ):
            times = [ms for steps in per_rank.values() for ms in steps.values()]
            if len(times) < 4:
                continue
            median = statistics.median(times)
            if median <= 0:
                continue
            slow = sorted(
                (
                    (ms, rank, step)
                    for rank, steps in per_rank.items()
                    for step, ms in steps.items()
                    if ms >= MIN_SLOW_FACTOR * median
                ),
                reverse=True,
            )
            for ms, rank, step in slow[:NOTES_SHOWN]:
                reasons = self._reasons(key, rank, step)
                if reasons:
                    label = key[0] if key[1] in (None, 0) else f"{key[0]} (attempt {key[1]})"
                    out.append(
                        f"{label} rank {rank}, step {step}: {ms:,.0f} ms (median {median:,.0f} "
                        "ms); " + "; ".join(reasons)
                    )
        return out

    def _reasons(self, key: tuple[str, int | None], rank: int, step: int) -> list[str]:
        reasons = []
        steps = self.ranks.get(key, {}).get(rank, {})
        now = steps.get(step, {})
        before = [s for s in steps if s < step]
        previous = steps[max(before)] if before else {}
        for name, what in _PEAKS.items():
            if name in now and name in previous:
                grown = now[name] - previous[name]
                if grown >= _MIN_PEAK_BYTES and grown >= MIN_PEAK_GROWTH * previous[name]:
                    reasons.append(
                        f"its {what} reached a new peak of {_gib(now[name])} (+{_gib(grown)})"
                    )
                    break
        host = self.host_of.get(key, {}).get(rank)
        host_steps = self.hosts.get(key, {}).get(host, {}) if host is not None else {}
        figures = host_steps.get(step, {})
        for name, what in _PRESSURES.items():
            value = figures.get(name)
            if value is None or value < MIN_PRESSURE_PCT:
                continue
            usual = statistics.median(v[name] for v in host_steps.values() if name in v)
            # a host always this busy slows every step, not this one
            if value - usual >= MIN_PRESSURE_RISE:
                reasons.append(
                    f"its host {host} was under {what} pressure ({value:.0f} % of the time tasks "
                    f"waited for {what})"
                )
        throttled = figures.get(_THROTTLE)
        before_host = [s for s in host_steps if s < step and _THROTTLE in host_steps[s]]
        if throttled is not None and before_host:
            delta = throttled - host_steps[max(before_host)][_THROTTLE]
            if delta > 0:
                reasons.append(f"its cgroup was CPU-throttled for {delta:.2f} s")
        return reasons
