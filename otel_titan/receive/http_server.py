"""The OTLP/HTTP endpoint of `otel-titan watch --otlp HOST:PORT`: ``POST /v1/logs`` into a `Spool`.

Standard library only (`http.server`, `ssl`), HTTP/1.1 with keep-alive, one
thread per connection (a rank's exporter keeps one connection open). What it
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
  retry it); larger than `Limits.max_body` (compressed or not), or holding
  a record longer than the reader takes (`schema.MAX_LINE_BYTES`): 413.

What no sender can do to it (docs/security.md, "The OTLP receiver"): with a
token (`OtlpHttpReceiver` ``token=``), a request without
``Authorization: Bearer <token>`` gets 401 before its body is decoded and
changes nothing; with ``tls=`` (`server_tls`: a certificate and key, as a
collector's ``tls.cert_file``/``key_file``) every connection is TLS. Each
connection must send its request's line and headers within `Limits.idle_s`
and its body within `Limits.request_s` plus a second per MiB, or it is
closed; past `Limits.max_connections` a new connection gets 503 and is
closed; past `Limits.max_in_flight` bytes of bodies held at once a request
gets 429 before its body is held (it is read and dropped). Both are
retried by OTLP exporters.

The answer to a request is sent once its records are written to the spool:
a sender that got 200 knows its records are on this machine's disk; one
whose records could not be written (a full disk, no file descriptor left, a
path that is a folder) gets 503 and sends them again.
"""

from __future__ import annotations

import errno
import hmac
import socket
import ssl
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from otel_titan.receive.decode import DecodeError, RecordTooLong, count_spans, decode_logs
from otel_titan.receive.spool import Spool, SpoolWriteError

__all__ = [
    "OtlpHttpReceiver",
    "ReceiverError",
    "Limits",
    "is_loopback",
    "parse_address",
    "receive_facts",
    "server_tls",
    "raise_open_files_limit",
    "MAX_BODY",
]

#: The largest request body taken, before and after decompression (the SDK exporters' batches are
#: far smaller).
MAX_BODY = 64 << 20
#: File descriptors kept for the spool's writes, the follower's reads and the process itself, beside
#: the connections.
_RESERVED_FDS = 64


class ReceiverError(OSError):
    """The receiver cannot listen where it was asked (the message says where and why)."""


@dataclass(frozen=True)
class Limits:
    """What all senders together may hold of one receiver (docs/security.md); beyond, an answer the
    sender retries, never a silent drop.

    Example:
        >>> Limits().max_in_flight >> 20, Limits.for_open_files(1024).max_connections
        (256, 960)
    """

    #: Connections open at once (each a thread and a file descriptor); past it a new one gets 503.
    max_connections: int = 4096
    #: Seconds a connection may sit without a whole request line and headers (kept-alive and idle,
    #: or trickling).
    idle_s: float = 60.0
    #: Seconds a request's body may take to arrive, plus one second per `body_bytes_per_s`.
    request_s: float = 30.0
    body_bytes_per_s: float = float(1 << 20)
    #: Bytes of bodies held at once, as read, inflated and decoded (twice the body); past it 429.
    max_in_flight: int = 256 << 20
    #: The largest body, compressed or not.
    max_body: int = MAX_BODY

    @classmethod
    def for_open_files(cls, soft_limit: int, **kwargs: Any) -> Limits:
        """The limits for a process that may open `soft_limit` files: connections up to it, less
        what the spool and follower need."""
        if soft_limit < 0:  # RLIM_INFINITY
            soft_limit = 1 << 30
        return cls(
            max_connections=max(16, min(cls.max_connections, soft_limit - _RESERVED_FDS)), **kwargs
        )


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's open-files soft limit to its hard limit (1,024 ranks hold 1,024 to 2,048
    connections); (soft, hard) after.

    Example (not run: it would change the calling process's limit):
        >>> soft, hard = raise_open_files_limit()  # doctest: +SKIP
        >>> Limits.for_open_files(soft).max_connections  # doctest: +SKIP
        4096
    """
    import resource  # POSIX only

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass  # the caller says what the limit is and what it needs
    return soft, hard


def server_tls(cert_file: str, key_file: str | None = None) -> ssl.SSLContext:
    """A TLS server context from a PEM certificate (chain) and its key (in `cert_file` when
    `key_file` is None); `ReceiverError` naming the file.

    The standard `ssl` module's defaults (TLS 1.2 at least, the system's ciphers).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except FileNotFoundError as error:
        raise ReceiverError(
            errno.ENOENT,
            f"cannot read the TLS certificate or key {error.filename or cert_file}: no such file",
        ) from None
    except (ssl.SSLError, OSError) as error:
        raise ReceiverError(
            errno.EINVAL,
            f"cannot use the TLS certificate {cert_file} and key {key_file or cert_file}: "
            f"{getattr(error, 'reason', None) or error}",
        ) from None
    return context


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine's loopback (only local processes reach it).

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("localhost"), is_loopback("0.0.0.0")
        (True, True, True, False)
    """
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_address(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT``, ``PORT`` or ``[v6]:PORT`` → (host, port); `ValueError` naming what
    is wrong. No host: loopback.

    Example:
        >>> parse_address("10.0.0.5:4318"), parse_address("4318"), parse_address("[::1]:4318")
        (('10.0.0.5', 4318), ('127.0.0.1', 4318), ('::1', 4318))
        >>> parse_address("host:http")
        Traceback (most recent call last):
        ...
        ValueError: 'host:http': the port must be a number from 0 to 65535 (HOST:PORT, e.g. 127.0.0.1:4318)
    """
    raw = text.strip()
    for prefix in ("http://", "https://"):
        if raw.startswith(prefix):
            raw = raw[len(prefix) :].rstrip("/")
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
        raise ValueError(
            f"{text!r}: the port must be a number from 0 to 65535 (HOST:PORT, e.g. 127.0.0.1:4318)"
        )
    return host or default_host, int(port_text)


_PATHS = {"/v1/logs": "logs", "/v1/traces": "traces", "/v1/metrics": "metrics"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # a watch restarted at once may listen again (TIME_WAIT), never beside a live one (SO_REUSEPORT is not set)
    request_queue_size = 1024  # 1,024 ranks connecting at once

    receiver: OtlpHttpReceiver

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection, or, at the bound of `Limits.max_connections`, a 503 and the
        door closed at once."""
        if not self.receiver._connections.admit(
            request, time.monotonic() + self.receiver.limits.idle_s
        ):
            self.receiver.count(overloaded=1)
            _turn_away(request, tls=self.receiver.tls is not None)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.receiver._connections.forget(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A sender that went away mid-request (reset, broken pipe, a failed TLS handshake):
        counted, never a traceback over the screen."""
        error = sys.exc_info()[1]
        if isinstance(error, TimeoutError):
            # else the tick thread closed it, and counted it
            if self.receiver._connections.forget(request):
                self.receiver.count(timed_out=1)
            return
        self.receiver.count(connection_errors=1)
        self.receiver.last_connection_error = (
            f"{type(error).__name__}: {error}"[:200] if error is not None else None
        )


class _Server6(_Server):
    address_family = socket.AF_INET6


def _turn_away(request: Any, *, tls: bool) -> None:
    """Answer 503 on a connection past the bound without a thread for it (under TLS there is no
    handshake to answer in: closed)."""
    try:
        if not tls:
            request.setblocking(False)
            request.send(_TURNED_AWAY)
            request.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        request.close()


_TURNED_AWAY = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 55\r\n\r\nthe receiver is at its bound of connections: retry soon"
)


class _Connections:
    """The open connections and when each must have sent what it owes (its deadline, monotonic); the
    tick thread closes the late ones.

    Why deadlines and not only a socket timeout: a sender that trickles a
    byte every few seconds never trips a per-read timeout, and would hold its
    thread and descriptor for ever.
    """

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._lock = threading.Lock()
        self._deadlines: dict[Any, float] = {}

    def __len__(self) -> int:
        return len(self._deadlines)

    def admit(self, connection: Any, deadline: float) -> bool:
        with self._lock:
            if len(self._deadlines) >= self.bound:
                return False
            self._deadlines[connection] = deadline
            return True

    def set_deadline(self, connection: Any, deadline: float) -> None:
        with self._lock:
            if connection in self._deadlines:
                self._deadlines[connection] = deadline

    def forget(self, connection: Any) -> bool:
        """Forget a connection; whether it was still here (not already closed as late)."""
        with self._lock:
            return self._deadlines.pop(connection, None) is not None

    def expired(self, now: float) -> list[Any]:
        """The connections past their deadline, forgotten (their thread ends once its blocked read
        returns)."""
        with self._lock:
            late = [c for c, deadline in self._deadlines.items() if deadline <= now]
            for connection in late:
                del self._deadlines[connection]
        return late

    def all(self) -> list[Any]:
        with self._lock:
            return list(self._deadlines)


class _InFlight:
    """Bytes of request bodies held at once (read, inflated, decoded), against
    `Limits.max_in_flight`."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.held = 0
        self.peak = 0
        self._lock = threading.Lock()

    def take(self, count: int) -> bool:
        with self._lock:
            if self.held + count > self.bound:
                return False
            self.held += count
            self.peak = max(self.peak, self.held)
            return True

    def give(self, count: int) -> None:
        with self._lock:
            self.held -= count


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # the base class's name
        """Silent: a request is not news for the watch's screen (the frame counts them)."""

    def log_error(self, format: str, *args: Any) -> None:  # the base class's name
        """Silent too; a connection silent for idle_s before its request's headers (http.server
        closes it) is counted."""
        if format.startswith("Request timed out") and self.server.receiver._connections.forget(
            self.request
        ):
            self.server.receiver.count(timed_out=1)

    def setup(self) -> None:
        self.timeout = self.server.receiver.limits.idle_s  # type: ignore[misc]  # per connection, as socketserver reads it from the instance; each read: a sender silent this long is gone
        super().setup()

    def handle_one_request(self) -> None:
        # The next request's line and headers must be in within idle_s (a kept-alive connection idle
        # that long is closed).
        receiver = self.server.receiver
        receiver._connections.set_deadline(self.request, time.monotonic() + receiver.limits.idle_s)
        super().handle_one_request()

    def do_POST(self) -> None:  # http.server's name
        receiver = self.server.receiver
        path = self.path.split("?", 1)[0].rstrip("/")
        if receiver.token is not None and not _authorized(
            self.headers.get("Authorization"), receiver.token
        ):
            # Before the body is taken: an unauthenticated sender changes nothing and costs no
            # memory (what it sent is dropped).
            receiver.count(unauthorized=1)
            self._discard(min(self._declared_length(), _DRAIN_UNAUTHORIZED))
            self._answer(
                401,
                b"a bearer token is required (Authorization: Bearer ...; the ranks' OTEL_EXPORTER_OTLP_HEADERS)",
                "text/plain; charset=utf-8",
                close=True,
                headers={"WWW-Authenticate": 'Bearer realm="otel-titan watch"'},
            )
            return
        held = 0
        try:
            length = self._length()
            held = self._hold(2 * length)  # the body, and its records' lines once decoded
            receiver._connections.set_deadline(
                self.request,
                time.monotonic()
                + receiver.limits.request_s
                + length / receiver.limits.body_bytes_per_s,
            )
            body, inflated = self._body(length)
            held += inflated
        except _Refused as refused:
            receiver.in_flight.give(held)
            receiver.count(**{refused.counter: 1})
            if refused.drain:
                self._discard(refused.drain)
            self._answer(
                refused.status,
                refused.message.encode(),
                "text/plain; charset=utf-8",
                close=True,
                headers=refused.headers,
            )
            return
        try:
            answer = self._serve(path, body)
        finally:
            del body
            # before the answer is written: a slow reader of answers holds no budget
            receiver.in_flight.give(held)
        self._answer(*answer)

    def _serve(self, path: str, body: bytes) -> tuple[int, bytes, str, dict[str, str] | None]:
        """What to answer a request: (status, body, content type, headers); its records are in the
        spool when 200."""
        receiver = self.server.receiver
        text = "text/plain; charset=utf-8"
        json_body = (self.headers.get("Content-Type") or "").split(";")[
            0
        ].strip().lower() == "application/json"
        kind = _PATHS.get(path)
        if kind is None:
            receiver.count(refused=1)
            return (
                404,
                f"no such OTLP path {path!r} (this receiver takes /v1/logs, /v1/traces, /v1/metrics)".encode(),
                text,
                None,
            )
        try:
            receiver.take(kind, body, json_body=json_body)
        except DecodeError as error:
            receiver.count(refused=1)
            return 400, str(error).encode(), text, None
        except RecordTooLong as error:
            receiver.count(refused=1)
            return 413, str(error).encode(), text, None
        except SpoolWriteError as error:
            # Not written: the sender must keep the records and send them again (503 is retried by
            # every OTLP exporter).
            receiver.count(write_failed=1)
            return 503, str(error).encode(), text, {"Retry-After": "1"}
        # The empty Export*ServiceResponse: full success (protobuf: no bytes at all).
        return (
            200,
            b"{}" if json_body else b"",
            "application/json" if json_body else "application/x-protobuf",
            None,
        )

    def _length(self) -> int:
        length_text = self.headers.get("Content-Length")
        if length_text is None or not length_text.isdigit():
            raise _Refused(411, "a Content-Length is required")
        length = int(length_text)
        if length > self.server.receiver.limits.max_body:
            raise _Refused(
                413, f"body of {length} bytes, more than {self.server.receiver.limits.max_body}"
            )
        return length

    def _hold(self, count: int) -> int:
        """Take `count` bytes of the in-flight budget, or refuse the request with 429 (the sender
        retries later)."""
        in_flight = self.server.receiver.in_flight
        if count > in_flight.bound:
            raise _Refused(
                413,
                f"body of {count // 2} bytes: more than this receiver holds at once "
                f"({in_flight.bound} bytes in flight)",
            )
        if not in_flight.take(count):
            raise _Refused(
                429,
                f"{in_flight.held} bytes of other requests in flight, at most {in_flight.bound}: "
                "retry soon",
                counter="overloaded",
                headers={"Retry-After": "1"},
                drain=self._declared_length(),
            )
        return count

    def _declared_length(self) -> int:
        text = self.headers.get("Content-Length") or ""
        return int(text) if text.isdigit() else 0

    def _discard(self, count: int) -> None:
        """Read and drop `count` bytes of a body not taken (a chunk at a time, under the request's
        deadline).

        Why: a connection closed with unread bytes is reset, and the reset can
        reach the sender before it reads the answer: it would see a broken
        connection instead of the 401 or 429 that says why.
        """
        try:
            while count > 0:
                chunk = self.rfile.read(min(count, 1 << 16))
                if not chunk:
                    return
                count -= len(chunk)
        except OSError:
            pass

    def _body(self, length: int) -> tuple[bytes, int]:
        """The body read and inflated; and the bytes taken from the in-flight budget for the
        inflated part."""
        body = self.rfile.read(length)
        if len(body) < length:
            raise _Refused(400, f"the body ended after {len(body)} of its {length} bytes")
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding == "identity":
            return body, 0
        if encoding not in ("gzip", "deflate"):
            raise _Refused(415, f"Content-Encoding {encoding!r} is not supported (gzip, deflate)")
        max_body = self.server.receiver.limits.max_body
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 32 if encoding == "gzip" else zlib.MAX_WBITS)
        parts: list[bytes] = []
        size = taken = 0
        try:
            while True:
                part = inflater.decompress(body, _INFLATE_STEP)
                body = inflater.unconsumed_tail
                if part:
                    size += len(part)
                    if size > max_body:
                        raise _Refused(413, f"body inflates to more than {max_body} bytes")
                    taken += self._hold(2 * len(part))
                    parts.append(part)
                elif not body:
                    break  # all input taken and no output left (a step that filled exactly is followed by one more call)
        except zlib.error as error:
            self.server.receiver.in_flight.give(taken)
            raise _Refused(400, f"body is not valid {encoding}: {error}") from None
        except _Refused:
            self.server.receiver.in_flight.give(taken)
            raise
        return b"".join(parts), taken

    def _answer(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)


#: The most of an unauthenticated request's body read (and dropped) so that its sender reads the 401
#: rather than a reset.
_DRAIN_UNAUTHORIZED = 1 << 20
#: Inflate a compressed body this many bytes at a time, each taken from the in-flight budget before
#: the next.
_INFLATE_STEP = 1 << 20


def _authorized(header: str | None, token: bytes) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time."""
    scheme, _, presented = (header or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode("utf-8", "surrogateescape"), token
    )


class _Refused(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        counter: str = "refused",
        headers: dict[str, str] | None = None,
        drain: int = 0,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.counter, self.headers, self.drain = (
            status,
            message,
            counter,
            headers,
            drain,
        )


class OtlpHttpReceiver:
    """An OTLP/HTTP receiver writing our records to `spool` (module docstring); `start` it, `stop`
    it.

    `token`: the bearer token every request must carry (None: none asked,
    for loopback behind a collector); `tls`: a `server_tls` context (None:
    plain HTTP); `limits`: what senders may hold (`Limits`). Raises
    `ReceiverError` from `start` when it cannot listen (the port is taken,
    the address is not this machine's, a port below 1024 without the right).
    A thread skips the spool's expired gaps and closes late connections four
    times a second.

    Example:
        >>> import tempfile
        >>> receiver = OtlpHttpReceiver("127.0.0.1", 0, Spool(tempfile.mkdtemp())).start()
        >>> receiver.endpoint.startswith("http://127.0.0.1:")
        True
        >>> receiver.stop()
    """

    def __init__(
        self,
        host: str,
        port: int,
        spool: Spool,
        *,
        clock: Any = time.time,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.host, self.port, self.spool, self.clock = host, port, spool, clock
        self.token = token.encode("utf-8", "surrogateescape") if token else None
        self.tls = tls
        self.limits = limits or Limits()
        self._connections = _Connections(self.limits.max_connections)
        self.in_flight = _InFlight(self.limits.max_in_flight)
        self._server: _Server | None = None
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()
        # requests are served on several threads: no increment lost
        self._counting = threading.Lock()
        #: Our records received; other log records; spans seen (not used: the records have them);
        #: metric requests; log requests; requests refused (bad path, body, encoding or size).
        self.received = 0
        self.foreign_logs = 0
        self.spans = 0
        self.metric_requests = 0
        self.log_requests = 0
        self.refused = 0
        #: Requests without the token (401); requests or connections turned away at a bound (429,
        #: 503); requests whose records could not be written (503); connections closed for being
        #: late; connections that failed (reset, TLS).
        self.unauthorized = 0
        self.overloaded = 0
        self.write_failed = 0
        self.timed_out = 0
        self.connection_errors = 0
        self.last_connection_error: str | None = None

    #: The ranks' ``OTEL_EXPORTER_OTLP_PROTOCOL`` for this endpoint.
    protocol = "http/protobuf"

    def take(self, kind: str, body: bytes, *, json_body: bool = False) -> None:
        """One request's body (``logs``, ``traces`` or ``metrics``): our records to the spool, the
        rest counted.

        Raises `DecodeError` if it does not decode, `RecordTooLong` if a record is longer than the
        reader takes, and `SpoolWriteError` if its records could not be written (nothing of it is
        then taken: the sender sends it again).
        """
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
        """The ranks' ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``http://HOST:PORT``, ``https://`` with TLS,
        for gRPC too), with the port actually bound."""
        host = self.host if self.host not in ("", "0.0.0.0", "::") else socket.gethostname()
        return f"{'https' if self.tls else 'http'}://{'[' + host + ']' if ':' in host else host}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._connections)

    def start(self) -> OtlpHttpReceiver:
        """Listen and serve on background threads."""
        server_class = _Server6 if ":" in self.host else _Server
        try:
            server = server_class((self.host, self.port), _Handler)
        except socket.gaierror as error:
            raise ReceiverError(
                errno.EADDRNOTAVAIL,
                f"cannot listen on {self.host}:{self.port}: unknown host "
                f"({error.strerror or error})",
            ) from None
        except OSError as error:
            reason = {
                errno.EADDRINUSE: "the port is in use (another watch, or a collector, listens there: choose another port)",
                errno.EACCES: "permission denied (ports below 1024 need privileges: choose a port such as 4318)",
                errno.EADDRNOTAVAIL: "the address is not one of this machine's",
            }.get(error.errno or 0, error.strerror or str(error))
            raise ReceiverError(
                error.errno or 0, f"cannot listen on {self.host}:{self.port}: {reason}"
            ) from None
        if self.tls is not None:
            # The handshake runs on the connection's own thread, at its first read (under its
            # deadline), never in accept().
            server.socket = self.tls.wrap_socket(
                server.socket, server_side=True, do_handshake_on_connect=False
            )
        server.receiver = self
        self._server = server
        self.port = server.server_address[1]
        serve = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="otel-titan-receive",
            daemon=True,
        )
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
            late = self._connections.expired(time.monotonic())
            if late:
                self.count(timed_out=len(late))
                _close_all(late)

    def stop(self) -> None:
        """Stop listening and close the connections; what was held past a gap is written (nothing
        received is lost)."""
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            _close_all(self._connections.all())
        for thread in self._threads:
            thread.join(5)
        self.spool.tick(float("inf"))

    def facts(self) -> dict[str, Any]:
        """What the frame shows about the receiver (docs/watch.md, ``receive``)."""
        return receive_facts([self])


def _close_all(connections: list[Any]) -> None:
    """Wake each connection's thread out of its blocked read (shutdown), which then closes it."""
    for connection in connections:
        try:
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def receive_facts(receivers: list[OtlpHttpReceiver]) -> dict[str, Any]:
    """The frame's ``receive`` object for the endpoints of one watch (HTTP, gRPC or both), which
    share one spool.

    Example:
        >>> import tempfile
        >>> receive_facts([OtlpHttpReceiver("127.0.0.1", 4318, Spool(tempfile.mkdtemp()))])["endpoint"]
        'http://127.0.0.1:4318'
    """
    spool = receivers[0].spool
    facts: dict[str, Any] = {
        "endpoint": ", ".join(
            r.endpoint + ("" if r.protocol == "http/protobuf" else f" ({r.protocol})")
            for r in receivers
        ),
        "spool": spool.folder,
        "processes": spool.processes,
        "records": sum(r.received for r in receivers),
        "written": spool.written,
        "duplicates": spool.duplicates,
        "lost": spool.lost,
        "malformed": spool.malformed,
        "out_of_sequence": spool.out_of_sequence,
        "restarts": spool.restarts,
        "other_logs": sum(r.foreign_logs for r in receivers),
        "spans": sum(r.spans for r in receivers),
        "refused": sum(r.refused for r in receivers),
    }
    for name in ("unauthorized", "overloaded", "write_failed", "timed_out", "connection_errors"):
        total = sum(getattr(r, name) for r in receivers)
        if total:  # only when something happened: the frame of a healthy watch stays as it was
            facts[name] = total
    facts["connections"] = sum(r.connections for r in receivers)
    if spool.write_error:
        facts["write_error"] = spool.write_error
    if facts.get("overloaded"):
        # Retried by the senders, so nothing is lost yet; but a rank turned away often lags
        # (docs/security.md).
        bound = receivers[0].limits
        facts["hint"] = (
            f"{facts['overloaded']:,} requests or connections turned away at a bound "
            f"({bound.max_connections:,} connections, "
            f"{bound.max_in_flight >> 20} MiB in flight; the senders retry): raise the open-files "
            "limit (ulimit -n) or split the job across watches"
        )
    if facts["spans"] and not facts["records"]:
        # Ranks that export their spans here but not their records: the spans alone carry no start
        # (a hung span never ends).
        facts["hint"] = (
            "spans arrive but no records: launch the ranks with OTEL_TITAN_OTLP_RECORDS=true "
            "(spans alone cannot show a hang)"
        )
    return facts
