"""`otel-titan watch --otlp`: the command line, its errors, and the receiver in its frame (real
processes, real sockets)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from tests.conftest import REPO
from tests.helpers import processes


def watch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return processes.run(
        [sys.executable, "-m", "otel_titan.cli", "watch", *args],
        timeout=timeout,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_a_port_in_use_is_an_error_that_says_so(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = watch("--otlp", f"127.0.0.1:{port}", "--spool", str(tmp_path / "spool"), "--once")
    assert done.returncode == 2, done
    assert f"--otlp: cannot listen on 127.0.0.1:{port}: the port is in use" in done.stderr, (
        done.stderr
    )


def test_wrong_arguments_are_named():
    cases = {
        ("--otlp", "localhost"): "--otlp: 'localhost': the port must be a number",
        ("--spool", "x", "run"): "--spool: only with --otlp or --otlp-grpc",
        (): "RUN_DIR is required (or --otlp HOST:PORT",
        ("--otlp", "127.0.0.1:0", "--spool", "a", "b"): "RUN_DIR or --spool, not both",
    }
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
    assert (
        receive["endpoint"].startswith("http://127.0.0.1:")
        and receive["spool"] == str(tmp_path / "spool")
        and receive["records"] == 0
    )
    assert (
        "OTEL_TITAN_OTLP_RECORDS=true OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:" in done.stderr
    )
    assert (tmp_path / "spool" / "structured_logs").is_dir()
    plain = watch("--otlp", "127.0.0.1:0", str(tmp_path / "spool2"), "--once", "--plain")
    assert plain.returncode == 0 and "receiving OTLP on http://127.0.0.1:" in plain.stdout, (
        plain.stdout
    )


def test_over_grpc_a_rank_s_records_reach_the_spool_and_the_frame(tmp_path):
    """``--otlp-grpc``: a real logger sending its records over OTLP/gRPC
    (OTEL_EXPORTER_OTLP_PROTOCOL=grpc) to the real command."""
    command = [
        sys.executable,
        "-m",
        "otel_titan.cli",
        "watch",
        "--otlp-grpc",
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
    )
    try:
        line = watcher.stderr.readline()  # type: ignore[union-attr]
        assert (
            "receiving OTLP (grpc) on http://127.0.0.1:" in line
            and "OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in line
        ), line
        endpoint = line.split(" on ", 1)[1].split(";", 1)[0]
        code = (
            "from otel_titan import structured_logger as "
            "sl\nsl.init_structured_logger('training', 'run', rank=0, world_size=1, run_id='g')\n"
            "with sl.log_trace_span('data_fetch'):\n    "
            "pass\nsl.shutdown_structured_logger(timeout=10)\n"
        )
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "OTEL_TITAN_OTLP_RECORDS": "true",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        }
        rank = processes.run(
            [sys.executable, "-c", code],
            timeout=60,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        assert rank.returncode == 0, rank.stderr
        frame = None
        for raw in watcher.stdout:  # type: ignore[union-attr]
            frame = json.loads(raw)
            if frame["type"] == "frame" and frame["receive"]["written"] >= 4:
                break
    finally:
        processes.kill_tree(watcher)
        watcher.stdout.close()  # type: ignore[union-attr]
        watcher.stderr.close()  # type: ignore[union-attr]
    assert (
        frame is not None
        and frame["receive"]["written"] == 4
        and frame["receive"]["endpoint"].endswith("(grpc)")
    ), frame
    assert frame["states"] == {"closed": 1}, frame["states"]
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


def test_grpc_port_in_use_is_an_error_that_says_so(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = watch(
            "--otlp-grpc", f"127.0.0.1:{port}", "--spool", str(tmp_path / "spool"), "--once"
        )
    assert (
        done.returncode == 2
        and f"--otlp-grpc: cannot listen on 127.0.0.1:{port}: the port is in use" in done.stderr
    ), done.stderr
