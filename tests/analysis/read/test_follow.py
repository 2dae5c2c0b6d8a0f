"""The incremental follower on real files, written the ways a running job writes them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import orjson

from otel_titan.analysis.read.follow import NUL_RETRIES, RunFollower

NAME = "training.global_rank_{rank}.20260101-000000-abcdef.jsonl"


def line(name: str, t: int, **extra) -> bytes:
    return (
        orjson.dumps({"log_type_name": name, "log_type": "event", "time_us": t, "rank": 0, **extra})
        + b"\n"
    )


def names(batch) -> list[str]:
    return [r["log_type_name"] for _, records in batch.records for r in records]


def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "structured_logs").mkdir()
    return tmp_path / "structured_logs"


def test_each_poll_reads_only_the_bytes_appended_since_the_last(tmp_path):
    logs = run_dir(tmp_path)
    path = logs / NAME.format(rank=0)
    path.write_bytes(line("a_start", 1) + line("a_end", 2))
    follower = RunFollower(tmp_path)
    first = follower.poll(1.0)
    assert names(first) == ["a_start", "a_end"] and first.bytes_read == path.stat().st_size
    assert follower.poll(2.0).bytes_read == 0
    extra = line("b_start", 3)
    with open(path, "ab") as handle:
        handle.write(extra)
    batch = follower.poll(3.0)
    assert names(batch) == ["b_start"] and batch.bytes_read == len(extra)


def test_a_torn_last_line_is_read_once_its_newline_arrives_and_a_lasting_one_is_dated(tmp_path):
    logs = run_dir(tmp_path)
    path = logs / NAME.format(rank=0)
    whole = line("a_start", 1)
    path.write_bytes(whole[:10])
    follower = RunFollower(tmp_path)
    assert names(follower.poll(1.0)) == []
    cursor = next(iter(follower.cursors.values()))
    assert cursor.torn_since == 1.0
    follower.poll(5.0)
    assert cursor.torn_since == 1.0, "an unchanged partial line keeps the time it was first seen"
    with open(path, "ab") as handle:
        handle.write(whole[10:])
    assert names(follower.poll(6.0)) == ["a_start"] and cursor.torn_since is None
    assert follower.skipped.count == 0


def test_a_nul_tail_is_not_written_yet_and_a_hole_that_stays_is_skipped_not_blocking(tmp_path):
    logs = run_dir(tmp_path)
    path = logs / NAME.format(rank=0)
    good = line("a_start", 1)
    path.write_bytes(good + b"\0" * 64)
    follower = RunFollower(tmp_path)
    assert names(follower.poll(1.0)) == ["a_start"]
    # The NUL bytes get filled in (NFS showed the size before the bytes): read as the record they
    # become.
    filled = line("a_end", 2)
    with open(path, "r+b") as handle:
        handle.seek(len(good))
        handle.write(filled)
    assert names(follower.poll(2.0)) == ["a_end"]
    # A hole that is never filled, with records after it: skipped after NUL_RETRIES polls, the
    # records after it read.
    with open(path, "ab") as handle:
        handle.write(b"\0" * 20 + b"\n" + line("b_start", 3))
    seen = []
    for poll in range(NUL_RETRIES + 1):
        seen += names(follower.poll(3.0 + poll))
    assert seen == ["b_start"] and follower.skipped.count == 1


def test_rotation_reads_the_old_segment_to_its_end_then_the_new_file(tmp_path):
    logs = run_dir(tmp_path)
    path = logs / NAME.format(rank=0)
    path.write_bytes(line("a_start", 1))
    follower = RunFollower(tmp_path)
    assert names(follower.poll(1.0)) == ["a_start"]
    with open(path, "ab") as handle:
        handle.write(line("a_end", 2))  # written just before the rotation, not read yet
    os.replace(path, str(path) + ".1")
    path.write_bytes(line("b_start", 3))
    assert names(follower.poll(2.0)) == ["a_end", "b_start"]
    assert next(iter(follower.cursors.values())).rotations == 1


def test_rotation_with_no_backups_counts_what_was_lost(tmp_path):
    logs = run_dir(tmp_path)
    path = logs / NAME.format(rank=0)
    path.write_bytes(line("a_start", 1))
    follower = RunFollower(tmp_path)
    follower.poll(1.0)
    lost = line("a_end", 2)
    with open(path, "ab") as handle:
        handle.write(lost)
    follower.poll(1.5)  # sees the new size, reads it
    with open(path, "ab") as handle:
        handle.write(lost)
    os.stat(path)
    # the refresh saw the size but not the bytes
    follower.cursors[str(path)].size = path.stat().st_size
    os.unlink(path)  # backup_count=0: the writer deletes the full file
    path.write_bytes(line("b_start", 3))
    assert names(follower.poll(2.0)) == ["b_start"]
    assert follower.cursors[str(path)].lost_bytes == len(lost)


def test_new_files_are_found_and_vanished_ones_marked_gone_and_kept(tmp_path):
    logs = run_dir(tmp_path)
    (logs / NAME.format(rank=0)).write_bytes(line("a_start", 1))
    follower = RunFollower(tmp_path)
    assert len(follower.poll(1.0).new) == 1
    (logs / NAME.format(rank=1)).write_bytes(line("a_start", 1))
    batch = follower.poll(2.0)
    assert [c.process.rank for c in batch.new] == [1] and names(batch) == ["a_start"]
    os.unlink(logs / NAME.format(rank=0))
    batch = follower.poll(3.0)
    assert [c.process.rank for c in batch.gone] == [0]
    assert len(follower.cursors) == 2 and follower.cursors[str(logs / NAME.format(rank=0))].gone


def test_a_file_rewritten_smaller_is_read_again_from_its_start(tmp_path):
    logs = run_dir(tmp_path)
    path = logs / NAME.format(rank=0)
    path.write_bytes(line("a_start", 1) + line("a_end", 2))
    follower = RunFollower(tmp_path)
    follower.poll(1.0)
    with open(path, "r+b") as handle:  # same inode, new contents
        handle.truncate(0)
        handle.write(line("z_start", 9))
    assert names(follower.poll(2.0)) == ["z_start"]
    assert follower.cursors[str(path)].restarts == 1


def test_a_big_file_first_seen_is_read_from_its_last_bytes_at_a_line_start(tmp_path):
    logs = run_dir(tmp_path)
    path = logs / NAME.format(rank=0)
    opened = (
        orjson.dumps(
            {
                "log_type_name": "structured_logger_opened",
                "log_type": "instant",
                "time_us": 0,
                "rank": 0,
                "world_size": 4,
                "run_id": "r",
            }
        )
        + b"\n"
    )
    body = b"".join(line("a_start", i) for i in range(1, 2000))
    path.write_bytes(opened + body)
    follower = RunFollower(tmp_path, first_read_bytes=4096)
    batch = follower.poll(1.0)
    cursor = follower.cursors[str(path)]
    assert batch.bytes_read <= 4096 + len(line("a_start", 1999)) and cursor.skipped_head > 0
    # started at a line start, no torn first line
    assert follower.skipped.count == 0, follower.skipped.examples
    assert cursor.process.world_size == 4, "the identity still comes from the file's first record"
    assert [r["time_us"] for _, rs in batch.records for r in rs][-1] == 1999


def test_invalid_utf8_and_garbage_lines_are_skipped_with_the_rest_read(tmp_path):
    logs = run_dir(tmp_path)
    path = logs / NAME.format(rank=0)
    path.write_bytes(
        line("a_start", 1)
        + b"\xff\xfe garbage\n"
        + json.dumps({"log_type_name": "fwd\udc80_start", "time_us": 2}).encode()
        + b"\n"
    )
    follower = RunFollower(tmp_path)
    got = names(follower.poll(1.0))
    assert got[0] == "a_start" and len(got) == 2 and got[1].isprintable()
    assert follower.skipped.count == 1


def test_the_real_writer_rotating_under_a_follower_loses_and_repeats_nothing(tmp_path):
    """The library itself writes and rotates (10 kB segments) while the follower polls between
    bursts: every seq_id once."""
    from otel_titan import structured_logger as sl

    sl.init_structured_logger(
        "training", str(tmp_path), rank=0, world_size=1, max_file_size_mb=0.01, backup_count=1000
    )
    follower = RunFollower(tmp_path)
    seen: list[int] = []
    try:
        for burst in range(30):
            for i in range(20):
                sl.set_step(burst * 20 + i + 1)
                with sl.log_trace_span("fwd"):
                    pass
            sl.flush_structured_logger()
            seen += [r["seq_id"] for _, rs in follower.poll(float(burst)).records for r in rs]
    finally:
        sl.shutdown_structured_logger()
    seen += [r["seq_id"] for _, rs in follower.poll(99.0).records for r in rs]
    cursor = next(iter(follower.cursors.values()))
    assert cursor.rotations >= 10, cursor.rotations
    assert seen == list(range(1, len(seen) + 1)) and len(seen) >= 1200, (len(seen), seen[:5])
    assert cursor.lost_bytes == 0 and follower.skipped.count == 0


def test_a_line_longer_than_readers_take_is_skipped_and_the_follow_goes_on(tmp_path):
    """A 40 MB line (more than a refresh reads of one file): skipped to its newline as the reader
    skips it, not re-read at every refresh and not taken for a torn line (before: the cursor never
    moved, and after 5 s the healthy rank was `crashed`)."""
    logs = run_dir(tmp_path)
    path = logs / NAME.format(rank=0)
    path.write_bytes(line("a_start", 1))
    follower = RunFollower(tmp_path)
    assert names(follower.poll(1.0)) == ["a_start"]
    with open(path, "ab") as handle:
        handle.write(
            b'{"log_type_name": "huge", "pad": "' + b"x" * (40 << 20) + b'"}\n' + line("a_end", 2)
        )
    seen = []
    for refresh in range(2, 6):
        seen += names(follower.poll(float(refresh)))
    cursor = next(iter(follower.cursors.values()))
    assert seen == ["a_end"] and cursor.offset == path.stat().st_size and cursor.torn_since is None
    assert follower.skipped.count == 1 and follower.bytes_read < path.stat().st_size + (1 << 20)
    with open(path, "ab") as handle:
        handle.write(line("b_start", 3))
    assert names(follower.poll(7.0)) == ["b_start"] and follower.skipped.count == 1


def test_a_folder_that_cannot_be_listed_makes_no_process_gone(tmp_path):
    """No file descriptor left (EMFILE) at a refresh: before, every process was marked gone (the
    listing came back empty). In a process of its own, which runs out of descriptors on purpose."""
    import subprocess
    import sys

    from tests.conftest import REPO

    logs = run_dir(tmp_path)
    (logs / NAME.format(rank=0)).write_bytes(line("a_start", 1))
    code = f"""
import os, sys
sys.path.insert(0, {str(REPO)!r})
from otel_titan.analysis.read.follow import RunFollower
follower = RunFollower({str(tmp_path)!r})
follower.poll(1.0)
hog = []
try:
    while True:
        hog.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
batch = follower.poll(2.0)
for fd in hog:
    os.close(fd)
print(len(batch.gone), sum(c.gone for c in follower.cursors.values()), follower.skipped.count)
with open({str(logs / NAME.format(rank=0))!r}, "ab") as handle:
    handle.write(b'{{"log_type_name": "a_end", "log_type": "event", "time_us": 2, "rank": 0}}\\n')
print([r["log_type_name"] for _, rs in follower.poll(3.0).records for r in rs])
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    gone, still_gone, skipped, *_ = done.stdout.split()
    assert (gone, still_gone) == ("0", "0") and int(skipped) >= 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[1] == "['a_end']", done.stdout + done.stderr
