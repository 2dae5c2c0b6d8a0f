"""Step ranges and rank lists as typed on the command line."""

from __future__ import annotations

import pytest

from otel_titan.analysis import StepRange, parse_rank_list, parse_step_range


@pytest.mark.parametrize(
    "text, expected",
    [
        ("100:200", StepRange(100, 200)),
        ("5:", StepRange(5, None)),
        (":9", StepRange(None, 9)),
        ("7", StepRange(7, 7)),
        (" 3 : 4 ", StepRange(3, 4)),
        (":", StepRange(None, None)),
    ],
)
def test_step_ranges(text, expected):
    assert parse_step_range(text) == expected


@pytest.mark.parametrize("text", ["", "a:b", "5:2", "1:2:3", "x"])
def test_bad_step_ranges_say_what_is_expected(text):
    with pytest.raises(ValueError, match="step range"):
        parse_step_range(text)


def test_step_range_membership_is_inclusive_and_needs_a_step():
    steps = StepRange(3, 5)
    assert [s in steps for s in (2, 3, 5, 6, None, "4", True)] == [
        False,
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    assert str(steps) == "3:5" and str(StepRange(None, 5)) == ":5"


def test_rank_lists():
    assert parse_rank_list("0,3,8-11") == [0, 3, 8, 9, 10, 11]
    assert parse_rank_list(" 2 , 2 ") == [2, 2]


@pytest.mark.parametrize("text", ["", ",", "a", "3-1", "-1", "1-", "0,x"])
def test_bad_rank_lists_name_the_bad_part(text):
    with pytest.raises(ValueError, match="rank"):
        parse_rank_list(text)
