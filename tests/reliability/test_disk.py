"""A disk that fills up or turns read-only under a running logger (real tmpfs mounts).

Injected: the run directory is a 1 MiB tmpfs; a filler file takes the rest of
the space (ENOSPC on the next write), or a read-only bind mount covers the
log directory (EROFS for anything created or renamed there). Then the space is
freed / the bind mount removed. (A deleted directory is in
tests/exporters/test_jsonl.py.)
Checked: every sl.* call returned normally, one warning per episode on the
console, the lost records counted, writing resumed, and the loss reported in
the file. These tests need to mount (root with CAP_SYS_ADMIN); elsewhere they
are skipped, and tests/exporters/test_jsonl.py covers ENOSPC with /dev/full.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from otel_titan import structured_logger as sl
from tests.conftest import jsonl_files, read_records


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        sl.shutdown_structured_logger()
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def fill(directory: Path) -> Path:
    """Write a filler file until the filesystem is full."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as error:
        assert error.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def emit(count: int, name: str) -> None:
    for i in range(count):
        sl.set_step(i)
        with sl.log_trace_span(name):
            pass
    sl.flush_structured_logger(timeout=10)


def test_disk_full_then_freed(small_disk, caplog):
    sl.init_structured_logger("training", small_disk / "run", world_size=1)
    emit(10, "before")
    filler = fill(small_disk)
    emit(50, "while_full")  # nothing fits: every write fails with ENOSPC
    emit(50, "while_full")
    filler.unlink()  # space again
    emit(10, "after")
    sl.shutdown_structured_logger()

    records = read_records(jsonl_files(small_disk / "run")[0])
    names = [r["log_type_name"] for r in records]
    assert names.count("before_end") == 10 and names.count("after_end") == 10
    assert names.count("while_full_end") == 0
    closing = records[-1]
    assert closing["log_type_name"] == "structured_logger_closed"
    assert closing["failed_records"] == 200 and closing["written_records"] == 40
    report = [r for r in records if r["log_type_name"] == "records_dropped"]
    assert (
        report
        and report[0]["failed_records"] == 200
        and names.index("records_dropped") < names.index("after_start")
    )
    warnings = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warnings) == 1 and "ENOSPC" in warnings[0].getMessage()
    assert any("again after" in r.getMessage() for r in caplog.records)


def test_directory_turned_read_only_keeps_the_file_growing_and_rotation_resumes(small_disk, caplog):
    # A read-only bind mount over the log directory: the open file keeps taking
    # writes (as it would on a real remount), but nothing can be created or
    # renamed there, so rotation fails with EROFS.
    run = small_disk / "run"
    logs = run / "structured_logs"
    sl.init_structured_logger("training", run, world_size=1, max_file_size_mb=0.01, backup_count=2)
    emit(5, "before")
    subprocess.run(["mount", "--bind", str(logs), str(logs)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(logs), str(logs)], check=True)
        emit(100, "while_read_only")  # ~70 kB through a 10 kB file: rotation is due and fails
        (active,) = jsonl_files(run)
        # grew past the limit instead of losing records
        assert os.path.getsize(active) > 0.01 * 1024 * 1024
    finally:
        subprocess.run(["umount", str(logs)], check=True)
    from otel_titan.exporters.jsonl import JsonlSpanExporter

    (exporter,) = [e for e in sl.get_exporters() if isinstance(e, JsonlSpanExporter)]
    exporter._file._next_rotation_attempt = 0.0  # do not wait the 10 s retry delay in a test
    emit(20, "after")
    sl.shutdown_structured_logger()
    (active,) = jsonl_files(run)
    segments = sorted(logs.glob("*.jsonl.*"))
    assert segments  # rotation worked again
    records = [
        r
        for p in [*sorted(segments, key=lambda p: -int(p.suffix[1:])), active]
        for r in read_records(p)
    ]
    assert records[-1]["log_type_name"] == "structured_logger_closed"
    # nothing lost
    assert records[-1]["failed_records"] == 0 and records[-1]["dropped_records"] == 0
    messages = [r.getMessage() for r in caplog.records if "cannot rotate" in r.getMessage()]
    assert len(messages) == 1 and "EROFS" in messages[0]
