"""Where the analysis cache lives, and how an entry is written and read so that no command ever sees half of one.

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

Trust: an entry is pickled state, and unpickling runs code, while run folders
are often shared (a project folder on the cluster). So every entry is signed
(HMAC-SHA256) with a key only this user can read
(``$XDG_CACHE_HOME/otel-titan/key``, mode 0600, made on first use); an entry
signed with another key (written by someone else, or planted) is a miss and
is never unpickled. A run copied by its own user still hits.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile
import time

__all__ = ["CACHE_FOLDER", "CacheFolder", "user_cache_home"]

#: The folder in the run folder.
CACHE_FOLDER = os.path.join("analysis", "cache")
_MAGIC = b"OTCACHE1"
_MAC_BYTES = 32


def user_cache_home() -> str:
    """The user's otel-titan cache folder: ``$XDG_CACHE_HOME/otel-titan``, else ``~/.cache/otel-titan``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "otel-titan")


def _user_key() -> bytes | None:
    """This user's signing key, made on first use (None when it can be neither read nor made: then nothing is cached)."""
    path = os.path.join(user_cache_home(), "key")
    try:
        with open(path, "rb") as handle:
            key = handle.read()
        if len(key) >= 32:
            return key
    except OSError:
        pass
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".key-")
        with os.fdopen(fd, "wb") as handle:  # mkstemp: mode 0600
            handle.write(secrets.token_bytes(32))
        try:
            os.link(temp, path)  # never replaces a key another command made meanwhile
        except FileExistsError:
            pass
        finally:
            os.unlink(temp)
        with open(path, "rb") as handle:
            key = handle.read()
        return key if len(key) >= 32 else None
    except OSError:
        return None


#: A temporary file older than this is a command's that was killed mid-write: removed by the next write.
STALE_TEMP_S = 3600


def _sweep(folder: str) -> None:
    """Remove the temporary files of commands killed mid-write (never a live one: those are younger than `STALE_TEMP_S`)."""
    try:
        names = [name for name in os.listdir(folder) if name.startswith(".") and name.endswith(".tmp")]
        now = time.time()
        for name in names:
            path = os.path.join(folder, name)
            if now - os.stat(path).st_mtime > STALE_TEMP_S:
                os.unlink(path)
    except OSError:
        pass


class CacheFolder:
    """The cache folders of one run (`run_dir`, whose files are in `log_dir`): `read` the entries called `name`, `write` one atomically.

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
        beside = os.path.join(os.path.abspath(run_dir), CACHE_FOLDER)
        where = hashlib.blake2b(os.fsencode(self.log_dir), digest_size=12).hexdigest()
        #: Looked in in this order; written to the first that can be.
        self.folders = [beside, os.path.join(user_cache_home(), "runs", where)]
        self._key = _user_key()

    def _sign(self, payload: bytes) -> bytes:
        assert self._key is not None
        return hmac.new(self._key, payload, hashlib.sha256).digest()

    def read(self, name: str) -> list[bytes]:
        """The payloads of the entries called `name` whose signature is this user's (beside the run first); torn or foreign ones are left out."""
        if self._key is None:
            return []
        out = []
        for folder in self.folders:
            try:
                with open(os.path.join(folder, name), "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            if len(data) < len(_MAGIC) + _MAC_BYTES or not data.startswith(_MAGIC):
                continue
            mac, payload = data[len(_MAGIC) : len(_MAGIC) + _MAC_BYTES], data[len(_MAGIC) + _MAC_BYTES :]
            if hmac.compare_digest(mac, self._sign(payload)):
                out.append(payload)
        return out

    def write(self, name: str, payload: bytes) -> bool:
        """Write the entry `name` (temporary file, then renamed over the old one); False when no folder could take it."""
        if self._key is None:
            return False
        data = _MAGIC + self._sign(payload) + payload
        for folder in self.folders:
            try:
                os.makedirs(folder, mode=0o700, exist_ok=True)
                fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{name[:40]}-", suffix=".tmp")
            except OSError:
                continue  # read-only, or not ours: the next folder
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                os.replace(temp, os.path.join(folder, name))
                _sweep(folder)
                return True
            except OSError:
                try:
                    os.unlink(temp)
                except OSError:
                    pass
        return False

    def new_path(self, name: str) -> tuple[str, str] | None:
        """(a temporary path to build the entry `name` in, where to `os.replace` it to once built), in the first folder that can be written; None when none can.

        For entries another library writes itself (a DuckDB database): the caller
        builds at the first path and renames; `path_of` finds it again.
        """
        for folder in self.folders:
            try:
                os.makedirs(folder, mode=0o700, exist_ok=True)
                fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{name[:40]}-", suffix=".tmp")
                os.close(fd)
                os.unlink(temp)  # the builder makes the file itself
                return temp, os.path.join(folder, name)
            except OSError:
                continue
        return None

    def paths_of(self, name: str) -> list[str]:
        """The existing files called `name`, beside the run first."""
        return [path for path in (os.path.join(folder, name) for folder in self.folders) if os.path.isfile(path)]

    def signature(self, text: str) -> str:
        """`text` signed with this user's key (hex): what a database entry stores to prove it is ours; "" without a key."""
        return "" if self._key is None else self._sign(text.encode()).hex()
