"""torchtitan's handler API (`TraceJsonlFormatter`): every record is formatted, whatever its strings hold."""

from __future__ import annotations

import json
import logging

from otel_titan import structured_logger as sl
from otel_titan.structured_logger import TraceJsonlFormatter
from tests.conftest import data_records, jsonl_files, read_records
from tests.helpers.torchtitan_db import MyDBClient

SEED_FACTORY = "tests.helpers.torchtitan_db.register_my_db_handler"


def test_a_lone_surrogate_reaches_a_torchtitan_handler_as_the_jsonl_file_has_it(run_dir, capfd):
    """The writer escapes a lone surrogate ("\\ud800", valid JSON); the formatter must too, not lose the record."""
    MyDBClient.ROWS.clear()
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="r", handlers=["otel_titan.exporters.jsonl.register_jsonl_handler", SEED_FACTORY])
    sl.set_step(1)
    sl.add_step_tag("ckpt\udc80")
    with sl.log_trace_span("fwd\ud800"):
        sl.log_trace_scalar({"loss\udfff": 1.5})
    sl.shutdown_structured_logger()

    assert "Logging error" not in capfd.readouterr().err
    rows = [json.loads(row) for row in MyDBClient.ROWS]
    assert [r["log_type_name"] for r in rows] == ["fwd\ud800_start", "metric_value", "fwd\ud800_end"]
    assert rows[1]["event_name"] == "loss\udfff" and all(r["step_tags"] == ["ckpt\udc80"] for r in rows)
    jsonl = data_records(read_records(jsonl_files(run_dir)[0]))
    for row, line in zip(rows, jsonl, strict=True):
        row.pop("cluster")
        assert row.pop("seq_id") == line.pop("seq_id") - 1
        assert row == line


def test_the_formatter_writes_what_orjson_refuses_with_the_standard_librarys_escapes():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    record.otel_titan_record = {"log_type_name": "a\ud800_start", "big": 1 << 70, "rank": 0}
    line = TraceJsonlFormatter(rank=2, source="training").format(record)
    assert line == '{"log_type_name":"a\\ud800_start","big":1180591620717411303424,"rank":2,"global_rank":2,"source":"training"}'
    assert json.loads(line)["log_type_name"] == "a\ud800_start"
    line.encode("utf-8")  # ASCII: writable by any handler, any stream encoding
