"""torchtitan's handler API (`TraceJsonlFormatter`): every record is formatted, whatever its strings
hold."""

from __future__ import annotations

import json
import logging

from otel_titan import structured_logger as sl
from otel_titan.structured_logger import TraceJsonlFormatter
from tests.conftest import data_records, jsonl_files, read_records
from tests.helpers.torchtitan_db import MyDBClient

SEED_FACTORY = "tests.helpers.torchtitan_db.register_my_db_handler"


def test_a_lone_surrogate_reaches_a_torchtitan_handler_as_the_jsonl_file_has_it(run_dir, capfd):
    """The writer escapes a lone surrogate ("\\ud800", valid JSON); the formatter must too, not lose
    the record."""
    MyDBClient.ROWS.clear()
    sl.init_structured_logger(
        "training",
        run_dir,
        rank=0,
        world_size=1,
        run_id="r",
        handlers=["otel_titan.exporters.jsonl.register_jsonl_handler", SEED_FACTORY],
    )
    sl.set_step(1)
    sl.add_step_tag("ckpt\udc80")
    with sl.log_trace_span("fwd\ud800"):
        sl.log_trace_scalar({"loss\udfff": 1.5})
    sl.shutdown_structured_logger()

    assert "Logging error" not in capfd.readouterr().err
    rows = [json.loads(row) for row in MyDBClient.ROWS]
    assert [r["log_type_name"] for r in rows] == [
        "fwd\ud800_start",
        "metric_value",
        "fwd\ud800_end",
    ]
    assert rows[1]["event_name"] == "loss\udfff" and all(
        r["step_tags"] == ["ckpt\udc80"] for r in rows
    )
    jsonl = data_records(read_records(jsonl_files(run_dir)[0]))
    # the handler's own count, from 0 as torchtitan's formatter
    assert [row.pop("seq_id") for row in rows] == [
        0,
        1,
        2,
    ]
    for row, line in zip(rows, jsonl, strict=True):
        row.pop("cluster")
        line.pop("seq_id")
        assert row == line


def test_the_formatter_writes_what_orjson_refuses_with_the_standard_librarys_escapes():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    record.otel_titan_record = {"log_type_name": "a\ud800_start", "big": 1 << 70, "rank": 0}
    line = TraceJsonlFormatter(rank=2, source="training").format(record)
    assert (
        line
        == '{"log_type_name":"a\\ud800_start","big":1180591620717411303424,"rank":2,"global_rank":2,"source":"training"}'
    )
    assert json.loads(line)["log_type_name"] == "a\ud800_start"
    line.encode("utf-8")  # ASCII: writable by any handler, any stream encoding


def test_a_record_logged_by_hand_is_formatted_as_torchtitans_formatter_writes_it(monkeypatch):
    # torchtitan's formatter tests (TestTraceJsonlFormatter): the step of the calling thread at
    # format time, the record's own fields from extra=, local_rank from LOCAL_RANK (0 unset), seq_id
    # from 0, a long message cut in the middle. Before, such a record kept what logging knows only
    # (no rank, step or seq_id; log_type "log").
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    formatter = TraceJsonlFormatter(rank=5, source="trainer")
    sl.set_step(101, relative_step=1)
    sl.add_step_tag("gc")
    parsed = []
    for message in ("short", "x" * 1500):
        record = logging.LogRecord("test", logging.INFO, "test.py", 1, message, None, None)
        record.log_type, record.log_type_name, record.task_name, record.value = (
            "event",
            "fwd_end",
            "worker-0",
            3,
        )
        parsed.append(json.loads(formatter.format(record)))
    first, second = parsed
    assert (first["rank"], first["global_rank"], first["local_rank"], first["source"]) == (
        5,
        5,
        0,
        "trainer",
    )
    assert (first["step"], first["relative_step"], first["step_tags"]) == (101, 1, ["gc"])
    assert (first["log_type"], first["log_type_name"], first["task_name"], first["value"]) == (
        "event",
        "fwd_end",
        "worker-0",
        3.0,
    )
    assert isinstance(first["time_us"], int) and first["caller"] == "test.py:1:None"
    assert [first["seq_id"], second["seq_id"]] == [0, 1]
    assert (
        first["message"] == "short"
        and len(second["message"]) == 1003
        and "..." in second["message"]
    )
