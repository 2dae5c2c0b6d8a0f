"""Receive the records over OTLP and write them as the run's files: `otel-titan watch --otlp
HOST:PORT`.

For runs whose files the watching machine cannot read in time (NFS shows
other hosts' writes tens of seconds late; node-local folders not at all), the
ranks send every record as an OTLP log record (``OTEL_TITAN_OTLP_RECORDS=true``,
exporters/otlp_records.py), directly or through a collector that fans them
out. This package turns those log records back into the very JSONL lines the
ranks' files hold and appends them, per process, to a spool folder laid out
as a run (``SPOOL/structured_logs/<the process's file name>``). `watch` then
follows that folder with its file follower: one path for detection, and the
spool is a run that `summarize`, `export` and `report` read afterwards.

Layers, each importing only those below: `decode` (OTLP/protobuf or OTLP/JSON
bytes → records; the only module that imports ``opentelemetry.proto``, and
nothing else of OpenTelemetry) → `spool` (order by ``seq_id``, drop
duplicates, skip lost records after a short hold, append) → `http_server` (the
OTLP/HTTP endpoint, standard library) and `grpc_server` (OTLP/gRPC, with
grpcio, loaded when it starts). It imports no part of the writer (pyproject.toml's
import contracts): a watcher machine needs the protobuf classes, not the SDK.

Who may send, and what no sender can do to it (a bearer token, TLS, deadlines,
a connection bound, bytes in flight, 413/429/503): `http_server.Limits` and
docs/security.md, "The OTLP receiver".

Example:
    >>> import tempfile
    >>> from otel_titan.receive import OtlpHttpReceiver, Spool
    >>> receiver = OtlpHttpReceiver("127.0.0.1", 0, Spool(tempfile.mkdtemp())).start()   # 0: any free port
    >>> receiver.endpoint.startswith("http://127.0.0.1:")
    True
    >>> receiver.stop()
"""

from otel_titan.receive.grpc_server import OtlpGrpcReceiver
from otel_titan.receive.http_server import (
    Limits,
    OtlpHttpReceiver,
    ReceiverError,
    is_loopback,
    parse_address,
    raise_open_files_limit,
    receive_facts,
    server_tls,
)
from otel_titan.receive.spool import Spool, SpoolWriteError

__all__ = [
    "Limits",
    "OtlpGrpcReceiver",
    "OtlpHttpReceiver",
    "ReceiverError",
    "Spool",
    "SpoolWriteError",
    "is_loopback",
    "parse_address",
    "raise_open_files_limit",
    "receive_facts",
    "server_tls",
]
