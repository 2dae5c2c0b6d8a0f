"""The cache's folders (`read.cache_folder`): beside the run or the user's, whole entries only, and only this user's."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from otel_titan.analysis.read.cache_folder import CACHE_FOLDER, CacheFolder


@pytest.fixture(autouse=True)
def _own_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def test_an_entry_is_written_beside_the_run_and_read_back(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "structured_logs").mkdir(parents=True)
    folder = CacheFolder(str(run), str(run / "structured_logs"))
    assert folder.write("a.summary", b"payload")
    assert (run / CACHE_FOLDER / "a.summary").is_file() and folder.read("a.summary") == [b"payload"]
    assert folder.write("a.summary", b"newer") and folder.read("a.summary") == [b"newer"]
    assert [p.name for p in (run / CACHE_FOLDER).iterdir()] == ["a.summary"]  # no temporary file left
    assert folder.read("missing.summary") == []


def test_where_the_run_cannot_take_it_the_users_folder_does(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "analysis").write_text("in the way")
    folder = CacheFolder(str(run), str(run))
    assert folder.write("a.summary", b"payload") and folder.read("a.summary") == [b"payload"]
    assert list((tmp_path / "xdg" / "otel-titan" / "runs").glob("*/a.summary"))


def test_torn_and_foreign_entries_are_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = CacheFolder(str(tmp_path), str(tmp_path))
    folder.write("a.summary", b"x" * 1000)
    entry = tmp_path / CACHE_FOLDER / "a.summary"
    whole = entry.read_bytes()
    entry.write_bytes(whole[:500])
    assert folder.read("a.summary") == []
    entry.write_bytes(whole)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-user"))
    assert CacheFolder(str(tmp_path), str(tmp_path)).read("a.summary") == []  # signed with another key


def _writer(run: str, index: int) -> None:
    folder = CacheFolder(run, run)
    for round_ in range(200):
        folder.write("shared.summary", bytes([index]) * (1000 + 997 * (round_ % 50)))


def test_readers_never_see_half_an_entry_while_others_write_it(tmp_path: Path) -> None:
    CacheFolder(str(tmp_path), str(tmp_path)).write("shared.summary", b"\0" * 1000)
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_writer, args=(str(tmp_path), index)) for index in (1, 2)]
    for writer in writers:
        writer.start()
    reader = CacheFolder(str(tmp_path), str(tmp_path))
    seen = 0
    try:
        while any(writer.is_alive() for writer in writers):
            for payload in reader.read("shared.summary"):
                assert len(set(payload)) == 1 and (len(payload) - 1000) % 997 == 0  # one writer's, whole
                seen += 1
    finally:
        for writer in writers:
            writer.join(60)
    assert seen > 0 and all(writer.exitcode == 0 for writer in writers)
    assert not [name for name in os.listdir(tmp_path / CACHE_FOLDER) if name.endswith(".tmp")]


def test_without_a_key_of_ones_own_nothing_is_kept_or_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "not-a-folder").write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))  # no cache folder of one's own can be made
    folder = CacheFolder(str(tmp_path), str(tmp_path))
    assert not folder.write("a.summary", b"payload") and folder.read("a.summary") == []
    with folder.new_sealed("a.duckdb", "k") as temp:
        assert temp is None
    assert not (tmp_path / CACHE_FOLDER).exists()


def test_a_killed_writers_temporary_file_is_swept_once_stale(tmp_path: Path) -> None:
    folder = CacheFolder(str(tmp_path), str(tmp_path))
    folder.write("a.summary", b"1")
    stale, live = tmp_path / CACHE_FOLDER / ".a.summary-x.tmp", tmp_path / CACHE_FOLDER / ".a.summary-y.tmp"
    stale.write_bytes(b"half")
    live.write_bytes(b"being written")
    os.utime(stale, (1, 1))
    folder.write("a.summary", b"2")
    assert not stale.exists() and live.exists() and folder.read("a.summary") == [b"2"]
