"""torchtitan-style handler factories (logging.Handler + TraceJsonlFormatter) keep working."""

from __future__ import annotations

import json
import logging
import time

from otel_titan import structured_logger as sl
from otel_titan.exporters.logging_bridge import LoggingBridgeExporter
from otel_titan.structured_logger.lifecycle import STRUCTURED_LOGGER_NAME
from tests.conftest import data_records, jsonl_files, read_records
from tests.helpers.torchtitan_db import MyDBClient

SEED_FACTORY = "tests.helpers.torchtitan_db.register_my_db_handler"


def test_the_seed_example_receives_every_record_enriched(run_dir, monkeypatch):
    MyDBClient.ROWS.clear()
    monkeypatch.setenv("CLUSTER_NAME", "cluster-a")
    monkeypatch.setenv(
        "TITAN_STRUCT_LOGGER_HANDLERS",
        f"otel_titan.exporters.jsonl.register_jsonl_handler,{SEED_FACTORY}",
    )
    sl.init_structured_logger("training", run_dir, rank=1, world_size=2, run_id="r")
    sl.set_step(3)
    with sl.log_trace_span("fwd_bwd"):
        sl.log_trace_scalar({"loss": 1.25})
    try:
        with sl.log_trace_span("optim"):
            raise ValueError("boom")
    except ValueError:
        pass
    sl.shutdown_structured_logger()

    rows = [json.loads(row) for row in MyDBClient.ROWS]
    assert [r["log_type_name"] for r in rows] == [
        "fwd_bwd_start",
        "metric_value",
        "fwd_bwd_end",
        "optim_start",
        "optim_error",
        "optim_end",
    ]
    assert all(
        r["cluster"] == "cluster-a"
        and r["rank"] == 1
        and r["source"] == "training"
        and r["step"] == 3
        for r in rows
    )
    assert rows[1]["event_name"] == "loss" and rows[1]["value"] == 1.25
    assert rows[4]["error_type"] == "ValueError"
    # The same records as the JSONL file, field by field (apart from the handler's own
    # addition, and seq_id, which numbers each sink's records: the file has its opening line).
    jsonl = data_records(read_records(jsonl_files(run_dir)[0]))
    assert len(jsonl) == len(rows)
    # the handler's own numbering, from 0 as torchtitan's
    assert [row.pop("seq_id") for row in rows] == list(range(len(rows)))
    for row, line in zip(rows, jsonl, strict=False):
        row.pop("cluster")
        line.pop("seq_id")
        assert row == line


def test_handlers_attached_by_factories_are_removed_at_shutdown(run_dir):
    import logging

    MyDBClient.ROWS.clear()
    sl.init_structured_logger("training", run_dir, world_size=1, handlers=[SEED_FACTORY])
    # plumbing, not a factory's exporter
    assert not any(isinstance(e, LoggingBridgeExporter) for e in sl.get_exporters())
    sl.shutdown_structured_logger()
    from tests.helpers.torchtitan_db import MyDBHandler

    assert not any(
        isinstance(h, MyDBHandler) for h in logging.getLogger(STRUCTURED_LOGGER_NAME).handlers
    )


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_handler_attached_to_the_structured_logger_after_init_receives_the_records(run_dir):
    # As in torchtitan, where any handler of its logger gets every record: before, only a factory's
    # handler did.
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1)
    handler = _Collect()
    logger = logging.getLogger(STRUCTURED_LOGGER_NAME)
    logger.addHandler(handler)
    try:
        sl.set_step(2)
        with sl.log_trace_span("fwd"):
            sl.log_trace_scalar({"loss": 0.5})
        sl.flush_structured_logger()
    finally:
        logger.removeHandler(handler)
    assert [r.log_type_name for r in handler.records] == ["fwd_start", "metric_value", "fwd_end"]
    assert all(r.step == 2 and r.name == STRUCTURED_LOGGER_NAME for r in handler.records)


def test_the_loggers_own_records_and_figures_stay_out_of_the_handlers(run_dir, monkeypatch):
    # Issue 28: a torchtitan-format file written through the bridge was 12 of 15 records the
    # logger's own figures.
    monkeypatch.setenv(
        "TITAN_STRUCT_LOGGER_HANDLERS",
        f"otel_titan.exporters.jsonl.register_jsonl_handler,{SEED_FACTORY}",
    )
    MyDBClient.ROWS.clear()
    sl.init_structured_logger(
        "training", run_dir, rank=0, world_size=1, process_figures=True, heartbeat_interval_s=0.05
    )
    for step in (1, 2, 3):
        sl.set_step(step)
        with sl.log_trace_span("fwd"):
            # past the heartbeat interval and the writer's period: figures of each step
            time.sleep(0.12)
        sl.log_trace_instant("step_done")
    sl.shutdown_structured_logger()
    written = read_records(jsonl_files(run_dir)[0])
    # the file has the figures...
    assert any(r.get("event_name") == "memory/rss_bytes" for r in written)
    assert {r["log_type_name"] for r in written} & {
        "heartbeat",
        "step_rollup",
        "structured_logger_opened",
    }
    rows = [json.loads(row) for row in MyDBClient.ROWS]
    # ...the handler only the program's records
    assert [r["log_type_name"] for r in rows] == [
        "fwd_start",
        "fwd_end",
        "step_done",
    ] * 3


def test_the_filter_passes_only_trace_records():
    import logging

    from otel_titan.structured_logger import TraceEventsOnlyFilter

    plain = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    traced = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    traced.log_type_name = "fwd_start"
    assert not TraceEventsOnlyFilter().filter(plain) and TraceEventsOnlyFilter().filter(traced)
