"""The spool writes each process's records in seq_id order, once each, inside its own folder."""

from __future__ import annotations

import json
import os

import pytest

from otel_titan.receive.decode import ReceivedRecord
from otel_titan.receive.spool import MAX_HELD, Spool, SpoolWriteError, safe_file_name

NAME = "training.global_rank_0.20260101-000000-abcdef.jsonl"


def rec(seq: int, name: str = NAME) -> ReceivedRecord:
    return ReceivedRecord(
        name,
        seq,
        json.dumps(
            {"seq_id": seq, "log_type_name": "x", "log_type": "instant", "time_us": 1_000_000 + seq}
        ).encode(),
    )


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
    # arrives after its gap was given up: too late, never out of order
    spool.add([rec(3)], now=11.5)
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
    spool.add(
        [ReceivedRecord(NAME, 0, b'{"a": 1}'), rec(1, other), ReceivedRecord(NAME, 0, b'{"a": 2}')],
        now=0.0,
    )
    assert open(os.path.join(spool.log_dir, NAME), "rb").read() == b'{"a": 1}\n{"a": 2}\n'
    assert seqs(spool, other) == [1] and spool.processes == 2


def test_a_line_that_is_not_one_json_object_on_one_line_is_dropped(tmp_path):
    spool = Spool(str(tmp_path))
    spool.add(
        [
            ReceivedRecord(NAME, 0, b'{"a": 1}\n{"b": 2}'),
            ReceivedRecord(NAME, 0, b"plain text"),
            ReceivedRecord(NAME, 0, b'{"ok": 1}'),
        ],
        now=0.0,
    )
    assert open(os.path.join(spool.log_dir, NAME), "rb").read() == b'{"ok": 1}\n'
    assert spool.malformed == 2


def test_a_name_from_the_network_never_writes_outside_the_spool(tmp_path):
    spool = Spool(str(tmp_path / "spool"))
    for name in (
        "../../escape.jsonl",
        "/etc/passwd",
        "..",
        "a/../../b.jsonl",
        "x\x00y.jsonl",
        ".hidden.jsonl",
        "é" * 300,
    ):
        spool.add([ReceivedRecord(name, 1, b'{"a": 1}')], now=0.0)
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and spool.log_dir not in str(p)]
    assert outside == []
    names = os.listdir(spool.log_dir)
    assert len(names) == 7 and all(
        n.endswith(".jsonl") and not n.startswith(".") and "/" not in n and len(n) <= 206
        for n in names
    ), names


def test_a_failed_write_is_raised_and_the_retry_is_written_not_dropped_as_a_duplicate(tmp_path):
    spool = Spool(str(tmp_path))
    os.rmdir(spool.log_dir)
    # the folder replaced by a file: every open fails (ENOTDIR), root or not
    open(spool.log_dir, "w").close()
    with pytest.raises(SpoolWriteError, match="cannot write .*Not a directory"):
        spool.add([rec(1), rec(2)], now=0.0)
    assert spool.failed == 2 and spool.written == 0 and "cannot write" in (spool.write_error or "")
    os.unlink(spool.log_dir)
    os.mkdir(spool.log_dir)
    spool.add([rec(1), rec(2)], now=0.1)  # the sender's retry of the same request (it got 503)
    spool.add([rec(3)], now=0.2)
    assert seqs(spool) == [1, 2, 3] and spool.write_error is None and spool.duplicates == 0


def test_a_gap_skip_that_cannot_be_written_is_done_again_later(tmp_path):
    spool = Spool(str(tmp_path), hold_s=1.0)
    spool.add([rec(1), rec(3)], now=0.0)
    os.rename(spool.log_dir, spool.log_dir + ".away")
    spool.tick(1.0)  # the skip to 3 cannot be written
    os.rename(spool.log_dir + ".away", spool.log_dir)
    spool.tick(1.1)
    assert seqs(spool) == [1, 3] and spool.lost == 1


def test_a_process_file_rotates_as_the_writer_s_and_the_follower_reads_through_it(tmp_path):
    from otel_titan.analysis.read.follow import RunFollower

    spool = Spool(str(tmp_path), max_bytes=2_000, backup_count=2)
    follower = RunFollower(str(tmp_path))
    seen = []
    for seq in range(1, 301):
        spool.add([rec(seq)], now=float(seq))
        if seq % 7 == 0:
            seen.extend(
                r["seq_id"] for _, records in follower.poll(now=float(seq)).records for r in records
            )
    seen.extend(r["seq_id"] for _, records in follower.poll(now=1e4).records for r in records)
    assert spool.rotations >= 10
    # the oldest beyond backup_count deleted
    assert sorted(os.listdir(spool.log_dir)) == [
        NAME,
        NAME + ".1",
        NAME + ".2",
    ]
    assert all(
        os.path.getsize(os.path.join(spool.log_dir, n)) <= 2_000 for n in os.listdir(spool.log_dir)
    )
    # followed across every rotation, nothing lost, nothing twice
    assert seen == list(range(1, 301))


def test_a_restarted_watch_appends_to_its_spool_and_rotates_by_the_size_there(tmp_path):
    line = b'{"pad": "' + b"x" * 988 + b'"}'  # 1,000 bytes and a newline
    Spool(str(tmp_path), max_bytes=2_500).add(
        [ReceivedRecord(NAME, 0, line), ReceivedRecord(NAME, 0, line)], now=0.0
    )
    # a new watch on the same spool: 2,000 bytes already there
    again = Spool(str(tmp_path), max_bytes=2_500)
    again.add([ReceivedRecord(NAME, 0, b'{"new": 1}')], now=0.0)
    assert again.rotations == 0 and os.path.getsize(os.path.join(again.log_dir, NAME)) == 2_011
    again.add([ReceivedRecord(NAME, 0, line)], now=0.0)
    assert again.rotations == 1
    assert open(os.path.join(again.log_dir, NAME), "rb").read() == line + b"\n"
    assert os.path.getsize(os.path.join(again.log_dir, NAME + ".1")) == 2_011


def line(seq: int, text: str = "x") -> ReceivedRecord:
    return ReceivedRecord(
        NAME,
        seq,
        json.dumps(
            {
                "seq_id": seq,
                "log_type_name": text,
                "log_type": "instant",
                "time_us": 1_000_000 + seq,
            }
        ).encode(),
    )


def test_a_forged_far_number_while_the_stream_arrives_in_order_swallows_nothing(tmp_path):
    spool = Spool(str(tmp_path), hold_s=1.0)
    spool.add([rec(n) for n in range(1, 101)], now=0.0)
    spool.add([rec(10**15)], now=0.1)  # forged (or a collector's corrupted number)
    for step in range(1, 30):  # the rank goes on sending, in order, past the hold
        spool.add([rec(100 + step)], now=0.1 * step)
        spool.tick(0.1 * step)
    assert (
        seqs(spool) == list(range(1, 130))
        and spool.duplicates == 0
        and spool.lost == 0
        and spool.out_of_sequence == 1
    )


def test_a_forged_far_number_while_the_rank_is_quiet_is_undone_when_the_rank_speaks_again(tmp_path):
    spool = Spool(str(tmp_path), hold_s=1.0)
    spool.add([rec(n) for n in range(1, 101)], now=0.0)
    spool.add([rec(10**15)], now=0.1)
    # the rank is in a long step: the hold expires and the gap is skipped to the forged number
    spool.tick(5.0)
    assert spool.lost == 10**15 - 101
    spool.add([rec(101), rec(102)], now=6.0)  # the rank's own next records: not duplicates
    spool.add([rec(103)], now=6.1)
    assert seqs(spool) == [*range(1, 101), 10**15, 101, 102, 103]
    assert spool.duplicates == 0 and spool.lost == 0 and spool.out_of_sequence == 1


def test_a_real_lost_batch_is_still_skipped_and_its_late_copy_dropped(tmp_path):
    """The defence against a wrong number keeps the rule for a real loss: the stream moved past the
    gap, a late copy is not rewritten."""
    spool = Spool(str(tmp_path), hold_s=1.0)
    spool.add([rec(1), *(rec(n) for n in range(10, 20))], now=0.0)
    spool.tick(1.0)
    spool.add([rec(20)], now=1.1)
    spool.add([rec(n) for n in range(2, 10)], now=1.2)  # the lost batch, late
    assert seqs(spool) == [1, *range(10, 21)] and spool.lost == 8 and spool.duplicates == 8


def test_a_new_process_reusing_the_file_name_starts_its_stream_again(tmp_path):
    spool = Spool(str(tmp_path), hold_s=1.0)
    spool.add([line(n, "first") for n in range(1, 50)], now=0.0)
    spool.add([line(1, "first")], now=0.5)  # a retry of the opening record: a duplicate
    # a restarted process, the same name, numbering from 1
    spool.add([line(n, "second") for n in range(1, 4)], now=1.0)
    assert [json.loads(x)["log_type_name"] for x in open(os.path.join(spool.log_dir, NAME), "rb")][
        -3:
    ] == ["second"] * 3
    assert spool.restarts == 1 and spool.duplicates == 1
