"""The records stream's hand-written OTLP bytes mean what the SDK's encoding of the same log records
means."""

from __future__ import annotations

import orjson
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk.resources import Resource

from otel_titan.core.identity import discover_identity
from otel_titan.exporters.otlp_records import OtlpRecordsExporter
from otel_titan.exporters.records import RecordEncoder


class _Nowhere:
    """A log exporter that takes nothing (the encoders are compared here, not the transport)."""

    def export(self, records):
        return None

    def shutdown(self):
        pass


def lines() -> list[bytes]:
    encoder = RecordEncoder(
        discover_identity(
            "training", environ={"RANK": "5", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "wire"}
        )
    )
    return [
        encoder.meta_line("structured_logger_opened", {"message": "opened, ünïcode ✓"}),
        encoder.meta_line(
            "stall",
            {"log_level": "WARNING", "threads": [{"frames": [{"file": "train.py", "line": 3}]}]},
        ),
        encoder.meta_line("heartbeat", {"log_level": "DEBUG"}),
        encoder.meta_line("records_dropped", {"log_level": "ERROR", "value": 3}),
        encoder.meta_line("x" * 300, {"log_level": "CRITICAL"}),
        encoder.meta_line("odd_level", {"log_level": "LOUD"}),
    ]


def test_the_bytes_decode_to_the_sdks_message_field_for_field():
    resource = Resource.create(
        {"service.name": "trainer", "otel_titan.rank": 5, "host.name": "node-7"}
    )
    exporter = OtlpRecordsExporter(
        _Nowhere(),
        resource,
        discover_identity("training", environ={"TORCHELASTIC_RUN_ID": "wire"}),
        "training.global_rank_5.x.jsonl",
    )
    try:
        batch = lines()
        ours = ExportLogsServiceRequest.FromString(exporter._wire.encode(batch))
        theirs = ExportLogsServiceRequest.FromString(
            encode_logs([exporter._log_record(line) for line in batch]).SerializeToString()
        )
    finally:
        exporter.discard()
    for request in (ours, theirs):
        for log in request.resource_logs[0].scope_logs[0].log_records:
            assert log.observed_time_unix_nano > 0
            log.observed_time_unix_nano = 0  # when it was sent: not the same instant
    assert ours == theirs
    logs = ours.resource_logs[0].scope_logs[0].log_records
    assert [log.severity_text for log in logs] == [
        "INFO",
        "WARN",
        "DEBUG",
        "ERROR",
        "FATAL",
        "LOUD",
    ]
    assert [log.severity_number for log in logs] == [9, 13, 5, 17, 21, 9]
    assert [orjson.loads(log.body.string_value)["seq_id"] for log in logs] == [1, 2, 3, 4, 5, 6]
    assert logs[0].time_unix_nano == orjson.loads(batch[0])["time_us"] * 1000
