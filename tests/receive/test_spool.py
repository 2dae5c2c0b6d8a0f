"""The spool writes each process's records in seq_id order, once each, inside its own folder."""

from __future__ import annotations

import json
import os

from otel_titan.receive.decode import ReceivedRecord
from otel_titan.receive.spool import MAX_HELD, Spool, safe_file_name

NAME = "training.global_rank_0.20260101-000000-abcdef.jsonl"


def rec(seq: int, name: str = NAME) -> ReceivedRecord:
    return ReceivedRecord(name, seq, json.dumps({"seq_id": seq, "log_type_name": "x", "log_type": "instant", "time_us": 1_000_000 + seq}).encode())


def seqs(spool: Spool, name: str = NAME) -> list[int]:
    path = os.path.join(spool.log_dir, safe_file_name(name))
    if not os.path.exists(path):
        return []
    return [json.loads(line)["seq_id"] for line in open(path, "rb")]


def test_batches_out_of_order_are_written_in_order(tmp_path):
    spool = Spool(str(tmp_path))
    spool.add([rec(4), rec(5)], now=0.0)
    spool.add([rec(1), rec(2)], now=0.1)
    assert seqs(spool) == [1, 2]  # 4 and 5 wait for 3
    spool.add([rec(3)], now=0.2)
    assert seqs(spool) == [1, 2, 3, 4, 5]
    assert (spool.written, spool.lost, spool.duplicates) == (5, 0, 0)


def test_a_retried_batch_is_written_once(tmp_path):
    spool = Spool(str(tmp_path))
    spool.add([rec(1), rec(2), rec(3)], now=0.0)
    spool.add([rec(2), rec(3), rec(4)], now=0.1)
    spool.add([rec(6), rec(6)], now=0.2)
    assert seqs(spool) == [1, 2, 3, 4]
    assert spool.duplicates == 3


def test_a_gap_that_stays_is_skipped_after_the_hold_and_counted_lost(tmp_path):
    spool = Spool(str(tmp_path), hold_s=1.0)
    spool.add([rec(1), rec(4), rec(5)], now=10.0)
    spool.tick(10.9)
    assert seqs(spool) == [1]
    spool.tick(11.0)
    assert seqs(spool) == [1, 4, 5]
    assert spool.lost == 2
    spool.add([rec(3)], now=11.5)  # arrives after its gap was given up: too late, never out of order
    assert seqs(spool) == [1, 4, 5] and spool.duplicates == 1


def test_a_watch_started_late_takes_the_stream_from_where_it_finds_it(tmp_path):
    spool = Spool(str(tmp_path), hold_s=1.0)
    spool.add([rec(5000), rec(5001)], now=0.0)
    spool.tick(1.0)
    assert seqs(spool) == [5000, 5001] and spool.lost == 4999


def test_held_records_are_bounded(tmp_path):
    spool = Spool(str(tmp_path), hold_s=1e9)
    spool.add([rec(n) for n in range(2, MAX_HELD + 3)], now=0.0)
    assert len(seqs(spool)) == MAX_HELD + 1 and spool.lost == 1


def test_records_without_a_number_are_written_as_they_come_and_processes_are_apart(tmp_path):
    spool = Spool(str(tmp_path))
    other = "training.global_rank_1.20260101-000000-zzzzzz.jsonl"
    spool.add([ReceivedRecord(NAME, 0, b'{"a": 1}'), rec(1, other), ReceivedRecord(NAME, 0, b'{"a": 2}')], now=0.0)
    assert open(os.path.join(spool.log_dir, NAME), "rb").read() == b'{"a": 1}\n{"a": 2}\n'
    assert seqs(spool, other) == [1] and spool.processes == 2


def test_a_line_that_is_not_one_json_object_on_one_line_is_dropped(tmp_path):
    spool = Spool(str(tmp_path))
    spool.add([ReceivedRecord(NAME, 0, b'{"a": 1}\n{"b": 2}'), ReceivedRecord(NAME, 0, b"plain text"), ReceivedRecord(NAME, 0, b'{"ok": 1}')], now=0.0)
    assert open(os.path.join(spool.log_dir, NAME), "rb").read() == b'{"ok": 1}\n'
    assert spool.malformed == 2


def test_a_name_from_the_network_never_writes_outside_the_spool(tmp_path):
    spool = Spool(str(tmp_path / "spool"))
    for name in ("../../escape.jsonl", "/etc/passwd", "..", "a/../../b.jsonl", "x\x00y.jsonl", ".hidden.jsonl", "é" * 300):
        spool.add([ReceivedRecord(name, 1, b'{"a": 1}')], now=0.0)
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and spool.log_dir not in str(p)]
    assert outside == []
    names = os.listdir(spool.log_dir)
    assert len(names) == 7 and all(n.endswith(".jsonl") and not n.startswith(".") and "/" not in n and len(n) <= 206 for n in names), names


def test_a_failed_write_is_counted_and_said_and_writing_resumes(tmp_path):
    spool = Spool(str(tmp_path))
    os.rmdir(spool.log_dir)
    open(spool.log_dir, "w").close()  # the folder replaced by a file: every open fails (ENOTDIR), root or not
    spool.add([rec(1)], now=0.0)
    assert spool.failed == 1 and spool.written == 0 and "cannot write" in (spool.write_error or "")
    os.unlink(spool.log_dir)
    os.mkdir(spool.log_dir)
    spool.add([rec(2)], now=0.1)
    assert seqs(spool) == [2] and spool.write_error is None


def test_a_process_file_rotates_as_the_writer_s_and_the_follower_reads_through_it(tmp_path):
    from otel_titan.analysis.read.follow import RunFollower

    spool = Spool(str(tmp_path), max_bytes=2_000, backup_count=2)
    follower = RunFollower(str(tmp_path))
    seen = []
    for seq in range(1, 301):
        spool.add([rec(seq)], now=float(seq))
        if seq % 7 == 0:
            seen.extend(r["seq_id"] for _, records in follower.poll(now=float(seq)).records for r in records)
    seen.extend(r["seq_id"] for _, records in follower.poll(now=1e4).records for r in records)
    assert spool.rotations >= 10
    assert sorted(os.listdir(spool.log_dir)) == [NAME, NAME + ".1", NAME + ".2"]  # the oldest beyond backup_count deleted
    assert all(os.path.getsize(os.path.join(spool.log_dir, n)) <= 2_000 for n in os.listdir(spool.log_dir))
    assert seen == list(range(1, 301))  # followed across every rotation, nothing lost, nothing twice


def test_a_restarted_watch_appends_to_its_spool_and_rotates_by_the_size_there(tmp_path):
    line = b'{"pad": "' + b"x" * 988 + b'"}'  # 1,000 bytes and a newline
    Spool(str(tmp_path), max_bytes=2_500).add([ReceivedRecord(NAME, 0, line), ReceivedRecord(NAME, 0, line)], now=0.0)
    again = Spool(str(tmp_path), max_bytes=2_500)  # a new watch on the same spool: 2,000 bytes already there
    again.add([ReceivedRecord(NAME, 0, b'{"new": 1}')], now=0.0)
    assert again.rotations == 0 and os.path.getsize(os.path.join(again.log_dir, NAME)) == 2_011
    again.add([ReceivedRecord(NAME, 0, line)], now=0.0)
    assert again.rotations == 1
    assert open(os.path.join(again.log_dir, NAME), "rb").read() == line + b"\n"
    assert os.path.getsize(os.path.join(again.log_dir, NAME + ".1")) == 2_011
