"""What no sender can do to `watch --otlp` (docs/security.md, "The OTLP receiver"): real sockets on
loopback, real TLS, the real exporters and command.

Each test stands for an item of issue 27 and fails on the receiver before it (545a737): a token and
TLS (14), timeouts and a connection bound (6), bytes in flight (7), a record the follower cannot
take (8), records that could not be written (11), the open-files limit (12), tracebacks over the
screen (13).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from otel_titan.receive import Limits, OtlpHttpReceiver, Spool
from tests.conftest import REPO
from tests.helpers import processes
from tests.receive.test_http_server import NAME, logs_request, spooled

TOKEN = "s3cret-token-receiver-safety"


def self_signed(folder: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM files), made with
    `cryptography`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "otel-titan watch test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
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
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


def post(
    url: str, body: bytes, *, context: ssl.SSLContext | None = None, **headers: str
) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/x-protobuf", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=20, context=context) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def last_frame(watcher: subprocess.Popen[str], done, timeout: float = 60.0) -> dict:
    """The watch's frames until `done(frame)`; the watch is killed past `timeout` (the test then
    fails on what it last said)."""
    timer = threading.Timer(timeout, processes.kill_tree, (watcher,))
    timer.start()
    frame: dict = {}
    try:
        for raw in watcher.stdout:  # type: ignore[union-attr]
            event = json.loads(raw)
            if event["type"] == "frame":
                frame = event
                if done(frame):
                    break
    finally:
        timer.cancel()
    return frame


def stderr_line(watcher: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The watch's next line on stderr ('' if it says nothing within `timeout`: it is then
    killed)."""
    timer = threading.Timer(timeout, processes.kill_tree, (watcher,))
    timer.start()
    try:
        return watcher.stderr.readline()  # type: ignore[union-attr]
    finally:
        timer.cancel()


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def make_receiver(tmp_path):
    made = []

    def make(**kwargs) -> OtlpHttpReceiver:
        receiver = OtlpHttpReceiver(
            "127.0.0.1", 0, Spool(str(tmp_path / f"spool{len(made)}")), **kwargs
        ).start()
        made.append(receiver)
        return receiver

    yield make
    for receiver in made:
        receiver.stop()


# -- 14: who may talk to it ------------------------------------------------------------------------


def test_without_the_token_a_request_gets_401_and_changes_nothing(make_receiver):
    receiver = make_receiver(token=TOKEN)
    url = f"http://127.0.0.1:{receiver.port}/v1/logs"
    body = logs_request((NAME, 1, '{"a": 1}'))
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
    ):
        status, text, answer = post(url, body, **headers)
        assert (
            status == 401
            and b"bearer token" in text
            and answer.get("WWW-Authenticate", "").startswith("Bearer")
        ), (headers, status, text)
    assert (
        spooled(receiver) == []
        and receiver.received == 0
        and receiver.spool.processes == 0
        and receiver.unauthorized == 4
    )
    assert post(url, body, Authorization=f"Bearer {TOKEN}")[0] == 200
    assert spooled(receiver) == ['{"a": 1}']


def test_tls_and_the_token_from_the_standard_variables_of_a_real_logger(tmp_path):
    """The real command with --otlp-tls-cert/--otlp-tls-key and $OTEL_TITAN_WATCH_TOKEN; a real
    logger sending its records stream with nothing but the standard OTEL_EXPORTER_OTLP_* variables
    (endpoint https://, headers, certificate)."""
    cert, key = self_signed(tmp_path)
    command = [
        sys.executable,
        "-m",
        "otel_titan.cli",
        "watch",
        "--otlp",
        "127.0.0.1:0",
        "--otlp-tls-cert",
        cert,
        "--otlp-tls-key",
        key,
        "--spool",
        str(tmp_path / "spool"),
        "--json",
        "--interval",
        "0.5",
    ]
    watcher = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "OTEL_TITAN_WATCH_TOKEN": TOKEN},
    )
    try:
        line = watcher.stderr.readline()  # type: ignore[union-attr]
        assert (
            "on https://127.0.0.1:" in line
            and "OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<token>" in line
        ), line
        endpoint = line.split(" on ", 1)[1].split(";", 1)[0]
        port = int(endpoint.rsplit(":", 1)[1])
        # Plain HTTP to the TLS port, and TLS without the token: nothing reaches the spool.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
            plain.sendall(b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            assert not plain.recv(100).startswith(b"HTTP/1.1 200")
        trusted = ssl.create_default_context(cafile=cert)
        assert (
            post(f"{endpoint}/v1/logs", logs_request((NAME, 1, '{"forged": 1}')), context=trusted)[
                0
            ]
            == 401
        )
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            # the client checks whom it talks to
            post(f"{endpoint}/v1/logs", b"", context=ssl.create_default_context())
        code = (
            "from otel_titan import structured_logger as "
            "sl\nsl.init_structured_logger('training', 'run', rank=0, world_size=1, "
            "run_id='tls')\n"
            "with sl.log_trace_span('data_fetch'):\n    "
            "pass\nsl.shutdown_structured_logger(timeout=10)\n"
        )
        # REQUESTS_CA_BUNDLE would win over OTEL_EXPORTER_OTLP_CERTIFICATE in requests (the SDK sets
        # the session's `verify`): docs/security.md.
        env = {
            k: v for k, v in os.environ.items() if k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
        }
        env |= {
            "PYTHONPATH": str(REPO),
            "OTEL_TITAN_OTLP_RECORDS": "true",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{TOKEN}",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": cert,
        }
        rank = processes.run(
            [sys.executable, "-c", code],
            timeout=60,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        assert rank.returncode == 0 and "Transient error" not in rank.stderr, rank.stderr
        frame = last_frame(watcher, lambda f: f["receive"]["written"] >= 4)
    finally:
        processes.kill_tree(watcher)
        watcher.stdout.close()  # type: ignore[union-attr]
        watcher.stderr.close()  # type: ignore[union-attr]
    assert frame["receive"]["written"] == 4 and frame["receive"]["unauthorized"] == 1, frame
    assert frame["receive"]["endpoint"].startswith("https://127.0.0.1:")
    (name,) = os.listdir(tmp_path / "spool" / "structured_logs")
    kinds = [
        json.loads(line)["log_type_name"]
        for line in open(tmp_path / "spool" / "structured_logs" / name)
    ]
    assert kinds == [
        "structured_logger_opened",
        "data_fetch_start",
        "data_fetch_end",
        "structured_logger_closed",
    ]


def test_the_default_is_loopback_and_beyond_it_a_token_is_required(tmp_path):
    watch = [
        sys.executable,
        "-m",
        "otel_titan.cli",
        "watch",
        "--once",
        "--json",
        "--spool",
        str(tmp_path / "spool"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "OTEL_TITAN_WATCH_TOKEN"} | {
        "PYTHONPATH": str(REPO)
    }
    alone = processes.run(
        [*watch, "--otlp", "0"], timeout=60, capture_output=True, text=True, cwd=REPO, env=env
    )
    assert alone.returncode == 0 and "on http://127.0.0.1:" in alone.stderr, alone.stderr
    wide = processes.run(
        [*watch, "--otlp", "0.0.0.0:0"],
        timeout=60,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert (
        wide.returncode == 2
        and "listening beyond loopback needs a token ($OTEL_TITAN_WATCH_TOKEN or --otlp-token-file)"
        in wide.stderr
    ), wide.stderr
    (tmp_path / "token").write_text(TOKEN + "\n")
    clear = processes.run(
        [*watch, "--otlp", "0.0.0.0:0", "--otlp-token-file", str(tmp_path / "token")],
        timeout=60,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert (
        clear.returncode == 0
        and "without TLS: the token and the records cross the network in clear" in clear.stderr
    ), clear.stderr
    (tmp_path / "empty").write_text("")
    empty = processes.run(
        [*watch, "--otlp", "0", "--otlp-token-file", str(tmp_path / "empty")],
        timeout=60,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert empty.returncode == 2 and "is empty" in empty.stderr
    bad = processes.run(
        [*watch, "--otlp", "0", "--otlp-tls-cert", str(tmp_path / "token")],
        timeout=60,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert (
        bad.returncode == 2 and "--otlp-tls-cert: cannot use the TLS certificate" in bad.stderr
    ), bad.stderr


# -- 6: timeouts and a connection bound ------------------------------------------------------------


def test_half_sent_requests_are_closed_at_their_deadline_and_bounded_meanwhile(make_receiver):
    receiver = make_receiver(limits=Limits(max_connections=8, idle_s=1.0, request_s=1.0))
    url = f"http://127.0.0.1:{receiver.port}/v1/logs"
    stalled = []
    for n in range(20):
        sock = socket.create_connection(("127.0.0.1", receiver.port), timeout=10)
        sock.sendall(
            b"POST /v1/logs HTTP/1.1\r\nHost: x\r\n"
            if n % 2
            else b"POST /v1/logs HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{"
        )
        stalled.append(sock)
    wait_for(lambda: receiver.overloaded >= 12)
    # past the bound: 503 at once, no thread, no descriptor kept
    assert receiver.connections <= 8 and receiver.overloaded == 12
    turned_away = stalled[-1].recv(4096)
    assert turned_away.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in turned_away, turned_away
    deadline = time.monotonic() + 10
    while receiver.connections and time.monotonic() < deadline:
        time.sleep(0.1)
    # each trickler closed at its deadline (1 s + 1 s a MiB)
    assert receiver.connections == 0 and receiver.timed_out == 8
    # a rank's request is served again
    assert post(url, logs_request((NAME, 1, '{"a": 1}')))[0] == 200
    for sock in stalled:
        sock.close()


def test_a_sender_trickling_a_byte_at_a_time_is_closed_at_its_deadline(make_receiver):
    """A per-read timeout alone never fires on a sender that sends a byte every half second: the
    request's deadline does."""
    receiver = make_receiver(limits=Limits(idle_s=2.0, request_s=1.0))
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as sock:
        try:
            for byte in b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40:
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            pass  # closed by the receiver
    assert time.monotonic() - started < 6 and receiver.timed_out == 1


# -- 7: bytes in flight ----------------------------------------------------------------------------


def test_bodies_past_the_bytes_in_flight_get_429_before_they_are_read(make_receiver):
    receiver = make_receiver(limits=Limits(max_in_flight=9 << 20))
    size = 2 << 20  # each held twice (the body and its decoded lines): two fit in 9 MiB, not three
    senders = []
    for _ in range(2):
        sock = socket.create_connection(("127.0.0.1", receiver.port), timeout=20)
        sock.sendall(
            f"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: {size}\r\n\r\n".encode()
        )
        senders.append(sock)
    wait_for(lambda: receiver.in_flight.held == 2 * 2 * size)
    status, text, headers = post(f"http://127.0.0.1:{receiver.port}/v1/logs", b"\0" * size)
    assert status == 429 and headers.get("Retry-After") == "1" and b"in flight" in text, (
        status,
        text,
    )
    assert receiver.in_flight.held == 2 * 2 * size and receiver.overloaded == 1
    for sock in senders:
        sock.sendall(b"\xff" * size)  # not protobuf: answered 400 once read
        assert sock.recv(4096).startswith(b"HTTP/1.1 400")
        sock.close()
    assert receiver.in_flight.held == 0 and receiver.in_flight.peak <= 9 << 20
    assert (
        post(f"http://127.0.0.1:{receiver.port}/v1/logs", logs_request((NAME, 1, '{"a": 1}')))[0]
        == 200
    )


def test_concurrent_large_bodies_leave_the_command_s_memory_bounded(tmp_path):
    """Six concurrent 60 MB bodies to the real command: its peak resident memory (VmHWM) stays far
    below the 360 MB they weigh."""
    watcher, port = start_watch(tmp_path)
    try:
        size = 60 << 20
        answers: list[bytes] = []

        def send() -> None:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
                sock.sendall(
                    f"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: {size}\r\n\r\n".encode()
                )
                try:
                    sock.settimeout(0.5)
                    early = sock.recv(4096)  # a 429 comes before the body is sent
                except TimeoutError:
                    early = b""
                if not early:
                    sock.settimeout(60)
                    sock.sendall(b"\xff" * size)
                    early = sock.recv(4096)
                answers.append(early[:12])

        threads = [threading.Thread(target=send) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        peak_kb = int(
            next(
                line for line in open(f"/proc/{watcher.pid}/status") if line.startswith("VmHWM:")
            ).split()[1]
        )
    finally:
        stop(watcher)
    assert sorted(answers).count(b"HTTP/1.1 429") >= 2, answers
    # before: 6 bodies held at once, 1.1 GB
    assert peak_kb < 330 << 10, f"peak resident memory {peak_kb >> 10} MB"


# -- 8: a record the follower cannot take ----------------------------------------------------------


def test_a_record_longer_than_readers_take_gets_413_and_nothing_is_written(make_receiver):
    receiver = make_receiver()
    url = f"http://127.0.0.1:{receiver.port}/v1/logs"
    huge = '{"log_type_name": "x", "pad": "' + "a" * (17 << 20) + '"}'
    status, text, _ = post(url, logs_request((NAME, 1, huge)))
    assert status == 413 and b"16 MiB" in text, (status, text[:200])
    assert spooled(receiver) == [] and receiver.spool.processes == 0
    assert post(url, logs_request((NAME, 1, '{"a": 1}')))[0] == 200 and spooled(receiver) == [
        '{"a": 1}'
    ]


# -- 11: records that could not be written ---------------------------------------------------------


def test_records_that_could_not_be_written_get_503_and_the_retry_is_written(make_receiver):
    receiver = make_receiver()
    url = f"http://127.0.0.1:{receiver.port}/v1/logs"
    path = os.path.join(receiver.spool.log_dir, NAME)
    # the process's file is a folder (EISDIR): as a full disk or EMFILE, the open or write fails
    os.mkdir(path)
    body = logs_request((NAME, 1, '{"a": 1}'), (NAME, 2, '{"a": 2}'))
    status, text, headers = post(url, body)
    assert status == 503 and b"cannot write" in text and headers.get("Retry-After") == "1", (
        status,
        text,
    )
    assert (
        receiver.facts()["write_failed"] == 1 and "cannot write" in receiver.facts()["write_error"]
    )
    os.rmdir(path)
    assert post(url, body)[0] == 200  # the exporter's retry
    assert spooled(receiver) == ['{"a": 1}', '{"a": 2}'] and receiver.spool.duplicates == 0


def test_emfile_gets_503_not_200(tmp_path):
    """No file descriptor left (EMFILE) while a request is served: the real receiver in a process
    with a low open-files limit."""
    code = f"""
import os, socket, sys
sys.path.insert(0, {str(REPO)!r})
from otel_titan.receive import OtlpHttpReceiver, Spool
from tests.receive.test_http_server import NAME, logs_request
receiver = OtlpHttpReceiver("127.0.0.1", 0, Spool({str(tmp_path / "spool")!r})).start()
clients = []  # kept open: a socket closed by the collector would free a descriptor at a moment of its choosing
def send(body):
    client = socket.create_connection(("127.0.0.1", receiver.port))
    clients.append(client)
    client.sendall(b"POST /v1/logs HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/x-protobuf\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body) + body)
    return client.recv(4096).split(b"\\r\\n")[0].decode()
assert send(logs_request(("warm-up.jsonl", 1, '{{"a": 1}}'))) == "HTTP/1.1 200 OK"  # the decoder's modules imported
hog = []
try:
    while True:
        hog.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
for fd in hog[-2:]:
    os.close(fd)  # room for the sender's socket and the accepted connection, none for the spool's file
print(send(logs_request((NAME, 1, '{{"a": 1}}'))), receiver.spool.write_error)
"""
    done = processes.run(
        [sys.executable, "-c", code],
        timeout=60,
        capture_output=True,
        text=True,
        cwd=REPO,
        preexec_fn=lambda: __import__("resource").setrlimit(
            __import__("resource").RLIMIT_NOFILE, (64, 64)
        ),
    )
    assert done.stdout.startswith("HTTP/1.1 503") and "Too many open files" in done.stdout, (
        done.stdout,
        done.stderr[-2000:],
    )


# -- 12: the open-files limit ----------------------------------------------------------------------


def start_watch(
    tmp_path: Path, *, limit: tuple[int, int] | None = None
) -> tuple[subprocess.Popen[str], int]:
    import resource

    command = [
        sys.executable,
        "-m",
        "otel_titan.cli",
        "watch",
        "--otlp",
        "127.0.0.1:0",
        "--spool",
        str(tmp_path / "spool"),
        "--json",
        "--interval",
        "0.5",
    ]
    watcher = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit)) if limit else None,
    )
    line = stderr_line(watcher)
    assert "receiving OTLP" in line, line
    return watcher, int(line.split(" on ", 1)[1].split(";", 1)[0].rsplit(":", 1)[1])


def stop(watcher: subprocess.Popen[str]) -> str:
    watcher.send_signal(signal.SIGINT)
    try:
        _, stderr = watcher.communicate(timeout=30)
    finally:
        processes.kill_tree(watcher)
    return stderr


def test_the_soft_open_files_limit_is_raised_to_the_hard_one_at_start(tmp_path):
    watcher, _ = start_watch(tmp_path, limit=(256, 4096))
    try:
        said = stderr_line(watcher)
        soft = next(
            line
            for line in open(f"/proc/{watcher.pid}/limits")
            if line.startswith("Max open files")
        ).split()[3]
    finally:
        stop(watcher)
    assert (
        soft == "4096"
        and "open files 4,096 (raised from 256)" in said
        and "at most 4,032 connections" in said
    ), said


def test_past_what_the_limit_allows_connections_get_503_and_the_frame_says_what_is_needed(tmp_path):
    watcher, port = start_watch(tmp_path, limit=(128, 128))
    held = []
    try:
        said = stderr_line(watcher)
        assert "at most 64 connections" in said and "raise the hard limit" in said, said
        # more ranks than descriptors: none refused by the kernel or left without an answer
        for _ in range(100):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        turned = sum(1 for sock in held[64:] if sock.recv(100).startswith(b"HTTP/1.1 503"))
        assert turned == 36
        for sock in held:
            sock.close()
        time.sleep(0.5)
        status, _, _ = post(f"http://127.0.0.1:{port}/v1/logs", logs_request((NAME, 1, '{"a": 1}')))
        assert status == 200
        frame = last_frame(watcher, lambda f: f["receive"]["written"] == 1)
    finally:
        stop(watcher)
    assert (
        frame["receive"]["overloaded"] == 36
        and "raise the open-files limit" in frame["receive"]["hint"]
    ), frame["receive"]


# -- 13: no tracebacks over the live screen --------------------------------------------------------


def test_a_sender_that_goes_away_mid_request_prints_no_traceback(tmp_path):
    watcher, port = start_watch(tmp_path)
    try:
        body = logs_request((NAME, 1, '{"a": 1}'))
        for _ in range(5):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(
                b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
                + body
                + b"POST /v1/logs HTTP/1.1\r\n"
            )
            # close with a reset, before the answer is read
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        time.sleep(1.5)
    finally:
        stderr = stop(watcher)
    assert "Traceback" not in stderr and "Exception occurred during processing" not in stderr, (
        stderr
    )


def test_over_grpc_the_token_is_asked_too(tmp_path, monkeypatch):
    """The gRPC endpoint is no side door: the SDK's gRPC log exporter without the token is refused
    (nothing written), with it (from OTEL_EXPORTER_OTLP_HEADERS, as gRPC metadata) its records are
    written."""
    from opentelemetry._logs import LogRecord
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import ReadWriteLogRecord
    from opentelemetry.sdk._logs.export import LogRecordExportResult

    from otel_titan.receive import OtlpGrpcReceiver

    receiver = OtlpGrpcReceiver("127.0.0.1", 0, Spool(str(tmp_path / "spool")), token=TOKEN).start()
    try:
        logs = [
            ReadWriteLogRecord(
                LogRecord(
                    body=json.dumps({"seq_id": 1}),
                    attributes={"otel_titan.file": NAME, "otel_titan.seq": 1},
                )
            )
        ]
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20wrong")
        refused = OTLPLogExporter(endpoint=f"127.0.0.1:{receiver.port}", insecure=True)
        assert refused.export(logs) == LogRecordExportResult.FAILURE
        refused.shutdown()
        assert spooled(receiver) == [] and receiver.unauthorized == 1
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer%20{TOKEN}")
        taken = OTLPLogExporter(endpoint=f"127.0.0.1:{receiver.port}", insecure=True)
        assert taken.export(logs) == LogRecordExportResult.SUCCESS
        taken.shutdown()
        assert spooled(receiver) == ['{"seq_id": 1}']
    finally:
        receiver.stop()


def test_a_compressed_body_is_inflated_a_step_at_a_time_within_the_bytes_in_flight(make_receiver):
    import gzip

    receiver = make_receiver(limits=Limits(max_in_flight=32 << 20, max_body=8 << 20))
    url = f"http://127.0.0.1:{receiver.port}/v1/logs"
    # about 3 MiB inflated: several steps
    records = [(NAME, n, json.dumps({"seq_id": n, "pad": "x" * 1000})) for n in range(1, 3001)]
    assert (
        post(url, gzip.compress(logs_request(*records)), **{"Content-Encoding": "gzip"})[0] == 200
    )
    assert len(spooled(receiver)) == 3000 and receiver.in_flight.held == 0
    bomb = gzip.compress(b"\0" * (9 << 20))  # 9 KB that inflate past max_body
    status, text, _ = post(url, bomb, **{"Content-Encoding": "gzip"})
    assert status == 413 and b"inflates to more than" in text and receiver.in_flight.held == 0
