"""`otel-titan watch` beside real jobs: 3 ranks (torchrun, gloo on CPU), one fault at a time
(tests/helpers/watch_workload.py).

Each test starts the job and, once its files exist, the real command
``otel-titan watch RUN --json --exit-on hang --interval 1``, with the ranks
launched with ``OTEL_TITAN_DUMP_TRIGGER`` so that the watch's request brings
their black boxes. It checks: the command exits 3 on its own; the alert names
the culprit rank and only it, in the right phase, with its line of code (a rank
that slows down by 30 % in data_fetch: named with its cost, nobody else);
and it came within the issue's target, max(15 s, 3 × the median step), of
the culprit's last record. The job's whole process tree is killed after.
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


def line_of(marker: str) -> int:
    for number, line in enumerate(open(WORKLOAD, encoding="utf-8"), 1):
        if marker in line:
            return number
    raise AssertionError(marker)


def launch(fault: str, output: Path, **extra: str) -> subprocess.Popen[bytes]:
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "OTEL_TITAN_DUMP_TRIGGER": str(output / "dump-now"),
        "WATCH_STEP_S": str(STEP_S),
        **extra,
    }
    log = open(output / "torchrun.log", "wb")
    return subprocess.Popen(
        [launcher, "--standalone", "--nproc_per_node=3", WORKLOAD, fault, str(BAD), str(output)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
    )


def wait_for_files(
    output: Path, job: subprocess.Popen[bytes], count: int = 3, timeout: float = 90
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(glob.glob(str(output / "structured_logs" / "*.jsonl"))) >= count:
            return
        assert job.poll() is None, (output / "torchrun.log").read_text(errors="replace")[-3000:]
        time.sleep(0.2)
    raise AssertionError("the ranks never opened their files")


def last_program_record_s(output: Path, rank: int) -> float:
    """When rank `rank` last wrote a record of its own program (epoch s): its last progress."""
    path = glob.glob(str(output / "structured_logs" / f"training.global_rank_{rank}.*.jsonl"))[0]
    last = None
    for line in open(path, "rb"):
        record = json.loads(line)
        if record["log_type_name"] not in (
            "heartbeat",
            "stall",
            "structured_logger_opened",
            "signal_received",
        ):
            last = record["time_us"] / 1e6
    assert last is not None
    return last


def watch_until_exit(
    output: Path, job: subprocess.Popen[bytes], timeout: float = 90
) -> tuple[int, list[dict]]:
    command = [
        sys.executable,
        "-m",
        "otel_titan.cli",
        "watch",
        str(output),
        "--json",
        "--exit-on",
        "hang",
        "--interval",
        "1",
    ]
    try:
        done = processes.run(
            command,
            timeout=timeout,
            capture_output=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"watch did not exit within {timeout:.0f} s; job log: "
            f"{(output / 'torchrun.log').read_text(errors='replace')[-2000:]}"
        ) from None
    lines = [json.loads(line) for line in done.stdout.decode().splitlines() if line.strip()]
    assert done.stderr.decode().strip() == "", done.stderr.decode()
    return done.returncode, lines


def parse_utc(text: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def run_hang(tmp_path: Path, fault: str) -> tuple[dict, float, list[dict]]:
    job = launch(fault, tmp_path)
    try:
        wait_for_files(tmp_path, job)
        code, lines = watch_until_exit(tmp_path, job)
        alerts = [line for line in lines if line["type"] == "alert"]
        assert code == 3, lines[-3:]
        hang = [a for a in alerts if a["kind"] == "hang"]
        assert len(hang) == 1, alerts
        latency = parse_utc(hang[0]["detected_utc"]) - last_program_record_s(tmp_path, BAD)
        return hang[0], latency, lines
    finally:
        processes.kill_tree(job)


def test_a_rank_hung_in_the_peer_phase_is_named_with_its_line_and_exit_on_hang_exits_3(tmp_path):
    hang, latency, lines = run_hang(tmp_path, "peer_phase")
    print(f"hang named {latency:.1f} s after the culprit's last record: {hang['message']}")
    assert hang["ranks"] == [BAD] and hang["phase"] == "data_fetch" and hang["victims"] == 2, hang
    assert hang["confirmed"] is True
    frames = [line for line in lines if line["type"] == "frame"]
    assert frames[-1]["states"].get("hung") == 1, frames[-1]["states"]
    assert latency <= max(15.0, 3 * STEP_S), latency
    # Its line of code: the black box the watch asked for (trigger file) or the span's start line.
    assert hang["line"] is not None and "watch_workload.py" in hang["line"], hang
    assert (tmp_path / "dump-now").exists(), "the watch did not touch the dump trigger file"


def test_a_rank_hung_between_spans_is_named_and_the_ranks_waiting_for_it_are_not(tmp_path):
    hang, latency, _ = run_hang(tmp_path, "between_spans")
    print(f"hang named {latency:.1f} s after the culprit's last record: {hang['message']}")
    assert hang["ranks"] == [BAD] and hang["phase"] == "between spans", hang
    assert latency <= max(15.0, 3 * STEP_S), latency


def test_a_healthy_job_raises_no_alert(tmp_path):
    job = launch("healthy", tmp_path)
    try:
        wait_for_files(tmp_path, job)
        command = [
            sys.executable,
            "-m",
            "otel_titan.cli",
            "watch",
            str(tmp_path),
            "--json",
            "--interval",
            "1",
        ]
        watcher = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        time.sleep(20)
        processes.kill_tree(watcher)
        lines = [
            json.loads(line) for line in watcher.stdout.read().decode().splitlines() if line.strip()
        ]
        watcher.stdout.close()
        watcher.stderr.close()
    finally:
        processes.kill_tree(job)
    frames = [line for line in lines if line["type"] == "frame"]
    assert len(frames) >= 10
    assert [line for line in lines if line["type"] == "alert"] == []
    assert frames[-1]["states"] == {"running": 3}, frames[-1]


def test_a_rank_that_slows_down_is_named_with_its_phase_and_cost_and_nobody_else(tmp_path):
    fault_step = 25
    job = launch("slow", tmp_path, WATCH_FAULT_STEP=str(fault_step), WATCH_SLOW_FACTOR="1.3")
    try:
        wait_for_files(tmp_path, job)
        command = [
            sys.executable,
            "-m",
            "otel_titan.cli",
            "watch",
            str(tmp_path),
            "--json",
            "--interval",
            "1",
        ]
        watcher = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            text=True,
        )
        alerts: list[dict] = []
        try:
            deadline = time.monotonic() + 90
            for line in watcher.stdout:
                event = json.loads(line)
                if event["type"] == "alert":
                    alerts.append(event)
                    if event["kind"] == "slow":
                        break
                if time.monotonic() > deadline:
                    break
        finally:
            processes.kill_tree(watcher)
            watcher.stdout.close()
        onset = None
        path = glob.glob(str(tmp_path / "structured_logs" / f"training.global_rank_{BAD}.*.jsonl"))[
            0
        ]
        for raw in open(path, "rb"):
            record = json.loads(raw)
            if record["log_type_name"] == "data_fetch_start" and record.get("step") == fault_step:
                onset = record["time_us"] / 1e6
                break
    finally:
        processes.kill_tree(job)
    assert [(a["kind"], a["ranks"], a["phase"]) for a in alerts] == [
        ("slow", [BAD], "data_fetch")
    ], alerts
    slow = alerts[0]
    step_s = STEP_S * 1.3  # the job runs at the slow rank's pace
    latency = parse_utc(slow["detected_utc"]) - onset
    print(f"slow named {latency:.1f} s after its onset: {slow['message']}")
    assert 0 < latency <= max(60.0, 30 * step_s), latency
    assert 40 <= slow["cost"]["ms_per_step"] <= 80 and slow["cost"]["pct_of_step"] > 10, slow[
        "cost"
    ]
