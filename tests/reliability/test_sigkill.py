"""SIGKILL in the middle of a span: what was emitted before is on disk, and the summary shows the
open span.

Injected: a real process emitting steps (each with a timestamped instant) and
then sitting inside a `data_fetch` span is killed with SIGKILL; in a second
variant the kill lands while records are being written, and half a line is
appended to the file to stand for a write cut short by the kill.
Checked: every record emitted more than 200 ms before the kill is in the file,
the file reads back (the partial last line skipped with a warning naming file
and line), and the summary reports the process as not closed cleanly with
`data_fetch` open.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from otel_titan.analysis import read_run, summarize_run
from tests.conftest import REPO, jsonl_files

pytestmark = pytest.mark.slow

_WORKLOAD = """
import sys, time
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], world_size=1)
step = 0
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    step += 1
    sl.set_step(step)
    with sl.log_trace_span("fwd_bwd"):
        sl.log_trace_instant(f"emitted_at_{time.time_ns()}")
    time.sleep(0.001)
with sl.log_trace_span("data_fetch"):
    print("in_data_fetch", flush=True)
    time.sleep(600)
"""


def start(run_dir, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _WORKLOAD, str(run_dir), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def emitted_before(run_dir) -> list[int]:
    with open(jsonl_files(run_dir)[0], "rb") as handle:
        lines = handle.read().split(b"\n")
    times = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record["log_type_name"].startswith("emitted_at_"):
            times.append(int(record["log_type_name"].rsplit("_", 1)[1]))
    return times


def test_sigkill_inside_a_span(run_dir):
    process = start(run_dir, 1.5)
    assert process.stdout.readline().strip() == "in_data_fetch"
    time.sleep(0.3)  # well past the writer's 50 ms tick
    process.send_signal(signal.SIGKILL)
    assert process.wait(10) == -signal.SIGKILL

    written = emitted_before(run_dir)
    assert len(written) > 100
    summary = summarize_run(str(run_dir))
    (proc,) = summary.processes
    assert proc.closed_cleanly is False
    assert [span.name for span in proc.open_spans] == ["data_fetch"]
    assert proc.last_step == len(written)  # one instant per step: the last step is on disk


def test_sigkill_while_writing_loses_only_the_last_200_ms(run_dir, caplog):
    process = start(run_dir, 30.0)
    time.sleep(2.0)
    killed_at = time.time_ns()
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    # Stand-in for a write cut short by the kill: half a record at the end of the file.
    (path,) = jsonl_files(run_dir)
    with open(path, "ab") as handle:
        handle.write(b'{"log_type":"event","log_type_name":"fwd_bw')

    on_disk = set(emitted_before(run_dir))
    assert on_disk
    # Every instant emitted up to 200 ms before the kill is there: they are consecutive,
    # so nothing older than the newest record on disk minus the tail may be missing.
    newest = max(on_disk)
    assert killed_at - newest < 200_000_000, (
        f"the last record on disk is {(killed_at - newest) / 1e6:.0f} ms older than the kill"
    )

    with caplog.at_level(logging.WARNING):
        run = read_run(str(run_dir))
        records = [r for process_log in run.processes for r in process_log.records(run.skipped)]
    assert records and records[-1]["log_type_name"] != "fwd_bw"
    assert run.skipped.count == 1
    assert any(
        os.path.basename(path) in message and "line" in message for message in caplog.messages
    )


def test_a_hung_phase_keeps_its_length_after_sigkill_thanks_to_heartbeats(run_dir, tmp_path):
    # Injected: a process hangs inside data_fetch for ~2 s (heartbeat every 0.3 s), then SIGKILL.
    code = """
import sys, time
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], world_size=1, heartbeat_interval_s=0.3)
sl.set_step(3)
with sl.log_trace_span("optimizer"):
    pass
time.sleep(1.0)  # quiet with nothing open: no heartbeat
with sl.log_trace_span("data_fetch"):
    print("hung", flush=True)
    time.sleep(600)
"""
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.stdout.readline().strip() == "hung"
    time.sleep(2.0)
    process.send_signal(signal.SIGKILL)
    process.wait(10)

    (path,) = jsonl_files(run_dir)
    records = [json.loads(line) for line in open(path)]
    beats = [r for r in records if r["log_type_name"] == "heartbeat"]
    fetch = [r for r in records if r["log_type_name"] == "data_fetch_start"][0]
    # none before the span opened
    assert len(beats) >= 3 and all(b["time_us"] > fetch["time_us"] for b in beats)
    assert beats[-1]["open_span_names"] == ["data_fetch"] and beats[-1]["open_spans"] == 1

    (proc,) = summarize_run(str(run_dir)).processes
    (open_span,) = proc.open_spans
    assert open_span.name == "data_fetch" and open_span.open_s >= 1.0
    assert proc.last_event == "data_fetch_start"  # heartbeats are not events of the program

    from otel_titan.analysis import generate_gantt_trace

    out = tmp_path / "trace.json"
    generate_gantt_trace(str(run_dir), str(out))
    bars = [
        e
        for e in json.load(open(out))["traceEvents"]
        if e.get("ph") == "X" and e["name"] == "data_fetch"
    ]
    assert len(bars) == 1 and bars[0]["args"]["incomplete"] is True and bars[0]["dur"] >= 1_000_000
    assert not [e for e in json.load(open(out))["traceEvents"] if e.get("name") == "heartbeat"]


def test_a_rank_killed_before_its_first_record_leaves_its_opened_record(run_dir):
    # Injected: a process hangs right after init, before recording anything, then SIGKILL.
    # The opening record is written by init itself, so the file says "opened, nothing since",
    # never nothing at all (an empty file looked like a rank that was up to date).
    code = """
import sys, time
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=1, flush_interval_s=10)
print("initialised", flush=True)
time.sleep(600)
"""
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert process.stdout.readline().strip() == "initialised"
        process.send_signal(signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    (path,) = jsonl_files(run_dir)
    records = [json.loads(line) for line in open(path)]
    assert [r["log_type_name"] for r in records] == ["structured_logger_opened"]
    assert records[0]["rank"] == 0 and records[0]["seq_id"] == 1
