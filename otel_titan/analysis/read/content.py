"""What a file holds, named by its bytes: the content keys of the analysis cache, and reads of a
byte range.

Why by content: runs live on Lustre, GPFS and NFS, where the device number
differs per client, mtimes come from the writer's clock and attribute caches
serve stale sizes. So what a read learned is keyed by the bytes it read, not
by ``st_dev``/inode/mtime: a copied run still hits, a rewritten file never does.

A file's *written content* is its bytes up to the end of its last complete
line (its last newline). What follows is "not written yet": a partial line
(the writer is mid-line, or died mid-line) or a tail of NUL bytes (a client
that sees the file's new size before its new bytes, or a preallocated
extent); it is read again every time, never cached. A NUL byte within the
last `BLOCK_BYTES` before the end makes the content end at the last newline
before it, so a hole a client has not seen filled yet is never cached.

A `ContentKey` names the written content by its length, a hash of its first
block and a hash of the block before its end (blake2b, 128 bits, blocks of
16 KiB): one or two small reads however big the file, so keying a 1,024-rank
run costs about 0.1 s on local disk (64 KiB blocks cost 0.5 s there, on a busy
machine: the hashing). What it cannot see: a rewrite that keeps the length,
the first and the last 16 KiB and changes only bytes in between (no writer of
these files does that; they append).

Example:
    >>> import os, tempfile
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = os.path.join(folder.name, "x.jsonl")
    >>> _ = open(path, "wb").write(b'{"a": 1}\\n{"b": 2}\\n{"c":')
    >>> key = content_key(path)
    >>> key.length, key.size      # two complete lines; the third is not written yet
    (18, 23)
    >>> _ = open(path, "ab").write(b' 3}\\n')
    >>> is_prefix(path, key), content_key(path).length
    (True, 27)
    >>> folder.cleanup()
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import BinaryIO

__all__ = ["BLOCK_BYTES", "ContentKey", "RangeReader", "content_key", "is_prefix", "read_range"]

#: The blocks hashed at each end of the written content.
BLOCK_BYTES = 16 << 10


@dataclass(frozen=True)
class ContentKey:
    """One file's written content: `name` (its base name), `length` (bytes up to its last complete
    line), hashes of its first and last block.

    `size` is the file's size when keyed and `rest` a hash of the bytes from
    `length` to `size` (the partial line, or NULs): not part of the content,
    but a read that consumed them (an answer, not a cache entry) depends on them.
    """

    name: str
    length: int
    head: str
    tail: str
    size: int
    rest: str

    def same_content(self, other: ContentKey) -> bool:
        """The same written content (whatever the file is called now: a rotated segment changes its
        name, never its bytes)."""
        return (self.length, self.head, self.tail) == (other.length, other.head, other.tail)


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _digest_range(handle: BinaryIO, start: int, stop: int) -> str:
    """`_digest` of bytes `start`..`stop`, read a block at a time: a torn last line of 2 GB costs a
    block of memory."""
    digest = hashlib.blake2b(digest_size=16)
    handle.seek(start)
    left = stop - start
    while left > 0:
        block = handle.read(min(BLOCK_BYTES, left))
        if not block:
            break
        digest.update(block)
        left -= len(block)
    return digest.hexdigest()


def read_range(handle: BinaryIO, start: int, stop: int) -> bytes:
    """Bytes `start`..`stop` of an open file (fewer when it is shorter)."""
    handle.seek(start)
    return handle.read(max(0, stop - start))


def _content_end(handle: BinaryIO, size: int, window: bytes, window_start: int) -> int:
    """Where the written content ends: after the last newline (before the first NUL of the last
    block), 0 when none.

    `window` holds the file's bytes from `window_start` to `size` (the last ones read already).
    """
    last_block = max(window_start, size - BLOCK_BYTES) - window_start
    hole = window.find(b"\0", last_block)
    # a hole not filled yet on this client: nothing after it is content
    end = hole if hole >= 0 else len(window)
    newline = window.rfind(b"\n", 0, end)
    if newline >= 0:
        return window_start + newline + 1
    end = window_start
    while end > 0:  # one line longer than the window: look further back
        start = max(0, end - BLOCK_BYTES)
        newline = read_range(handle, start, end).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def content_key(path: str) -> ContentKey | None:
    """The `ContentKey` of the file at `path` now; None when it cannot be read (gone, or no
    permission).

    One read of the last 32 KiB (and one of the first 16 KiB for a bigger file).

    Example:
        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     path = os.path.join(folder, "x.jsonl")
        ...     _ = open(path, "wb").write(b'{"a": 1}\\n' + bytes(100))
        ...     content_key(path).length  # the NULs after the last line are not written yet
        9
    """
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            window_start = max(0, size - 2 * BLOCK_BYTES)
            window = read_range(handle, window_start, size)
            length = _content_end(handle, size, window, window_start)

            def span(start: int, stop: int) -> bytes:
                if start >= window_start and stop <= window_start + len(window):
                    return window[start - window_start : stop - window_start]
                return read_range(handle, start, stop)

            head = _digest(span(0, min(length, BLOCK_BYTES)))
            tail = _digest(span(max(0, length - BLOCK_BYTES), length))
            rest = _digest_range(handle, length, size) if size > length else ""
    except OSError:
        return None
    return ContentKey(os.path.basename(path), length, head, tail, size, rest)


def is_prefix(path: str, key: ContentKey) -> bool:
    """Whether the file at `path` still begins with the content `key` names (it was appended to,
    never rewritten).

    Reads the two blocks `key` hashed, at the same places: a file that grew
    is checked without reading what it grew by.
    """
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < key.length:
                return False
            if key.length and read_range(handle, key.length - 1, key.length) != b"\n":
                return False
            head = _digest(read_range(handle, 0, min(key.length, BLOCK_BYTES)))
            tail = _digest(read_range(handle, max(0, key.length - BLOCK_BYTES), key.length))
    except OSError:
        return False
    return (head, tail) == (key.head, key.tail)


class RangeReader:
    """A file read from `start` to `stop` only, as a binary stream (what `read.lines.file_records`
    reads), counting the newlines it hands out.

    Why: the cache resumes a file where its cached content ended and stops at
    the content key's end, so that what was read is exactly what the key names,
    even if the writer appends meanwhile.

    Example:
        >>> import io
        >>> reader = RangeReader(io.BytesIO(b"a\\nb\\nc\\n"), 2, 4)
        >>> reader.read(100), reader.read(100), reader.newlines
        (b'b\\n', b'', 1)
    """

    def __init__(self, handle: BinaryIO, start: int, stop: int | None) -> None:
        self.handle = handle
        self.left = None if stop is None else max(0, stop - start)
        self.newlines = 0
        handle.seek(start)

    def read(self, size: int = -1) -> bytes:
        if self.left is not None:
            size = self.left if size < 0 else min(size, self.left)
        data = self.handle.read(size)
        if self.left is not None:
            self.left -= len(data)
        self.newlines += data.count(b"\n")
        return data

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
