"""The records over OTLP (exporters/otlp_records.py): each record of the file, as it happens, to a
real OTLP receiver.

The receiver is otel-titan's own (otel_titan/receive: HTTP/protobuf, into a
spool folder) or the gRPC test backend; the ranks' side is the real logger.
"""

from __future__ import annotations

import glob
import json
import os
import time

import pytest

from otel_titan import structured_logger as sl
from otel_titan.exporters.otlp_records import RECORDS_HANDLER, records_enabled
from otel_titan.receive import OtlpHttpReceiver, Spool
from otel_titan.structured_logger.handler_factories import default_handler_specs
from tests.conftest import jsonl_files, read_records
from tests.helpers.collector import free_port
from tests.helpers.otlp_signals_receiver import OtlpSignalsReceiver


@pytest.fixture
def receiver(tmp_path):
    server = OtlpHttpReceiver("127.0.0.1", 0, Spool(str(tmp_path / "spool"))).start()
    yield server
    server.stop()


def records_env(monkeypatch, endpoint: str) -> None:
    monkeypatch.setenv("OTEL_TITAN_OTLP_RECORDS", "true")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_TITAN_OTLP_RECORDS_DELAY_MS", "50")


def spooled(receiver: OtlpHttpReceiver) -> list[dict]:
    files = glob.glob(os.path.join(receiver.spool.log_dir, "*.jsonl"))
    return [json.loads(line) for path in files for line in open(path, "rb")]


def wait_for(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_a_spans_start_reaches_the_receiver_while_the_span_is_open_and_every_record_is_the_files(
    receiver, run_dir, monkeypatch
):
    records_env(monkeypatch, receiver.endpoint)
    # the file's per-step totals: not in the stream (docs/watch.md)
    monkeypatch.setenv("OTEL_TITAN_STEP_ROLLUPS", "1")
    sl.init_structured_logger(
        "training",
        run_dir,
        rank=2,
        world_size=4,
        run_id="otlp-records",
        heartbeat_interval_s=0.5,
        stall_after_s=1,
    )
    sl.set_step(1)
    with sl.log_trace_span("data_fetch"):
        pass
    sl.log_trace_scalar({"loss": 0.5})
    span = sl.log_trace_span("all_reduce")
    span.__enter__()
    try:
        # The span is open: its start, a heartbeat and the black box (stall) arrive while it stays
        # open.
        assert wait_for(
            lambda: (
                {"all_reduce_start", "heartbeat", "stall"}
                <= {r["log_type_name"] for r in spooled(receiver)}
            )
        ), [r["log_type_name"] for r in spooled(receiver)]
        assert "all_reduce_end" not in {r["log_type_name"] for r in spooled(receiver)}
    finally:
        span.__exit__(None, None, None)
    assert sl.shutdown_structured_logger(timeout=10)
    assert wait_for(
        lambda: any(r["log_type_name"] == "structured_logger_closed" for r in spooled(receiver))
    )
    (path,) = jsonl_files(run_dir)
    written = read_records(path)
    assert any(r["log_type_name"] == "step_rollup" for r in written)
    written = [r for r in written if r["log_type_name"] != "step_rollup"]
    received = spooled(receiver)
    # The same records, in the same order, field for field: the opening record names the file's side
    # file, the rest is equal.
    assert [r["log_type_name"] for r in received] == [r["log_type_name"] for r in written]
    for mine, theirs in zip(received[1:-1], written[1:-1]):
        # the file numbers its rollups too
        assert {k: v for k, v in mine.items() if k != "seq_id"} == {
            k: v for k, v in theirs.items() if k != "seq_id"
        }
    assert (
        received[0]["rank"] == 2
        and received[0]["world_size"] == 4
        and received[0]["message"] == written[0]["message"]
    )
    assert received[-1]["written_records"] == written[-1]["written_records"]
    (name,) = os.listdir(receiver.spool.log_dir)
    assert name.startswith("training.global_rank_2.") and name.endswith(".jsonl")
    assert receiver.spool.lost == 0 and receiver.spool.duplicates == 0


def test_off_unless_asked(receiver, run_dir, monkeypatch):
    assert RECORDS_HANDLER not in default_handler_specs({})
    assert RECORDS_HANDLER in default_handler_specs({"OTEL_TITAN_OTLP_RECORDS": "true"})
    assert not records_enabled({"OTEL_TITAN_OTLP_RECORDS": "true", "OTEL_SDK_DISABLED": "true"})
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
    monkeypatch.delenv("OTEL_TITAN_OTLP_RECORDS", raising=False)
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1)
    with sl.log_trace_span("data_fetch"):
        pass
    assert sl.shutdown_structured_logger(timeout=10)
    assert receiver.received == 0 and spooled(receiver) == []


def test_over_grpc_each_record_is_a_log_record_with_its_file_seq_and_kind(run_dir, monkeypatch):
    backend = OtlpSignalsReceiver()
    try:
        records_env(monkeypatch, backend.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="grpc-records")
        with sl.log_trace_span("data_fetch"):
            pass
        assert sl.shutdown_structured_logger(timeout=10)
        assert backend.wait_for(lambda b: len(b.logs()) >= 4)
        logs = backend.logs()
    finally:
        backend.stop()
    kinds = [log.attributes["otel_titan.record"] for log in logs]
    assert kinds == [
        "structured_logger_opened",
        "data_fetch_start",
        "data_fetch_end",
        "structured_logger_closed",
    ]
    assert [log.attributes["otel_titan.seq"] for log in logs] == [1, 2, 3, 4]
    assert len({log.attributes["otel_titan.file"] for log in logs}) == 1
    assert json.loads(logs[1].body)["log_type_name"] == "data_fetch_start"
    assert logs[0].resource["service.name"] and "otel_titan.file" not in logs[0].resource


def test_a_receiver_that_is_down_costs_the_training_nothing(run_dir, monkeypatch):
    records_env(monkeypatch, f"http://127.0.0.1:{free_port()}")  # nobody listens
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1)
    started = time.perf_counter()
    for step in range(200):
        sl.set_step(step)
        with sl.log_trace_span("data_fetch"):
            pass
    spent = time.perf_counter() - started
    began = time.monotonic()
    assert sl.shutdown_structured_logger(timeout=10)
    assert time.monotonic() - began < 8  # its shutdown is bounded (3 s), beside the others'
    # not a speed figure: a send that blocked the training would take 200 × the 1 s timeout
    assert spent < 5, spent
    (path,) = jsonl_files(run_dir)
    assert sum(1 for r in read_records(path) if r["log_type_name"] == "data_fetch_end") == 200


def test_named_in_a_handler_list_it_runs_without_the_variable(receiver, run_dir, monkeypatch):
    monkeypatch.delenv("OTEL_TITAN_OTLP_RECORDS", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv(
        "OTEL_TITAN_HANDLERS",
        f"otel_titan.exporters.jsonl.register_jsonl_handler,{RECORDS_HANDLER}",
    )
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1)
    with sl.log_trace_span("data_fetch"):
        pass
    assert sl.shutdown_structured_logger(timeout=10)
    assert wait_for(
        lambda: (
            [r["log_type_name"] for r in spooled(receiver)]
            == [
                "structured_logger_opened",
                "data_fetch_start",
                "data_fetch_end",
                "structured_logger_closed",
            ]
        )
    )
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    sl.init_structured_logger("training", run_dir / "off", rank=0, world_size=1)
    assert sl.shutdown_structured_logger(timeout=10)
    assert len(spooled(receiver)) == 4  # the OpenTelemetry side off: nothing more sent
