"""Whether the whole job slowed down against its own past: the ``job_slow`` rule, one for `watch`
(over the steps it has read, raised and held by its clock) and `summarize` (at the run's end).

Every rank slower at once is no straggler: compared with each other no rank
stands out (`model.stragglers`), they all moved. The yardstick is the job's
own earlier steps:

* a step's time is the median over the ranks that finished it (per token
  where the program logs a token count, `TOKEN_SCALARS`: a longer batch is
  no slowdown), `step_value`;
* the median of the last `WINDOW` steps against the `BASELINE` steps before
  them (`rise`) is slower by the straggler rule's own bar
  (`stragglers.effect_bar` of `MIN_EFFECT`) and by `MIN_Z` times the noise of
  that median (the larger spread of the two stretches): steps vary together
  (sequence lengths, rollouts), the rise must stand out of the job's own
  step-to-step spread; and three quarters of the window's steps are slower
  than three quarters of the baseline's (`_apart`). Judged once the run has
  `MIN_STEPS` (`WINDOW` + `BASELINE`) steps. Once raised it holds while the rise stays
  `KEEP_SHARE` of the effect (`grew`);
* and some phase grew on most ranks (the median over ranks and steps; the
  step-closing collective by its floor, the last arrival's wait) by at least
  `MIN_STEP_SHARE` of the step (`grown_phase`): where none did, every rank
  waits for one or a few, a straggler, which the rank rule names;
* and no straggler is named: what every rank waits for is the straggler's
  cost, not the job's.

Example:
    >>> steps = list(range(1, 61))
    >>> per_rank = {r: {k: 100.0 + 40.0 * (k > 40) for k in steps} for r in range(4)}
    >>> phases = {"data_fetch": {r: {k: 10.0 + 40.0 * (k > 40) for k in steps} for r in range(4)}}
    >>> values = {k: step_value([per_rank[r][k] for r in per_rank]) for k in steps}
    >>> judge(values, per_rank, phases, closing=None).describe()
    'job slower: step time +40% (100.0 → 140.0 ms) since step 41; data_fetch grew most (+40.0 ms)'
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Mapping, Sequence

from otel_titan.analysis.model.facts import JobSlowdown
from otel_titan.analysis.model.rules import MAD_TO_SD, MEDIAN_SE
from otel_titan.analysis.model.stragglers import (
    MIN_EFFECT,
    MIN_STEP_SHARE,
    MIN_Z,
    WINDOW_MIN_STEPS,
    effect_bar,
)

__all__ = [
    "BASELINE",
    "MIN_STEPS",
    "INNERMOST_SHARE",
    "KEEP_SHARE",
    "change_split",
    "TOKEN_SCALARS",
    "WINDOW",
    "grew",
    "grown_phase",
    "judge",
    "rise",
    "rising",
    "since_step",
    "step_value",
]

#: The steps judged now, against ...
WINDOW = 20
#: ... this many steps before them (the job's own past is the only yardstick: a longer window,
#: less noise). Judged once the run has `MIN_STEPS`, on at least half the baseline before the
#: change.
BASELINE = 32
#: The steps a run needs before its own slowdown is judged, after the fact as live.
MIN_STEPS = WINDOW + BASELINE
#: Once raised, the slowdown holds while its rise stays this share of `MIN_EFFECT`.
KEEP_SHARE = 0.5
#: A phase grown by this share of the most grown one explains it as well (the innermost is named).
INNERMOST_SHARE = 0.9
#: The scalars (``sl.log_trace_scalar``) that count a step's tokens.
TOKEN_SCALARS = frozenset(
    {"tokens", "num_tokens", "ntokens", "n_tokens", "tokens_per_step", "batch_tokens"}
)


def step_value(durations: Sequence[float], tokens: Sequence[float] = ()) -> float:
    """One step's time for the job: the median over its ranks (ms), per token where any rank
    logged a positive token count (the median count).

    Example:
        >>> step_value([100.0, 120.0, 110.0]), step_value([100.0, 120.0], [50.0, 50.0])
        (110.0, 2.2)
    """
    ms = statistics.median(durations)
    counted = [t for t in tokens if t > 0]
    return ms / statistics.median(counted) if counted else ms


def rise(
    values: Sequence[float],
    split: int | None = None,
    window: int = WINDOW,
    baseline: int = BASELINE,
) -> tuple[float, float, float]:
    """(the last `window` steps' median, the median of the `baseline` steps before index `split`,
    the noise of the latter): the job now against its own past. `split` (an index into `values`):
    where the slower steps begin; None, the last `window` (a rise just seen).

    Example:
        >>> rise([10.0, 11.0, 9.0, 10.0, 20.0, 20.0], window=2, baseline=4)
        (20.0, 10.0, 0.656953)
    """
    split = len(values) - window if split is None else split
    now = values[-window:]
    recent = statistics.median(now)
    past = values[max(0, split - baseline) : split]
    base = statistics.median(past)
    # The larger spread of the two stretches: a baseline chosen for standing lowest
    # (`change_split`) is often the calmest stretch too.
    spread = max(
        statistics.median(abs(v - base) for v in past),
        statistics.median(abs(v - recent) for v in now),
    )
    noise = MAD_TO_SD * spread * MEDIAN_SE / window**0.5
    return recent, base, round(noise, 6)


def change_split(values: Sequence[float], window: int = WINDOW, baseline: int = BASELINE) -> int:
    """Where the job's steps became slower, for a reader of the whole run: the index into `values`
    whose `baseline` steps before it stand lowest under the last `window` steps (a slowdown that
    began long before the end still has its past), from `baseline` // 2 steps in to the window;
    among equal medians, the lowest mean, then the latest.

    Example:
        >>> change_split([10.0] * 40 + [14.0] * 80)
        40
    """
    last = max(len(values) - window, 0)
    best, best_base = last, (math.inf, math.inf)
    for split in range(baseline // 2, last + 1):
        past = values[max(0, split - baseline) : split]
        # The lowest median; among equal ones the lowest mean (no slower step in it yet), the latest.
        base = (statistics.median(past), statistics.fmean(past))
        if base <= best_base:
            best, best_base = split, base
    return best


def grew(recent: float, base: float, noise: float, *, raised: bool = False) -> bool:
    """Whether the step time `recent` stands over its own past `base`: by the straggler rule's bar
    and `MIN_Z` × its `noise` to raise; by `KEEP_SHARE` of the effect to hold, once `raised`.

    Example:
        >>> grew(108.0, 100.0, 1.0), grew(106.0, 100.0, 1.0), grew(106.0, 100.0, 1.0, raised=True)
        (True, False, True)
    """
    excess = recent - base
    if raised:
        return excess >= KEEP_SHARE * MIN_EFFECT * base
    return excess >= effect_bar(base) and excess >= MIN_Z * noise


def grown_phase(
    phases: Mapping[str, Mapping[int, Mapping[int, float]]],
    closing: str | None,
    recent: Sequence[int],
    past: Sequence[int],
) -> tuple[str | None, float | None]:
    """(the phase that grew most from steps `past` to `recent`, by how much: ms per step); (None,
    None) where none grew.

    `phases`: phase → rank → step → ms. A phase's growth is the median of its
    times over the ranks and the `recent` steps less the same over the `past`
    ones; `closing` (the step-closing collective) by its floor per step, the
    last arrival's wait: a collective grows on every rank when one rank is
    late. Of the phases grown `INNERMOST_SHARE` as much as the most, the
    shortest now: the innermost.

    Example:
        >>> times = lambda before, now: {0: {1: before, 2: now}, 1: {1: before, 2: now}}
        >>> grown_phase({"fwd_bwd": times(50.0, 90.0), "fwd": times(20.0, 59.0)}, None, [2], [1])
        ('fwd', 39.0)
    """
    growth: dict[str, tuple[float, float]] = {}
    for name, ranks in phases.items():
        now = _phase_times(ranks, recent, floor=name == closing)
        before = _phase_times(ranks, past, floor=name == closing)
        if now and before:
            median_now = statistics.median(now)
            growth[name] = (median_now - statistics.median(before), median_now)
    most = max((grown for grown, _ in growth.values()), default=0.0)
    if most <= 0:
        return None, None
    # A span and the one around it grow alike (`fwd` in `fwd_bwd`): the innermost that explains the
    # growth, the shortest phase that grew nearly as much, as the straggler rule names the innermost.
    phase = min(
        (name for name, (grown, _) in growth.items() if grown >= INNERMOST_SHARE * most),
        key=lambda name: (growth[name][1], name),
    )
    return phase, growth[phase][0]


def _phase_times(
    ranks: Mapping[int, Mapping[int, float]], steps: Sequence[int], *, floor: bool
) -> list[float]:
    """A phase's times over `steps`: every rank's (0 where a rank did not run it that step), or one
    per step, the least (`floor`); steps no rank timed are left out."""
    out: list[float] = []
    for step in steps:
        row = [by_step.get(step, 0.0) for by_step in ranks.values()]
        if not any(step in by_step for by_step in ranks.values()):
            continue
        if floor:
            out.append(min(row))
        else:
            out += row
    return out


def since_step(values: Mapping[int, float], base: float, recent: float) -> int:
    """Where the slowdown began: the first step after the running median (`WINDOW_MIN_STEPS` wide)
    last stood below the midpoint of `base` and `recent`.

    Example:
        >>> since_step({k: 100.0 + 40.0 * (k > 30) + 80.0 * (k == 12) for k in range(1, 61)}, 100.0, 140.0)
        31
    """
    steps = sorted(values)
    mid = (base + recent) / 2.0
    half = WINDOW_MIN_STEPS // 2
    for index in range(len(steps) - 1, -1, -1):
        around = [values[k] for k in steps[max(0, index - half) : index + half + 1]]
        if statistics.median(around) < mid:
            return steps[min(index + 1, len(steps) - 1)]
    return steps[0]


def rising(
    values: Mapping[int, float], split: int | None = None, *, raised: bool = False
) -> tuple[int, float, float] | None:
    """(the index of `split` in the steps, the recent and the base step time) where the step time
    stands over its past (`rise`, `grew`), else None: `judge`'s first test, cheap enough to ask on
    every refresh. `split`, `raised`: as `judge`'s."""
    steps = sorted(values)
    if len(steps) < MIN_STEPS:
        return None
    at = len(steps) - WINDOW if split is None else bisect.bisect_left(steps, split)
    if at < BASELINE // 2:
        return None
    series = [values[k] for k in steps]
    recent, base, noise = rise(series, at)
    if not grew(recent, base, noise, raised=raised):
        return None
    if not raised and not _apart(series[-WINDOW:], series[max(0, at - BASELINE) : at]):
        return None
    return at, recent, base


def _apart(now: Sequence[float], past: Sequence[float]) -> bool:
    """Whether three quarters of the steps `now` are slower than three quarters of the steps
    `past`: the job moved, not a few of its steps.

    Why besides the medians: steps that flip between two speeds (`make train`'s toy run, 1.2 or
    2.2 ms at random) put the median of 20 on one speed or the other by chance (a rise of 70 %
    and more, on a calm baseline); their quartiles never part.

    Example:
        >>> _apart([11.0, 11.5, 12.0, 11.8], [10.0, 10.2, 9.9, 10.1]), _apart([1.2, 2.2, 2.2, 2.2], [1.2, 1.2, 2.2, 1.2])
        (True, False)
    """
    low_now = statistics.quantiles(now, n=4)[0]
    high_past = statistics.quantiles(past, n=4)[2]
    return low_now > high_past


def judge(
    values: Mapping[int, float],
    per_rank: Mapping[int, Mapping[int, float]],
    phases: Mapping[str, Mapping[int, Mapping[int, float]]],
    closing: str | None,
    *,
    split: int | None = None,
    per_token: bool = False,
    raised: bool = False,
    straggler: bool = False,
) -> JobSlowdown | None:
    """The ``job_slow`` rule (the module docstring) on the steps judged; None when the job did not
    slow down.

    `values`: step → its time (`step_value`); `per_rank`: rank → step → ms;
    `phases`: phase → rank → step → ms; `closing`: the step-closing collective
    on evidence (None: none). `split`: the first step of the slower part, its
    baseline the steps before it (`watch` holds the one it raised with; a
    reader of the whole run finds it, `change_split`); None: the last `WINDOW`
    steps. `raised`: it holds already (`watch`); `straggler`: a rank is named
    slow.
    """
    if straggler and not raised:
        return None
    rose = rising(values, split, raised=raised)
    if rose is None:
        return None
    steps = sorted(values)
    at, recent, base = rose
    window, past = steps[-WINDOW:], steps[max(0, at - BASELINE) : at]
    phase, grown_ms = grown_phase(phases, closing, window, past)
    step_ms = [by_step[k] for by_step in per_rank.values() for k in window if k in by_step]
    if not raised and (
        grown_ms is None or (step_ms and grown_ms < MIN_STEP_SHARE * statistics.median(step_ms))
    ):
        return None
    return JobSlowdown(
        since_step=since_step({k: values[k] for k in steps[max(0, at - BASELINE) :]}, base, recent),
        split_step=steps[min(at, len(steps) - 1)],
        last_step=steps[-1],
        base_ms=round(base, 6),
        recent_ms=round(recent, 6),
        pct=round(100.0 * (recent - base) / base, 3) if base else 0.0,
        per_token=per_token,
        phase=phase,
        phase_grown_ms=None if grown_ms is None else round(grown_ms, 6),
    )
