"""The cache's folders (`read.cache_folder`): beside the run or the user's, whole entries only, and
only this user's."""

from __future__ import annotations

import multiprocessing
import os
import time
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
    # no temporary file left
    assert [p.name for p in (run / CACHE_FOLDER).iterdir()] == ["a.summary"]
    assert folder.read("missing.summary") == []


def test_where_the_run_cannot_take_it_the_users_folder_does(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "analysis").write_text("in the way")
    folder = CacheFolder(str(run), str(run))
    assert folder.write("a.summary", b"payload") and folder.read("a.summary") == [b"payload"]
    assert list((tmp_path / "xdg" / "otel-titan" / "runs").glob("*/a.summary"))


def test_torn_and_foreign_entries_are_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = CacheFolder(str(tmp_path), str(tmp_path))
    folder.write("a.summary", b"x" * 1000)
    entry = tmp_path / CACHE_FOLDER / "a.summary"
    whole = entry.read_bytes()
    entry.write_bytes(whole[:500])
    assert folder.read("a.summary") == []
    entry.write_bytes(whole)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-user"))
    # signed with another key
    assert CacheFolder(str(tmp_path), str(tmp_path)).read("a.summary") == []


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
                # one writer's, whole
                assert len(set(payload)) == 1 and (len(payload) - 1000) % 997 == 0
                seen += 1
    finally:
        for writer in writers:
            writer.join(60)
    assert seen > 0 and all(writer.exitcode == 0 for writer in writers)
    assert not [name for name in os.listdir(tmp_path / CACHE_FOLDER) if name.endswith(".tmp")]


def test_without_a_key_of_ones_own_nothing_is_kept_or_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "not-a-folder").write_text("x")
    # no cache folder of one's own can be made
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    folder = CacheFolder(str(tmp_path), str(tmp_path))
    assert not folder.write("a.summary", b"payload") and folder.read("a.summary") == []
    with folder.new_sealed("a.duckdb", "k") as temp:
        assert temp is None
    assert not (tmp_path / CACHE_FOLDER).exists()


def test_a_killed_writers_temporary_file_is_swept_once_stale(tmp_path: Path) -> None:
    folder = CacheFolder(str(tmp_path), str(tmp_path))
    folder.write("a.summary", b"1")
    stale, live = (
        tmp_path / CACHE_FOLDER / ".a.summary-x.tmp",
        tmp_path / CACHE_FOLDER / ".a.summary-y.tmp",
    )
    stale.write_bytes(b"half")
    live.write_bytes(b"being written")
    os.utime(stale, (1, 1))
    folder.write("a.summary", b"2")
    assert not stale.exists() and live.exists() and folder.read("a.summary") == [b"2"]


def test_every_folder_it_makes_is_0700_whatever_the_umask(tmp_path: Path) -> None:
    """Issue 27 item 3: ``os.makedirs(mode=0o700)`` set the leaf's mode only (and the umask took
    bits off): ``analysis/`` was 0775 under umask 002."""
    run = tmp_path / "run"
    run.mkdir()
    old = os.umask(0o002)
    try:
        assert CacheFolder(str(run), str(run)).write("a.summary", b"payload")
        # beside the run taken away: the user's folder takes the next write
        (run / "analysis").rename(run / "analysis.moved")
        (run / "analysis").write_text("in the way")
        assert CacheFolder(str(run), str(run)).write("b.summary", b"payload")
    finally:
        os.umask(old)
    made = [
        run / "analysis.moved",
        run / "analysis.moved" / "cache",
        tmp_path / "xdg",
        tmp_path / "xdg" / "otel-titan",
        tmp_path / "xdg" / "otel-titan" / "runs",
    ]
    made += list((tmp_path / "xdg" / "otel-titan" / "runs").iterdir())
    assert {str(folder): oct(folder.stat().st_mode & 0o777) for folder in made} == {
        str(folder): "0o700" for folder in made
    }
    assert oct((tmp_path / "xdg" / "otel-titan" / "key").stat().st_mode & 0o777) == "0o600"


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if "not using the analysis cache" in record.getMessage()
    ]


def test_a_key_others_can_read_is_refused_with_one_warning_and_left_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27 item 2: the key was taken whatever its mode (and whoever made it:
    tests/analysis/test_cache_trust.py, with two users)."""
    CacheFolder(str(tmp_path), str(tmp_path))  # makes the key
    key = tmp_path / "xdg" / "otel-titan" / "key"
    key.chmod(0o644)
    folder = CacheFolder(str(tmp_path), str(tmp_path))
    assert not folder.write("a.summary", b"payload") and folder.read("a.summary") == []
    CacheFolder(str(tmp_path), str(tmp_path))
    (line,) = _refusals(caplog)  # one line, however often it is refused
    assert str(key) in line and "mode 0644" in line and "uncached" in line
    # never repaired, nothing written
    assert key.stat().st_mode & 0o777 == 0o644 and not (tmp_path / CACHE_FOLDER).exists()


def test_a_cache_folder_others_can_write_is_refused_and_left_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder beside the run that its group or others can write: anyone there could have planted
    or swapped its entries."""
    folder = CacheFolder(str(tmp_path), str(tmp_path))
    assert folder.write("a.summary", b"payload") and folder.read("a.summary") == [b"payload"]
    (tmp_path / "analysis").chmod(0o775)
    assert folder.read("a.summary") == []
    (line,) = _refusals(caplog)
    assert (
        str(tmp_path / "analysis") in line
        and "writable by its group (mode 0775)" in line
        and str(tmp_path / "xdg") in line
    )
    # the user's folder instead
    assert folder.write("a.summary", b"elsewhere") and folder.read("a.summary") == [b"elsewhere"]
    assert (tmp_path / "analysis").stat().st_mode & 0o777 == 0o775 and (
        tmp_path / CACHE_FOLDER / "a.summary"
    ).is_file()


def test_an_entry_others_can_write_or_that_is_a_link_is_a_miss(tmp_path: Path) -> None:
    folder = CacheFolder(str(tmp_path), str(tmp_path))
    folder.write("a.summary", b"payload")
    entry = tmp_path / CACHE_FOLDER / "a.summary"
    entry.chmod(0o666)
    assert folder.read("a.summary") == []
    entry.chmod(0o600)
    entry.rename(tmp_path / "elsewhere")
    entry.symlink_to(tmp_path / "elsewhere")
    assert folder.read("a.summary") == []


def test_the_folder_is_bounded_by_age_size_and_sql_selections(tmp_path: Path) -> None:
    """Issue 27 item 5: entries were never removed (16 single-rank queries left 12.8 MB for a 9.3 MB
    run)."""
    from otel_titan.analysis.read import cache_folder

    folder = CacheFolder(str(tmp_path), str(tmp_path))
    for index in range(cache_folder.MAX_SQL_SELECTIONS + 3):
        with folder.new_sealed(f"sql-{index}.duckdb", "k") as temp:
            assert temp is not None
            with open(temp, "wb") as handle:
                handle.write(b"db" * 100)
        time.sleep(0.01)  # a later use: a later mtime
    kept = sorted(path.name for path in (tmp_path / CACHE_FOLDER).glob("sql-*.duckdb"))
    # the most recently used
    assert kept == sorted(
        f"sql-{index}.duckdb" for index in range(3, cache_folder.MAX_SQL_SELECTIONS + 3)
    )
    assert sorted(path.name for path in (tmp_path / CACHE_FOLDER).glob("*.seal")) == [
        name + ".seal" for name in kept
    ]
    folder.write("old.facts", b"x")
    old = tmp_path / CACHE_FOLDER / "old.facts"
    os.utime(old, (1, time.time() - (cache_folder.MAX_AGE_DAYS + 1) * 86400))
    folder.write("new.facts", b"y")
    assert not old.exists() and (tmp_path / CACHE_FOLDER / "new.facts").is_file()
    with folder.sealed("sql-3.duckdb", "k") as paths:  # what is read is used: it stays longest
        assert len(paths) == 1
    fd = os.open(tmp_path / CACHE_FOLDER, os.O_RDONLY | os.O_DIRECTORY)
    try:
        removed = cache_folder.prune(fd, now=time.time() + 0.5)
        assert removed == []
        with pytest.MonkeyPatch.context() as patch:
            # room for the newest three: sql-3 (used just now) and the two facts
            patch.setattr(cache_folder, "MAX_BYTES", 600)
            removed = cache_folder.prune(fd)
    finally:
        os.close(fd)
    assert "sql-3.duckdb" not in removed and (tmp_path / CACHE_FOLDER / "sql-3.duckdb").is_file()
    assert len(list((tmp_path / CACHE_FOLDER).glob("sql-*.duckdb"))) <= 3


def test_a_cache_folder_that_is_a_link_is_refused_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A link is followed by nothing: whoever could make it could point it anywhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    run = tmp_path / "run"
    run.mkdir()
    (run / "analysis").symlink_to(elsewhere)
    folder = CacheFolder(str(run), str(run))
    # written to the user's folder instead
    assert folder.write("a.summary", b"payload") and not list(elsewhere.iterdir())
    (line,) = _refusals(caplog)
    assert str(run / "analysis") in line and "symbolic link" in line
