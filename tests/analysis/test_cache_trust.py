"""The analysis cache where runs are shared (issue 27, items 1-4; docs/security.md): another user's
files are at worst ignored.

Two real users (``tests.helpers.users``: useradd, one shared group, commands
run as each with setpriv), real commands (``otel-titan sql`` / ``summarize``),
real planted files, built the way the attacks of the issue built them on
545a737: a DuckDB file whose ``cache_key`` is a VIEW that reads the reader's
key and computes the HMAC in SQL, a pickle that runs a command, a key and
folder pre-made in a shared ``XDG_CACHE_HOME``. Each attack succeeds on that
commit (the forged count, the command run, the SQL run); here it must be
refused or ignored, the answer must be the one ``--no-cache`` gives, and a
refused folder or key must be named in one warning line.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis.query.sql import _SqlCache, open_run
from otel_titan.analysis.read.records import read_run
from tests.helpers.users import User, local_users, skip_reason

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

OTEL_TITAN = os.path.join(os.path.dirname(sys.executable), "otel-titan")
SPANS = "SELECT count(*) AS spans FROM spans"


@pytest.fixture()
def people() -> Iterator[tuple[User, User, int, Path]]:
    """(A, B, their group's gid, a fresh folder both can enter)."""
    with local_users("cache-safety") as (users, gid, top):
        yield users[0], users[1], gid, Path(top)


def _make_run(path: Path, owner: User, gid: int, dir_mode: int, file_mode: int) -> Path:
    generate_run(str(path), RunSpec(ranks=8, steps=6, seed=3, ranks_per_host=4))
    for folder, _, names in os.walk(path):
        os.chown(folder, owner.uid, gid)
        os.chmod(folder, dir_mode)
        for name in names:
            os.chown(os.path.join(folder, name), owner.uid, gid)
            os.chmod(os.path.join(folder, name), file_mode)
    return path


def _give(path: Path, owner: User, mode: int) -> None:
    os.chown(path, owner.uid, owner.gid)
    os.chmod(path, mode)


def _sql(
    user: User, run: Path, *options: str, umask: int = 0o022, env: dict[str, str] | None = None
) -> tuple[int, str]:
    done = user.run(
        [OTEL_TITAN, "sql", str(run), SPANS, "--format", "json", "--no-progress", *options],
        umask=umask,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)[0]["spans"], done.stderr


class _FifoWatch:
    """A FIFO that records whether anything opened it for reading (a planted view's ``read_text``
    running), and lets that read end."""

    def __init__(self, path: Path) -> None:
        self.path, self.opened, self._stop = path, False, threading.Event()
        os.mkfifo(path, 0o666)
        os.chmod(path, 0o666)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        # returns when someone opens it for reading, however briefly
        fd = os.open(self.path, os.O_WRONLY)
        self.opened = not self._stop.is_set()
        try:
            os.write(fd, b"x")
        except OSError:
            pass
        os.close(fd)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            # ours: releases the waiting writer, not counted
            reader = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            self._thread.join(5)
            os.close(reader)


_PAD = "unhex(array_to_string(list_transform(range(64), lambda i: printf('%02X', xor(('0x' || substr(kp, 2*i+1, 2))::INTEGER, {pad}))), ''))"


def _plant_sql(folder: Path, run: Path, key_file: Path, fifo: Path, owner: User) -> int:
    """B's forged ``sql-*.duckdb`` for `run`, in `folder`: every process's records but one, and a
    ``cache_key`` VIEW that reads `key_file` when queried (the reader's own key) and computes its
    HMAC of the content key, after reading `fifo`. The number of spans it answers."""

    logs = read_run(run)
    entry = _SqlCache.of(logs.run_dir, logs.log_dir, logs.processes, True)
    assert entry is not None
    db = open_run(run, cache=False)
    db.load()
    con = db.con
    planted = folder / entry.name
    con.execute(f"ATTACH '{planted}' AS plant")
    con.execute(
        "CREATE TABLE plant.records AS SELECT * FROM records WHERE process_id <> (SELECT "
        "max(process_id) FROM records)"
    )
    con.execute("CREATE TABLE plant.clock_offsets AS SELECT * FROM clock_offsets")
    # a plain file while the view is made (DuckDB binds it), a FIFO once planted
    fifo.write_text("x")
    hmac_sql = (
        "WITH k AS (SELECT hex(content) || repeat('00', 64 - octet_length(content)) AS kp FROM "
        f"read_blob('{key_file}')), "
        f"pads AS (SELECT {_PAD.format(pad=54)} AS ipad, {_PAD.format(pad=92)} AS opad FROM k) "
        f"SELECT sha256(opad || unhex(sha256(ipad || '{entry.key}'::BLOB))) AS signature FROM pads"
    )
    # The FIFO's content is part of the answer, so DuckDB must read it (an unused column would be
    # optimized away).
    con.execute(
        f"CREATE VIEW plant.cache_key AS SELECT '{entry.key}' AS key, h.signature || "
        "substr(f.content, 1, 0) AS signature, "
        f"'{db.clock}' AS clock FROM ({hmac_sql}) h, (SELECT content FROM read_text('{fifo}')) f"
    )
    forged = con.execute(
        "SELECT count(*) FROM spans WHERE process_id <> (SELECT max(process_id) FROM records)"
    ).fetchone()[0]
    con.execute("DETACH plant")
    con.close()
    fifo.unlink()
    _give(planted, owner, 0o644)
    return forged


def _a_key(user: User) -> Path:
    return Path(user.home) / ".cache" / "otel-titan" / "key"


def test_a_planted_duckdb_file_is_never_opened_and_its_sql_never_runs(
    people: tuple[User, User, int, Path],
) -> None:
    """Item 1: B's run, B's cache folder, B's planted file whose view would compute A's HMAC from
    A's key: A's ``sql`` answers from the files."""
    a, b, gid, top = people
    run = _make_run(top / "runB", b, gid, 0o755, 0o644)
    truth, _ = _sql(a, run, "--no-cache")
    # makes A's key, and keeps A's entry in A's own cache folder (B's run is not A's to write)
    assert _sql(a, run)[0] == truth
    assert _a_key(a).is_file()
    cache = run / "analysis" / "cache"
    cache.mkdir(parents=True)
    for folder in (run / "analysis", cache):
        _give(folder, b, 0o775)  # as B's umask 002 makes them in a project folder
    fifo = top / "tripwire"
    forged = _plant_sql(cache, run, _a_key(a), fifo, b)
    assert forged < truth
    watch = _FifoWatch(fifo)
    try:
        answer, err = _sql(a, run)  # the planted file is looked at first: it is beside the run
    finally:
        watch.close()
    assert answer == truth, err
    assert not watch.opened, "the planted view's SQL ran in A's process"
    # B's own folder beside B's own run: never A's to use, nothing to warn A about
    assert "not using" not in err


def _evil_pickle(marker: Path) -> bytes:
    class Evil:
        def __reduce__(self) -> tuple:
            return os.system, (f"id -u > {marker}",)

    return pickle.dumps({"x": Evil()})


def test_a_key_and_folder_made_by_another_user_in_a_shared_cache_home_are_refused(
    people: tuple[User, User, int, Path],
) -> None:
    """Item 2: B made ``otel-titan/`` (0777) and a key (0644) first in a shared XDG_CACHE_HOME and
    signed a pickle with it: A refuses both, runs uncached, runs nothing."""
    a, b, gid, top = people
    shared = top / "shared-cache"
    shared.mkdir()
    os.chmod(shared, 0o777)
    home = shared / "otel-titan"
    home.mkdir()
    _give(home, b, 0o777)
    key = os.urandom(32)
    (home / "key").write_bytes(key)
    _give(home / "key", b, 0o644)
    run = _make_run(top / "runB", b, gid, 0o755, 0o644)
    drop = top / "drop"
    drop.mkdir()
    os.chmod(drop, 0o777)
    marker = drop / "ran-as-a"
    cache = run / "analysis" / "cache"
    cache.mkdir(parents=True)
    for folder in (run / "analysis", cache):
        _give(folder, b, 0o755)
    payload = _evil_pickle(marker)
    # 545a737's format
    (cache / "reads.pack").write_bytes(
        b"OTCACHE1" + hmac.new(key, payload, hashlib.sha256).digest() + payload
    )
    _give(cache / "reads.pack", b, 0o644)
    done = a.run(
        [OTEL_TITAN, "summarize", str(run), "--json"], env=a.env(XDG_CACHE_HOME=str(shared))
    )
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), "B's pickle ran as A"
    assert len(json.loads(done.stdout)["processes"]) == 8
    refused = [line for line in done.stderr.splitlines() if "not using the analysis cache" in line]
    assert (
        len(refused) == 1
        and str(home) in refused[0]
        and f"owned by uid {b.uid}" in refused[0]
        and "uncached" in refused[0]
    ), done.stderr
    # refused, never repaired
    assert stat.S_IMODE(home.stat().st_mode) == 0o777 and home.stat().st_uid == b.uid
    assert not list(shared.rglob("runs"))  # nothing of A's was written into B's folder


def test_in_a_group_writable_project_folder_a_swapped_cache_is_refused(
    people: tuple[User, User, int, Path],
) -> None:
    """Item 3: A's run in a setgid, group-writable project folder (umask 002): A's folders are 0700,
    and B's swap of them is refused with a warning."""
    a, b, gid, top = people
    project = top / "project"
    project.mkdir()
    os.chown(project, 0, gid)
    os.chmod(project, 0o2775)
    run = _make_run(project / "runA", a, gid, 0o2775, 0o664)
    truth, _ = _sql(a, run, "--no-cache", umask=0o002)
    first, _ = _sql(a, run, umask=0o002)  # keeps A's cache beside the run
    assert first == truth
    for folder in (run / "analysis", run / "analysis" / "cache"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    # B moves A's cache (or, where A's analysis/ lets nobody in, the whole analysis/ folder) away
    # and plants its own.
    swap = (
        "import os, sys\n"
        "run = sys.argv[1]\n"
        "try:\n    os.rename(os.path.join(run, 'analysis', 'cache'), os.path.join(run, "
        "'analysis', 'cache.moved'))\n"
        "except PermissionError:\n    os.rename(os.path.join(run, 'analysis'), os.path.join(run, "
        "'analysis.moved'))\n"
        "os.makedirs(os.path.join(run, 'analysis', 'cache'), exist_ok=True)\n"
    )
    done = b.run([sys.executable, "-c", swap, str(run)], umask=0o002)
    assert done.returncode == 0, done.stderr
    # A's analysis/ kept B out: B could only move all of it
    assert not (run / "analysis" / "cache.moved").exists()
    planted_in = run / "analysis" / "cache"
    assert planted_in.stat().st_uid == b.uid
    fifo = top / "tripwire"
    _plant_sql(planted_in, run, _a_key(a), fifo, b)
    watch = _FifoWatch(fifo)
    try:
        answer, err = _sql(a, run, umask=0o002)
    finally:
        watch.close()
    assert answer == truth and not watch.opened
    refused = [line for line in err.splitlines() if "not using the analysis cache" in line]
    assert (
        len(refused) == 1
        and str(run / "analysis") in refused[0]
        and f"owned by uid {b.uid}" in refused[0]
    ), err
