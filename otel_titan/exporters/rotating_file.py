"""A size-bounded, append-only file of whole lines, written with raw `os.write`.

Why not `logging.handlers.RotatingFileHandler` or a buffered file object:

* raw, unbuffered writes leave nothing in a user-space buffer, so a forked
  child can never flush a copy of the parent's data into the file, and what
  `write_lines` returned from is in the kernel (it survives SIGKILL);
* lines are never split across segments, so every segment parses on its own;
* ``backup_count=0`` still bounds the disk (the active file is replaced),
  where ``RotatingFileHandler`` would grow forever;
* a file deleted or moved under us (the run directory was cleaned up) is
  noticed and recreated instead of writing into an unlinked inode; the path is
  made absolute at construction, so an ``os.chdir`` is never taken for a deletion.

Segments: ``X.jsonl`` is the active one, ``X.jsonl.1`` the newest older one,
``X.jsonl.<backup_count>`` the oldest. Disk use stays under about
``(backup_count + 1) × max_bytes``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

__all__ = ["RotatingFile"]

#: Files are created rw for owner and group at most; the process umask applies on top.
FILE_MODE = 0o664


class RotatingFile:
    """Append whole lines to `path`, rotating at `max_bytes` and keeping `backup_count` segments.

    Raises `OSError` from the constructor when the file cannot be created, and
    from `write_lines` when a write fails (the caller decides what to count);
    a later call retries, reopening the file if needed.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> f = RotatingFile(os.path.join(d, "x.jsonl"), max_bytes=10, backup_count=1)
        >>> f.write_lines([b"0123456789\\n", b"abc\\n"])
        >>> sorted(os.listdir(d))
        ['x.jsonl', 'x.jsonl.1']
        >>> f.close()
    """

    #: After a failed rotation, how long to keep appending before trying again.
    ROTATION_RETRY_S = 10.0

    def __init__(
        self, path: str, max_bytes: int, backup_count: int, liveness_interval_s: float = 0.0
    ) -> None:
        """`liveness_interval_s`: how often to check that the file still exists at its path
        (0: before every write; one `stat` per batch, so a record is never written
        into a file that was deleted before the batch)."""
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        if backup_count < 0:
            raise ValueError(f"backup_count must be >= 0, got {backup_count}")
        # Absolute once: a relative path re-checked after an os.chdir would name
        # another file, and the writer would think this one was deleted.
        self.path = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
        self.max_bytes = max_bytes
        self.backup_count = backup_count
        self.liveness_interval_s = liveness_interval_s
        self._fd = -1
        self._size = 0
        self._inode: tuple[int, int] | None = None
        self._torn = False  # a partial line was written: start the next write on a new line
        self._next_check = 0.0
        self._next_rotation_attempt = 0.0
        self.rotations = 0
        #: The error of the last failed rotation (None once one succeeds); the file grows meanwhile.
        self.rotation_error: OSError | None = None
        self._open()

    # -- file handling ------------------------------------------------------------------------
    def _open(self) -> None:
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
        stat = os.fstat(fd)
        self._fd = fd
        self._size = stat.st_size
        self._inode = (stat.st_dev, stat.st_ino)
        self._next_check = time.monotonic() + self.liveness_interval_s

    def _close_fd(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1

    def _still_ours(self) -> bool:
        try:
            stat = os.stat(self.path)
        except OSError:
            return False
        return (stat.st_dev, stat.st_ino) == self._inode

    def _ensure_open(self) -> None:
        now = time.monotonic()
        if self._fd >= 0 and now < self._next_check:
            return
        self._next_check = now + self.liveness_interval_s
        if self._fd >= 0 and self._still_ours():
            return
        # Deleted, moved, or closed after an error: start a fresh file at the path.
        self._close_fd()
        self._open()

    def segment_paths(self) -> list[str]:
        """Existing segments, oldest first (the order a reader should use)."""
        older = [f"{self.path}.{i}" for i in range(self.backup_count, 0, -1)]
        return [p for p in older if os.path.exists(p)] + (
            [self.path] if os.path.exists(self.path) else []
        )

    def _rotate(self) -> None:
        try:
            self._rotate_now()
        except OSError as error:
            # The directory turned read-only (or full): keep appending to the
            # current file past its limit rather than lose records; retry later.
            self.rotation_error = error
            if self._fd < 0:
                self._open()
            self._next_rotation_attempt = time.monotonic() + self.ROTATION_RETRY_S
        else:
            self.rotation_error = None

    def _rotate_now(self) -> None:
        # Rename while the descriptor stays open: if the directory refuses
        # (read-only, full), the current file is still ours to append to.
        if self.backup_count == 0:
            os.unlink(self.path)
        else:
            oldest = f"{self.path}.{self.backup_count}"
            if os.path.exists(oldest):
                os.unlink(oldest)
            for index in range(self.backup_count - 1, 0, -1):
                source = f"{self.path}.{index}"
                if os.path.exists(source):
                    os.replace(source, f"{self.path}.{index + 1}")
            os.replace(self.path, f"{self.path}.1")
        self.rotations += 1
        self._close_fd()
        self._open()

    # -- writing ------------------------------------------------------------------------------
    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        written_any = False
        try:
            while view:
                count = os.write(self._fd, view)
                written_any = True
                view = view[count:]
        except OSError:
            if written_any:
                # A partial write (the disk filled mid-batch) would leave half a
                # line: cut the file back to its last whole line, or failing
                # that start the next write on a new line.
                try:
                    os.ftruncate(self._fd, self._size)
                    view = memoryview(data)  # nothing of this write is left
                except OSError:
                    self._torn = True
            # Reopen on the next call: the fd may be unusable (EIO, a remounted disk).
            self._close_fd()
            raise
        finally:
            self._size += len(data) - len(view)

    def write_lines(self, lines: Sequence[bytes]) -> None:
        """Append `lines` (each ending in a newline), rotating between lines as needed."""
        if not lines:
            return
        self._ensure_open()
        if self._torn:
            self._write_all(b"\n")
            self._torn = False
        if (
            self._size + sum(map(len, lines)) <= self.max_bytes
            or time.monotonic() < self._next_rotation_attempt
        ):
            self._write_all(b"".join(lines))  # the usual case: no rotation inside this batch
            return
        chunk: list[bytes] = []
        chunk_size = 0
        limit = self.max_bytes
        for line in lines:
            size = len(line)
            if (
                self._size + chunk_size + size > limit
                and (self._size + chunk_size) > 0
                and time.monotonic() >= self._next_rotation_attempt
            ):
                if chunk:
                    self._write_all(b"".join(chunk))
                    chunk, chunk_size = [], 0
                if self._size > 0:
                    self._rotate()
            chunk.append(line)
            chunk_size += size
        if chunk:
            self._write_all(b"".join(chunk))

    @property
    def size(self) -> int:
        """Bytes in the active segment."""
        return self._size

    def close(self) -> None:
        """Close the file descriptor (idempotent)."""
        self._close_fd()

    def close_after_fork(self) -> None:
        """In a forked child: drop the inherited descriptor without touching the file."""
        self._close_fd()
