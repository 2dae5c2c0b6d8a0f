"""model/scalar_steps.py: the scalars over steps the report draws, kept bounded (the first names
only) and merged as one pass would."""

from __future__ import annotations

import math

from otel_titan.analysis.model.scalar_steps import SERIES_KEPT, ScalarSteps


def _records(names: list[str], steps: int, ranks: int) -> list[dict]:
    return [
        {"event_name": name, "step": step, "value": float(rank * 10 + step)}
        for name in names
        for step in range(1, steps + 1)
        for rank in range(ranks)
    ]


def _as_lists(kept: ScalarSteps) -> dict:
    return {
        name: {step: sorted(values) for step, values in steps.items()}
        for name, steps in kept.series.items()
    }


def test_only_the_first_names_are_kept_whatever_the_order() -> None:
    names = [f"m{index:02d}" for index in range(SERIES_KEPT + 5)]
    forward, backward = ScalarSteps(), ScalarSteps()
    for record in _records(names, 3, 2):
        forward.observe(record)
    for record in reversed(_records(names, 3, 2)):
        backward.observe(record)
    assert sorted(forward.series) == sorted(backward.series) == names[:SERIES_KEPT]
    assert _as_lists(forward) == _as_lists(backward)
    assert forward.series["m00"][2].tolist() == [2.0, 12.0]


def test_merged_shares_equal_one_pass() -> None:
    names = [f"m{index:02d}" for index in range(SERIES_KEPT + 3)]
    records = _records(names, 4, 3)
    whole = ScalarSteps()
    for record in records:
        whole.observe(record)
    left, right = ScalarSteps(), ScalarSteps()
    # shares hold different names: the right one sees the late ones first
    for index, record in enumerate(records):
        (left if index % 3 else right).observe(record)
    left.merge(right)
    assert _as_lists(left) == _as_lists(whole)


def test_what_is_not_drawn_is_not_kept() -> None:
    kept = ScalarSteps()
    for value in ("NaN", math.nan, math.inf, True, None, "1.5"):
        kept.observe({"event_name": "loss", "step": 1, "value": value})
    kept.observe({"event_name": "loss", "step": None, "value": 1.0})
    kept.observe({"event_name": 7, "step": 1, "value": 1.0})
    assert kept.series == {}
    kept.observe({"event_name": "loss", "step": 1, "value": 3})
    assert kept.series["loss"][1].tolist() == [3.0]
