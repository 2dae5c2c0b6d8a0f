"""Whatever the records hold, export and summary finish, and the trace stays valid Chrome Trace JSON."""

from __future__ import annotations

import json
import shutil

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_titan.analysis import NoRecordsError, format_summary, generate_gantt_trace, summarize_run
from tests.analysis import T0, load_trace, titan_file

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
_json = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=8)
_names = st.sampled_from(["fwd_start", "fwd_end", "fwd_error", "opt_start", "opt_end", "metric_value", "mark", "records_dropped", "signal_received", "structured_logger_closed", "_start", "_end"])


@st.composite
def records(draw):
    record = {
        "log_type": draw(st.one_of(st.sampled_from(["event", "instant"]), _json)),
        "log_type_name": draw(st.one_of(_names, _json)),
        "time_us": draw(st.one_of(st.integers(min_value=T0, max_value=T0 + 10_000_000), _json)),
    }
    for key in ("tid", "task_name", "span_id", "parent_span_id", "step", "relative_step", "step_tags", "value", "event_name", "seq_id", "error_type", "message", "dropped_records", "signal"):
        if draw(st.booleans()):
            record[key] = draw(_json)
    return record


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(lines=st.lists(records(), min_size=1, max_size=25))
def test_arbitrary_records_never_break_export_or_summary(tmp_path, lines):
    run_dir = tmp_path / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    path = titan_file(run_dir)
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in lines))  # NaN, Infinity, big ints: the fallback parser's job
    try:
        generate_gantt_trace(run_dir, run_dir / "t.json", log_skipped=False)
    except NoRecordsError:
        pass
    else:
        load_trace(run_dir / "t.json")
    try:
        summary = summarize_run(run_dir, log_skipped=False)
    except NoRecordsError:
        return
    json.dumps(summary.to_dict(), allow_nan=False)
    format_summary(summary)
