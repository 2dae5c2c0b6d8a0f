"""Bad input to the API (property-based): every call either raises TypeError/ValueError at once,
skips a scalar value that is not a number (without raising), or writes a line that parses as JSON
and reads back to the same value.

Injected (Hypothesis): event names, descriptions and tags with unicode,
newlines, quotes, control characters, lone surrogates, empty and 1 MB strings;
steps that are negative, huge, floats, None, bools, numpy integers; scalar
values of every type (bool, ints beyond 64 bits, NaN, infinities, numpy and
torch scalars, tensors, strings, containers).
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_titan import structured_logger as sl
from tests.conftest import data_records, jsonl_files, read_records

numpy = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

names = st.one_of(
    st.text(max_size=60),
    # includes lone surrogates
    st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=30),
    st.sampled_from(
        ["", "x" * 1_000_000, 'a"b\\c\n\r\t\x00\x1f', "\u2028\u2029", "../../etc/passwd", "fwd/bwd"]
    ),
    st.integers(),
    st.none(),
    st.binary(max_size=10),
)
steps = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40).map(numpy.int64),
    st.text(max_size=3),
)
scalar_values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(width=32).map(numpy.float32),
    # int32 holds up to 2**31 - 1
    st.integers(min_value=-(2**31), max_value=2**31 - 1).map(numpy.int32),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: torch.tensor(v)),
    st.text(max_size=5),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.just(complex(1, 1)),
)


def last_data_record(run_dir):
    assert sl.flush_structured_logger(timeout=10)
    return data_records(read_records(jsonl_files(run_dir)[0]))[-1]


def expected_number(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, numpy.floating):
        return expected_number(float(value))
    if isinstance(value, (bool, numpy.integer)):
        return int(value)
    return value


@SETTINGS
@given(name=names, description=st.one_of(st.none(), names))
def test_span_and_instant_names(logged, run_dir, name, description):
    if not sl.is_initialized():
        logged()
    try:
        scope = sl.log_trace_span(name, description)
    except (TypeError, ValueError):
        assert (
            not isinstance(name, str)
            or not name
            or (description is not None and not isinstance(description, str))
        )
        return
    with scope:
        pass
    record = last_data_record(run_dir)
    assert record["log_type_name"] == f"{name}_end"
    assert record.get("description") == description
    sl.log_trace_instant(name)
    assert last_data_record(run_dir)["log_type_name"] == name


@SETTINGS
@given(tag=names)
def test_step_tags(logged, run_dir, tag):
    if not sl.is_initialized():
        logged()
    sl.set_step(1)
    try:
        sl.add_step_tag(tag)
    except (TypeError, ValueError):
        assert not isinstance(tag, str) or not tag
        return
    sl.log_trace_instant("tagged")
    assert last_data_record(run_dir)["step_tags"] == [tag]


@SETTINGS
@given(step=steps, relative=steps)
def test_steps(logged, run_dir, step, relative):
    if not sl.is_initialized():
        logged()
    try:
        sl.set_step(step, relative_step=relative)
    except (TypeError, ValueError):
        for value in (step, relative):
            if value is None:
                continue
            ok = (
                isinstance(value, (int, numpy.integer))
                and not isinstance(value, bool)
                and -(2**63) <= int(value) < 2**63
            )
            if not ok:
                return
        pytest.fail(f"set_step({step!r}, relative_step={relative!r}) raised for valid input")
    sl.log_trace_instant("stepped")
    record = last_data_record(run_dir)
    assert record.get("step") == (None if step is None else int(step))
    # defaults to the step, as in torchtitan
    expected_relative = step if relative is None else relative
    assert record.get("relative_step") == (
        None if expected_relative is None else int(expected_relative)
    )


@SETTINGS
@given(value=scalar_values)
def test_scalar_values(logged, run_dir, value):
    if not sl.is_initialized():
        logged()
    sl.log_trace_instant("before_scalar")
    # never raises: a value that is not a number is skipped, warned and counted
    sl.log_trace_scalar({"metric": value})
    sl.log_trace_instant("after_scalar")
    assert sl.flush_structured_logger(timeout=10)
    records = data_records(read_records(jsonl_files(run_dir)[0]))
    before = max(i for i, r in enumerate(records) if r["log_type_name"] == "before_scalar")
    written = records[before + 1 : -1]
    real = isinstance(value, (bool, int, float, numpy.integer, numpy.floating)) and not isinstance(
        value, complex
    )
    in_range = (
        not isinstance(value, (int, numpy.integer))
        or isinstance(value, bool)
        or -(2**63) <= int(value) < 2**63
    )
    if not (real and in_range):
        assert written == [], f"wrote {value!r}"
        return
    (record,) = written
    assert record["event_name"] == "metric"
    expected = expected_number(value)
    assert record["value"] == expected or (
        isinstance(expected, float) and math.isclose(record["value"], expected)
    )
    json.dumps(record, allow_nan=False)  # strict JSON: no bare NaN / Infinity
