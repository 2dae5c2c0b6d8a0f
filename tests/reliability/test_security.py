"""Security: paths, file modes, secrets, TLS to the collector, host names.

Each test states what it injects. TLS uses a self-signed certificate made for
the test (cryptography) and loopback receivers: gRPC (grpcio with server
credentials) and HTTP (http.server wrapped in ssl).
"""

from __future__ import annotations

import datetime
import glob
import http.server
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from otel_titan import structured_logger as sl
from tests.conftest import REPO, data_records, jsonl_files, read_records
from tests.helpers.collector import free_port

SECRET = "s3cr3t-token-DO-NOT-LEAK"


# -- paths and modes -------------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["../outside", "a/../../b", "/etc/x", "x\x00y", "..", "."])
def test_a_source_cannot_name_a_file_outside_the_log_directory(tmp_path, source):
    # Injected: path separators, `..` and NUL in the source (the only part of the file name from the
    # user).
    with pytest.raises(ValueError):
        sl.init_structured_logger(source, tmp_path / "run", world_size=1)
    assert not (tmp_path / "outside").exists() and list(tmp_path.rglob("*.jsonl")) == []


def test_event_names_never_become_paths(run_dir):
    # Injected: names that look like paths. They are data: one file, in the log directory.
    sl.init_structured_logger("training", run_dir, world_size=1)
    with sl.log_trace_span("../../escape"):
        sl.log_trace_instant("/etc/passwd")
    sl.shutdown_structured_logger()
    assert [p.name for p in run_dir.rglob("*") if p.is_file()] == [
        os.path.basename(jsonl_files(run_dir)[0])
    ]
    names = [r["log_type_name"] for r in data_records(read_records(jsonl_files(run_dir)[0]))]
    assert names == ["../../escape_start", "/etc/passwd", "../../escape_end"]


def test_files_take_the_process_umask_and_are_never_world_writable(run_dir):
    # Injected: umask 0 (the most permissive) and 077 (the strictest).
    for umask, expected in ((0o000, 0o664), (0o077, 0o600)):
        old = os.umask(umask)
        try:
            sl.init_structured_logger(
                "training",
                run_dir / oct(umask),
                world_size=1,
                max_file_size_mb=0.001,
                backup_count=1,
            )
            for _ in range(20):
                with sl.log_trace_span("x"):
                    pass
            sl.shutdown_structured_logger()
        finally:
            os.umask(old)
        files = glob.glob(str(run_dir / oct(umask) / "structured_logs" / "*"))
        assert len(files) == 2  # the active file and a rotated one
        assert {os.stat(f).st_mode & 0o777 for f in files} == {expected}


# -- secrets ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_otlp_credentials_appear_in_no_record_log_line_or_error(tmp_path, protocol):
    # Injected: a bearer token in OTEL_EXPORTER_OTLP_HEADERS and user:password in the endpoint,
    # with nothing listening there, so the exporter fails and logs its errors.
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OTEL_") or k == "OTEL_TITAN_PROCESS_FIGURES"
    }
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "OTEL_TRACES_EXPORTER": "otlp,console",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://admin:{SECRET}@127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {SECRET},x-api-key={SECRET}",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
    )
    result = subprocess.run(
        [sys.executable, "-m", "tests.helpers.workload", str(tmp_path / "run"), "--steps", "3"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout and SECRET not in result.stderr
    for path in glob.glob(str(tmp_path / "run" / "structured_logs" / "*")):
        assert SECRET not in open(path, encoding="utf-8").read()
    assert "not delivered" in result.stderr  # the failure was reported, without the secret


def test_init_warnings_do_not_echo_header_values(run_dir, monkeypatch, caplog):
    # Injected: a malformed protocol next to a secret header. An unknown value of a standard
    # variable is warned about and ignored (the OpenTelemetry specification; issue 29): the warning
    # names the variable, not the secret.
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer {SECRET}")
    with caplog.at_level("WARNING"):
        sl.init_structured_logger("training", run_dir, world_size=1)
    sl.shutdown_structured_logger()
    said = "\n".join(record.getMessage() for record in caplog.records)
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" in said and "carrier-pigeon" in said and SECRET not in said


# -- TLS -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory = tmp_path_factory.mktemp("tls")
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class _GrpcTlsReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, cert: Path, key: Path) -> None:
        self.spans: list[str] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
        self.port = self.server.add_secure_port("127.0.0.1:0", credentials)
        self.server.start()

    def Export(self, request, context):
        self.spans += [
            s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans
        ]
        return trace_service_pb2.ExportTraceServiceResponse()


class _HttpTlsReceiver:
    def __init__(self, cert: Path, key: Path) -> None:
        self.spans: list[str] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.spans += [
                    s.name
                    for rs in request.resource_spans
                    for ss in rs.scope_spans
                    for s in ss.spans
                ]
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_tls_to_the_collector_with_otel_exporter_otlp_certificate(certificate, tmp_path, protocol):
    # Injected: a receiver that only speaks TLS with a self-signed certificate; the run is told
    # to trust it only through OTEL_EXPORTER_OTLP_CERTIFICATE.
    cert, key = certificate
    receiver = _GrpcTlsReceiver(cert, key) if protocol == "grpc" else _HttpTlsReceiver(cert, key)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OTEL_") or k == "OTEL_TITAN_PROCESS_FIGURES"
    }
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"https://localhost:{receiver.port}",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(cert),
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
    )
    result = subprocess.run(
        [sys.executable, "-m", "tests.helpers.workload", str(tmp_path / "run"), "--steps", "2"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert receiver.spans.count("data_fetch") == 2, result.stderr[-2000:]
    # Without the certificate the same receiver is refused (so TLS really was verified).
    env.pop("OTEL_EXPORTER_OTLP_CERTIFICATE")
    before = len(receiver.spans)
    subprocess.run(
        [sys.executable, "-m", "tests.helpers.workload", str(tmp_path / "run2"), "--steps", "1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert len(receiver.spans) == before


# -- host names ------------------------------------------------------------------------------------
def test_host_name_left_out_of_every_record_and_the_resource(run_dir, monkeypatch):
    # Injected: include_hostname=False, even with host.name in OTEL_RESOURCE_ATTRIBUTES.
    import socket

    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"host.name={socket.gethostname()}")
    sl.init_structured_logger(
        "training",
        run_dir,
        world_size=1,
        include_hostname=False,
        handlers=[
            "tests.helpers.factories.register_memory",
            "otel_titan.exporters.jsonl.register_jsonl_handler",
        ],
    )
    with sl.log_trace_span("x"):
        sl.log_trace_scalar({"y": 1})
    sl.shutdown_structured_logger()
    records = read_records(jsonl_files(run_dir)[0])
    assert records and all("host_name" not in r for r in records)
    assert all(
        socket.gethostname() not in (v for v in r.values() if isinstance(v, str)) for r in records
    )
    from tests.helpers import factories

    spans = factories.LAST["exporter"].get_finished_spans()
    assert spans and all("host.name" not in s.resource.attributes for s in spans)
    assert all(socket.gethostname() not in json.dumps(dict(s.resource.attributes)) for s in spans)
