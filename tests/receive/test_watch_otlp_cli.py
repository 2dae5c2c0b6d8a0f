"""`otel-titan watch --otlp`: the command line, its errors, and the receiver in its frame (real processes, real sockets)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from tests.conftest import REPO
from tests.helpers import processes


def watch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return processes.run([sys.executable, "-m", "otel_titan.cli", "watch", *args], timeout=timeout, capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_port_in_use_is_an_error_that_says_so(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = watch("--otlp", f"127.0.0.1:{port}", "--spool", str(tmp_path / "spool"), "--once")
    assert done.returncode == 2, done
    assert f"--otlp: cannot listen on 127.0.0.1:{port}: the port is in use" in done.stderr, done.stderr


def test_wrong_arguments_are_named():
    cases = {("--otlp", "localhost"): "--otlp: 'localhost': the port must be a number",
             ("--spool", "x", "run"): "--spool: only with --otlp",
             (): "RUN_DIR is required (or --otlp HOST:PORT",
             ("--otlp", "127.0.0.1:0", "--spool", "a", "b"): "RUN_DIR or --spool, not both"}
    for args, message in cases.items():
        done = watch(*args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


def test_a_spool_that_cannot_be_made_is_an_error(tmp_path):
    (tmp_path / "file").write_text("x")
    done = watch("--otlp", "127.0.0.1:0", "--spool", str(tmp_path / "file" / "spool"), "--once")
    assert done.returncode == 2 and "--spool: cannot create" in done.stderr, done.stderr


def test_the_frame_carries_the_receiver_and_the_screen_shows_it(tmp_path):
    done = watch("--otlp", "127.0.0.1:0", "--spool", str(tmp_path / "spool"), "--once", "--json")
    assert done.returncode == 0, done.stderr
    (frame,) = [json.loads(line) for line in done.stdout.splitlines()]
    receive = frame["receive"]
    assert receive["endpoint"].startswith("http://127.0.0.1:") and receive["spool"] == str(tmp_path / "spool") and receive["records"] == 0
    assert "OTEL_TITAN_OTLP_RECORDS=true OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:" in done.stderr
    assert (tmp_path / "spool" / "structured_logs").is_dir()
    plain = watch("--otlp", "127.0.0.1:0", str(tmp_path / "spool2"), "--once", "--plain")
    assert plain.returncode == 0 and "receiving OTLP on http://127.0.0.1:" in plain.stdout, plain.stdout
