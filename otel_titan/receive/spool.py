"""Received records → per-process JSONL files laid out as a run: ``SPOOL/structured_logs/<file>``.

Why files, and not records handed to the detector in memory: `watch` already
follows files (rotation, new processes, torn lines), and the spool is a run
that every other command reads afterwards; one path for detection, nothing
received is lost when `watch` exits.

Order. Each process numbers its records (``seq_id``, from 1). Batches can
arrive out of order through a collector with several export workers, or
twice (a retry after a timeout whose first attempt did arrive). A start
written after its end would leave a span open forever, and a hung rank is
named by its open span, so records are written in ``seq_id`` order only: a
duplicate (a number already written) is dropped; a record past a gap is held
until the gap is filled, or for `hold_s` (1 s) at most, after which the gap
is skipped and counted as lost (a full queue on the rank, a collector that
dropped a batch). A record without a number is written as it comes. At most
`MAX_HELD` records wait per process: past that the gap is skipped at once.

A number from the network can be wrong (forged, a collector's bug, a
restarted process that reuses its file name), and one wrong number must not
swallow the process: every later record would fall below it and be dropped
as a duplicate. So a gap is skipped only when the stream left it behind (no
record arrived in order during the hold; records that are far ahead of a
stream still arriving in order are dropped, counted `out_of_sequence`); a
skip that landed on a lone record, after which nothing followed it, is
undone when the numbers before it arrive (the lone record is counted
`out_of_sequence`, the gap no longer `lost`); and a new opening record
(number 1, other bytes than the first one's) starts the process's stream
again.

Writes. A request is answered once its records are written; when they
cannot be (a full disk, no file descriptor left, a path that is a folder)
`add` raises `SpoolWriteError` and leaves the order as it was before the
request, so the sender's retry of the same records is written, not dropped
as duplicates.

Size. Each process's spool file rotates as the ranks' own files do (at
`max_bytes`, 128 MB by default, into ``X.jsonl.1`` … ``X.jsonl.<backup_count>``,
3 by default, the oldest deleted), so a job of days fills the watching
machine's disk no more than its ranks' files fill theirs; the follower reads
through rotation as it does for any run.

File names come from the network: a name that is not a plain file name
(separators, ``..``, control characters, too long) is made one (each
offending character becomes ``_``), so nothing is ever written outside the
spool's ``structured_logs/`` folder.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_titan.receive.decode import ReceivedRecord

__all__ = ["Spool", "SpoolWriteError", "safe_file_name", "MAX_HELD"]

#: Records held per process past a gap before the gap is skipped regardless of `hold_s`.
MAX_HELD = 100_000


class SpoolWriteError(OSError):
    """Records could not be written to the spool (the message says which file and why); nothing of
    the request was taken."""


_UNSAFE = re.compile(r"[^A-Za-z0-9_.+=@,-]")
_MAX_NAME = 200


def safe_file_name(name: str) -> str:
    """`name` as a plain ``.jsonl`` file name: no folder, no hidden file, no control character, at
    most 200 characters.

    Example:
        >>> safe_file_name("training.global_rank_3.20260101-000000-abcdef.jsonl")
        'training.global_rank_3.20260101-000000-abcdef.jsonl'
        >>> safe_file_name("../../etc/passwd")
        '__._etc_passwd.jsonl'
    """
    cleaned = _UNSAFE.sub("_", name)
    cleaned = cleaned.lstrip(".")
    if cleaned.endswith(".jsonl"):
        cleaned = cleaned[: -len(".jsonl")]
    cleaned = cleaned.replace("..", "_.")[:_MAX_NAME] or "unnamed"
    return cleaned + ".jsonl"


@dataclass
class _Process:
    path: str
    size: int = 0
    next_seq: int = 1
    held: dict[int, bytes] = field(default_factory=dict)
    held_since: float | None = None
    written: int = 0
    #: When a record last arrived in order (watcher time): a stream still arriving in order left no
    #: gap behind.
    in_order_at: float | None = None
    #: The last skip, while it may be undone: (the number skipped from, the number landed on,
    #: next_seq right after).
    jump: tuple[int, int, int] | None = None
    #: The line of the record numbered 1: another line under that number is a new process reusing
    #: the file name.
    first_line: bytes | None = None
    #: Numbers skipped (never received).
    lost: int = 0

    def order(self) -> tuple[Any, ...]:
        """Where the order stands, to be put back when a write fails."""
        return (
            self.next_seq,
            dict(self.held),
            self.held_since,
            self.in_order_at,
            self.jump,
            self.first_line,
            self.lost,
        )

    def restore(self, order: tuple[Any, ...]) -> None:
        (
            self.next_seq,
            self.held,
            self.held_since,
            self.in_order_at,
            self.jump,
            self.first_line,
            self.lost,
        ) = order


class Spool:
    """Write received records to ``folder/structured_logs/`` in each process's order (module
    docstring); thread-safe.

    Example:
        >>> import tempfile, os
        >>> from otel_titan.receive.decode import ReceivedRecord
        >>> spool = Spool(tempfile.mkdtemp())
        >>> spool.add([ReceivedRecord("p.jsonl", 2, b'{"seq_id": 2}'), ReceivedRecord("p.jsonl", 1, b'{"seq_id": 1}')], now=0.0)
        >>> open(os.path.join(spool.log_dir, "p.jsonl")).read()
        '{"seq_id": 1}\\n{"seq_id": 2}\\n'
    """

    def __init__(
        self, folder: str, *, hold_s: float = 1.0, max_bytes: int = 128 << 20, backup_count: int = 3
    ) -> None:
        self.folder = os.path.abspath(folder)
        self.log_dir = os.path.join(self.folder, "structured_logs")
        # OSError: the caller says which folder could not be made
        os.makedirs(self.log_dir, exist_ok=True)
        self.hold_s = hold_s
        self.max_bytes = max_bytes
        self.backup_count = backup_count
        #: Rotations done (all processes).
        self.rotations = 0
        self._lock = threading.Lock()
        self._processes: dict[str, _Process] = {}
        self._by_path: dict[str, _Process] = {}
        #: Records written; numbers received twice (dropped); numbers never received (skipped after
        #: `hold_s`); records whose line is not one JSON object on one line (dropped); failed writes
        #: (records lost).
        self.written = 0
        self.duplicates = 0
        self.malformed = 0
        self.failed = 0
        #: Records whose number did not fit their process's stream (far ahead of it, or a skip
        #: undone); new streams under a used name.
        self.out_of_sequence = 0
        self.restarts = 0
        self.write_error: str | None = None

    @property
    def lost(self) -> int:
        """Numbers never received (gaps skipped after `hold_s`), all processes."""
        return sum(p.lost for p in list(self._processes.values()))

    @property
    def processes(self) -> int:
        """Processes heard from."""
        return len(self._processes)

    def add(self, records: Iterable[ReceivedRecord], now: float) -> None:
        """Take one request's records (watcher time `now`, seconds); write what is in order;
        `SpoolWriteError` when it cannot."""
        with self._lock:
            out: dict[str, list[bytes]] = {}
            before: dict[str, tuple[Any, ...]] = {}
            for record in records:
                line = record.line
                if not line.startswith(b"{") or b"\n" in line or b"\r" in line:
                    self.malformed += 1
                    continue
                process = self._process(record.file)
                if process.path not in before:
                    before[process.path] = process.order()
                self._place(process, record.seq, line, out.setdefault(process.path, []), now)
            failed = self._write(out)
            for path in failed:
                self._by_path[path].restore(before[path])
            if failed:
                raise SpoolWriteError(self.write_error or "cannot write the spool")

    def _place(
        self, process: _Process, seq: int, line: bytes, lines: list[bytes], now: float
    ) -> None:
        """One numbered record into its process's order: written, held past a gap, or dropped (a
        duplicate)."""
        if seq <= 0:
            lines.append(line)
            return
        if seq == 1:
            if process.first_line is None:
                process.first_line = line
            elif line != process.first_line and process.next_seq > 1:
                # Another process's opening record under this name (a restart reusing it): its
                # stream starts again.
                self.restarts += 1
                (
                    process.next_seq,
                    process.held,
                    process.held_since,
                    process.jump,
                    process.first_line,
                ) = 1, {}, None, None, line
        if seq < process.next_seq and process.jump is not None and self._undo_jump(process, seq):
            pass  # the numbers before a lone record arrive after all: it was the wrong one, the stream goes on from here
        if seq < process.next_seq or seq in process.held:
            self.duplicates += 1
        elif seq == process.next_seq:
            lines.append(line)
            process.next_seq += 1
            process.in_order_at = now
            process.jump = None
            self._release(process, lines)
        else:
            process.held[seq] = line
            if process.held_since is None:
                process.held_since = now
            if len(process.held) > MAX_HELD:
                self._skip_gap(process, lines, now)

    def _undo_jump(self, process: _Process, seq: int) -> bool:
        """Undo the last skip if `seq` lies in the gap it skipped and the skip landed on one record
        that nothing followed."""
        skipped_from, landed_on, next_after = process.jump  # type: ignore[misc]  # called only after a jump was recorded
        if not (
            skipped_from <= seq < landed_on
            and next_after == landed_on + 1
            and process.next_seq == next_after
        ):
            return False
        # the numbers from `seq` on are the stream's after all; those before it stay lost
        process.lost -= landed_on - seq
        self.out_of_sequence += 1
        # Records held past the lone one are kept (they may be as wrong as it, or the stream's: they
        # wait their hold).
        process.next_seq, process.jump = seq, None
        return True

    def tick(self, now: float) -> None:
        """Skip the gaps held for `hold_s` or longer (called a few times a second)."""
        with self._lock:
            out: dict[str, list[bytes]] = {}
            before: dict[str, tuple[Any, ...]] = {}
            for process in self._processes.values():
                if process.held_since is not None and now - process.held_since >= self.hold_s:
                    before[process.path] = process.order()
                    if (
                        process.in_order_at is not None
                        and process.in_order_at > process.held_since
                        and now != float("inf")
                    ):
                        # the stream still arrives in order: it left no gap behind it
                        self._drop_far_ahead(process, now)
                    else:
                        self._skip_gap(process, out.setdefault(process.path, []), now)
            for path in self._write(out):
                # skipped again at the next tick, once the spool can be written
                self._by_path[path].restore(before[path])

    def _drop_far_ahead(self, process: _Process, now: float) -> None:
        """Held records further ahead of a stream arriving in order than `MAX_HELD` are not its own:
        dropped; the rest wait again."""
        limit = process.next_seq + MAX_HELD
        far = [seq for seq in process.held if seq > limit]
        for seq in far:
            del process.held[seq]
        self.out_of_sequence += len(far)
        process.held_since = now if process.held else None

    def _process(self, name: str) -> _Process:
        process = self._processes.get(name)
        if process is None:
            path = os.path.join(self.log_dir, safe_file_name(name))
            try:
                # a watch restarted on its spool appends to what is there
                size = os.path.getsize(path)
            except OSError:
                size = 0
            process = self._processes[name] = self._by_path[path] = _Process(path, size=size)
        return process

    def _rotate(self, process: _Process) -> None:
        """``X.jsonl`` → ``X.jsonl.1`` (older segments shifted, the oldest past `backup_count`
        deleted), as the writer rotates."""
        path = process.path
        try:
            if self.backup_count <= 0:
                os.unlink(path)
            else:
                for index in range(self.backup_count - 1, 0, -1):
                    if os.path.exists(f"{path}.{index}"):
                        os.replace(f"{path}.{index}", f"{path}.{index + 1}")
                os.replace(path, f"{path}.1")
        except OSError as error:
            self.write_error = f"cannot rotate {path}: {error.strerror or error}"  # written on past max_bytes until it can
            return
        process.size = 0
        self.rotations += 1

    @staticmethod
    def _release(process: _Process, lines: list[bytes]) -> None:
        held = process.held
        while process.next_seq in held:
            lines.append(held.pop(process.next_seq))
            process.next_seq += 1
        if not held:
            process.held_since = None

    def _skip_gap(self, process: _Process, lines: list[bytes], now: float) -> None:
        first = min(process.held)
        skipped_from = process.next_seq
        process.lost += first - skipped_from
        process.next_seq = first
        self._release(process, lines)
        process.jump = (skipped_from, first, process.next_seq)
        if process.held:
            process.held_since = now  # the next gap waits its own hold

    def _write(self, out: dict[str, list[bytes]]) -> list[str]:
        """Append each process's lines (one write each); the paths that could not be written."""
        by_path = self._by_path
        failed = []
        for path, lines in out.items():
            if not lines:
                continue
            data = b"\n".join(lines) + b"\n"
            process = by_path[path]
            if process.size and process.size + len(data) > self.max_bytes:
                self._rotate(process)
            try:
                # One append per process and request: the follower never sees half a batch's line
                # (O_APPEND, one write).
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
            except OSError as error:
                # A short write leaves a partial line at worst; the retried request writes its
                # records whole after it.
                self.failed += len(lines)
                self.write_error = f"cannot write {path}: {error.strerror or error}"
                failed.append(path)
                continue
            process.size += len(data)
            self.written += len(lines)
            self.write_error = None
        return failed
