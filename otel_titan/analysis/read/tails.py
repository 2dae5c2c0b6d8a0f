"""The last records of a process, read from the end of its files: where it stopped, without reading
the rest.

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

import os
from typing import Any

from otel_titan.analysis.read.content import RangeReader
from otel_titan.analysis.read.lines import SkippedLines, file_records
from otel_titan.analysis.read.records import META_EVENTS, ProcessLog
from otel_titan.schema import Field

__all__ = ["tail_records", "ends_torn", "TAIL_BLOCK", "MIN_LINES"]

#: Bytes read per step backwards, at first; doubling up to MAX_TAIL_BLOCK.
TAIL_BLOCK = 32 << 10
MAX_TAIL_BLOCK = 4 << 20
#: Complete lines wanted before stopping (covers a step's nest of open spans in a training loop).
MIN_LINES = 24


def ends_torn(process: ProcessLog) -> bool:
    """Whether the newest non-empty segment ends without a newline: a write cut short (SIGKILL,
    crash) or still in progress.

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


def tail_records(
    process: ProcessLog, skipped: SkippedLines, min_lines: int = MIN_LINES, trimmed: bool = False
) -> tuple[list[dict[str, Any]], bool]:
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
        records, at_start = _segment_tail(
            process.segments[index],
            skipped,
            min_lines - lines,
            need_program=not program,
            trimmed=trimmed,
        )
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


def _segment_tail(
    path: str, skipped: SkippedLines, min_lines: int, need_program: bool, trimmed: bool = False
) -> tuple[list[dict[str, Any]], bool]:
    """The last complete lines of one file, parsed; and whether the file was read from its start.

    Blocks are read backwards only to count newlines (at most `MAX_TAIL_BLOCK` bytes held: a 2 GB
    last line is counted through, never held); once enough lines follow the first newline seen, that
    window is parsed from the file by `file_records`, which skips a line longer than its limit
    without keeping it. A window too short in records is parsed again only once it has doubled, and
    what each parse skipped is counted in `skipped` only for the window kept (`_Noted`), in order.
    """
    try:
        handle = open(path, "rb")
    except OSError as error:
        skipped.add(path, 0, f"cannot open ({error.strerror or error})")
        return [], True
    with handle:
        size = handle.seek(0, os.SEEK_END)
        position = size
        newlines = 0
        first_newline = -1  # offset of the first newline at or after `position`, -1 while none seen
        parsed_from = size + 1  # where the last window parsed began
        block = TAIL_BLOCK
        while position > 0:
            read = min(block, position)
            position -= read
            handle.seek(position)
            data = handle.read(read)
            newlines += data.count(b"\n")
            found = data.find(b"\n")
            if found >= 0:
                first_newline = position + found
            block = min(2 * block, MAX_TAIL_BLOCK)  # a file of long lines needs few rounds
            if position == 0:
                break
            if newlines < min_lines or first_newline < 0:
                continue  # at most that many complete lines after the cut one (and a last without newline): too few
            start = first_newline + 1
            if size - start < 2 * (size - parsed_from) and parsed_from <= size:
                continue  # not twice the window parsed last: read further back first
            parsed_from = start
            noted = _Noted()
            with RangeReader(open(path, "rb"), start, size) as window:
                records = list(file_records(path, noted, None, source=window, trimmed=trimmed))  # type: ignore[arg-type]  # RangeReader reads as a binary file does
            if len(records) >= min_lines and (
                not need_program or any(r[Field.LOG_TYPE_NAME] not in META_EVENTS for r in records)
            ):
                # The window is the tail: parsed exactly as a full read parses (torn last line, bad
                # lines and all).
                noted.replay(skipped)
                return records, False
    # Read from its start: the whole file, parsed as a full read parses it.
    records = list(file_records(path, skipped, None, trimmed=trimmed))
    return records, True


class _Noted(SkippedLines):
    """What a window's parse skipped or repaired, noted but not counted: replayed into the caller's
    if the window is kept."""

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
