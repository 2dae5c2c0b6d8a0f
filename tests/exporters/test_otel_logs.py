"""The training log as OpenTelemetry logs (exporters/otel_logs.py), sent to a real OTLP/gRPC
receiver."""

from __future__ import annotations

import io
import logging
import time

import pytest

from otel_titan import structured_logger as sl
from otel_titan.exporters.otel_logs import OtelLogHandler, OtelLogsExporter, logs_exporters
from otel_titan.logging import init_logger
from otel_titan.structured_logger.handler_factories import JSONL_HANDLER, default_handler_specs
from tests.conftest import data_records, jsonl_files, read_records
from tests.helpers.collector import free_port
from tests.helpers.otlp_signals_receiver import OtlpSignalsReceiver


@pytest.fixture
def backend():
    receiver = OtlpSignalsReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def root_logging():
    """init_logger's console on the root logger, as a training script has it; restored after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    init_logger()
    (console,) = [h for h in root.handlers if getattr(h, "_otel_titan_console", False)]
    previous = console.setStream(io.StringIO())
    yield root
    console.setStream(previous)
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def otlp_logs_env(monkeypatch, endpoint: str) -> None:
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_BLRP_SCHEDULE_DELAY", "100")


def test_log_lines_arrive_with_the_rank_resource_and_the_ids_of_their_span(
    backend, root_logging, run_dir, monkeypatch
):
    otlp_logs_env(monkeypatch, backend.endpoint)
    sl.init_structured_logger("training", run_dir, rank=1, world_size=2, run_id="logs-run")
    sl.set_step(7)
    logging.getLogger("trainer.data").info("outside any span")
    with sl.log_trace_span("checkpoint"):
        root_logging.warning("saving %d shards", 4)
        with sl.log_trace_span("write"):
            logging.getLogger("trainer.checkpoint").error("slow disk")
    assert sl.shutdown_structured_logger(10)
    assert backend.wait_for(lambda b: len(b.logs()) >= 3)
    logs = {log.body: log for log in backend.logs()}
    assert set(logs) == {"outside any span", "saving 4 shards", "slow disk"}
    spans = {
        r["log_type_name"]: (r["trace_id"], r["span_id"])
        for r in data_records(read_records(jsonl_files(run_dir)[0]))
    }
    assert (logs["saving 4 shards"].trace_id, logs["saving 4 shards"].span_id) == spans[
        "checkpoint_start"
    ]
    assert (logs["slow disk"].trace_id, logs["slow disk"].span_id) == spans["write_start"]
    assert logs["outside any span"].trace_id == "" and logs["outside any span"].span_id == ""
    # Python's own severity text (as the SDK's LoggingHandler sends it); the severity number is the
    # specification's.
    assert [logs[b].severity for b in ("outside any span", "saving 4 shards", "slow disk")] == [
        "INFO",
        "WARNING",
        "ERROR",
    ]
    assert logs["slow disk"].attributes["logger.name"] == "trainer.checkpoint"
    for log in logs.values():
        assert (
            log.resource["titan.rank"],
            log.resource["titan.run_id"],
            log.resource["service.name"],
        ) == (1, "logs-run", "training")
    # The console shows the same lines as before, in torchtitan's format; shutdown removed the
    # handler.
    (console,) = [h for h in root_logging.handlers if getattr(h, "_otel_titan_console", False)]
    lines = console.stream.getvalue().splitlines()
    assert [line.split(" - ", 1)[1] for line in lines] == [
        "trainer.data - INFO - outside any span",
        "root - WARNING - saving 4 shards",
        "trainer.checkpoint - ERROR - slow disk",
    ]
    assert all(line.startswith("[titan] ") for line in lines)
    assert not any(isinstance(h, OtelLogHandler) for h in logging.getLogger().handlers)


def test_a_dead_collector_drops_and_counts_and_never_slows_the_writer(
    root_logging, run_dir, monkeypatch
):
    otlp_logs_env(monkeypatch, f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("OTEL_BLRP_MAX_QUEUE_SIZE", "100")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30")
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="dead-logs")
    (exporter,) = [e for e in sl.get_exporters() if isinstance(e, OtelLogsExporter)]
    began = time.perf_counter()
    for i in range(5000):
        logging.getLogger("trainer").debug("not enabled: never formatted, never queued %d", i)
        logging.getLogger("trainer").info("line %d", i)
    spent = time.perf_counter() - began
    # the queue bound, plus one batch taken by the blocked thread at most
    assert exporter.dropped_logs >= 5000 - 100 - 512
    # 5,000 console lines plus queueing; a blocking handler would wait 30 s per batch
    assert spent < 10, spent
    began = time.monotonic()
    sl.shutdown_structured_logger(10)
    assert time.monotonic() - began < 8


def test_the_standard_variable_chooses_the_handler():
    assert (
        default_handler_specs({"OTEL_LOGS_EXPORTER": "otlp"})[-1]
        == "otel_titan.exporters.otel_logs.register_otel_logs_handler"
    )
    assert default_handler_specs({"OTEL_LOGS_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) == [
        JSONL_HANDLER
    ]
    assert logs_exporters({"OTEL_LOGS_EXPORTER": "none"}) == []
    # warned about and ignored (test_otel_env.py)
    assert logs_exporters({"OTEL_LOGS_EXPORTER": "loki"}) == []


def test_log_records_a_slow_collector_could_not_take_are_counted_in_the_closing_record_the_health_counter_and_one_warning(
    run_dir, root_logging, monkeypatch, caplog
):
    """A collector taking 300 ms per export received about half of a 5,000-line burst; the closing
    record said "0 dropped"."""
    backend = OtlpSignalsReceiver(log_delay_s=0.3)
    try:
        monkeypatch.setenv("OTEL_LOGS_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", backend.endpoint)
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
        monkeypatch.setenv("OTEL_TITAN_HOST_METRICS", "0")
        with caplog.at_level(logging.WARNING, logger="otel_titan"):
            sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="slow-logs")
            for i in range(5000):
                logging.getLogger("trainer").info("burst %d", i)
            time.sleep(1.0)  # a few of the collector's slow exports, and a metrics export or more
            assert sl.shutdown_structured_logger(10)
        received = sum(str(log.body).startswith("burst ") for log in backend.logs())
        closing = read_records(jsonl_files(run_dir)[0])[-1]
        assert closing["log_type_name"] == "structured_logger_closed"
        losses = closing["exporter_losses"]["logs:otlp"]
        assert 0 < received < 5000 and losses["dropped"] > 0, (received, losses)
        # Every line of the burst is either received or counted (a few other lines, the warning
        # among them, may be counted too).
        assert 5000 <= received + losses["dropped"] + losses["failed"] <= 5000 + 10, (
            received,
            losses,
        )
        assert "logs:otlp" in closing["message"] and "dropped" in closing["message"]
        # The health counter of the metrics: the last export (at shutdown) carries the drops.
        dropped = [
            p.value
            for p in backend.points()
            if p.metric == "titan.logger.records" and p.attributes.get("outcome") == "dropped"
        ]
        assert dropped and max(dropped) >= losses["dropped"] - 10, (dropped, losses)
        warnings = [
            r.getMessage()
            for r in caplog.records
            if "OTLP log records are being dropped" in r.getMessage()
        ]
        assert len(warnings) == 1, warnings
    finally:
        backend.stop()


SIGTERM_CHILD = r"""
import logging, sys, time
from otel_titan import structured_logger as sl
from otel_titan.logging import init_logger
init_logger()
sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=1, run_id="sigterm-logs")
for step in range(1, 4):
    sl.set_step(step)
    sl.log_trace_scalar({"loss": 1.0 / step})
    for i in range(10):
        logging.getLogger("trainer").info("queued line %d of step %d", i, step)
logging.getLogger("trainer").info("queued line last")
time.sleep(0.3)  # the metrics reader's export is now stuck on the endpoint that never answers
print("ready", flush=True)
time.sleep(60)
"""


def test_on_sigterm_a_hung_metrics_endpoint_does_not_starve_the_logs(run_dir, backend):
    """_flush_for_sigterm drained exporters one after another: metrics used the whole 5 s and 0 of
    the 31 queued lines arrived."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.helpers import processes

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)  # accepts connections in the kernel, never answers: a collector that hangs
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(
            {
                "PYTHONPATH": str(REPO),
                "OTEL_LOGS_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": backend.endpoint,
                "OTEL_BLRP_SCHEDULE_DELAY": "60000",  # nothing goes before the SIGTERM drain
                "OTEL_METRICS_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"http://127.0.0.1:{hung.getsockname()[1]}",
                "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "30",
                "OTEL_TITAN_HOST_METRICS": "0",
            }
        )
        child = subprocess.Popen(
            [sys.executable, "-c", SIGTERM_CHILD, str(run_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            for line in child.stdout:  # the console's lines, then ours
                if line.strip() == "ready":
                    break
            else:
                raise AssertionError("the child ended before it was ready")
            began = time.monotonic()
            child.send_signal(signal.SIGTERM)
            assert child.wait(timeout=30) == -signal.SIGTERM
            took = time.monotonic() - began
        finally:
            processes.kill_tree(child, timeout=10)
            child.stdout.close()
        queued = [log for log in backend.logs() if str(log.body).startswith("queued line")]
        assert len(queued) == 31, (len(queued), took)
        assert took < 8, took  # the 5 s budget (exit_timeout_s), shared, not added up
    finally:
        hung.close()


def test_logger_exception_carries_the_exception_attributes_and_python_severity_text(
    backend, root_logging, run_dir, monkeypatch
):
    """logger.exception arrived with the traceback in the body only; a backend could not filter on
    exception.type."""
    otlp_logs_env(monkeypatch, backend.endpoint)
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="logs-exception")
    with sl.log_trace_span("checkpoint"):
        try:
            raise ValueError("shard 3 is missing")
        except ValueError:
            logging.getLogger("trainer").exception("checkpoint failed")
    logging.getLogger("trainer").critical("giving up")
    assert sl.shutdown_structured_logger(10)
    assert backend.wait_for(lambda b: len(b.logs()) >= 2)
    logs = {str(log.body): log for log in backend.logs()}
    failed = logs["checkpoint failed"]  # the message is the body; the traceback is an attribute
    assert failed.severity == "ERROR" and failed.attributes["exception.type"] == "ValueError"
    assert failed.attributes["exception.message"] == "shard 3 is missing"
    stack = failed.attributes["exception.stacktrace"]
    assert (
        stack.startswith("Traceback (most recent call last):")
        and 'raise ValueError("shard 3 is missing")' in stack
        and stack.rstrip().endswith("ValueError: shard 3 is missing")
    )
    assert (
        logs["giving up"].severity == "CRITICAL"
        and "exception.type" not in logs["giving up"].attributes
    )
