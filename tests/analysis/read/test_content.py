"""Content keys (`read.content`): the written content ends at the last complete line; appends keep
the prefix, rewrites do not."""

from __future__ import annotations

import shutil
from pathlib import Path

from otel_titan.analysis.read.content import BLOCK_BYTES, RangeReader, content_key, is_prefix


def _lines(count: int, start: int = 0) -> bytes:
    return b"".join(
        b'{"log_type_name": "x_start", "time_us": %d, "pad": "%s"}\n' % (i, b"p" * 40)
        for i in range(start, start + count)
    )


def test_the_content_ends_after_the_last_complete_line(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    data = _lines(2000)
    path.write_bytes(data + b'{"log_type_name": "torn')
    key = content_key(str(path))
    assert key is not None and key.length == len(data) and key.size == len(data) + 23 and key.rest
    path.write_bytes(data)
    whole = content_key(str(path))
    assert (
        whole is not None
        and whole.same_content(key)
        and whole.rest == ""
        and whole.size == whole.length
    )


def test_a_copy_has_the_same_key_and_a_rewrite_another(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(_lines(3000))
    copy = tmp_path / "copy" / "a.jsonl"
    copy.parent.mkdir()
    shutil.copy(path, copy)
    assert content_key(str(path)) == content_key(str(copy))  # no inode, device or mtime in it
    data = bytearray(path.read_bytes())
    data[10] = ord("X")  # in the first block
    path.write_bytes(bytes(data))
    assert not content_key(str(path)).same_content(content_key(str(copy)))  # type: ignore[union-attr]
    data = bytearray(copy.read_bytes())
    data[-20] = ord("X")  # in the last block
    path.write_bytes(bytes(data))
    assert not content_key(str(path)).same_content(content_key(str(copy)))  # type: ignore[union-attr]


def test_nuls_at_the_end_or_in_the_last_block_are_not_written_yet(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    data = _lines(100)
    path.write_bytes(data + bytes(5000))
    assert content_key(str(path)).length == len(data)  # type: ignore[union-attr]
    # a hole a client has not seen filled, then lines after it
    path.write_bytes(data + bytes(300) + _lines(3, 100))
    assert content_key(str(path)).length == len(data)  # type: ignore[union-attr]


def test_a_line_longer_than_the_window_is_found_by_looking_further_back(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    head = _lines(10)
    path.write_bytes(
        head
        + b'{"big": "'
        + b"x" * (5 * BLOCK_BYTES)
        + b'"}\n'
        + b'{"partial": "'
        + b"y" * (3 * BLOCK_BYTES)
    )
    assert content_key(str(path)).length == len(head) + 9 + 5 * BLOCK_BYTES + 3  # type: ignore[union-attr]
    path.write_bytes(b"x" * (4 * BLOCK_BYTES))  # no newline at all
    assert content_key(str(path)).length == 0  # type: ignore[union-attr]


def test_an_append_keeps_the_prefix_a_truncation_or_rewrite_does_not(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(_lines(1500))
    key = content_key(str(path))
    assert key is not None
    with open(path, "ab") as handle:
        handle.write(_lines(500, 1500))
    assert is_prefix(str(path), key)
    data = path.read_bytes()
    path.write_bytes(data[: key.length - 10])
    assert not is_prefix(str(path), key)
    path.write_bytes(data[: key.length - 5] + b"XXXX\n" + data[key.length :])
    assert not is_prefix(str(path), key)
    assert not is_prefix(str(tmp_path / "gone.jsonl"), key)
    assert content_key(str(tmp_path / "gone.jsonl")) is None


def test_a_range_reader_stops_at_its_end_and_counts_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"a\nbb\nccc\ndddd\n")
    with RangeReader(open(path, "rb"), 2, 9) as reader:
        assert (
            reader.read(3) + reader.read() == b"bb\nccc\n"
            and reader.read() == b""
            and reader.newlines == 2
        )
    with RangeReader(open(path, "rb"), 9, None) as reader:
        assert reader.read() == b"dddd\n" and reader.newlines == 1
