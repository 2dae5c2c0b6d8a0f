"""The JSONL handler under the real logger: rotation, failed writes, vanished directories."""

from __future__ import annotations

import glob
import json
import os
import shutil

from otel_titan import structured_logger as sl
from otel_titan.exporters.jsonl import JsonlSpanExporter
from tests.conftest import jsonl_files


def segments_oldest_first(run_dir):
    (active,) = jsonl_files(run_dir)
    older = sorted(glob.glob(active + ".*"), key=lambda p: -int(p.rsplit(".", 1)[1]))
    return older + [active]


def test_rotation_bounds_disk_and_keeps_records_in_order_across_segments(run_dir):
    sl.init_structured_logger(
        "training", run_dir, world_size=1, max_file_size_mb=0.05, backup_count=2, step_rollups=True
    )
    for step in range(1, 1001):
        sl.set_step(step)
        with sl.log_trace_span("fwd_bwd"):
            pass
        if step % 100 == 0:
            sl.flush_structured_logger()
    sl.shutdown_structured_logger()
    paths = segments_oldest_first(run_dir)
    assert len(paths) == 3
    limit = int(0.05 * 1024 * 1024)
    assert all(os.path.getsize(p) <= limit for p in paths)
    records = [json.loads(line) for p in paths for line in open(p)]
    seq = [r["seq_id"] for r in records]
    # contiguous: nothing lost between segments
    assert seq == list(range(seq[0], seq[0] + len(seq)))
    assert (
        records[-1]["log_type_name"] == "structured_logger_closed"
        and records[-1]["written_records"] == 2000
    )
    # The last step's rollup sits between its records and the closing line (not complete: no next
    # step ended it).
    assert (
        records[-2]["log_type_name"] == "step_rollup"
        and records[-2]["step"] == 1000
        and records[-2]["complete"] is False
    )
    spans = [r for r in records if r["log_type_name"] != "step_rollup"]
    assert spans[-2]["log_type_name"] == "fwd_bwd_end" and spans[-2]["step"] == 1000
    # One rollup per step in what the segments kept, the earlier ones complete.
    rollups = [r["step"] for r in records if r["log_type_name"] == "step_rollup"]
    assert (
        rollups == list(range(rollups[0], 1001))
        and rollups[0] <= min(r["step"] for r in spans if "step" in r) + 1
    )


def test_failed_writes_are_counted_reported_and_writing_resumes(run_dir, caplog):
    sl.init_structured_logger("training", run_dir, world_size=1)
    (exporter,) = [e for e in sl.get_exporters() if isinstance(e, JsonlSpanExporter)]
    sl.log_trace_instant("before")
    sl.flush_structured_logger()
    full = os.open("/dev/full", os.O_WRONLY)  # the disk is full: a real ENOSPC from the kernel
    os.dup2(full, exporter._file._fd)
    os.close(full)
    sl.log_trace_instant("lost")
    sl.log_trace_instant("lost_too")
    sl.flush_structured_logger()
    sl.log_trace_instant("after")  # the next write reopens the file at its path
    sl.shutdown_structured_logger()
    records = [json.loads(line) for line in open(jsonl_files(run_dir)[0])]
    names = [r["log_type_name"] for r in records]
    assert names == [
        "structured_logger_opened",
        "before",
        "records_dropped",
        "after",
        "structured_logger_closed",
    ]
    assert records[2]["failed_records"] == 2 and records[2]["value"] == 2
    assert records[-1]["failed_records"] == 2 and records[-1]["written_records"] == 2
    assert caplog.text.count("cannot write") == 1 and "ENOSPC" in caplog.text
    assert "again after" in caplog.text


def test_directory_removed_mid_run_is_recreated(run_dir):
    sl.init_structured_logger("training", run_dir, world_size=1)
    sl.log_trace_instant("before")
    sl.flush_structured_logger()
    shutil.rmtree(run_dir)
    sl.log_trace_instant("after")
    sl.shutdown_structured_logger()
    (path,) = jsonl_files(run_dir)
    names = [json.loads(line)["log_type_name"] for line in open(path)]
    assert names == ["after", "structured_logger_closed"]


def test_records_carry_the_threading_name_of_their_thread(run_dir):
    import threading

    sl.init_structured_logger("training", run_dir, world_size=1)

    def load():
        with sl.log_trace_span("data_fetch"):
            pass
        sl.log_trace_instant("loaded")

    worker = threading.Thread(target=load, name="loader-0")
    worker.start()
    worker.join()
    with sl.log_trace_span("fwd_bwd"):
        pass
    sl.shutdown_structured_logger()
    (path,) = jsonl_files(run_dir)
    names = {r["log_type_name"]: r.get("thread_name") for r in map(json.loads, open(path))}
    assert names["data_fetch_start"] == names["data_fetch_end"] == names["loaded"] == "loader-0"
    assert names["fwd_bwd_start"] == "MainThread"
    assert names["structured_logger_opened"] is None  # the logger's own records name no thread
