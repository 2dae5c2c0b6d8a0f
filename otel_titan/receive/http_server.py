"""The OTLP/HTTP endpoint of `otel-titan watch --otlp HOST:PORT`: ``POST /v1/logs`` into a `Spool`.

Standard library only (`http.server`), HTTP/1.1 with keep-alive, one thread
per connection (a rank's exporter keeps one connection open). What it
accepts, as an OTLP/HTTP receiver must (the specification's paths, bodies
and answers):

* ``POST /v1/logs``: protobuf (``application/x-protobuf``) or JSON
  (``application/json``), optionally ``Content-Encoding: gzip`` or
  ``deflate`` (collectors compress by default); our records go to the spool,
  other log records are counted and dropped;
* ``POST /v1/traces`` and ``/v1/metrics``: answered 200 and counted, so a rank
  that also exports its spans or metrics to the same endpoint
  (``OTEL_EXPORTER_OTLP_ENDPOINT`` is shared by all signals) gets no errors;
* anything else: 404; a body that does not decode: 400 (the sender does not
  retry it); larger than `MAX_BODY` (compressed or not): 413.

The answer to a request is sent once its records are written to the spool:
a sender that got 200 knows its records are on this machine's disk.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from otel_titan.receive.decode import DecodeError, count_spans, decode_logs
from otel_titan.receive.spool import Spool

__all__ = ["OtlpHttpReceiver", "ReceiverError", "parse_address", "receive_facts", "MAX_BODY"]

#: The largest request body taken, before and after decompression (the SDK exporters' batches are far smaller).
MAX_BODY = 64 << 20


class ReceiverError(OSError):
    """The receiver cannot listen where it was asked (the message says where and why)."""


def parse_address(text: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT``, ``PORT`` or ``[v6]:PORT`` → (host, port); `ValueError` naming what is wrong.

    Example:
        >>> parse_address("0.0.0.0:4318"), parse_address("4318"), parse_address("[::1]:4318")
        (('0.0.0.0', 4318), ('0.0.0.0', 4318), ('::1', 4318))
        >>> parse_address("host:http")
        Traceback (most recent call last):
        ...
        ValueError: 'host:http': the port must be a number from 0 to 65535 (HOST:PORT, e.g. 0.0.0.0:4318)
    """
    raw = text.strip()
    for prefix in ("http://", "https://"):
        if raw.startswith(prefix):
            raw = raw[len(prefix):].rstrip("/")
    if raw.startswith("["):
        host, _, rest = raw[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif raw.count(":") == 1:
        host, port_text = raw.split(":")
    elif ":" not in raw:
        host, port_text = "", raw
    else:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets ([::1]:4318)")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{text!r}: the port must be a number from 0 to 65535 (HOST:PORT, e.g. 0.0.0.0:4318)")
    return host or default_host, int(port_text)


_PATHS = {"/v1/logs": "logs", "/v1/traces": "traces", "/v1/metrics": "metrics"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # a watch restarted at once may listen again (TIME_WAIT), never beside a live one (SO_REUSEPORT is not set)
    request_queue_size = 1024  # 1,024 ranks connecting at once

    receiver: OtlpHttpReceiver


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Silent: a request is not news for the watch's screen (the frame counts them)."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        receiver = self.server.receiver
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            body = self._body()
        except _Refused as refused:
            receiver.count(refused=1)
            self._answer(refused.status, refused.message.encode(), "text/plain; charset=utf-8", close=True)
            return
        json_body = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower() == "application/json"
        kind = _PATHS.get(path)
        if kind is None:
            receiver.count(refused=1)
            self._answer(404, f"no such OTLP path {path!r} (this receiver takes /v1/logs, /v1/traces, /v1/metrics)".encode(), "text/plain; charset=utf-8")
            return
        try:
            receiver.take(kind, body, json_body=json_body)
        except DecodeError as error:
            receiver.count(refused=1)
            self._answer(400, str(error).encode(), "text/plain; charset=utf-8")
            return
        # The empty Export*ServiceResponse: full success (protobuf: no bytes at all).
        self._answer(200, b"{}" if json_body else b"", "application/json" if json_body else "application/x-protobuf")

    def _body(self) -> bytes:
        length_text = self.headers.get("Content-Length")
        if length_text is None or not length_text.isdigit():
            raise _Refused(411, "a Content-Length is required")
        length = int(length_text)
        if length > MAX_BODY:
            raise _Refused(413, f"body of {length} bytes, more than {MAX_BODY}")
        body = self.rfile.read(length)
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding in ("gzip", "deflate"):
            inflater = zlib.decompressobj(zlib.MAX_WBITS | 32 if encoding == "gzip" else zlib.MAX_WBITS)
            try:
                body = inflater.decompress(body, MAX_BODY + 1)
            except zlib.error as error:
                raise _Refused(400, f"body is not valid {encoding}: {error}") from None
            if len(body) > MAX_BODY:
                raise _Refused(413, f"body inflates to more than {MAX_BODY} bytes")
        elif encoding != "identity":
            raise _Refused(415, f"Content-Encoding {encoding!r} is not supported (gzip, deflate)")
        return body

    def _answer(self, status: int, body: bytes, content_type: str, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class OtlpHttpReceiver:
    """An OTLP/HTTP receiver writing our records to `spool` (module docstring); `start` it, `stop` it.

    Raises `ReceiverError` from `start` when it cannot listen (the port is
    taken, the address is not this machine's, a port below 1024 without the
    right). A thread skips the spool's expired gaps four times a second.

    Example:
        >>> import tempfile
        >>> receiver = OtlpHttpReceiver("127.0.0.1", 0, Spool(tempfile.mkdtemp())).start()
        >>> receiver.endpoint.startswith("http://127.0.0.1:")
        True
        >>> receiver.stop()
    """

    def __init__(self, host: str, port: int, spool: Spool, *, clock: Any = time.time) -> None:
        self.host, self.port, self.spool, self.clock = host, port, spool, clock
        self._server: _Server | None = None
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()
        self._counting = threading.Lock()  # requests are served on several threads: no increment lost
        #: Our records received; other log records; spans seen (not used: the records have them); metric requests;
        #: log requests; requests refused (bad path, body, encoding or size).
        self.received = 0
        self.foreign_logs = 0
        self.spans = 0
        self.metric_requests = 0
        self.log_requests = 0
        self.refused = 0

    #: The ranks' ``OTEL_EXPORTER_OTLP_PROTOCOL`` for this endpoint.
    protocol = "http/protobuf"

    def take(self, kind: str, body: bytes, *, json_body: bool = False) -> None:
        """One request's body (``logs``, ``traces`` or ``metrics``): our records to the spool, the rest counted; `DecodeError` if it does not decode."""
        if kind == "logs":
            decoded = decode_logs(body, json_body=json_body)
            self.spool.add(decoded.records, self.clock())
            self.count(received=len(decoded.records), foreign_logs=decoded.foreign, log_requests=1)
        elif kind == "traces":
            self.count(spans=count_spans(body, json_body=json_body))
        else:
            self.count(metric_requests=1)

    def count(self, **deltas: int) -> None:
        """Add to the counters (any thread)."""
        with self._counting:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    @property
    def endpoint(self) -> str:
        """The ranks' ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``http://HOST:PORT``, for gRPC too), with the port actually bound."""
        host = self.host if self.host not in ("", "0.0.0.0", "::") else socket.gethostname()
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    def start(self) -> OtlpHttpReceiver:
        """Listen and serve on background threads."""
        server_class = _Server6 if ":" in self.host else _Server
        try:
            server = server_class((self.host, self.port), _Handler)
        except socket.gaierror as error:
            raise ReceiverError(errno.EADDRNOTAVAIL, f"cannot listen on {self.host}:{self.port}: unknown host ({error.strerror or error})") from None
        except OSError as error:
            reason = {errno.EADDRINUSE: "the port is in use (another watch, or a collector, listens there: choose another port)",
                      errno.EACCES: "permission denied (ports below 1024 need privileges: choose a port such as 4318)",
                      errno.EADDRNOTAVAIL: "the address is not one of this machine's"}.get(error.errno or 0, error.strerror or str(error))
            raise ReceiverError(error.errno or 0, f"cannot listen on {self.host}:{self.port}: {reason}") from None
        server.receiver = self
        self._server = server
        self.port = server.server_address[1]
        serve = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="otel-titan-receive", daemon=True)
        serve.start()
        self._threads.append(serve)
        self._start_tick()
        return self

    def _start_tick(self) -> None:
        tick = threading.Thread(target=self._tick, name="otel-titan-receive-tick", daemon=True)
        tick.start()
        self._threads.append(tick)

    def _tick(self) -> None:
        while not self._stopped.wait(0.25):
            self.spool.tick(self.clock())

    def stop(self) -> None:
        """Stop listening; what was held past a gap is written (nothing received is lost)."""
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(5)
        self.spool.tick(float("inf"))

    def facts(self) -> dict[str, Any]:
        """What the frame shows about the receiver (docs/watch.md, ``receive``)."""
        return receive_facts([self])


def receive_facts(receivers: list[OtlpHttpReceiver]) -> dict[str, Any]:
    """The frame's ``receive`` object for the endpoints of one watch (HTTP, gRPC or both), which share one spool.

    Example:
        >>> import tempfile
        >>> receive_facts([OtlpHttpReceiver("127.0.0.1", 4318, Spool(tempfile.mkdtemp()))])["endpoint"]
        'http://127.0.0.1:4318'
    """
    spool = receivers[0].spool
    facts: dict[str, Any] = {"endpoint": ", ".join(r.endpoint + ("" if r.protocol == "http/protobuf" else f" ({r.protocol})") for r in receivers),
                             "spool": spool.folder, "processes": spool.processes, "records": sum(r.received for r in receivers),
                             "written": spool.written, "duplicates": spool.duplicates, "lost": spool.lost, "malformed": spool.malformed,
                             "other_logs": sum(r.foreign_logs for r in receivers), "spans": sum(r.spans for r in receivers),
                             "refused": sum(r.refused for r in receivers)}
    if spool.write_error:
        facts["write_error"] = spool.write_error
    if facts["spans"] and not facts["records"]:
        # Ranks that export their spans here but not their records: the spans alone carry no start (a hung span never ends).
        facts["hint"] = "spans arrive but no records: launch the ranks with OTEL_TITAN_OTLP_RECORDS=true (spans alone cannot show a hang)"
    return facts
