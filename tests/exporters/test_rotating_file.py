"""RotatingFile: whole lines, bounded segments, recreated when deleted, umask respected."""

from __future__ import annotations

import os

import pytest

from otel_titan.exporters.rotating_file import RotatingFile


def lines(n, size=100):
    return [(f"{i:06d}".ljust(size - 1, "x") + "\n").encode() for i in range(n)]


def read_all(f):
    out = []
    for path in f.segment_paths():
        with open(path, "rb") as handle:
            out.extend(handle.read().splitlines(keepends=True))
    return out


def test_rotation_keeps_backup_count_segments_of_whole_lines(tmp_path):
    f = RotatingFile(str(tmp_path / "x.jsonl"), max_bytes=1000, backup_count=2)
    data = lines(100)  # 10 kB through a 1 kB file
    for i in range(0, 100, 7):
        f.write_lines(data[i : i + 7])
    paths = f.segment_paths()
    assert [os.path.basename(p) for p in paths] == ["x.jsonl.2", "x.jsonl.1", "x.jsonl"]
    assert all(os.path.getsize(p) <= 1000 for p in paths)
    kept = read_all(f)
    assert kept == data[-len(kept) :]  # the newest lines, oldest segment first, in order
    assert len(kept) >= 21  # three segments of (up to) ten lines
    assert f.rotations >= 7


def test_backup_count_zero_still_bounds_the_disk(tmp_path):
    f = RotatingFile(str(tmp_path / "x.jsonl"), max_bytes=500, backup_count=0)
    for _chunk in range(20):
        f.write_lines(lines(3))
    assert f.segment_paths() == [str(tmp_path / "x.jsonl")]
    assert os.path.getsize(tmp_path / "x.jsonl") <= 500


def test_a_line_longer_than_the_limit_is_written_whole(tmp_path):
    f = RotatingFile(str(tmp_path / "x.jsonl"), max_bytes=50, backup_count=1)
    f.write_lines(lines(1, size=200))
    assert read_all(f) == lines(1, size=200)


def test_a_deleted_file_is_recreated_at_its_path(tmp_path):
    f = RotatingFile(str(tmp_path / "logs" / "x.jsonl"), max_bytes=10_000, backup_count=1)
    f.write_lines(lines(2))
    import shutil

    shutil.rmtree(tmp_path / "logs")
    f.write_lines(lines(3))
    assert read_all(f) == lines(3)


def test_files_are_never_world_writable_even_with_umask_zero(tmp_path):
    old = os.umask(0)
    try:
        f = RotatingFile(str(tmp_path / "x.jsonl"), max_bytes=100, backup_count=1)
        f.write_lines(lines(1))
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "x.jsonl").st_mode & 0o777 == 0o664


def test_write_errors_surface_and_writing_resumes(tmp_path):
    f = RotatingFile(str(tmp_path / "x.jsonl"), max_bytes=10_000, backup_count=1)
    full = os.open("/dev/full", os.O_WRONLY)  # a real ENOSPC from the kernel
    os.dup2(full, f._fd)
    os.close(full)
    with pytest.raises(OSError) as raised:
        f.write_lines(lines(2))
    assert raised.value.errno == 28  # ENOSPC
    f.write_lines(lines(1))  # reopened at the path
    assert read_all(f) == lines(1)


def test_bad_arguments():
    with pytest.raises(ValueError):
        RotatingFile("/tmp/x", max_bytes=0, backup_count=1)
    with pytest.raises(ValueError):
        RotatingFile("/tmp/x", max_bytes=1, backup_count=-1)
