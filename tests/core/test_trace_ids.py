"""Trace and span ids: deterministic per (run, attempt, step), unique span ids."""

from __future__ import annotations

from otel_titan.core.trace_ids import SpanIdAllocator, StepTraceIds, splitmix64


def test_trace_id_depends_on_run_attempt_and_step_only():
    a = StepTraceIds("run", 0)
    assert a.for_step(3) == StepTraceIds("run", 0).for_step(3)
    assert (
        len(
            {
                a.for_step(3),
                a.for_step(4),
                a.for_step(None),
                StepTraceIds("run", 1).for_step(3),
                StepTraceIds("other", 0).for_step(3),
            }
        )
        == 5
    )
    assert 0 < a.for_step(3) < 2**128


def test_span_ids_are_unique_nonzero_and_disjoint_from_fresh_ids():
    ids = SpanIdAllocator()
    spans = {ids.for_seq(i) for i in range(1, 100_001)}
    fresh = {ids.fresh() for _ in range(100_000)}
    assert len(spans) == 100_000 and len(fresh) == 100_000 and not spans & fresh
    assert 0 not in spans and max(spans | fresh) < 2**64


def test_span_ids_are_a_function_of_the_sequence_number():
    ids = SpanIdAllocator(salt=123)
    assert (
        ids.for_seq(5)
        == SpanIdAllocator(salt=123).for_seq(5)
        != SpanIdAllocator(salt=124).for_seq(5)
    )


def test_splitmix64_is_a_bijection_on_a_sample():
    assert len({splitmix64(i) for i in range(50_000)}) == 50_000


def test_ranks_of_a_trace_group_share_a_step_trace_and_other_groups_do_not():
    from otel_titan.core.trace_ids import StepTraceIds, trace_group_of

    ids = {
        rank: StepTraceIds("run", 0, trace_group_of(rank, 32)).for_step(7) for rank in range(1024)
    }
    assert len(set(ids.values())) == 32
    assert ids[0] == ids[31] != ids[32] == ids[63]
    # size 0: one trace for every rank, its own id
    assert StepTraceIds("run", 0, None).for_step(7) not in ids.values()
    assert StepTraceIds("run", 0, 1).for_step(7) != StepTraceIds("run", 0, 1).for_step(8)


def test_trace_group_size_from_option_then_environment_with_clear_errors():
    import pytest

    from otel_titan.core.options import parse_options
    from otel_titan.core.trace_ids import resolve_trace_group_size

    assert resolve_trace_group_size(None, {}) == 32
    assert resolve_trace_group_size(None, {"OTEL_TITAN_TRACE_GROUP_SIZE": " 8 "}) == 8
    assert resolve_trace_group_size(4, {"OTEL_TITAN_TRACE_GROUP_SIZE": "8"}) == 4
    with pytest.raises(ValueError, match="OTEL_TITAN_TRACE_GROUP_SIZE='eight' is not an integer"):
        resolve_trace_group_size(None, {"OTEL_TITAN_TRACE_GROUP_SIZE": "eight"})
    with pytest.raises(ValueError, match="must be >= 0"):
        resolve_trace_group_size(None, {"OTEL_TITAN_TRACE_GROUP_SIZE": "-1"})
    with pytest.raises(ValueError, match="option trace_group_size must be an int >= 0"):
        parse_options({"trace_group_size": -2})
