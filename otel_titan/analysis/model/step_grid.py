"""The run as a grid of ranks × steps (and phases, and scalars): what the report's figures are drawn
from.

Why: the report's pictures (step time by rank and step, arrival at the
step-closing collective, each phase per rank, the scalars over steps) are
facts per rank, step and phase that the summary's one streaming pass
(`model.collect`) already gathers for its straggler rule. Kept here, they
are drawn from the same read, by the same rules (`model.rules`: what begins a
step, which span closes it), so the page and ``summarize`` never disagree
about a step's time. Memory: a few numbers per rank and step (and per phase,
and per value of the drawn scalars), never per record read.

Example:
    >>> grid = StepGrid(step_ms={("training", 0): {0: {1: 10.0}, 1: {1: 12.0}}}, step_starts={("training", 0): {0: {1: 0, 2: 10_000}, 1: {1: 0, 2: 12_000}}})
    >>> grid.source_steps("training")
    (1, 2)
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

__all__ = ["StepGrid"]

#: (source, attempt): restarts are kept apart (attempt None: files that name none).
Key = tuple[str, "int | None"]
#: rank → step → a figure (ms, or µs on the rank's own clock).
PerRank = dict[int, dict[int, float]]


@dataclass
class StepGrid:
    """Per source and attempt, per rank and step: step times, step starts, phase times, arrival at
    the step-closing collective; the scalars.

    `step_ms`: a step's time (its start to the next step's start; a process's
    last step has none). `step_starts`: when each step began on the rank's own
    clock (µs; every step, the last included). `phase_step_ms`: per (source,
    attempt, phase) the total of the rank's completed spans of the phase that
    started in the step: the figure the straggler rule compares. `arrival_ms`:
    from the step's start to the rank's arrival at `anchor`, the step-closing
    collective the clocks were aligned on (both on the rank's own clock: no
    shared clock needed); empty without one. `scalars`: name → step → every
    rank's values (`model.scalar_steps`). `bytes_read`: the JSONL bytes read.
    """

    step_ms: dict[Key, PerRank] = field(default_factory=dict)
    step_starts: dict[Key, dict[int, dict[int, int]]] = field(default_factory=dict)
    phase_step_ms: dict[tuple[str, int | None, str], PerRank] = field(default_factory=dict)
    arrival_ms: dict[Key, PerRank] = field(default_factory=dict)
    anchor: str | None = None
    scalars: dict[str, dict[int, array]] = field(default_factory=dict)
    bytes_read: int = 0

    def source_steps(self, source: str) -> tuple[int | None, int | None]:
        """(first, last) step any rank of `source` began (every attempt); (None, None) without
        steps."""
        steps = [
            step
            for (src, _), per_rank in self.step_starts.items()
            if src == source
            for starts in per_rank.values()
            for step in starts
        ]
        return (min(steps), max(steps)) if steps else (None, None)

    def source_ranks(self, source: str) -> int | None:
        """The highest rank of `source` with a step (None without steps)."""
        ranks = [
            rank
            for (src, _), per_rank in self.step_starts.items()
            if src == source
            for rank, starts in per_rank.items()
            if starts
        ]
        return max(ranks) if ranks else None

    def rows(self, figure: dict[Key, PerRank], source: str) -> list[tuple[int, dict[int, float]]]:
        """(rank, step → value) of every attempt of `source` in `figure` (`step_ms` or
        `arrival_ms`); a rank restarted has a row per attempt."""
        return [
            (rank, steps)
            for (src, _), per_rank in figure.items()
            if src == source
            for rank, steps in per_rank.items()
            if steps
        ]

    def phases_by_rank(self, source: str) -> dict[str, dict[int, list[float]]]:
        """phase → rank → its per-step times in the phase (every attempt of `source`), phases and
        ranks in order."""
        out: dict[str, dict[int, list[float]]] = {}
        for (src, _, phase), per_rank in sorted(
            self.phase_step_ms.items(),
            key=lambda item: (item[0][0], item[0][2], -1 if item[0][1] is None else item[0][1]),
        ):
            if src != source:
                continue
            by_rank = out.setdefault(phase, {})
            for rank, steps in per_rank.items():
                by_rank.setdefault(rank, []).extend(steps.values())
        return {phase: dict(sorted(by_rank.items())) for phase, by_rank in out.items()}
