"""Straggler verdicts: which rank is slower than its peers, on what evidence, and what it costs the
run.

Why a module of its own: a verdict that names a rank must be right (a wrong
culprit costs more trust than a missing one), so each step of the reasoning is
spelled out here and every later analysis (summarize, the report) reads the
same findings:

* *peers* (`peer_groups`): a rank is compared only with ranks that should do
  the same work: the same mesh coordinates but data-parallel (a pipeline's
  last stage always runs a longer forward; an expert or tensor-parallel
  position differs by design). Without a declared mesh every rank is a peer.
* *the statistic* (`compare_ranks`, its bar `stands_out`, which `watch` applies too): a median at
  least `EFFECT_MARGIN` × `MIN_EFFECT` (7.5 %: a median of noisy steps understates a true 10 % half
  the time) above the peers' median and at least `MIN_Z` times the noise, over at least `MIN_STEPS`
  steps. With fewer than `MIN_MAJORITY` peers there is no majority to call one rank abnormal: the
  difference is shown, nobody is blamed.
* *wait or work* (`lateness`): a longer phase that ends when the others' ends
  is a wait (the rank that reaches a collective first waits inside it). On one
  clock the ends are compared directly; across hosts, on each rank's own
  clock, against the moment every rank leaves the step-closing collective (its
  end is one instant on every rank): no shared clock is needed, so drifting
  or unaligned clocks cannot make the waiting rank look late. Where neither
  holds, nothing is judged and the summary says what was withheld and why.
* *arrival* (`arrivals`): when a rank enters the step-closing collective,
  measured from when it left the previous one, both on its own clock: the last
  to arrive waits least, and delays everyone.
* *cost* (`finding`): in synchronous training every rank pays a straggler's
  delay at the collective: the run would save the rank's lateness per step,
  times the steps. Only a finding that costs at least `HEADLINE_MIN_SHARE` of
  the step (the phase rule's own 1 %: what `watch` raises `slow` about,
  `summarize` puts first) and holds in both halves of the run reaches "Look first at"; the
  others stay in the Stragglers section (a finding that came and went says
  when).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from otel_titan.analysis.model.facts import RankSlowness, StepTimes, StragglerFinding
from otel_titan.analysis.model.rules import MAD_TO_SD, MEDIAN_SE, robust_sd
from otel_titan.schema import DATA_PARALLEL_PREFIX

__all__ = [
    "compare_ranks",
    "stands_out",
    "effect_bar",
    "EFFECT_MARGIN",
    "MIN_Z_BELOW_EFFECT",
    "peer_groups",
    "peer_key",
    "describe_group",
    "per_step_differences",
    "change_windows",
    "window_stands_out",
    "within",
    "lateness",
    "arrivals",
    "finding",
    "judge_phase",
    "judge_arrival",
    "windowed",
    "phase_lateness",
    "MIN_STEPS",
    "MIN_EFFECT",
    "MIN_Z",
    "MIN_STEP_SHARE",
    "MIN_LATENESS_SHARE",
    "MIN_ARRIVAL_EFFECT",
    "MIN_MAJORITY",
    "HEADLINE_MIN_SHARE",
    "PERSISTENT_SHARE",
    "STRAGGLER_RULE",
]

#: A rank is a straggler only with at least this many steps compared with other ranks ...
MIN_STEPS = 6
#: ... slower than the other ranks by this fraction: the slowdown the rule is built to find
#: (Greyhound's and FALCON's 10 %) ...
MIN_EFFECT = 0.10
#: ... which a median over noisy steps understates about half the time: the bar on the estimate is
#: this share of it. One bar for `summarize` (`compare_ranks`) and `watch` (its window): a rank 10 %
#: slower is found by both, or by neither.
EFFECT_MARGIN = 0.75
#: Between that bar and `MIN_EFFECT` itself, the difference must stand this many times the noise
#: (not `MIN_Z`): a smaller effect needs stronger evidence, or the many ranks × phases of a noisy
#: healthy run offer one at 3.5 σ.
MIN_Z_BELOW_EFFECT = 5.0
#: ... and that difference at least this many times the noise (robust z; 3.5 is the usual outlier
#: bar).
MIN_Z = 3.5
#: A phase straggler's difference must also be at least this fraction of the median step time.
MIN_STEP_SHARE = 0.01
#: ... and a phase straggler finishes the phase late by at least this share of its difference (else
#: it waited).
MIN_LATENESS_SHARE = 0.5
#: A late arrival at the step-closing collective delays every rank: a smaller share of the others'
#: arrival time counts.
MIN_ARRIVAL_EFFECT = 0.10
#: With fewer peers than this there is no majority to call one abnormal: a difference, nobody
#: blamed.
MIN_MAJORITY = 3
#: A finding reaches "Look first at" only when it costs the run at least this share of the step: the
#: phase bar itself (`MIN_STEP_SHARE`), so a rank `watch` raises `slow` about (the same rule,
#: `stands_out`) is one `summarize` puts first (issue 26: at 5 % a rank 12 % slower in `fwd`, 3.5 %
#: of the step, was named by both but kept out of the headline) ...
HEADLINE_MIN_SHARE = MIN_STEP_SHARE
#: ... in both halves of the run: in each, its median per-step difference is at least this share of
#: the whole run's.
PERSISTENT_SHARE = 0.5
#: ... or, begun mid-run, large in at least this share of the steps from its first large one to the
#: last step (it lasted).
LASTED_SHARE = 0.8
#: The rule as data (in ``--json``), so that a reader knows what "straggler" meant.
STRAGGLER_RULE = {
    "min_steps": MIN_STEPS,
    "min_effect_pct": MIN_EFFECT * 100,
    "effect_bar_pct": round(EFFECT_MARGIN * MIN_EFFECT * 100, 6),
    "min_robust_z_below_effect": MIN_Z_BELOW_EFFECT,
    "min_robust_z": MIN_Z,
    "phase_min_share_of_step_pct": MIN_STEP_SHARE * 100,
    "arrival_min_effect_pct": MIN_ARRIVAL_EFFECT * 100,
    "min_ranks_for_majority": MIN_MAJORITY,
    "headline_min_cost_share_of_step_pct": HEADLINE_MIN_SHARE * 100,
}
#: Up to this many ranks, the spread of "the other ranks" leaves each rank out exactly.
_EXACT_SPREAD_UP_TO = 64


# -- peers ----------------------------------------------------------------------------------------
def peer_key(mesh: Mapping[str, int] | None) -> tuple[tuple[str, int], ...]:
    """What a rank must share with its peers: its mesh coordinates but the data-parallel ones (names
    starting ``dp``).

    Example:
        >>> peer_key({"pp": 1, "dp": 3, "tp": 0}), peer_key(None)
        ((('pp', 1), ('tp', 0)), ())
    """
    if not mesh:
        return ()
    return tuple(
        sorted(
            (name, coord)
            for name, coord in mesh.items()
            if not name.startswith(DATA_PARALLEL_PREFIX)
        )
    )


def peer_groups(
    meshes: Mapping[int, Mapping[str, int] | None],
) -> dict[tuple[tuple[str, int], ...], list[int]]:
    """Ranks that should do the same work, by `peer_key`; ranks without a mesh are all peers of each
    other.

    Example:
        >>> peer_groups({0: {"pp": 0, "dp": 0}, 1: {"pp": 0, "dp": 1}, 2: {"pp": 1, "dp": 0}, 3: {"pp": 1, "dp": 1}})
        {(('pp', 0),): [0, 1], (('pp', 1),): [2, 3]}
    """
    groups: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for rank in sorted(meshes):
        groups.setdefault(peer_key(meshes[rank]), []).append(rank)
    return groups


def describe_group(key: tuple[tuple[str, int], ...]) -> str:
    """``pp 1, tp 0`` (empty for all ranks)."""
    return ", ".join(f"{name} {coord}" for name, coord in key)


# -- the statistic ---------------------------------------------------------------------------------
def effect_bar(reference: float, min_effect: float = MIN_EFFECT) -> float:
    """The least excess (same unit as `reference`) that counts as `min_effect` slower than
    `reference`: `EFFECT_MARGIN` of it.

    Example:
        >>> round(effect_bar(30.0), 6)  # ms: a rank whose fwd takes 30 ms on its peers is slow from +2.25 ms
        2.25
    """
    return EFFECT_MARGIN * min_effect * reference


def stands_out(
    excess: float,
    reference: float,
    noise: float,
    *,
    min_effect: float = MIN_EFFECT,
    min_z: float = MIN_Z,
    step_ms: float | None = None,
    min_step_share: float = MIN_STEP_SHARE,
) -> bool:
    """Whether a unit's `excess` over its peers' `reference` is a slowdown on evidence: the one rule
    `summarize` and `watch` apply.

    At least `effect_bar` of the reference (when the reference is positive),
    at least `min_z` times the `noise` (when there is any; `MIN_Z_BELOW_EFFECT`
    times while under `min_effect` of the reference), and, with
    `step_ms` (a phase), at least `min_step_share` of the step. `summarize`
    asks it of a rank's median over every step (`compare_ranks`), `watch` of
    its median over the last steps against its peers': the same bar, so at the
    end of a run both name the same ranks.

    Example:
        >>> stands_out(3.0, 30.0, 0.3), stands_out(2.0, 30.0, 0.3), stands_out(3.0, 30.0, 1.0), stands_out(3.0, 30.0, 0.3, step_ms=400.0)
        (True, False, False, False)
        >>> stands_out(2.5, 30.0, 0.6), stands_out(2.5, 30.0, 0.4)  # under 10 %: 5 × the noise, not 3.5 ×
        (False, True)
    """
    # under the effect the rule is built for: stronger evidence
    below = reference > 0 and excess < min_effect * reference
    return (
        excess > 0
        and (reference <= 0 or excess >= effect_bar(reference, min_effect))
        and (noise <= 0 or excess >= max(min_z, MIN_Z_BELOW_EFFECT if below else 0.0) * noise)
        and (step_ms is None or excess >= min_step_share * step_ms)
    )


def compare_ranks(
    per_rank: Mapping[int, Mapping[int, float]],
    *,
    step_ms: float | None = None,
    min_effect: float = MIN_EFFECT,
    table: bool = True,
) -> tuple[list[StepTimes], list[RankSlowness]]:
    """Per step: each rank's time and the slowest rank (None on a tie); per rank: is it a straggler,
    by how much.

    A rank's *excess* is its median minus the median of the other ranks'
    medians (over the steps it shares with another rank). It *differs* when it
    has `MIN_STEPS` such steps and its excess passes `stands_out`: at least
    `EFFECT_MARGIN` × `min_effect` of the others' median, at least `MIN_Z`
    times the noise, and (with `step_ms`, for a phase) at least
    `MIN_STEP_SHARE` of the step; it is a *straggler* when it
    differs among at least `MIN_MAJORITY` ranks (with two, either could be the
    odd one). The noise is the larger of the spread of the other ranks'
    medians (`rules.robust_sd`: 1.4826 × MAD) and the standard error of the
    rank's median per-step difference from the others (`rules.MEDIAN_SE` ×
    that spread / √n: 1.2533 × 1.4826 × MAD / √n);
    `robust_z` is None when both are 0. Ranks come out stragglers first, then
    by excess. `table` False: the per-step rows are not built (an empty list;
    a caller that only wants the verdicts saves a dict per step).

    Example:
        >>> steps, ranks = compare_ranks({0: {s: 10.0 for s in range(1, 9)}, 1: {s: 15.0 + s % 2 for s in range(1, 9)}, 2: {s: 10.5 for s in range(1, 9)}})
        >>> [(r.rank, r.median_ms, r.others_median_ms, r.median_excess_ms, r.straggler) for r in ranks]
        [(1, 15.5, 10.25, 5.25, True), (2, 10.5, 12.75, -2.25, False), (0, 10.0, 13.0, -3.0, False)]
        >>> compare_ranks({0: {1: 10.0, 2: 10.0}, 1: {1: 10.0, 2: 10.0}})[0][0].slowest_rank is None  # a tie is nobody's
        True
    """
    rows: list[StepTimes] = []
    dense = _dense(per_rank, rows if table else None)
    if dense is not None:
        slowest_count, counts, medians, standard_errors = dense
    else:
        slowest_count, counts, medians, standard_errors = _per_step(per_rank, rows, table)
    ordered_medians = sorted(medians.values())
    # Beyond this many ranks, leaving one rank out moves the spread by at most one order statistic:
    # the spread of all ranks stands for "the others'" (O(R log R) instead of O(R² log R) at 1,000
    # ranks).
    shared_spread = (
        robust_sd(ordered_medians) if len(ordered_medians) > _EXACT_SPREAD_UP_TO else None
    )
    majority = len(medians) >= MIN_MAJORITY
    ranks = []
    for rank, compared in counts.items():
        others_median = _median_without(ordered_medians, medians[rank])
        excess = medians[rank] - others_median
        pct = 100.0 * excess / others_median if others_median > 0 else None
        if shared_spread is not None:
            spread = shared_spread
        else:
            others = [median for other, median in medians.items() if other != rank]
            spread = robust_sd(others) if len(others) > 1 else 0.0
        noise = max(spread, standard_errors[rank])
        z = excess / noise if noise > 0 else None
        differs = compared >= MIN_STEPS and stands_out(
            excess, others_median, noise, min_effect=min_effect, step_ms=step_ms
        )
        ranks.append(
            RankSlowness(
                rank=rank,
                compared_steps=compared,
                slowest_steps=slowest_count.get(rank, 0),
                median_ms=round(medians[rank], 6),
                others_median_ms=round(others_median, 6),
                median_excess_ms=round(excess, 6),
                median_excess_pct=None if pct is None else round(pct, 2),
                noise_ms=round(noise, 6),
                robust_z=None if z is None else round(z, 2),
                straggler=differs and majority,
                differs=differs,
            )
        )
    ranks.sort(key=lambda r: (not r.straggler, not r.differs, -r.median_excess_ms, r.rank))
    return rows, ranks


def _per_step(
    per_rank: Mapping[int, Mapping[int, float]], rows: list[StepTimes], table: bool
) -> tuple[dict[int, int], dict[int, int], dict[int, float], dict[int, float]]:
    """`compare_ranks`'s per-step pass, any shape: (slowest steps, compared steps, median, standard
    error of the difference) per rank; `rows` filled when `table`."""
    # defaultdicts, not setdefault: one call per rank and step, without a new empty container each
    # time.
    steps: dict[int, dict[int, float]] = defaultdict(dict)
    for rank, by_step in per_rank.items():
        for step, ms in by_step.items():
            steps[step][rank] = ms
    slowest_count: dict[int, int] = {}
    own: dict[int, list[float]] = defaultdict(list)
    differences: dict[int, list[float]] = defaultdict(list)
    for step in sorted(steps):
        times = steps[step]
        if len(times) < 2:
            continue
        ordered = sorted(times.values())
        slowest: int | None = None
        excess = 0.0
        if ordered[-2] < ordered[-1]:  # a shared slowest time is nobody's
            slowest = max(times, key=times.__getitem__)
            slowest_count[slowest] = slowest_count.get(slowest, 0) + 1
            excess = ordered[-1] - _median_without(ordered, ordered[-1])
        without = _median_without_each(ordered)
        for rank, ms in times.items():
            own[rank].append(ms)
            differences[rank].append(ms - without(ms))
        if table:
            rows.append(
                StepTimes(
                    step=step,
                    ms=dict(sorted(times.items())),
                    slowest_rank=slowest,
                    excess_ms=round(excess, 6),
                )
            )
    counts = {rank: len(values) for rank, values in own.items()}
    medians = {rank: statistics.median(values) for rank, values in own.items()}
    errors = {
        rank: MEDIAN_SE * robust_sd(differences[rank]) / math.sqrt(len(values))
        for rank, values in own.items()
    }
    return slowest_count, counts, medians, errors


def _dense(
    per_rank: Mapping[int, Mapping[int, float]], rows: list[StepTimes] | None = None
) -> tuple[dict[int, int], dict[int, int], dict[int, float], dict[int, float]] | None:
    """`_per_step`'s answer for the common shape, in numpy: every rank (three or more) timed, as a
    float, in the same steps (None: another shape); `rows`, when given, filled as `_per_step` fills
    them.

    Why: the verdicts are computed on every first read of a question (the cache keeps them beside
    the facts, `collect._kept_stragglers`, but not across a changed file, `--steps` or
    `--no-align`), and at 1,024 ranks × 50 steps this pass was most of a `summarize` of cached
    facts. The same operations on the same operands, in the same order, as `_per_step` (a sort per
    step; the median without each value from the two or three values around the middle,
    `_median_without_each`; medians as the middle value or the half-sum of the two middle ones; the
    MAD as `rules.robust_sd`), so the result is the same to the bit
    (tests/analysis/model/test_stragglers.py compares them).
    """
    if len(per_rank) < 3:
        return None
    ranks = list(per_rank)
    first = per_rank[ranks[0]]
    if len(first) < 1:
        return None
    keys = first.keys()
    if any(by_step.keys() != keys for by_step in per_rank.values()):
        return None
    import numpy as np

    steps = sorted(keys)
    try:
        matrix = np.array(
            [[by_step[step] for step in steps] for by_step in per_rank.values()], dtype=np.float64
        )
    except (TypeError, ValueError):
        return None
    if (
        any(type(ms) is not float for by_step in per_rank.values() for ms in by_step.values())
        or np.isnan(matrix).any()
    ):
        return None  # ints (a median of ints stays an int in Python) or NaN (which sorts otherwise): the general pass
    ordered = np.sort(matrix, axis=0)
    n = len(ranks) - 1
    if n % 2:
        pivot, above = ordered[n // 2], ordered[n // 2 + 1]
        without = np.where(matrix > pivot, pivot, above)
    else:
        low, high, next_high = ordered[n // 2 - 1], ordered[n // 2], ordered[n // 2 + 1]
        without = np.where(
            matrix > high,
            (low + high) / 2,
            np.where(matrix > low, (low + next_high) / 2, (high + next_high) / 2),
        )
    differences = matrix - without
    slowest_count: dict[int, int] = {}
    unique = ordered[-2] < ordered[-1]  # a shared slowest time is nobody's
    slowest_index = np.argmax(matrix, axis=0)
    if unique.any():
        for index in slowest_index[unique].tolist():
            slowest_count[ranks[index]] = slowest_count.get(ranks[index], 0) + 1
    if rows is not None:
        # The slowest value's median of the others is `without` at its cell: the excess `_per_step`
        # computes.
        excess = np.where(
            unique, ordered[-1] - without[slowest_index, np.arange(len(steps))], 0.0
        ).tolist()
        by_rank = sorted(range(len(ranks)), key=ranks.__getitem__)
        sorted_ranks = [ranks[index] for index in by_rank]
        columns = matrix[by_rank].T.tolist()
        for column, step, is_unique, index, step_excess in zip(
            columns, steps, unique.tolist(), slowest_index.tolist(), excess
        ):
            rows.append(
                StepTimes(
                    step=step,
                    ms=dict(zip(sorted_ranks, column)),
                    slowest_rank=ranks[index] if is_unique else None,
                    excess_ms=round(step_excess, 6),
                )
            )
    medians = _row_medians(np, matrix)
    spread = MAD_TO_SD * _row_medians(
        np, np.abs(differences - _row_medians(np, differences)[:, None])
    )
    errors = MEDIAN_SE * spread / math.sqrt(len(steps))
    count = len(steps)
    return (
        slowest_count,
        dict.fromkeys(ranks, count),
        dict(zip(ranks, medians.tolist())),
        dict(zip(ranks, errors.tolist())),
    )


def _row_medians(np: Any, matrix: Any) -> Any:
    """Each row's median as `statistics.median` takes it: the middle value, or the half-sum of the
    two middle ones."""
    ordered = np.sort(matrix, axis=1)
    width = ordered.shape[1]
    if width % 2:
        return ordered[:, width // 2]
    return (ordered[:, width // 2 - 1] + ordered[:, width // 2]) / 2


def _median_without(ordered: list[float], value: float) -> float:
    """Median of sorted `ordered` with one occurrence of `value` left out (O(log n), not O(n))."""
    skip = bisect.bisect_left(ordered, value)
    n = len(ordered) - 1
    middle = n // 2
    # ordered[i] of the list without `value` is ordered[i] before `skip`, ordered[i + 1] from it on.
    if n % 2:
        return ordered[middle] if middle < skip else ordered[middle + 1]
    low = ordered[middle - 1] if middle - 1 < skip else ordered[middle]
    high = ordered[middle] if middle < skip else ordered[middle + 1]
    return (low + high) / 2


def _median_without_each(ordered: list[float]) -> Callable[[float], float]:
    """`_median_without(ordered, value)` for any `value` of sorted `ordered`, each in one or two
    comparisons.

    Why: it is asked for every rank of every step (51,200 times per statistic
    at 1,024 ranks × 50 steps). Leaving one value out moves the median by at
    most one position, so the answer is one of two (odd count left) or three
    (even) values known once per step; the same operands are added in the same
    order as `_median_without`, so the result is the same to the bit.
    """
    n = len(ordered) - 1
    if n < 2:
        return lambda value: _median_without(ordered, value)
    if n % 2:
        h = n // 2
        pivot, above = ordered[h], ordered[h + 1]
        return lambda value: pivot if value > pivot else above
    a = n // 2 - 1
    low, high, next_high = ordered[a], ordered[a + 1], ordered[a + 2]
    both_low, mixed, both_high = (low + high) / 2, (low + next_high) / 2, (high + next_high) / 2
    return lambda value: both_low if value > high else (mixed if value > low else both_high)


def per_step_differences(
    rank: int, per_rank: Mapping[int, Mapping[int, float]]
) -> list[tuple[int, float]]:
    """Per step the rank shares with another: its value minus the median of the others' (step
    order)."""
    out = []
    for step, value in sorted(per_rank.get(rank, {}).items()):
        others = [
            by_step[step]
            for other, by_step in per_rank.items()
            if other != rank and step in by_step
        ]
        if others:
            out.append((step, value - statistics.median(others)))
    return out


# -- when: slowdowns that start late or come and go ------------------------------------------------
#: The width of the running median that finds a change window (a single slow step is no shift) ...
WINDOW_MIN_STEPS = MIN_STEPS
#: ... and the steps a window holds at least: fewer, and a run of noisy steps chosen for being high
#: looks like one.
WINDOW_MIN_LENGTH = 2 * MIN_STEPS
#: At most this many windows per rank and phase are judged (the largest first).
MAX_WINDOWS = 3
#: A window is chosen for being high, out of every rank's, phase's and step's: judged on its steps
#: alone, it must be `MIN_EFFECT` slower (the ≥ 10 % filter itself, not the bar below it) and stand
#: this many times the noise (a noisy healthy 64-rank run offered a 10-step window at +15 %, z 5.3;
#: a rank's fwd doubling shows z 37 to 71).
WINDOW_MIN_Z = 8.0


def window_stands_out(slow: RankSlowness) -> bool:
    """Whether a rank judged on a change window's steps alone (`change_windows`) is slower on the
    stricter evidence a chosen window needs.

    Example:
        >>> from otel_titan.analysis.model.facts import RankSlowness
        >>> window_stands_out(RankSlowness(9, 20, 20, 60.0, 30.0, 30.0, 100.0, 0.5, 60.0, True, True))
        True
        >>> window_stands_out(RankSlowness(9, 12, 12, 36.0, 30.0, 6.0, 20.0, 1.0, 6.0, True, True))  # z 6 < 8
        False
    """
    return (
        slow.differs
        and slow.median_excess_pct is not None
        and slow.median_excess_pct >= 100.0 * MIN_EFFECT
        and (slow.robust_z is None or slow.robust_z >= WINDOW_MIN_Z)
    )


def change_windows(
    per_rank: Mapping[int, Mapping[int, float]],
    skip: set[int] | frozenset[int] = frozenset(),
    *,
    min_effect: float = MIN_EFFECT,
) -> list[tuple[int, int, int]]:
    """Where a rank shifted above its peers for a while: [(rank, first step, last step)], largest
    windows first.

    Why: `compare_ranks` judges each rank's median over every step, and a slowdown that starts in
    the last quarter of the run (or comes and goes) never moves a median over the run. Per rank, its
    per-step difference from the median of every rank in that step, smoothed by a running median
    over `WINDOW_MIN_STEPS` steps (a single slow step is no shift); the steps where it stays at
    least `MIN_EFFECT` of the ranks' median (the change points: the ≥ 10 % filter of Greyhound and
    FALCON) form windows of at least `WINDOW_MIN_LENGTH` steps. A window is a candidate only: the
    caller judges the rank on those steps alone (`compare_ranks`), on the stricter evidence a window
    chosen for being high needs (`window_stands_out`). Ranks in `skip` (already found over the whole
    run) are not searched.

    Example:
        >>> times = {r: {s: 10.0 + (10.0 if r == 2 and s > 28 else 0.0) + 0.1 * ((r + s) % 3) for s in range(1, 41)} for r in range(5)}
        >>> change_windows(times)
        [(2, 29, 40)]
    """
    import numpy as np

    ranks = [rank for rank in per_rank if rank not in skip]
    steps = sorted({step for by_step in per_rank.values() for step in by_step})
    if (
        len(per_rank) < MIN_MAJORITY
        or not ranks
        or len(steps) < WINDOW_MIN_LENGTH + WINDOW_MIN_STEPS
    ):
        return []
    index = {step: i for i, step in enumerate(steps)}
    matrix = np.full((len(per_rank), len(steps)), np.nan)
    order = list(per_rank)
    for row, rank in enumerate(order):
        for step, ms in per_rank[rank].items():
            matrix[row, index[step]] = ms
    with np.errstate(all="ignore"):
        step_median = np.nanmedian(matrix, axis=0)
        reference = float(np.nanmedian(np.nanmedian(matrix, axis=1)))
    if not reference > 0:
        return []
    bar = min_effect * reference
    out = []
    width = WINDOW_MIN_STEPS
    for row, rank in enumerate(order):
        if rank in skip:
            continue
        differences = matrix[row] - step_median
        present = ~np.isnan(differences)
        if present.sum() < WINDOW_MIN_LENGTH + width:
            continue
        values, kept = differences[present], np.asarray(steps)[present]
        # smooth[i]: values[i : i + width]
        smooth = np.median(np.lib.stride_tricks.sliding_window_view(values, width), axis=1)
        large = smooth >= bar
        windows = []
        i = 0
        while i < large.size:
            if not large[i]:
                i += 1
                continue
            j = i
            while j + 1 < large.size and large[j + 1]:
                j += 1
            # Running windows i..j cover values i .. j + width - 1; trim to the steps that are
            # themselves large: at least half the window's own median shift (a noisy step at the bar
            # just before the onset is not in it).
            first, last = i, j + width - 1
            edge = max(bar, 0.5 * float(np.median(values[first : last + 1])))
            while first < last and values[first] < edge:
                first += 1
            while last > first and values[last] < edge:
                last -= 1
            if last - first + 1 >= WINDOW_MIN_LENGTH:
                windows.append((last - first + 1, int(kept[first]), int(kept[last])))
            i = j + 1
        for _, first_step, last_step in sorted(windows, reverse=True)[:MAX_WINDOWS]:
            out.append((rank, first_step, last_step))
    out.sort(key=lambda item: (item[1] - item[2], item[0]))
    return out


def within(
    per_rank: Mapping[int, Mapping[int, Any]], first: int, last: int
) -> dict[int, dict[int, Any]]:
    """`per_rank` (rank → step → value) with only the steps `first`…`last` (ranks left with none
    dropped)."""
    out = {
        rank: {step: value for step, value in by_step.items() if first <= step <= last}
        for rank, by_step in per_rank.items()
    }
    return {rank: by_step for rank, by_step in out.items() if by_step}


# -- wait or work ----------------------------------------------------------------------------------
def lateness(
    rank: int, ends: Mapping[int, Mapping[int, int]], exits: Mapping[int, Mapping[int, int]] | None
) -> float | None:
    """Median over steps of how much later `rank` finished a phase than its peers (ms); None without
    a shared step.

    `ends`: rank → step → when its last span of the phase in that step ended
    (µs, its own clock). With `exits` (rank → step → when it left the
    step-closing collective, its own clock: one instant on every rank), each
    rank's end is measured back from its exit, so no clock is compared with
    another (drift and offsets cancel). Without, the ends are compared as they
    are: only valid when every rank writes on one clock.
    """

    def before_exit(other: int, step: int) -> float | None:
        end = ends.get(other, {}).get(step)
        if exits is None:
            return None if end is None else -float(end)
        exit_us = exits.get(other, {}).get(step)
        return None if end is None or exit_us is None else float(exit_us - end)

    late = []
    for step in ends.get(rank, {}):
        mine = before_exit(rank, step)
        if mine is None:
            continue
        others = [
            value
            for other in ends
            if other != rank
            for value in (before_exit(other, step),)
            if value is not None
        ]
        if others:
            late.append((statistics.median(others) - mine) / 1000.0)
    return statistics.median(late) if late else None


def arrivals(anchors: Mapping[int, Mapping[int, tuple[int, int]]]) -> dict[int, dict[int, float]]:
    """rank → step → ms from leaving step N−1's closing collective to entering step N's, on the
    rank's own clock.

    `anchors`: rank → step → (start, end) µs of its step-closing collective.
    Every rank leaves the collective at one instant, so this is every rank's
    arrival measured from one moment, with no clock compared with another.
    """
    out: dict[int, dict[int, float]] = {}
    for rank, by_step in anchors.items():
        own = {
            step: (start - by_step[step - 1][1]) / 1000.0
            for step, (start, _) in by_step.items()
            if step - 1 in by_step
        }
        if own:
            out[rank] = own
    return out


# -- cost and persistence --------------------------------------------------------------------------
def finding(
    slow: RankSlowness,
    *,
    kind: str,
    what: str,
    source: str,
    attempt: int | None,
    per_rank: Mapping[int, Mapping[int, float]],
    step_ms: float | None,
    peers: list[int],
    group: tuple[tuple[str, int], ...],
    late_ms: float | None = None,
    verdict: str | None = None,
    why: str | None = None,
    window: tuple[int, int] | None = None,
    window_to_end: bool = False,
) -> StragglerFinding:
    """One finding with its cost (what the run would save without it) and whether it held in both
    halves of the run.

    The cost per step is the rank's excess, or for a phase its lateness when
    smaller (what the others wait for at the collective); over the run, that
    times the steps compared. `verdict` defaults to ``straggler`` (a majority
    of peers) or ``difference`` (fewer than `MIN_MAJORITY` peers). `window`:
    the steps (first, last) a slowdown that started late or came and went was
    judged on (`change_windows`; `per_rank` holds those steps only): with
    `window_to_end` (it runs to the run's last step) an onset that lasted
    (``since step N``), else one that came and went (``in steps A–B only``);
    either reaches "Look first at" when it costs enough, in both halves of its
    window.
    """
    cost = _cost_per_step(slow, late_ms)
    held = _persistence(slow, per_rank)
    persistent, lasted = held.persistent, held.lasted
    share = cost / step_ms if step_ms else None
    verdict = verdict or ("straggler" if slow.straggler else "difference")
    if window is not None:
        # Judged on the window's steps alone ("both halves" are the window's): to the end of the run
        # an onset that kept costing (since step N), else one that came and went, said with its
        # steps.
        lasted = window_to_end
        persistent = persistent and not window_to_end
    headline = _reaches_headline(verdict, persistent or lasted, share)
    if why is None and not headline:
        why = _why_not_headline(verdict, share, held)
    return StragglerFinding(
        source=source,
        attempt=attempt,
        rank=slow.rank,
        kind=kind,
        what=what,
        verdict=verdict,
        peers=list(peers),
        group=dict(group),
        median_ms=slow.median_ms,
        others_median_ms=slow.others_median_ms,
        excess_ms=slow.median_excess_ms,
        excess_pct=slow.median_excess_pct,
        noise_ms=slow.noise_ms,
        robust_z=slow.robust_z,
        compared_steps=slow.compared_steps,
        slowest_steps=slow.slowest_steps,
        lateness_ms=_rounded(late_ms, 6),
        cost_per_step_ms=round(cost, 6),
        cost_run_ms=round(cost * slow.compared_steps, 3),
        share_of_step=_rounded(share, 4),
        persistent=persistent,
        first_half_excess_ms=_rounded(held.first, 6),
        second_half_excess_ms=_rounded(held.second, 6),
        large_from_step=held.large[0] if held.large else None,
        large_to_step=held.large[-1] if held.large else None,
        large_steps=len(held.large),
        headline=headline,
        why_not_headline=None if headline else why,
        since_step=_since_step(held.large, window) if lasted else None,
        window_from_step=None if window is None else window[0],
        window_to_step=None if window is None else window[1],
    )


def _cost_per_step(slow: RankSlowness, late_ms: float | None) -> float:
    """What the run would save per step without the finding: the rank's excess, or for a phase its
    lateness when smaller (what the others wait for at the collective; 0 when not late)."""
    return (
        slow.median_excess_ms if late_ms is None else max(0.0, min(slow.median_excess_ms, late_ms))
    )


class _Persistence(NamedTuple):
    """How a rank's per-step difference from its peers held over the steps judged (`finding`):
    whether it is a lasting cost or came and went."""

    #: Steps compared (with another rank).
    steps: int
    #: The median difference in the first half of those steps, and in the second (None: no step in
    #: that half).
    first: float | None
    second: float | None
    #: At least `PERSISTENT_SHARE` of the rank's excess in both halves.
    persistent: bool
    #: The steps whose difference is at least that share (in step order).
    large: list[int]
    #: Not in both halves, but large from one step to the last in nearly every step since
    #: (`LASTED_SHARE`).
    lasted: bool


def _persistence(slow: RankSlowness, per_rank: Mapping[int, Mapping[int, float]]) -> _Persistence:
    """Whether `slow`'s excess held in both halves of the steps, or began at a step and lasted to
    the last one (`_Persistence`).

    Why: a cost that holds in both halves (or lasts from its onset to the
    end) is one the run keeps paying, what "Look first at" is for; one large
    in a few steps only came and went, and is said with its steps instead.
    """
    differences = per_step_differences(slow.rank, per_rank)
    half = len(differences) // 2
    bar = PERSISTENT_SHARE * slow.median_excess_ms
    first = _median_difference(differences[:half])
    second = _median_difference(differences[half:])
    persistent = (
        slow.median_excess_ms > 0
        and first is not None
        and second is not None
        and first >= bar
        and second >= bar
    )
    large = _large_steps(differences, slow.median_excess_ms, bar)
    return _Persistence(
        len(differences),
        first,
        second,
        persistent,
        large,
        _lasted(differences, large, second, bar, persistent),
    )


def _median_difference(differences: list[tuple[int, float]]) -> float | None:
    """The median of (step, difference) pairs' differences; None for no step."""
    return statistics.median([d for _, d in differences]) if differences else None


def _large_steps(differences: list[tuple[int, float]], excess_ms: float, bar: float) -> list[int]:
    """The steps whose difference reaches `bar` (none when the rank is not slower at all), in step
    order."""
    if not excess_ms > 0:
        return []
    return [step for step, d in differences if d >= bar]


def _lasted(
    differences: list[tuple[int, float]],
    large: list[int],
    second: float | None,
    bar: float,
    persistent: bool,
) -> bool:
    """Not in both halves, but large from one step to the last (nearly every step since): it began
    then and keeps costing.

    That is what "both halves" is there to find; one that came and went does not qualify.
    """
    if persistent or not large or second is None or not second >= bar:
        return False
    since = [step for step, _ in differences if step >= large[0]]
    return large[-1] == differences[-1][0] and len(large) >= LASTED_SHARE * len(since)


def _reaches_headline(verdict: str, lasting: bool, share: float | None) -> bool:
    """Whether a finding reaches "Look first at": a verdict on evidence, a lasting cost, and at
    least `HEADLINE_MIN_SHARE` of the step."""
    return (
        verdict in ("straggler", "difference")
        and lasting
        and share is not None
        and share >= HEADLINE_MIN_SHARE
    )


def _why_not_headline(verdict: str, share: float | None, held: _Persistence) -> str:
    """Why a finding stays out of "Look first at": it cannot tell, it costs too little, or it came
    and went (with the steps it was large in)."""
    if verdict == "cannot tell":
        return "cannot tell"
    if share is None or share < HEADLINE_MIN_SHARE:
        return (
            f"costs {0.0 if share is None else share:.1%} of the step (< {HEADLINE_MIN_SHARE:.0%})"
        )
    where = f"steps {held.large[0]}–{held.large[-1]}" if held.large else "no step"
    return f"came and went: large in {len(held.large)} of {held.steps} steps, {where}; not in both halves of the run"


def _since_step(large: list[int], window: tuple[int, int] | None) -> int:
    """Where a lasting slowdown began: its change window's first step, else its first large step."""
    return window[0] if window is not None else large[0]


def _rounded(value: float | None, digits: int) -> float | None:
    """`value` rounded to `digits`, None kept."""
    return None if value is None else round(value, digits)


# -- one group's verdicts: the rule `summarize` (every step) and `watch` (its window) both call ----
def windowed(
    times: Mapping[int, Mapping[int, float]], slowness: list[RankSlowness], step_ms: float | None
) -> list[tuple[RankSlowness, dict[int, dict[int, float]], tuple[int, int]]]:
    """Ranks not found over every step that stand out between change points (`change_windows`):
    judged by the same rule on those steps alone.

    Each: (its verdict on the window, the peers' times in it, the window). A
    slowdown that begins late or comes and goes never moves a median over the
    run; on the steps where it happened it is plain.
    """
    found = {slow.rank for slow in slowness if slow.differs}
    out = []
    for rank, first, last in change_windows(times, skip=found):
        window_times = within(times, first, last)
        if len(window_times) < MIN_MAJORITY or rank not in window_times:
            continue
        _, judged = compare_ranks(window_times, step_ms=step_ms, table=False)
        slow = next((r for r in judged if r.rank == rank), None)
        if slow is not None and window_stands_out(slow) and rank not in found:
            found.add(rank)  # one window per rank and phase: the largest
            out.append((slow, window_times, (first, last)))
    return out


def phase_lateness(
    rank: int,
    ends: Mapping[int, Mapping[int, int]],
    exits: Mapping[int, Mapping[int, int]] | None,
    one_clock: bool,
    step_ms: float | None,
) -> tuple[float | None, bool]:
    """How much later `rank` finished the phase than its peers (ms), on the best evidence there is
    (None: cannot tell), and whether in lockstep.

    One clock: the ends compared as written (exact, no assumption); ranks
    more than a step apart there are not in lockstep (False): no rank waits
    for another, the durations decide. Several hosts: each end measured back
    from the rank's exit of the step-closing collective, on its own clock (no
    shared clock needed). Neither: None.
    """
    if one_clock:
        late = lateness(rank, ends, None)
        if late is not None and step_ms is not None and abs(late) > step_ms:
            return None, False
        return late, True
    return (lateness(rank, ends, exits) if exits is not None else None), True


def judge_phase(
    phase: str,
    times: Mapping[int, Mapping[int, float]],
    ends: Mapping[int, Mapping[int, int]],
    exits: Mapping[int, Mapping[int, int]] | None,
    *,
    one_clock: bool,
    step_ms: float | None,
    last_step: int,
    source: str,
    attempt: int | None,
    peers: list[int],
    group: tuple[tuple[str, int], ...],
    change_points: bool = True,
) -> tuple[list[StragglerFinding], int, list[RankSlowness]]:
    """One peer group's verdicts on one phase: (findings, how many are "cannot tell", every rank's
    comparison).

    The one implementation of "a rank is slow in a phase", called by
    `summarize` (`collect._stragglers`, over every step of the run or
    ``--steps``) and by `watch` (`watch.detect`, over its last steps): the
    only differences between them are the steps given (the window) and when
    it is asked (the clock). `times`: rank → step → ms of the phase;
    `ends`: rank → step → when its last span of the phase in that step ended
    (µs, own clock); `exits`: rank → step → when it left the step-closing
    collective (own clock), None without one every rank leaves together.
    A rank is compared with its peers (`compare_ranks`, `stands_out`); one
    not found over the steps is judged again on a change window's
    (`windowed`, when `change_points`); then wait or work
    (`phase_lateness`): a longer phase that ends with the others' is a wait
    and no finding; one whose lateness cannot be measured is ``cannot tell``.
    Each finding carries its cost and whether it reaches "Look first at"
    (`finding`).
    """
    common = dict(source=source, attempt=attempt, step_ms=step_ms, peers=peers, group=group)
    if len(times) < 2:
        return [], 0, []
    _, slowness = compare_ranks(times, step_ms=step_ms, table=False)
    judged = [(slow, times, None) for slow in slowness if slow.differs] + (
        windowed(times, slowness, step_ms) if change_points else []
    )
    out: list[StragglerFinding] = []
    cannot_tell = 0
    for slow, judged_times, window in judged:
        where: dict[str, Any] = (
            {} if window is None else {"window": window, "window_to_end": window[1] >= last_step}
        )
        late, lockstep = phase_lateness(
            slow.rank, ends if window is None else within(ends, *window), exits, one_clock, step_ms
        )
        if not lockstep:  # one clock, ranks more than a step apart: nobody waits for another, the durations decide
            out.append(
                finding(slow, kind="phase", what=phase, per_rank=judged_times, **where, **common)  # type: ignore[arg-type]  # common: finding's other arguments
            )
            continue
        if late is None:
            cannot_tell += 1
            out.append(
                finding(
                    slow,
                    kind="phase",
                    what=phase,
                    per_rank=judged_times,
                    verdict="cannot tell",
                    why="cannot tell whether it waited or worked (see withheld)",
                    **where,
                    **common,  # type: ignore[arg-type]  # common: finding's other arguments
                )
            )
            continue
        if late < MIN_LATENESS_SHARE * slow.median_excess_ms:
            continue  # longer, but it ends with the others: it waited (e.g. inside a collective), it was not slow
        out.append(
            finding(
                slow,
                kind="phase",
                what=phase,
                per_rank=judged_times,
                late_ms=late,
                **where,
                **common,  # type: ignore[arg-type]  # common: finding's other arguments
            )
        )
    return out, cannot_tell, slowness


def judge_arrival(
    anchor: str,
    anchors: Mapping[int, Mapping[int, tuple[int, int]]],
    *,
    step_ms: float | None,
    source: str,
    attempt: int | None,
    peers: list[int],
    group: tuple[tuple[str, int], ...],
) -> tuple[list[StragglerFinding], list[StepTimes]]:
    """One peer group's verdicts on arrival at the step-closing collective `anchor`: (findings, the
    per-step rows).

    `anchors`: rank → step → (start, end) µs of its `anchor` span, own clock
    (`arrivals`); the bar is `MIN_ARRIVAL_EFFECT` of the others' arrival
    time and `MIN_STEP_SHARE` of the step. Called by `summarize` and `watch`
    alike (see `judge_phase`).
    """
    per_rank = arrivals(anchors)
    if len(per_rank) < 2:
        return [], []
    rows, slowness = compare_ranks(per_rank, step_ms=step_ms, min_effect=MIN_ARRIVAL_EFFECT)
    common = dict(source=source, attempt=attempt, step_ms=step_ms, peers=peers, group=group)
    return [
        finding(slow, kind="arrival", what=anchor, per_rank=per_rank, **common)  # type: ignore[arg-type]  # common: finding's other arguments
        for slow in slowness
        if slow.differs
    ], rows
