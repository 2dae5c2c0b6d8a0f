"""Where the analysis cache lives, who may have written it, and how an entry is written and read so
that no command ever sees half of one.

Where: beside the run, in ``<run>/analysis/cache/`` (where ``export`` writes
its trace; a copied or moved run takes its cache along, and nothing is added
to ``structured_logs/``, which the writer, torchtitan's tools and users'
scripts list), or, where that folder cannot be written (a read-only run,
another user's), in the user's cache folder,
``$XDG_CACHE_HOME/otel-titan/runs/<hash of the log folder's path>/``
(``~/.cache`` without ``XDG_CACHE_HOME``). Both are looked in; a write goes to
the first that can be written.

How: an entry is written to a temporary file in the same folder and renamed
over the old one (`os.replace`, atomic on POSIX filesystems, Lustre, GPFS
and NFS included): a reader sees the old entry or the new one, never half of
either. A truncated, corrupt or foreign entry is a miss, never a crash. A
command killed mid-write leaves its temporary file; the next write removes
those older than an hour.

Trust (docs/security.md): run folders are often shared (a project folder on
the cluster that a whole group can write), so a cache entry is used only
when all of these hold:

* every folder of the cache that otel-titan makes (``analysis/``,
  ``analysis/cache/``; ``otel-titan/``, ``runs/``, ``runs/<hash>/``) is owned
  by the reader and writable by nobody else; they are made 0700, whatever the
  umask. Each is opened without following links and checked on the open
  folder (``fstat``), then the entry is opened inside it (``dir_fd``), so a
  folder swapped meanwhile is never used;
* the entry itself is a regular file owned by the reader, writable by nobody else;
* it is signed (HMAC-SHA256 over its bytes) with the reader's key,
  ``otel-titan/key``: 32 random bytes, made on first use, used only when owned
  by the reader and readable by nobody else. An entry signed with another key
  (written by someone else, or planted) is a miss.

A folder or key that fails a check is refused, never repaired (its mode is
left as it is): one warning line says which and why, and the command goes on
without it (without the key: uncached). A planted cache is at worst ignored.

Bounded (`prune`): after each write, entries unused for `MAX_AGE_DAYS` are
removed, then the least recently used until the folder holds at most
`MAX_BYTES`, and at most `MAX_SQL_SELECTIONS` of `sql`'s databases.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import logging
import os
import secrets
import stat
import time
from collections.abc import Iterator

__all__ = [
    "CACHE_FOLDER",
    "CacheFolder",
    "MAX_AGE_DAYS",
    "MAX_BYTES",
    "MAX_SQL_SELECTIONS",
    "make_private_folders",
    "remove_made_folders",
    "refusal",
    "user_cache_home",
]

#: The folder in the run folder.
CACHE_FOLDER = os.path.join("analysis", "cache")
_MAGIC = b"OTCACHE2"
_MAC_BYTES = 32
#: A sealed file's seal (its MAC over the file's bytes): ``<name>`` + this.
_SEAL = ".seal"

#: Entries not used for this long are removed by the next write into their folder.
MAX_AGE_DAYS = 30
#: A cache folder holds at most this much (the least recently used entries go first).
MAX_BYTES = 1 << 30
#: At most this many of `sql`'s databases (one per ``--ranks``/``--sources`` selection) are kept per
#: folder.
MAX_SQL_SELECTIONS = 8

_LOG = logging.getLogger("otel_titan.analysis")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_warned: set[str] = set()


def user_cache_home() -> str:
    """The user's otel-titan cache folder: ``$XDG_CACHE_HOME/otel-titan``, else
    ``~/.cache/otel-titan``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "otel-titan")


class _Refused(Exception):
    """A folder, key or entry that is not the reader's alone (the message says whose, or what
    mode)."""


def refusal(info: os.stat_result, path: str, secret: bool = False) -> str | None:
    """Why `path` (as `info` says) cannot be trusted: not owned by this user, or writable by others
    (readable too, when `secret`); None when it can.

    Example:
        >>> import tempfile; folder = tempfile.mkdtemp()
        >>> refusal(os.stat(folder), folder) is None
        True
        >>> os.chmod(folder, 0o777); refusal(os.stat(folder), "f")
        'f is writable by group and others (mode 0777)'
    """
    uid = os.geteuid()
    if info.st_uid != uid:
        return f"{path} is owned by uid {info.st_uid}, not by you (uid {uid})"
    loose = stat.S_IMODE(info.st_mode) & (0o077 if secret else 0o022)
    if loose:
        who = (
            "group and others"
            if loose & 0o070 and loose & 0o007
            else "its group"
            if loose & 0o070
            else "others"
        )
        return f"{path} is {'readable or writable' if secret else 'writable'} by {who} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _warn(path: str, reason: str, then: str) -> None:
    """One line per folder and command: what is refused, why, and how to trust it again."""
    if path in _warned:
        return
    _warned.add(path)
    _LOG.warning(
        "not using the analysis cache %s: %s (left as it is; fix it or remove it to use it "
        "again); %s",
        path,
        reason,
        then,
    )


def _open_dir(parent: int | None, name: str, create: bool, path: str) -> int:
    """The folder `name` in the open folder `parent` (or the path `name`), opened without following
    a link and checked; made 0700 when `create`.

    Raises `_Refused` (not this user's alone), FileNotFoundError (missing and not `create`), other
    OSErrors.
    """
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Refused(f"{path} is a symbolic link or not a folder") from None
        if not isinstance(error, FileNotFoundError) or not create:
            raise
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass  # made meanwhile: checked below like any other
        else:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            os.fchmod(fd, 0o700)  # mkdir's mode is masked by the umask: 0700 whatever it is
            return fd
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    reason = refusal(os.fstat(fd), path)
    if reason is not None:
        os.close(fd)
        raise _Refused(reason)
    return fd


def make_private_folders(path: str) -> list[str]:
    """Make the folder `path` and any missing parent, each new one 0700 whatever the umask (existing
    ones are left as they are); the folders made, outermost first.

    For what otel-titan writes beside a run (``analysis/``): a trace or a
    report names the run's processes and hosts; the user shares it by choice.

    Example:
        >>> import tempfile; top = tempfile.mkdtemp()
        >>> [os.path.basename(made) for made in make_private_folders(os.path.join(top, "analysis", "cache"))]
        ['analysis', 'cache']
        >>> oct(os.stat(os.path.join(top, "analysis")).st_mode & 0o777)
        '0o700'
    """
    path = os.path.abspath(path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    made = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            if not os.path.isdir(folder):
                raise
            continue
        os.chmod(folder, 0o700)
        made.append(folder)
    return made


def remove_made_folders(made: list[str]) -> None:
    """Remove the folders `make_private_folders` made (innermost first), where still empty: what a
    command that failed leaves behind."""
    for folder in reversed(made):
        try:
            os.rmdir(folder)
        except OSError:
            return


def _user_key() -> bytes | None:
    """This user's signing key, made on first use; None (nothing is then cached) when it can be
    neither read nor made, or is refused."""
    home = user_cache_home()
    path = os.path.join(home, "key")
    try:
        make_private_folders(os.path.dirname(home))  # $XDG_CACHE_HOME (or ~/.cache), when missing
        folder = _open_dir(None, home, True, home)
    except _Refused as refused:
        _warn(home, str(refused), "running uncached")
        return None
    except OSError:
        return None
    try:
        return _key_in(folder, path)
    except _Refused as refused:
        _warn(path, str(refused), "running uncached")
        return None
    except OSError:
        return None
    finally:
        os.close(folder)


def _key_in(folder: int, path: str) -> bytes | None:
    """The key file in the open folder `folder`: read when it is this user's alone, else made (never
    replacing one made meanwhile)."""
    for _ in range(2):
        try:
            fd = os.open("key", _FILE_FLAGS, dir_fd=folder)
        except FileNotFoundError:
            temp = f".key-{secrets.token_hex(8)}"
            made = os.open(
                temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder
            )
            try:
                os.fchmod(made, 0o600)
                os.write(made, secrets.token_bytes(32))
            finally:
                os.close(made)
            try:
                # never replaces a key another command made meanwhile
                os.link(temp, "key", src_dir_fd=folder, dst_dir_fd=folder)
            except FileExistsError:
                pass
            finally:
                os.unlink(temp, dir_fd=folder)
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _Refused(f"{path} is not a file")
            reason = refusal(info, path, secret=True)
            if reason is not None:
                raise _Refused(reason)
            key = os.read(fd, 64)
        finally:
            os.close(fd)
        return key if len(key) >= 32 else None
    return None


#: A temporary file older than this is a command's that was killed mid-write: removed by the next
#: write.
STALE_TEMP_S = 3600


class CacheFolder:
    """The cache folders of one run (`run_dir`, whose files are in `log_dir`): `read` the entries
    called `name`, `write` one atomically.

    Example (not run here: the first use makes your signing key in ~/.cache/otel-titan;
    tests/analysis/read/test_cache_folder.py runs it):
        >>> folder = CacheFolder("outputs", "outputs/structured_logs")  # doctest: +SKIP
        >>> folder.write("x.summary", b"facts")  # outputs/analysis/cache/x.summary  # doctest: +SKIP
        True
        >>> folder.read("x.summary")  # doctest: +SKIP
        [b'facts']
    """

    def __init__(self, run_dir: str, log_dir: str) -> None:
        self.log_dir = os.path.abspath(log_dir)
        self.run_dir = os.path.abspath(run_dir)
        where = hashlib.blake2b(os.fsencode(self.log_dir), digest_size=12).hexdigest()
        home = user_cache_home()
        #: Looked in in this order; written to the first that can be. Each: (where it starts, the
        #: folders made in it).
        self._chains = [
            (self.run_dir, ["analysis", "cache"]),
            (os.path.dirname(home), [os.path.basename(home), "runs", where]),
        ]
        self.folders = [os.path.join(start, *names) for start, names in self._chains]
        self._key = _user_key()

    # -- the folders, checked ----------------------------------------------------------------------
    def _open(self, index: int, create: bool) -> int | None:
        """Folder `index` opened and checked at every level (made 0700 where missing, when
        `create`); None when missing, unwritable or refused."""
        start, names = self._chains[index]
        try:
            # the run folder, or $XDG_CACHE_HOME: as the user named them
            fd = os.open(start, _DIR_FLAGS & ~os.O_NOFOLLOW)
        except OSError:
            return None
        path = start
        try:
            for name in names:
                path = os.path.join(path, name)
                inner = _open_dir(fd, name, create, path)
                os.close(fd)
                fd = inner
            return fd
        except _Refused as refused:
            os.close(fd)
            if not self._quiet(index, path):
                _warn(
                    path,
                    str(refused),
                    "using " + (self.folders[1] if index == 0 else "no cache folder") + " instead",
                )
            return None
        except OSError:
            os.close(fd)
            return None

    def _quiet(self, index: int, path: str) -> bool:
        """A folder beside another user's run that is that user's: theirs, never this user's to use
        (no warning: this user's cache is in the user's folder).

        A folder of someone else's beside this user's own run is what a swap
        looks like (issue 27): that is warned about.
        """
        if index != 0:
            return False
        try:
            theirs, run = os.lstat(path), os.stat(self.run_dir)
        except OSError:
            return True
        return theirs.st_uid == run.st_uid != os.geteuid()

    @contextlib.contextmanager
    def _entry(self, folder: int, name: str) -> Iterator[int | None]:
        """The entry `name` of the open folder: its file, when it is a regular file of this user's
        that nobody else can write."""
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=folder)
        except OSError:
            yield None
            return
        try:
            info = os.fstat(fd)
            yield fd if stat.S_ISREG(info.st_mode) and refusal(info, name) is None else None
        finally:
            os.close(fd)

    def _mac(self, *parts: bytes, fd: int | None = None) -> bytes:
        """HMAC-SHA256 with this user's key over `parts` (each with its length), then every byte of
        the open file `fd`, read in chunks."""
        assert self._key is not None
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in parts:
            mac.update(len(part).to_bytes(8, "big"))
            mac.update(part)
        offset = 0
        while fd is not None:
            chunk = os.pread(fd, 1 << 20, offset)
            if not chunk:
                break
            mac.update(chunk)
            offset += len(chunk)
        return mac.digest()

    # -- entries read whole ------------------------------------------------------------------------
    def read(self, name: str) -> list[bytes]:
        """The payloads of the entries called `name` whose signature is this user's (beside the run
        first); torn or foreign ones are left out."""
        if self._key is None:
            return []
        out = []
        for index in range(len(self._chains)):
            folder = self._open(index, create=False)
            if folder is None:
                continue
            try:
                with self._entry(folder, name) as fd:
                    data = _read_all(fd) if fd is not None else b""
                if fd is not None:
                    _touch(folder, name)
            finally:
                os.close(folder)
            if len(data) < len(_MAGIC) + _MAC_BYTES or not data.startswith(_MAGIC):
                continue
            mac, payload = (
                data[len(_MAGIC) : len(_MAGIC) + _MAC_BYTES],
                data[len(_MAGIC) + _MAC_BYTES :],
            )
            if hmac.compare_digest(mac, self._mac(name.encode(), payload)):
                out.append(payload)
        return out

    def write(self, name: str, payload: bytes) -> bool:
        """Write the entry `name` (temporary file, then renamed over the old one); False when no
        folder could take it."""
        if self._key is None:
            return False
        data = _MAGIC + self._mac(name.encode(), payload) + payload
        for index in range(len(self._chains)):
            folder = self._open(index, create=True)
            if folder is None:
                continue  # read-only, or not ours: the next folder
            try:
                if _write_into(folder, name, data):
                    _sweep(folder)
                    prune(folder, keep=name)
                    return True
            finally:
                os.close(folder)
        return False

    # -- entries another library writes and reads (a DuckDB database) ------------------------------
    @contextlib.contextmanager
    def sealed(self, name: str, seal: str) -> Iterator[list[str]]:
        """The files called `name` whose bytes this user sealed with `seal` (`new_sealed`): a path
        to open each by, beside the run first.

        The seal (a MAC over `seal` and every byte of the file) is checked
        before anything opens the file, and the path opens the very file that
        was checked (``/proc/self/fd``, where there is one), for as long as
        the ``with`` lasts.
        """
        opened: list[int] = []
        paths: list[str] = []
        try:
            for index in range(len(self._chains)) if self._key is not None else ():
                folder = self._open(index, create=False)
                if folder is None:
                    continue
                try:
                    fd = self._sealed_file(folder, name, seal)
                finally:
                    os.close(folder)
                if fd is not None:
                    opened.append(fd)
                    paths.append(_fd_path(fd, os.path.join(self.folders[index], name)))
            yield paths
        finally:
            for fd in opened:
                os.close(fd)

    def _sealed_file(self, folder: int, name: str, seal: str) -> int | None:
        with self._entry(folder, name + _SEAL) as mac_fd:
            mac = _read_all(mac_fd) if mac_fd is not None else b""
        if len(mac) != _MAC_BYTES:
            return None
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=folder)
        except OSError:
            return None
        info = os.fstat(fd)
        if (
            stat.S_ISREG(info.st_mode)
            and refusal(info, name) is None
            and hmac.compare_digest(mac, self._mac(name.encode(), seal.encode(), fd=fd))
        ):
            _touch(folder, name)
            return fd
        os.close(fd)
        return None

    @contextlib.contextmanager
    def new_sealed(self, name: str, seal: str) -> Iterator[str | None]:
        """A temporary path to build the entry `name` in (None when no folder can take it); once the
        ``with`` ends without error, the file is sealed with `seal` and renamed to `name`.

        For entries another library writes itself (a DuckDB database): the
        builder makes the file; `sealed` finds it again.
        """
        folder = None
        for index in range(len(self._chains)) if self._key is not None else ():
            folder = self._open(index, create=True)
            if folder is not None:
                break
        if folder is None:
            yield None
            return
        temp = f".{name[:40]}-{secrets.token_hex(6)}.tmp"
        try:
            yield _fd_path(folder, os.path.join(self.folders[index], temp), temp)
            fd = os.open(temp, _FILE_FLAGS, dir_fd=folder)
            try:
                os.fchmod(fd, 0o600)
                mac = self._mac(name.encode(), seal.encode(), fd=fd)
            finally:
                os.close(fd)
            if _write_into(folder, name + _SEAL, mac):
                os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
                prune(folder, keep=name)
        except OSError:
            pass  # best effort: no cache
        finally:
            for leftover in (temp, temp + ".wal"):
                with contextlib.suppress(OSError):
                    os.unlink(leftover, dir_fd=folder)
            os.close(folder)


def _fd_path(fd: int, fallback: str, name: str = "") -> str:
    """A path that opens the open file `fd` (or the file `name` in the open folder `fd`) wherever it
    has moved meanwhile; `fallback` without ``/proc``."""
    proc = f"/proc/self/fd/{fd}"
    if not os.path.exists(proc):
        return fallback
    return os.path.join(proc, name) if name else proc


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _touch(folder: int, name: str) -> None:
    """Mark the entry used now (what `prune` keeps longest)."""
    with contextlib.suppress(OSError):
        os.utime(name, dir_fd=folder, follow_symlinks=False)


def _write_into(folder: int, name: str, data: bytes) -> bool:
    """`data` as the file `name` of the open folder: written to a temporary file (0600), then
    renamed over the old one."""
    temp = f".{name[:40]}-{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder
        )
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=folder)
        return False


def _sweep(folder: int) -> None:
    """Remove the temporary files of commands killed mid-write (never a live one: those are younger
    than `STALE_TEMP_S`)."""
    try:
        names = [
            name for name in os.listdir(folder) if name.startswith(".") and name.endswith(".tmp")
        ]
        now = time.time()
        for name in names:
            if now - os.stat(name, dir_fd=folder, follow_symlinks=False).st_mtime > STALE_TEMP_S:
                os.unlink(name, dir_fd=folder)
    except OSError:
        pass


def prune(folder: int, keep: str = "", now: float | None = None) -> list[str]:
    """Bound the open cache folder `folder`: remove entries unused for `MAX_AGE_DAYS`, then the
    least recently used beyond `MAX_SQL_SELECTIONS` sql databases and `MAX_BYTES`; never `keep`
    (just written). The names removed."""
    now = time.time() if now is None else now
    entries = []
    try:
        for name in os.listdir(folder):
            if name.startswith(".") or name.endswith(_SEAL):
                continue
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if stat.S_ISREG(info.st_mode):
                seal = name + _SEAL
                size = info.st_size + (
                    os.stat(seal, dir_fd=folder, follow_symlinks=False).st_size
                    if _exists(folder, seal)
                    else 0
                )
                entries.append((info.st_mtime, name, size))
    except OSError:
        return []
    entries.sort(reverse=True)  # the most recently used first
    removed, total, selections = [], 0, 0
    for used, name, size in entries:
        if name != keep:
            sql = name.startswith("sql-") and name.endswith(".duckdb")
            if (
                now - used > MAX_AGE_DAYS * 86400
                or total + size > MAX_BYTES
                or (sql and selections >= MAX_SQL_SELECTIONS)
            ):
                for path in (name, name + _SEAL):
                    with contextlib.suppress(OSError):
                        os.unlink(path, dir_fd=folder)
                removed.append(name)
                continue
        total += size
        selections += name.startswith("sql-") and name.endswith(".duckdb")
    return removed


def _exists(folder: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
        return True
    except OSError:
        return False
