"""Trace and span ids: deterministic per (run, attempt, step), unique span ids."""

from __future__ import annotations

from otel_titan.core.trace_ids import SpanIdAllocator, StepTraceIds, splitmix64


def test_trace_id_depends_on_run_attempt_and_step_only():
    a = StepTraceIds("run", 0)
    assert a.for_step(3) == StepTraceIds("run", 0).for_step(3)
    assert len({a.for_step(3), a.for_step(4), a.for_step(None), StepTraceIds("run", 1).for_step(3), StepTraceIds("other", 0).for_step(3)}) == 5
    assert 0 < a.for_step(3) < 2**128


def test_span_ids_are_unique_nonzero_and_disjoint_from_fresh_ids():
    ids = SpanIdAllocator()
    spans = {ids.for_seq(i) for i in range(1, 100_001)}
    fresh = {ids.fresh() for _ in range(100_000)}
    assert len(spans) == 100_000 and len(fresh) == 100_000 and not spans & fresh
    assert 0 not in spans and max(spans | fresh) < 2**64


def test_span_ids_are_a_function_of_the_sequence_number():
    ids = SpanIdAllocator(salt=123)
    assert ids.for_seq(5) == SpanIdAllocator(salt=123).for_seq(5) != SpanIdAllocator(salt=124).for_seq(5)


def test_splitmix64_is_a_bijection_on_a_sample():
    assert len({splitmix64(i) for i in range(50_000)}) == 50_000
