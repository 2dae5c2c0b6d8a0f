"""Follow a run folder while it is written: each refresh reads only the bytes appended since the
last one.

Why a follower of its own rather than `read.records.read_run` in a loop: a full
read of 1,024 growing files costs seconds to minutes; a refresh must cost a
fraction of a second, so it keeps, per process, where it stopped reading and
reads from there (`FileCursor`). It is the incremental read of the ``read/``
layer (issue 19): `RunFollower.poll` is a pure "what is new" step,
independent of what is done with the records.

What it tolerates, each the way a writer can leave a file while it runs:

* **a torn last line** (a write in progress, or a process killed mid-write):
  bytes after the last newline are not read yet; they are read once their
  newline arrives. `FileCursor.torn_since` says since when (the watcher's
  clock) a partial line has sat unchanged: a crash, not a write in progress;
* **a NUL tail or hole** (NFS and some filesystems show a file's new size
  before its bytes; a crash can leave zero-filled blocks): a line that starts
  with NUL bytes is "not written yet" and is retried; after `NUL_RETRIES`
  refreshes with the same bytes it is skipped (counted), so a hole that is
  never filled cannot stop the follow;
* **rotation** (``X.jsonl`` renamed to ``X.jsonl.1``, a new ``X.jsonl``):
  the old file's inode is looked for among the segments and its last bytes
  read before the new file is read from its start; where it was deleted
  (``backup_count=0``) its unread bytes are counted as lost;
* **new files** (ranks joining late, a restart's new attempt): found at each
  refresh by listing the folder;
* **files that disappear** (deleted, moved away): the process is kept,
  marked `gone`, and what was read from it stays known; a folder that
  cannot be listed (no file descriptor left, EMFILE) makes no file gone: the
  known files are read as they are, and the failure is counted;
* **a file rewritten in place** (smaller than the offset already read): read
  again from the start as a new file (counted in `restarts`);
* **a line longer than `lines.MAX_LINE_BYTES`** (16 MiB, more than a refresh
  may hold as one line): skipped up to its newline and counted, as every
  reader skips it, so the follow never stops on it (re-reading its first
  32 MiB at every refresh) and it is not taken for a torn line.

Every line goes through `read.lines.file_records` (the same parsing and
checks as every other command: invalid UTF-8, lone surrogates, NaN), and
each process's identity through `read.records`'s own rule, so `watch` and
`summarize` see the same records.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from typing import Any

from otel_titan.analysis.read.lines import MAX_LINE_BYTES, SkippedLines, file_records
from otel_titan.analysis.read.records import _SEGMENT, ProcessLog, _identify, find_log_dir

__all__ = [
    "FileCursor",
    "RunFollower",
    "Batch",
    "NUL_RETRIES",
    "MAX_READ_BYTES",
    "FIRST_READ_BYTES",
]

#: Refreshes a NUL-headed line may stay as it is before it is skipped as a hole that will not be
#: filled.
NUL_RETRIES = 3
#: At most this many bytes of one file per refresh (the rest next time): one refresh's memory stays
#: bounded.
MAX_READ_BYTES = 32 << 20
#: A file already bigger than this when first seen is read from its last this-many bytes (its first
#: record still gives its identity): starting `watch` on a day-old run must not read its gigabytes
#: first.
FIRST_READ_BYTES = 8 << 20


@dataclass
class FileCursor:
    """Where reading of one process's active file stands."""

    process: ProcessLog
    #: (st_dev, st_ino) of the active file being read; None before the first read.
    identity: tuple[int, int] | None = None
    offset: int = 0
    #: Size seen at the last refresh, and the watcher's time at which the file last grew.
    size: int = 0
    grew_at: float | None = None
    #: Since when (watcher's clock) bytes after the last newline sat unchanged (None: the file ends
    #: with a newline).
    torn_since: float | None = None
    torn_bytes: int = 0
    #: Offset of a NUL-headed line being retried, and how many refreshes it has been seen.
    nul_at: int | None = None
    nul_seen: int = 0
    gone: bool = False
    rotations: int = 0
    restarts: int = 0
    lost_bytes: int = 0
    #: Bytes skipped when the file was first seen already big (FIRST_READ_BYTES); its start was not
    #: read.
    skipped_head: int = 0
    bytes_read: int = 0
    #: The active file's modification time (epoch seconds) at the last refresh, and whether it has
    #: been read yet.
    mtime: float | None = None
    reads: int = 0
    #: The file's first bytes: a file deleted and created again can get the same inode
    #: (backup_count=0 rotation), its first line (time, pid) cannot be the same.
    head: bytes = b""
    #: Inside a line longer than MAX_LINE_BYTES: what is read is dropped up to its newline.
    overlong: bool = False


@dataclass
class Batch:
    """What one refresh brought: new records per process, new and vanished processes, bytes read."""

    records: list[tuple[FileCursor, list[dict[str, Any]]]] = field(default_factory=list)
    new: list[FileCursor] = field(default_factory=list)
    gone: list[FileCursor] = field(default_factory=list)
    bytes_read: int = 0


class RunFollower:
    """Incremental reader of one run folder; `poll` returns what was appended since the previous
    poll.

    Example:
        >>> import tempfile, os, time
        >>> run = tempfile.mkdtemp(); os.mkdir(os.path.join(run, "structured_logs"))
        >>> path = os.path.join(run, "structured_logs", "training.global_rank_0.20260101-000000-abcdef.jsonl")
        >>> with open(path, "wb") as f: _ = f.write(b'{"log_type_name": "a_start", "time_us": 1}\\n{"log_type_name": "a_e')
        >>> follower = RunFollower(run)
        >>> [r["log_type_name"] for _, rs in follower.poll(now=1.0).records for r in rs]
        ['a_start']
        >>> with open(path, "ab") as f: _ = f.write(b'nd", "time_us": 2}\\n')
        >>> [r["log_type_name"] for _, rs in follower.poll(now=2.0).records for r in rs]
        ['a_end']
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        skipped: SkippedLines | None = None,
        first_read_bytes: int = FIRST_READ_BYTES,
    ) -> None:
        self.run_dir, self.log_dir, self.only_base = find_log_dir(path)
        self.skipped = skipped if skipped is not None else SkippedLines(log=False)
        self.first_read_bytes = first_read_bytes
        self.cursors: dict[str, FileCursor] = {}
        self.bytes_read = 0
        self.polls = 0

    def poll(self, now: float) -> Batch:
        """One refresh at watcher time `now` (seconds, any monotonic clock): new files, appended
        records, vanished files."""
        self.polls += 1
        batch = Batch()
        chains = self._list()
        if chains is None:
            # The folder could not be listed (EMFILE, a remount): no file is new or gone, the known
            # ones are read as they are.
            chains = {
                base: cursor.process.segments
                for base, cursor in self.cursors.items()
                if not cursor.gone
            }
        for base, segments in chains.items():
            if base not in self.cursors:
                cursor = FileCursor(process=_identify(base, segments))
                self.cursors[base] = cursor
                batch.new.append(cursor)
        for base, cursor in self.cursors.items():
            if base not in chains:
                if not cursor.gone:
                    cursor.gone = True
                    batch.gone.append(cursor)
                continue
            if cursor.gone:
                cursor.gone = False  # it came back (a copy, a remount)
            cursor.process.segments = chains[base]
            records = self._advance(cursor, now)
            if records:
                batch.records.append((cursor, records))
        batch.bytes_read = sum(c.bytes_read for c in self.cursors.values()) - self.bytes_read
        self.bytes_read += batch.bytes_read
        return batch

    # -- discovery -----------------------------------------------------------------------------
    def _list(self) -> dict[str, list[str]] | None:
        """base path → its segments, oldest first (the same rule as `read.records.read_run`); None
        when the folder cannot be listed."""
        chains: dict[str, list[tuple[int, str]]] = {}
        try:
            entries = list(os.scandir(self.log_dir))
        except OSError as error:
            self.skipped.add(self.log_dir, 0, f"cannot list the folder ({error.strerror or error})")
            return None
        for entry in entries:
            match = _SEGMENT.match(entry.name)
            if match is None:
                continue
            base = os.path.join(self.log_dir, match.group("base"))
            if self.only_base is not None and base != self.only_base:
                continue
            chains.setdefault(base, []).append((int(match.group("segment") or 0), entry.path))
        return {
            base: [p for _, p in sorted(items, key=lambda item: (item[0] == 0, -item[0]))]
            for base, items in chains.items()
            if any(n == 0 for n, _ in items)
        }

    # -- reading -------------------------------------------------------------------------------
    def _advance(self, cursor: FileCursor, now: float) -> list[dict[str, Any]]:
        base = cursor.process.base
        try:
            info = os.stat(base)
        except OSError:
            return []
        identity = (info.st_dev, info.st_ino)
        cursor.mtime = info.st_mtime
        records: list[dict[str, Any]] = []
        if cursor.identity is None:
            cursor.identity = identity
            # The older segments already there are read first (oldest first), within
            # FIRST_READ_BYTES from the end.
            budget = self.first_read_bytes - info.st_size
            older = []
            for path in reversed(cursor.process.segments[:-1]):
                if budget <= 0:
                    break
                try:
                    size = os.path.getsize(path)
                except OSError:
                    continue
                older.append((path, max(0, size - budget)))
                budget -= size
            for path, start in reversed(older):
                cursor.offset = self._line_start(path, start) if start else 0
                cursor.skipped_head += cursor.offset
                records.extend(self._read(cursor, path, now, final=True) or [])
            cursor.offset = 0
            if info.st_size > self.first_read_bytes:
                start = self._line_start(base, info.st_size - self.first_read_bytes)
                cursor.offset = start
                cursor.skipped_head += start
        elif identity != cursor.identity:
            # Rotated: finish the old file (now a numbered segment, found by inode), then every
            # segment rotated after it (several rotations can happen between two refreshes), then
            # the new active file from 0.
            old = self._find_inode(cursor)
            if old is not None:
                records.extend(self._read(cursor, old, now, final=True) or [])
                segments = cursor.process.segments
                for path in segments[segments.index(old) + 1 : -1]:
                    cursor.offset = 0
                    records.extend(self._read(cursor, path, now, final=True) or [])
                    cursor.rotations += 1
            else:
                cursor.lost_bytes += max(0, cursor.size - cursor.offset)
            cursor.rotations += 1
            cursor.identity, cursor.offset, cursor.size, cursor.head, cursor.overlong = (
                identity,
                0,
                0,
                b"",
                False,
            )
            cursor.torn_since, cursor.nul_at, cursor.nul_seen = None, None, 0
        elif info.st_size < cursor.offset:
            self._restart(cursor)
        if info.st_size != cursor.size:
            cursor.grew_at = now
        if info.st_size > cursor.offset:
            got = self._read(cursor, base, now, final=False)
            if got is None:  # its first bytes changed: a new file under the same name and inode
                self._restart(cursor)
                got = self._read(cursor, base, now, final=False) or []
            records.extend(got)
        cursor.size = info.st_size
        cursor.reads += 1
        return records

    @staticmethod
    def _restart(cursor: FileCursor) -> None:
        """A new file under the same name and inode (rewritten in place, or deleted and created
        again)."""
        cursor.restarts += 1
        cursor.lost_bytes += max(0, cursor.size - cursor.offset)
        (
            cursor.offset,
            cursor.size,
            cursor.torn_since,
            cursor.nul_at,
            cursor.head,
            cursor.overlong,
        ) = 0, 0, None, None, b"", False

    def _find_inode(self, cursor: FileCursor) -> str | None:
        for path in cursor.process.segments:
            try:
                info = os.stat(path)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) == cursor.identity:
                return path
        return None

    @staticmethod
    def _line_start(path: str, offset: int) -> int:
        """The first line start at or after `offset` (the byte after a newline)."""
        try:
            with open(path, "rb") as handle:
                handle.seek(max(0, offset - 1))
                chunk = handle.read(1 << 20)
        except OSError:
            return 0
        index = chunk.find(b"\n")
        return offset if index < 0 else max(0, offset - 1) + index + 1

    def _read(
        self, cursor: FileCursor, path: str, now: float, *, final: bool
    ) -> list[dict[str, Any]] | None:
        """The complete lines after `cursor.offset`; None when the file's first bytes are not the
        ones seen before."""
        try:
            with open(path, "rb") as handle:
                if cursor.head and cursor.offset and not final:
                    # A file deleted and created again can get the same inode (backup_count=0
                    # rotation); its first line (time, pid) cannot be the same. Checked in the same
                    # open as the read.
                    if handle.read(len(cursor.head)) != cursor.head:
                        return None
                handle.seek(cursor.offset)
                data = handle.read(MAX_READ_BYTES)
                if len(cursor.head) < 64 and not final:
                    handle.seek(0)
                    cursor.head = handle.read(64)
        except OSError as error:
            self.skipped.add(path, 0, f"cannot read ({error.strerror or error})")
            return []
        cursor.bytes_read += len(data)
        if cursor.overlong:
            newline = data.find(b"\n")
            if newline < 0:
                cursor.offset += len(data)
                return []
            cursor.offset += newline + 1
            data, cursor.overlong = data[newline + 1 :], False
        end = data.rfind(b"\n") + 1  # complete lines only; 0 when none
        if not end and len(data) > MAX_LINE_BYTES and not final:
            # No newline in more than a line may hold: not a record (every reader skips it), and not
            # a torn line either.
            self.skipped.add(
                path, 0, f"line longer than {MAX_LINE_BYTES >> 20} MiB at offset {cursor.offset}"
            )
            cursor.offset += len(data)
            cursor.overlong = True
            cursor.torn_since, cursor.torn_bytes = None, 0
            return []
        complete, rest = data[:end], data[end:]
        if rest.strip(b"\0"):
            if cursor.torn_since is None or cursor.torn_bytes != len(rest):
                cursor.torn_since, cursor.torn_bytes = now, len(rest)
        else:
            cursor.torn_since, cursor.torn_bytes = None, 0
        if final and rest:
            # the old segment will never grow: its last partial line is read as is
            complete += rest + b"\n"
            end = len(data)
        hole = complete.find(b"\0")
        if hole >= 0:
            line_start = complete.rfind(b"\n", 0, hole) + 1
            at = cursor.offset + line_start
            if cursor.nul_at == at and cursor.nul_seen + 1 >= NUL_RETRIES:
                # A hole that stays: skip that line, count it, and go on after it.
                line_end = complete.find(b"\n", hole) + 1
                self.skipped.add(
                    path, 0, f"NUL bytes at offset {at} (a hole the writer never filled)"
                )
                records = self._parse(path, complete[:line_start])
                cursor.offset += line_end
                cursor.nul_at, cursor.nul_seen = None, 0
                return (
                    records + (self._read(cursor, path, now, final=final) or [])
                    if line_end < len(complete)
                    else records
                )
            cursor.nul_seen = cursor.nul_seen + 1 if cursor.nul_at == at else 1
            cursor.nul_at = at
            complete = complete[:line_start]
            end = line_start
        else:
            cursor.nul_at, cursor.nul_seen = None, 0
        cursor.offset += end
        return self._parse(path, complete)

    def _parse(self, path: str, complete: bytes) -> list[dict[str, Any]]:
        if not complete:
            return []
        return list(file_records(path, self.skipped, source=io.BytesIO(complete)))
