"""Slices of a run: steps ``A:B``, rank lists ``0,3,8-11``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepRange", "parse_step_range", "parse_rank_list"]


@dataclass(frozen=True)
class StepRange:
    """Steps ``first..last``, both included; None on a side means unbounded.

    Example:
        >>> 5 in StepRange(3, 8), 9 in StepRange(3, None), None in StepRange(1, 2)
        (True, True, False)
    """

    first: int | None = None
    last: int | None = None

    def __contains__(self, step: object) -> bool:
        if type(step) is not int:
            return False
        return (self.first is None or step >= self.first) and (
            self.last is None or step <= self.last
        )

    def __str__(self) -> str:
        return (
            f"{'' if self.first is None else self.first}:{'' if self.last is None else self.last}"
        )


def parse_step_range(text: str) -> StepRange:
    """``"A:B"`` (both included), ``"A:"``, ``":B"`` or ``"N"`` → `StepRange`; ValueError when
    malformed.

    Example:
        >>> parse_step_range("100:200"), parse_step_range("7")
        (StepRange(first=100, last=200), StepRange(first=7, last=7))
    """
    low, colon, high = text.strip().partition(":")
    try:
        first = int(low) if low.strip() else None
        last = (int(high) if high.strip() else None) if colon else first
    except ValueError:
        raise ValueError(
            f"bad step range {text!r} (expected A:B, A:, :B or N, e.g. 100:200)"
        ) from None
    if not colon and first is None:
        raise ValueError(f"bad step range {text!r} (expected A:B, A:, :B or N, e.g. 100:200)")
    if first is not None and last is not None and first > last:
        raise ValueError(f"bad step range {text!r}: {first} > {last}")
    return StepRange(first, last)


def parse_rank_list(text: str) -> list[int]:
    """``"0,3,8-11"`` → ``[0, 3, 8, 9, 10, 11]``; raises ValueError naming the bad part.

    Example:
        >>> parse_rank_list("0,3,8-10")
        [0, 3, 8, 9, 10]
    """
    ranks: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        try:
            if dash:
                first, last = int(low), int(high)
                if first > last or first < 0:
                    raise ValueError
                ranks.extend(range(first, last + 1))
            else:
                value = int(part)
                if value < 0:
                    raise ValueError
                ranks.append(value)
        except ValueError:
            raise ValueError(f"bad rank {part!r} (expected N or A-B, e.g. 0,3,8-11)") from None
    if not ranks:
        raise ValueError(f"no ranks in {text!r}")
    return ranks
