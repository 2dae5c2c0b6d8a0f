"""A real OpenTelemetry collector for the tests: `rotel-agent` from the PyPI package `rotel`.

Started on free loopback ports, receiving OTLP over gRPC and HTTP, forwarding
everything over OTLP/gRPC to a receiver of the test's choice.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import rotel

from tests.helpers import processes


def agent_path() -> str:
    return os.path.join(os.path.dirname(rotel.__file__), "rotel-agent")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _accepting(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class RotelCollector:
    """Run ``rotel-agent start`` forwarding to `forward_to` (``http://127.0.0.1:<port>``)."""

    def __init__(self, forward_to: str, workdir: Path, protocol: str = "grpc") -> None:
        self.forward_to = forward_to
        self.protocol = (
            protocol  # how it forwards: grpc, or http (OTLP/HTTP protobuf, gzip: rotel's default)
        )
        self.workdir = workdir
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> RotelCollector:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ROTEL_", "OTEL_"))}
        self.log_path = self.workdir / "rotel.log"
        self.process = subprocess.Popen(
            [
                agent_path(),
                "start",
                "--otlp-grpc-endpoint",
                f"127.0.0.1:{self.grpc_port}",
                "--otlp-http-endpoint",
                f"127.0.0.1:{self.http_port}",
                "--exporter",
                "otlp",
                "--otlp-exporter-endpoint",
                self.forward_to,
                "--otlp-exporter-protocol",
                self.protocol,
                "--pid-file",
                str(self.workdir / "rotel.pid"),
                "--log-file",
                str(self.log_path),
                "--batch-timeout",
                "100ms",
            ],
            stdout=open(self.workdir / "rotel.stdout", "wb"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + 15
        while not (_accepting(self.grpc_port) and _accepting(self.http_port)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                status = self.process.poll()
                self.kill()  # still running but not listening: leave nothing behind
                output = (self.workdir / "rotel.stdout").read_text(errors="replace")
                raise RuntimeError(f"rotel-agent did not start (exit {status}): {output[-2000:]}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        """Stop it the hard way (a collector that dies mid-run): it and anything it started."""
        if self.process and self.process.poll() is None:
            processes.kill_tree(self.process, timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
