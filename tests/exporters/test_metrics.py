"""Scalars and phase times as OpenTelemetry metrics (exporters/metrics.py), read back from the real
SDK.

The logger runs as in training (its processor thread, the JSONL file beside);
the metrics are read with the SDK's own in-memory reader.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_titan import structured_logger as sl
from otel_titan.exporters import metrics as metrics_module
from otel_titan.exporters.metric_readers import metrics_exporters, prometheus_address
from otel_titan.exporters.metrics import MetricsSpanExporter, metrics_exporter_handler_specs
from otel_titan.structured_logger.handler_factories import JSONL_HANDLER, default_handler_specs
from tests.conftest import data_records, jsonl_files, read_records
from tests.helpers.collector import free_port


def points(reader: InMemoryMetricReader) -> tuple[dict[str, list[Any]], Any]:
    """name → data points, and the Resource (one provider: one Resource)."""
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    resource = None
    for resource_metrics in data.resource_metrics:
        resource = resource_metrics.resource
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out, resource


def start(
    run_dir, reader: InMemoryMetricReader, **exporter_options: Any
) -> list[MetricsSpanExporter]:
    made: list[MetricsSpanExporter] = []

    def factory(add_span_exporter, resource, stats, **_):
        exporter = MetricsSpanExporter(
            MeterProvider(
                resource=resource, metric_readers=[reader], views=metrics_module.summary_views()
            ),
            stats=stats,
            **exporter_options,
        )
        made.append(exporter)
        add_span_exporter(exporter)

    sl.init_structured_logger(
        "training",
        run_dir,
        rank=3,
        world_size=4,
        run_id="metrics-run",
        handlers=[JSONL_HANDLER, factory],
    )
    return made


def train(steps: int, names: tuple[str, ...] = ("data_fetch", "fwd_bwd")) -> None:
    for step in range(1, steps + 1):
        sl.set_step(step)
        sl.add_step_tag("gc")
        for name in names:
            with sl.log_trace_span(name):
                time.sleep(0.002)
        sl.log_trace_scalar({"loss": 1.0 / step, "lr": 0.1})


def test_scalars_gauges_spans_histograms_and_step_counters_without_step_or_tag_attributes(run_dir):
    reader = InMemoryMetricReader()
    start(run_dir, reader, per_rank=["fwd_*"])
    train(5)
    assert sl.flush_structured_logger(10)
    got, resource = points(reader)
    assert resource.attributes["titan.rank"] == 3 and resource.attributes["service.instance.id"]
    # The last value of each scalar, as a gauge of its own name.
    assert [p.value for p in got["loss"]] == [pytest.approx(0.2)] and [
        p.value for p in got["lr"]
    ] == [0.1]
    # The allowlisted phase has buckets; the other its sum and count only.
    (fwd,) = got["titan.span.duration"]
    assert (
        dict(fwd.attributes) == {"titan.span.name": "fwd_bwd"}
        and fwd.count == 5
        and fwd.explicit_bounds == metrics_module.DURATION_BUCKETS_S
    )
    # In seconds, the semantic conventions' unit for durations.
    assert (
        fwd.explicit_bounds[0] == 0.001
        and fwd.explicit_bounds[-1] == 1_800
        and 0.002 * 5 <= fwd.sum < 5
    )
    # Fine where phases live: no bucket from 8 ms to 131 s is more than 19 % wide (a +20 % straggler
    # moves a bucket).
    fine = [b for b in fwd.explicit_bounds if 0.008 <= b <= 131.072]
    assert len(fine) == 57 and max(high / low for low, high in zip(fine, fine[1:])) < 1.19
    (fetch,) = got["titan.span.duration.summary"]
    assert (
        dict(fetch.attributes) == {"titan.span.name": "data_fetch"}
        and fetch.count == 5
        and fetch.explicit_bounds == ()
    )
    # Step progress: steps 1..4 ended (5 is current), their durations are one histogram.
    assert [p.value for p in got["titan.step"]] == [5]
    assert [p.value for p in got["titan.steps.completed"]] == [4]
    (step_time,) = got["titan.step.duration"]
    assert step_time.count == 4 and step_time.sum >= 4 * 0.004
    # Never the step, a tag or an id as an attribute: the series stay one per name.
    for name, data_points in got.items():
        for point in data_points:
            assert not {"titan.step", "titan.step_tags", "step", "span_id", "trace_id"} & set(
                point.attributes
            ), (name, point.attributes)
    health = {dict(p.attributes)["outcome"]: p.value for p in got["titan.logger.records"]}
    assert (
        set(health) == {"written", "dropped", "skipped", "failed"}
        and health["dropped"] == health["failed"] == 0
    )


def test_exemplars_link_a_duration_bucket_to_the_span_in_the_jsonl(run_dir):
    reader = InMemoryMetricReader()
    start(run_dir, reader, per_rank=["fwd_bwd"])
    train(2, names=("fwd_bwd",))
    assert sl.flush_structured_logger(10)
    got, _ = points(reader)
    (fwd,) = got["titan.span.duration"]
    assert fwd.exemplars, "a sampled span's duration carries its trace as an exemplar"
    assert sl.shutdown_structured_logger(10)
    spans = {
        (r["trace_id"], r["span_id"])
        for r in data_records(read_records(jsonl_files(run_dir)[0]))
        if r["log_type_name"] == "fwd_bwd_end"
    }
    for exemplar in fwd.exemplars:
        assert (f"{exemplar.trace_id:032x}", f"{exemplar.span_id:016x}") in spans


def test_names_past_the_cap_are_counted_and_warned_once(run_dir, caplog):
    reader = InMemoryMetricReader()
    (exporter,) = start(run_dir, reader, max_names=3)
    with caplog.at_level(logging.WARNING, logger="otel_titan"):
        sl.set_step(1)
        sl.log_trace_scalar({f"s{i}": i for i in range(5)})
        for i in range(5):
            with sl.log_trace_span(f"phase{i}"):
                pass
        assert sl.flush_structured_logger(10)
    got, _ = points(reader)
    assert {"s0", "s1", "s2"} <= set(got) and "s3" not in got and "s4" not in got
    span_names = sorted(
        dict(p.attributes)["titan.span.name"] for p in got["titan.span.duration.summary"]
    )
    assert span_names == ["_overflow", "phase0", "phase1", "phase2"]
    overflow = {
        (dict(p.attributes)["kind"], dict(p.attributes)["titan.metric.prefix"]): p.value
        for p in got["titan.metrics.overflow"]
    }
    assert (
        overflow
        == {("scalar", "s3"): 1, ("scalar", "s4"): 1, ("span", "phase3"): 1, ("span", "phase4"): 1}
        and exporter.overflowed == 4
    )
    warnings = [r.getMessage() for r in caplog.records if "distinct" in r.getMessage()]
    assert len(warnings) == 2 and "'s3'" in warnings[0] and "'phase3'" in warnings[1]


def test_the_training_thread_never_touches_the_metrics_sdk(run_dir, monkeypatch):
    """Every recording happens on the processor thread (the training thread only appends to its
    queue)."""
    reader = InMemoryMetricReader()
    (exporter,) = start(run_dir, reader, per_rank=["fwd_bwd"])
    threads: set[str] = set()
    real_export = exporter.export

    def spy(spans):
        threads.add(threading.current_thread().name)
        return real_export(spans)

    monkeypatch.setattr(exporter, "export", spy)
    train(3)
    assert sl.flush_structured_logger(10)
    assert threads == {"otel-titan-processor"}


def test_a_dead_collector_costs_training_nothing_and_shutdown_a_bounded_time(run_dir, monkeypatch):
    """OTLP metrics to a port nobody listens on: the steps and the JSONL file are unaffected,
    shutdown is bounded."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30")
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="dead-collector")
    assert any(isinstance(e, MetricsSpanExporter) for e in sl.get_exporters())
    train(3)
    assert sl.flush_structured_logger(5)  # never waits for the collector
    began = time.monotonic()
    sl.shutdown_structured_logger(10)
    assert time.monotonic() - began < 6
    names = [r["log_type_name"] for r in data_records(read_records(jsonl_files(run_dir)[0]))]
    assert names.count("fwd_bwd_end") == 3


def test_traces_metrics_and_logs_to_a_dead_collector_end_within_the_default_shutdown_and_lose_nothing(
    run_dir, monkeypatch, caplog
):
    """All three signals on: each exporter's own 3 s bound must not add up past shutdown's 5 s
    default.

    In turn they did (about 9 s): the exit waited the full 5 s, and the warning said records "may be
    lost" although the JSONL file had closed cleanly. The exporters now stop side by side.
    """
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    # nothing listens: refused, retried
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    sl.init_structured_logger(
        "training", run_dir, rank=0, world_size=1, run_id="dead-collector-all"
    )
    train(3)
    logging.getLogger("train").warning("a line for the logs exporter")
    time.sleep(0.5)  # every exporter is now retrying against the dead endpoint
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="otel_titan"):
        finished = sl.shutdown_structured_logger()
    took = time.monotonic() - began
    assert finished and took < 5.0, took
    assert not [r for r in caplog.records if "may be lost" in r.getMessage()]
    records = read_records(jsonl_files(run_dir)[0])
    assert (
        records[-1]["log_type_name"] == "structured_logger_closed"
        and records[-1]["dropped_records"] == 0
    )
    assert [r["log_type_name"] for r in data_records(records)].count("fwd_bwd_end") == 3


def test_the_standard_variables_choose_the_exporters():
    assert (
        metrics_exporters({"OTEL_METRICS_EXPORTER": "none"}) == []
        and metrics_exporter_handler_specs({}) == []
    )
    assert default_handler_specs({"OTEL_METRICS_EXPORTER": "otlp,prometheus"}) == [
        JSONL_HANDLER,
        metrics_module.METRICS_HANDLER,
    ]
    assert default_handler_specs(
        {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}
    ) == [JSONL_HANDLER]
    # warned about and ignored (test_otel_env.py)
    assert metrics_exporters({"OTEL_METRICS_EXPORTER": "zipkin"}) == []
    # One scrape port per local rank, so the ranks of a host do not collide.
    assert prometheus_address(1, {"OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1"}) == (
        "127.0.0.1",
        9465,
    )
    assert prometheus_address(0, {"OTEL_EXPORTER_PROMETHEUS_PORT": "x"}) == ("localhost", 9464)


def test_a_bad_value_of_our_own_metrics_variable_fails_init_naming_it(run_dir, monkeypatch):
    """Ours (OTEL_TITAN_*) are checked like every option; the standard ones are warned about and
    ignored (test_otel_env.py)."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_TITAN_METRICS_MAX_NAMES", "0")
    with pytest.raises(sl.HandlerFactoryError, match="OTEL_TITAN_METRICS_MAX_NAMES='0'"):
        sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="bad")


def test_a_forked_child_never_exports_the_parents_metrics(run_dir, monkeypatch):
    """A DataLoader-style fork: the SDK restarts its reader thread in the child; nothing may leave
    from there."""
    import os

    from tests.helpers import processes
    from tests.helpers.otlp_signals_receiver import OtlpSignalsReceiver

    backend = OtlpSignalsReceiver()
    try:
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", backend.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
        monkeypatch.setenv("OTEL_TITAN_HOST_METRICS", "0")
        sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="fork")
        train(2)
        assert sl.flush_structured_logger(5)
        pid = os.fork()
        if pid == 0:  # the child: live for a while, as a worker does, then leave without cleanup
            time.sleep(1.5)
            os._exit(0)
        try:
            assert sl.shutdown_structured_logger(10)  # the parent's last export; its reader stops
            after_parent = len(backend.metric_requests)
            assert after_parent >= 1
            time.sleep(1.0)  # ten of the child's intervals
            assert len(backend.metric_requests) == after_parent
        finally:
            os.waitpid(pid, 0)
            processes.wait_gone([pid], 5)
    finally:
        backend.stop()


def test_otlp_sends_exponential_histograms_by_default_and_a_nan_loss_as_it_is(run_dir, monkeypatch):
    """Over OTLP the bucketed histograms are exponential unless asked otherwise (fine buckets
    wherever the data falls); the summary ones keep their sum and count; a NaN loss arrives as NaN,
    not as the last finite value."""
    import math

    from tests.helpers.otlp_signals_receiver import OtlpSignalsReceiver

    backend = OtlpSignalsReceiver()
    try:
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", backend.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        monkeypatch.delenv(
            "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION", raising=False
        )
        monkeypatch.setenv("OTEL_TITAN_METRICS_PER_RANK", "fwd_bwd")
        monkeypatch.setenv("OTEL_TITAN_HOST_METRICS", "0")
        sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="exp")
        train(4)
        sl.log_trace_scalar({"loss": float("nan")})
        assert sl.shutdown_structured_logger(10)
        assert backend.wait_for(lambda b: any(p.metric == "loss" for p in b.points()))
        (loss,) = [p for p in backend.points() if p.metric == "loss"]
        assert math.isnan(loss.value)
        assert backend.wait_for(
            lambda b: any(p.metric == "titan.span.duration" for p in b.points())
        )
        kinds = {p.metric: p.kind for p in backend.points()}
        assert (
            kinds["titan.span.duration"] == "exponential_histogram"
            and kinds["titan.step.duration"] == "exponential_histogram"
        )
        assert kinds["titan.span.duration.summary"] == "histogram"
        (fetch,) = [p for p in backend.points() if p.metric == "titan.span.duration.summary"]
        assert (
            fetch.count == 4
            and list(fetch.raw.explicit_bounds) == []
            and len(fetch.raw.bucket_counts) == 1
        )
        (fwd,) = [p for p in backend.points() if p.metric == "titan.span.duration"]
        assert fwd.count == 4 and fwd.exemplars
        assert fwd.raw.scale >= 2  # buckets at most 2^(1/4) = 19 % wide
    finally:
        backend.stop()


def test_explicit_buckets_over_otlp_when_the_standard_variable_asks(run_dir, monkeypatch):
    from tests.helpers.otlp_signals_receiver import OtlpSignalsReceiver

    backend = OtlpSignalsReceiver()
    try:
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", backend.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        monkeypatch.setenv(
            "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION", "explicit_bucket_histogram"
        )
        monkeypatch.setenv("OTEL_TITAN_METRICS_PER_RANK", "fwd_bwd")
        monkeypatch.setenv("OTEL_TITAN_HOST_METRICS", "0")
        sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="explicit")
        train(2)
        assert sl.shutdown_structured_logger(10)
        assert backend.wait_for(
            lambda b: any(p.metric == "titan.span.duration" for p in b.points())
        )
        (fwd,) = [p for p in backend.points() if p.metric == "titan.span.duration"]
        assert (
            fwd.kind == "histogram"
            and tuple(fwd.raw.explicit_bounds) == metrics_module.DURATION_BUCKETS_S
        )
    finally:
        backend.stop()


def test_a_forked_child_that_outlives_its_rank_does_not_keep_the_prometheus_port(
    run_dir, monkeypatch
):
    """A DataLoader worker kept the rank's listening socket: once the rank was gone, its restart
    could not listen."""
    import os
    import socket

    from tests.helpers import processes

    port = free_port()
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
    monkeypatch.setenv("OTEL_TITAN_HOST_METRICS", "0")
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="fork-port")
    train(1)
    pid = os.fork()
    if pid == 0:  # the worker: outlives the rank's logger
        time.sleep(3)
        os._exit(0)
    try:
        # the rank's endpoint closes (as the rank's process would end)
        assert sl.shutdown_structured_logger(10)
        restarted = socket.socket()
        try:
            restarted.bind(("127.0.0.1", port))  # EADDRINUSE while the child held its copy
            restarted.listen(1)
        finally:
            restarted.close()
    finally:
        os.waitpid(pid, 0)
        processes.wait_gone([pid], 5)


def test_a_dead_collector_gets_each_export_error_once_a_minute_per_signal_with_the_count(
    run_dir, monkeypatch, caplog
):
    """Metrics and logs to a dead collector printed ~25 SDK warnings a minute per rank; traces were
    already held to one a minute."""
    from otel_titan.exporters import otlp

    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    # nothing listens: refused, retried
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
    monkeypatch.setenv("OTEL_BLRP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("OTEL_TITAN_HOST_METRICS", "0")
    with caplog.at_level(logging.WARNING):
        sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="dead-quiet")
        deadline = time.monotonic() + 4
        # 4 s of exports every 100 ms, each retried against the dead port
        while time.monotonic() < deadline:
            train(1)
            logging.getLogger("trainer").warning("a line for the logs exporter")
            time.sleep(0.1)
        sl.shutdown_structured_logger(10)
    sdk = [r for r in caplog.records if r.name.startswith("opentelemetry")]
    for signal in ("metrics", "logs"):
        lines = [r.getMessage() for r in sdk if signal in r.getMessage()]
        assert lines, (signal, [r.getMessage() for r in sdk])
        # At most one line per distinct message in the minute (transient, failed; a shutdown
        # notice).
        templates = {str(r.msg).split(" (and ")[0] for r in sdk if signal in r.getMessage()}
        assert len(lines) <= len(templates) <= 4, (signal, lines)
    assert otlp._quiet._held  # and what was held back is counted for the next line that passes


def test_the_line_that_passes_after_a_minute_says_how_many_were_held_back():
    from otel_titan.exporters.otlp import _ExporterLogFilter

    quiet = _ExporterLogFilter(every_s=0.2)
    logger = logging.getLogger("opentelemetry.exporter.otlp.proto.grpc.exporter")

    def record(signal: str) -> logging.LogRecord:
        return logger.makeRecord(
            logger.name,
            logging.WARNING,
            __file__,
            1,
            "Failed to export %s to %s, error code: %s",
            (signal, "localhost:4317", "UNAVAILABLE"),
            None,
        )

    passed = [quiet.filter(record(s)) for s in ("metrics", "metrics", "metrics", "logs")]
    # one a minute per signal: the logs' first line is not held back by the metrics'
    assert passed == [
        True,
        False,
        False,
        True,
    ]
    time.sleep(0.25)
    later = record("metrics")
    assert quiet.filter(later) and "(and 2 more like it in the last 0.2 s" in later.getMessage()
