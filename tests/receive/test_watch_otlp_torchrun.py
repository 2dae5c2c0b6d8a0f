"""`otel-titan watch --otlp` beside real jobs whose files it cannot read: 3 ranks (torchrun, gloo on
CPU), one fault at a time.

The ranks write their files to a folder the watch is never given (a
node-local disk, as far as the watch knows) and send their records over OTLP
(``OTEL_TITAN_OTLP_RECORDS=true``, ``OTEL_TRACES_EXPORTER=otlp``, one
``OTEL_EXPORTER_OTLP_ENDPOINT`` for both), straight to the watch or through a
real collector (rotel) that forwards them over OTLP/HTTP with gzip. No dump
trigger either (``--no-trigger``): nothing shared but the network. Each test
checks: ``watch --otlp --json --exit-on hang`` exits 3 on its own; the alert
names the culprit rank and only it, in the right phase; within the issue's
target, max(15 s, 3 × the median step), of the culprit's last record (read
from its own file afterwards); and the spool holds the very records the files
hold, in their order. A rank that slows down by 30 % is named alone, with its
phase, within max(60 s, 30 steps). The job's and the collector's process trees are killed after.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers import processes

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

WORKLOAD = str(REPO / "tests" / "helpers" / "watch_workload.py")
BAD = 1
STEP_S = 0.2
META = (
    "heartbeat",
    "stall",
    "structured_logger_opened",
    "structured_logger_closed",
    "signal_received",
    "records_dropped",
    "step_rollup",
)


def start_watch(spool: Path) -> tuple[subprocess.Popen[str], str]:
    """``watch --otlp 127.0.0.1:0``; returns it and the endpoint it says it listens on (its first
    stderr line)."""
    command = [
        sys.executable,
        "-m",
        "otel_titan.cli",
        "watch",
        "--otlp",
        "127.0.0.1:0",
        "--spool",
        str(spool),
        "--json",
        "--exit-on",
        "hang",
        "--interval",
        "1",
        "--no-trigger",
    ]
    watcher = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        text=True,
    )
    line = watcher.stderr.readline()  # type: ignore[union-attr]
    assert "receiving OTLP (http/protobuf) on http://127.0.0.1:" in line, (
        line + watcher.stderr.read()
    )  # type: ignore[union-attr]
    endpoint = line.split(" on ", 1)[1].split(";", 1)[0]
    return watcher, endpoint


def launch(fault: str, files: Path, endpoint: str, **extra: str) -> subprocess.Popen[bytes]:
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",
            "WATCH_STEP_S": str(STEP_S),
            "OTEL_TITAN_OTLP_RECORDS": "true",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            **extra,
        }
    )
    env.pop("OTEL_TITAN_DUMP_TRIGGER", None)
    files.mkdir(parents=True, exist_ok=True)
    log = open(files / "torchrun.log", "wb")  # closed with the process
    return subprocess.Popen(
        [launcher, "--standalone", "--nproc_per_node=3", WORKLOAD, fault, str(BAD), str(files)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
    )


def wait_exit(
    watcher: subprocess.Popen[str], files: Path, timeout: float = 120
) -> tuple[int, list[dict]]:
    try:
        stdout, stderr = watcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        processes.kill_tree(watcher)
        stdout, stderr = watcher.communicate()
        raise AssertionError(
            f"watch did not exit within {timeout:.0f} s; its last lines: {stdout[-1500:]}; job "
            "log: "
            f"{(files / 'torchrun.log').read_text(errors='replace')[-1500:]}"
        ) from None
    assert stderr.strip() == "", stderr
    return watcher.returncode, [json.loads(line) for line in stdout.splitlines() if line.strip()]


def program_records(path: str) -> list[tuple]:
    out = []
    for line in open(path, "rb"):
        record = json.loads(line)
        if record["log_type_name"] not in META:
            out.append(
                (
                    record["log_type_name"],
                    record.get("span_id"),
                    record.get("step"),
                    record["time_us"],
                    record["rank"],
                )
            )
    return out


def check_spool_matches_files(spool: Path, files: Path) -> None:
    """Per rank, the spool's program records are the file's, in the file's order (the file may have
    more: it went on)."""
    spooled = sorted(glob.glob(str(spool / "structured_logs" / "*.jsonl")))
    assert len(spooled) == 3, spooled
    for path in spooled:
        rank = json.loads(open(path, "rb").readline())["rank"]
        first = json.loads(open(path, "rb").readline())
        assert first["log_type_name"] == "structured_logger_opened", first
        received = program_records(path)
        written = program_records(
            glob.glob(str(files / "structured_logs" / f"training.global_rank_{rank}.*.jsonl"))[0]
        )
        assert len(received) >= 10 and received == written[: len(received)], (
            rank,
            received[:3],
            written[:3],
        )


def parse_utc(text: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def last_program_record_s(files: Path, rank: int) -> float:
    path = glob.glob(str(files / "structured_logs" / f"training.global_rank_{rank}.*.jsonl"))[0]
    return program_records(path)[-1][3] / 1e6


def run_hang(
    tmp_path: Path, fault: str, *, collector: bool = False
) -> tuple[dict, float, list[dict]]:
    spool, files = tmp_path / "spool", tmp_path / "node-local"
    watcher, endpoint = start_watch(spool)
    rotel = None
    job = None
    try:
        if collector:
            from tests.helpers.collector import RotelCollector

            rotel = RotelCollector(endpoint, tmp_path / "rotel", protocol="http").start()
            endpoint = rotel.http_endpoint
        job = launch(fault, files, endpoint)
        code, lines = wait_exit(watcher, files)
        alerts = [line for line in lines if line["type"] == "alert"]
        assert code == 3, lines[-3:]
        hang = [a for a in alerts if a["kind"] == "hang"]
        assert len(hang) == 1, alerts
        latency = parse_utc(hang[0]["detected_utc"]) - last_program_record_s(files, BAD)
        frames = [line for line in lines if line["type"] == "frame"]
        receive = frames[-1]["receive"]
        assert (
            receive["processes"] == 3
            and receive["lost"] == 0
            and receive["malformed"] == 0
            and receive["refused"] == 0
        ), receive
        # the spans went to the same endpoint, and were answered
        assert receive["spans"] > 0, receive
        check_spool_matches_files(spool, files)
        return hang[0], latency, lines
    finally:
        if job is not None:
            processes.kill_tree(job)
        if rotel is not None:
            rotel.kill()
        processes.kill_tree(watcher)


def test_a_rank_hung_in_the_peer_phase_is_named_over_otlp_from_files_the_watch_cannot_read(
    tmp_path,
):
    hang, latency, lines = run_hang(tmp_path, "peer_phase")
    print(f"hang named {latency:.1f} s after the culprit's last record: {hang['message']}")
    assert hang["ranks"] == [BAD] and hang["phase"] == "data_fetch" and hang["victims"] == 2, hang
    assert hang["confirmed"] is True
    assert [line for line in lines if line["type"] == "frame"][-1]["states"].get("hung") == 1
    assert latency <= max(15.0, 3 * STEP_S), latency
    # No black box crossed (no shared trigger): its line is where its open span began, from that
    # span's _start record.
    assert hang["line"] is not None and "watch_workload.py" in hang["line"], hang
    assert not (tmp_path / "node-local" / "dump-now").exists()


def test_a_rank_hung_between_spans_is_named_over_otlp(tmp_path):
    hang, latency, _ = run_hang(tmp_path, "between_spans")
    print(f"hang named {latency:.1f} s after the culprit's last record: {hang['message']}")
    assert hang["ranks"] == [BAD] and hang["phase"] == "between spans", hang
    assert latency <= max(15.0, 3 * STEP_S), latency


def test_a_hang_is_named_through_a_collector_that_fans_the_records_out(tmp_path):
    """rotel receives the ranks' OTLP and forwards it (OTLP/HTTP, gzip, its own batches) to the
    watch."""
    hang, latency, _ = run_hang(tmp_path, "peer_phase", collector=True)
    print(
        f"hang named {latency:.1f} s after the culprit's last record, through rotel: "
        f"{hang['message']}"
    )
    assert hang["ranks"] == [BAD] and hang["phase"] == "data_fetch" and hang["victims"] == 2, hang
    assert latency <= max(15.0, 3 * STEP_S), latency


def test_a_rank_that_slows_down_is_named_over_otlp_with_its_phase_and_nobody_else(tmp_path):
    """Its phases' durations come from its own clock inside the records, not from when the batches
    arrived."""
    spool, files = tmp_path / "spool", tmp_path / "node-local"
    command = [
        sys.executable,
        "-m",
        "otel_titan.cli",
        "watch",
        "--otlp",
        "127.0.0.1:0",
        "--spool",
        str(spool),
        "--json",
        "--interval",
        "1",
        "--no-trigger",
    ]
    watcher = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        text=True,
    )
    job = None
    alerts: list[dict] = []
    fault_step = 25
    try:
        first = json.loads(watcher.stdout.readline())  # type: ignore[union-attr]
        endpoint = first["receive"]["endpoint"]
        job = launch(
            "slow", files, endpoint, WATCH_FAULT_STEP=str(fault_step), WATCH_SLOW_FACTOR="1.3"
        )
        deadline = time.monotonic() + 120
        for line in watcher.stdout:  # type: ignore[union-attr]
            event = json.loads(line)
            if event["type"] == "alert":
                alerts.append(event)
                if event["kind"] == "slow":
                    break
            if time.monotonic() > deadline:
                break
        onset = next(
            r[3] / 1e6
            for r in program_records(
                glob.glob(str(files / "structured_logs" / f"training.global_rank_{BAD}.*.jsonl"))[0]
            )
            if r[0] == "data_fetch_start" and r[2] == fault_step
        )
    finally:
        if job is not None:
            processes.kill_tree(job)
        processes.kill_tree(watcher)
        watcher.stdout.close()  # type: ignore[union-attr]
    assert [(a["kind"], a["ranks"], a["phase"]) for a in alerts] == [
        ("slow", [BAD], "data_fetch")
    ], alerts
    latency = parse_utc(alerts[0]["detected_utc"]) - onset
    print(f"slow named {latency:.1f} s after its onset, over OTLP: {alerts[0]['message']}")
    assert 0 < latency <= max(60.0, 30 * STEP_S * 1.3), latency
