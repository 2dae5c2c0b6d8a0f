"""The file format is defined once (otel_titan/schema.py): writer and reader use the same names."""

from __future__ import annotations

from otel_titan import schema
from otel_titan.analysis.model import collect as summary
from otel_titan.analysis.model import timeline
from otel_titan.analysis.read import records as reader
from tests.conftest import jsonl_files, read_records, run_python


def test_one_set_of_meta_records_for_both_sides():
    assert schema.META_EVENTS == {"structured_logger_opened", "records_dropped", "signal_received", "heartbeat", "stall", "structured_logger_closed", "step_rollup"}
    assert {value for name, value in vars(schema.MetaEvent).items() if not name.startswith("_")} == schema.META_EVENTS
    assert reader.META_EVENTS is timeline.META_EVENTS is summary.META_EVENTS is schema.META_EVENTS


def test_what_the_writer_writes_is_what_the_schema_says(tmp_path):
    code = """
import sys
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=1, step_rollups=True)
sl.set_step(1)
with sl.log_trace_span("fwd_bwd"):
    sl.log_trace_scalar({"loss": 1.0})
sl.shutdown_structured_logger()
"""
    assert run_python(code, str(tmp_path)).returncode == 0
    records = read_records(jsonl_files(tmp_path)[0])
    rollups = [r for r in records if r[schema.Field.LOG_TYPE_NAME] == schema.MetaEvent.STEP_ROLLUP]
    assert len(rollups) == 1 and rollups[0][schema.RollupField.VERSION] == schema.ROLLUP_VERSION
    # A rollup carries the short identity (docs/schema.md): the file names the rest.
    assert {r[schema.Field.LOGGER_NAME] for r in records if r not in rollups} == {schema.LOGGER_NAME}
    assert schema.Field.LOGGER_NAME not in rollups[0] and rollups[0]["attempt"] == 0
    assert {r[schema.Field.SCHEMA_VERSION] for r in records} == {schema.SCHEMA_VERSION}
    names = [r[schema.Field.LOG_TYPE_NAME] for r in records]
    assert names[0] == schema.MetaEvent.OPENED and names[-1] == schema.MetaEvent.CLOSED and names[-2] == schema.MetaEvent.STEP_ROLLUP
    closing = records[-1]
    assert closing[schema.Field.DROPPED_RECORDS] == 0 and closing[schema.Field.SKIPPED_VALUES] == 0
    for record in records:
        for field in (schema.Field.LOG_TYPE, schema.Field.SEQ_ID, schema.Field.TIME_MS, schema.Field.TIME_US, schema.Field.RANK, schema.Field.SOURCE):
            assert field in record, (field, record)


def test_int64_bounds():
    assert schema.INT64_MAX == 2**63 - 1 and schema.INT64_MIN == -(2**63)
