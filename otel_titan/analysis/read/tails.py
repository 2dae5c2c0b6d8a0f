"""The last records of a process, read from the end of its files: where it stopped, without reading the rest.

Why: "where did every rank stop" is the first question after a hang, and at
1,000 ranks of gigabytes each a full read takes minutes where the answer sits
in the last few kB of each file. `tail_records` seeks to the end of the
newest segment and reads backwards in blocks until it holds at least
`MIN_LINES` complete lines, one of them a program record (not the logger's
own ``heartbeat`` / ``signal_received`` / ``closed``), continuing into older
segments when the newest has too little, down to the whole chain when
needed (a process that logged nothing: a full read is the only way to be
sure, and such files are tiny).

The lines come back in file order, parsed and checked exactly as a full read
would (`read.lines.file_records` on the bytes read), so a summary of the
tails agrees with one of the whole files on everything the tails hold.
"""

from __future__ import annotations

import io
import os
from typing import Any

from otel_titan.analysis.read.records import META_EVENTS, ProcessLog
from otel_titan.analysis.read.lines import SkippedLines, file_records
from otel_titan.schema import Field

__all__ = ["tail_records", "ends_torn", "TAIL_BLOCK", "MIN_LINES"]

#: Bytes read per step backwards.
TAIL_BLOCK = 32 << 10
#: Complete lines wanted before stopping (covers a step's nest of open spans in a training loop).
MIN_LINES = 24


def ends_torn(process: ProcessLog) -> bool:
    """Whether the newest non-empty segment ends without a newline: a write cut short (SIGKILL, crash) or still in progress.

    Example (True for a SIGKILLed process's file; this run closed cleanly):
        >>> from otel_titan.analysis import read_run
        >>> ends_torn(read_run("outputs").processes[0])
        False
    """
    for path in reversed(process.segments):
        try:
            with open(path, "rb") as handle:
                size = handle.seek(0, os.SEEK_END)
                if size == 0:
                    continue
                handle.seek(size - 1)
                return handle.read(1) != b"\n"
        except OSError:
            continue
    return False


def tail_records(process: ProcessLog, skipped: SkippedLines, min_lines: int = MIN_LINES, trimmed: bool = False) -> tuple[list[dict[str, Any]], bool]:
    """(the last records of `process`, in file order; whether they are all of them).

    `trimmed`: as `ProcessLog.records`' (only the fields the analysis reads).

    Example (a hung rank's last record is its collective's ``_start``; this one closed):
        >>> from otel_titan.analysis import read_run
        >>> records, whole = tail_records(read_run("outputs").processes[0], SkippedLines(log=False))
        >>> records[-1]["log_type_name"], whole
        ('structured_logger_closed', True)
    """
    chunks: list[list[dict[str, Any]]] = []
    lines = 0
    program = False
    whole = True
    for index in range(len(process.segments) - 1, -1, -1):
        records, at_start = _segment_tail(process.segments[index], skipped, min_lines - lines, need_program=not program, trimmed=trimmed)
        chunks.append(records)
        lines += len(records)
        program = program or any(r[Field.LOG_TYPE_NAME] not in META_EVENTS for r in records)
        if not at_start:
            whole = False
            break
        if lines >= min_lines and program:
            whole = index == 0
            break
    out: list[dict[str, Any]] = []
    for records in reversed(chunks):
        out.extend(records)
    return out, whole


def _segment_tail(path: str, skipped: SkippedLines, min_lines: int, need_program: bool, trimmed: bool = False) -> tuple[list[dict[str, Any]], bool]:
    """The last complete lines of one file, parsed; and whether the file was read from its start.

    Each window read is parsed only once it holds enough lines (newlines are counted first, in C), and the
    window kept is not parsed again: what it skipped is counted in `skipped` then (`_Noted`), in order.
    """
    try:
        handle = open(path, "rb")
    except OSError as error:
        skipped.add(path, 0, f"cannot open ({error.strerror or error})")
        return [], True
    with handle:
        size = handle.seek(0, os.SEEK_END)
        position = size
        data = b""
        block = TAIL_BLOCK
        while position > 0:
            read = min(block, position)
            position -= read
            handle.seek(position)
            data = handle.read(read) + data
            block *= 2  # a file of long lines needs few rounds
            if position == 0:
                break
            if data.count(b"\n") < min_lines:
                continue  # at most that many complete lines after the cut one (and a last without newline): too few
            window = data[data.index(b"\n") + 1 :] if b"\n" in data else b""
            noted = _Noted()
            records = list(file_records(path, noted, None, source=io.BytesIO(window), trimmed=trimmed))
            if len(records) >= min_lines and (not need_program or any(r[Field.LOG_TYPE_NAME] not in META_EVENTS for r in records)):
                # The window is the tail: parsed exactly as a full read parses (torn last line, bad lines and all).
                noted.replay(skipped)
                return records, False
    # Read from its start: the whole file, parsed as a full read parses it.
    records = list(file_records(path, skipped, None, source=io.BytesIO(data), trimmed=trimmed))
    return records, True


class _Noted(SkippedLines):
    """What a window's parse skipped or repaired, noted but not counted: replayed into the caller's if the window is kept."""

    def __init__(self) -> None:
        super().__init__(log=False)
        self.calls: list[tuple[bool, str, int, Any]] = []

    def add(self, path: str, line_no: int, reason: str) -> None:
        self.calls.append((False, path, line_no, reason))

    def repair(self, path: str, line_no: int, strings: int) -> None:
        self.calls.append((True, path, line_no, strings))

    def replay(self, skipped: SkippedLines) -> None:
        for repaired, path, line_no, detail in self.calls:
            (skipped.repair if repaired else skipped.add)(path, line_no, detail)
