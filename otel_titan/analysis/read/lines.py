"""One JSONL file → its usable records, line by line, whatever the file holds.

A line that is not JSON (torn by a crash, random bytes, invalid UTF-8), not
an object, or without ``log_type_name`` or a timestamp is skipped: counted in
`SkippedLines`, and reported with a warning naming the file and line (the
first few per file; the rest are counted). A missing ``time_us`` is taken
from ``time_ms`` or ``time``; a missing ``log_type`` from the name.
torchtitan's ``json.dumps`` writes bare ``NaN``/``Infinity``, which orjson
refuses: such lines go through the standard parser instead.

Invalid Unicode that is valid JSON (a lone surrogate such as ``"\\ud800"``,
which the writer itself escapes that way) cannot be printed or encoded again:
the standard parser's strings are checked, each lone surrogate is replaced by
its visible escape (``\\ud800``, six characters), and the line is kept and
counted in `SkippedLines.repaired` (with a warning naming file and line).
Every record this module yields therefore holds only valid Unicode.

Memory: one block (1 MiB) and one partial line at a time; a "line" longer
than 16 MiB is skipped without being held.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Iterator

import orjson

from otel_titan.analysis.read.safe_text import escape_surrogates

__all__ = ["SkippedLines", "file_records", "loads_line", "record_problem", "BLOCK_BYTES", "MAX_LINE_BYTES", "WARNINGS_PER_FILE"]

_log = logging.getLogger("otel_titan.analysis")

#: Types a lane or pairing key may have (anything else could not be a dict key).
_KEY_TYPES = (str, type(None))
#: Beyond this (µs, about 146,000 years) a timestamp is not one; it also keeps every figure within 64 bits.
_MAX_TIME_US = 1 << 62

#: Read size: large enough that per-block overhead vanishes, small enough to be irrelevant in memory.
BLOCK_BYTES = 1 << 20
#: A longer "line" is not a record (a file of binary garbage without newlines): skipped without holding it.
MAX_LINE_BYTES = 16 << 20
#: Warnings logged per file before they are only counted (a file of garbage must not flood the terminal).
WARNINGS_PER_FILE = 5


@dataclass
class SkippedLines:
    """Lines that could not be read, counted per file; the first few of each file are logged.

    Example:
        >>> skipped = SkippedLines(log=False)
        >>> skipped.add("a.jsonl", 3, "malformed JSON")
        >>> skipped.count, skipped.examples
        (1, ['a.jsonl:3: malformed JSON; line skipped'])
    """

    log: bool = True
    count: int = 0
    by_file: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    #: Lines kept after invalid Unicode in their strings was escaped (see `repair`), and per file.
    repaired: int = 0
    repaired_by_file: Counter = field(default_factory=Counter)

    def add(self, path: str, line_no: int, reason: str) -> None:
        """Count one skipped line of `path` (1-based `line_no`) and warn about the first few."""
        self.count += 1
        self.by_file[path] += 1
        seen = self.by_file[path]
        if seen <= WARNINGS_PER_FILE:
            message = f"{path}:{line_no}: {reason}; line skipped"
            if len(self.examples) < 100:
                self.examples.append(message)
            if self.log:
                _log.warning("%s", message)
        elif seen == WARNINGS_PER_FILE + 1 and self.log:
            _log.warning("%s: more unreadable lines; only counting them from now on", path)

    def repair(self, path: str, line_no: int, strings: int) -> None:
        """Count one line of `path` kept after `strings` strings with lone surrogates were escaped; warn about the first few.

        Example:
            >>> skipped = SkippedLines(log=False)
            >>> skipped.repair("a.jsonl", 7, 2)
            >>> skipped.repaired, skipped.count
            (1, 0)
        """
        self.repaired += 1
        self.repaired_by_file[path] += 1
        seen = self.repaired_by_file[path]
        if not self.log:
            return
        if seen <= WARNINGS_PER_FILE:
            _log.warning("%s:%d: %d string%s with invalid Unicode (lone surrogate) escaped as \\uXXXX text; line kept", path, line_no, strings, "" if strings == 1 else "s")
        elif seen == WARNINGS_PER_FILE + 1:
            _log.warning("%s: more lines with invalid Unicode; only counting them from now on", path)


def loads_line(raw: bytes) -> Any:
    """Parse one line; None when it is not JSON at all. Lone surrogates in its strings come back escaped.

    Example:
        >>> loads_line(b'{"value": NaN}'), loads_line(b'{"torn'), loads_line(b'{"name": "fwd\\\\ud800"}')
        ({'value': nan}, None, {'name': 'fwd\\\\ud800'})
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _loads_fallback(raw)[0]


def _loads_fallback(raw: bytes) -> tuple[Any, int]:
    """(parsed line or None, strings repaired) for a line orjson refused.

    torchtitan writes NaN / Infinity as bare tokens (json.dumps' default), and
    JSON may hold lone surrogates (``"\\ud800"``): orjson refuses both, the
    standard parser accepts both. Its strings are then made valid Unicode, so
    nothing downstream (printing, orjson) ever meets a surrogate.
    """
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None, 0
    repaired = [0]
    try:
        return _valid_unicode(record, repaired), repaired[0]
    except RecursionError:  # nested deeper than this interpreter's stack allows: not a record
        return None, 0


def _valid_unicode(value: Any, repaired: list[int]) -> Any:
    """`value` with every string (keys too) holding a lone surrogate escaped; `repaired[0]` counts them."""
    kind = type(value)
    if kind is str:
        if value.isascii():
            return value
        clean = escape_surrogates(value)
        if clean is not value:
            repaired[0] += 1
        return clean
    if kind is dict:
        if all(type(key) is str and key.isascii() for key in value):
            for key, item in value.items():
                if type(item) in (str, dict, list):
                    value[key] = _valid_unicode(item, repaired)
            return value
        return {_valid_unicode(key, repaired): _valid_unicode(item, repaired) for key, item in value.items()}
    if kind is list:
        for index, item in enumerate(value):
            if type(item) in (str, dict, list):
                value[index] = _valid_unicode(item, repaired)
        return value
    return value


def record_problem(record: Any) -> str | None:
    """Why a parsed line is not a usable record, or None after repairing what can be repaired.

    A missing ``time_us`` is taken from ``time_ms`` or ``time``, a missing
    ``log_type`` from the name; a ``tid``, ``task_name`` or ``span_id`` of the
    wrong type is dropped (or made a string), so that pairing never trips on it.

    Example:
        >>> record_problem([1]), record_problem({"log_type_name": "x", "time_ms": 5, "tid": [1]})
        ('not a JSON object (list)', None)
    """
    if type(record) is not dict:
        return f"not a JSON object ({type(record).__name__})"
    name = record.get("log_type_name")
    if type(name) is not str or not name:
        return "no log_type_name"
    time_us = record.get("time_us")
    if type(time_us) is not int:
        time_ms, time_s = record.get("time_ms"), record.get("time")
        if type(time_ms) is int:
            time_us = record["time_us"] = time_ms * 1000
        elif type(time_s) in (int, float) and math.isfinite(time_s):
            time_us = record["time_us"] = int(time_s * 1_000_000)
        else:
            return "no timestamp (time_us, time_ms or time)"
    if not 0 <= time_us < _MAX_TIME_US:
        return "timestamp out of range (before 1970, or not µs)"
    if type(record.get("log_type")) is not str:
        record["log_type"] = "event" if name.endswith(("_start", "_end", "_error")) else "instant"
    if type(record.get("tid", 0)) is not int:
        del record["tid"]
    if type(record.get("span_id")) not in _KEY_TYPES:
        del record["span_id"]
    task_name = record.get("task_name")
    if type(task_name) not in _KEY_TYPES:
        record["task_name"] = str(task_name)
    return None


def file_records(path: str, skipped: SkippedLines, on_bytes: Callable[[int], None] | None = None, source: BinaryIO | None = None, first_line: int = 0) -> Iterator[dict[str, Any]]:
    """Every usable record of one file, in order; unusable lines are counted in `skipped` with file and line.

    `source`: read these bytes (the tail of `path`, see `read.tails`, or a range
    of it, see `read.content.RangeReader`) instead of opening `path`;
    `first_line`: how many lines of the file come before them (for the line
    numbers of what is skipped).

    Example:
        >>> # for record in file_records("run/structured_logs/x.jsonl", SkippedLines()): ...
    """
    if source is not None:
        handle = source
    else:
        try:
            handle = open(path, "rb")
        except OSError as error:
            # Rotated away between listing and reading, or unreadable: the rest of the run stays usable.
            skipped.add(path, 0, f"cannot open ({error.strerror or error})")
            return
    loads = orjson.loads
    decode_error = orjson.JSONDecodeError
    with handle:
        line_no = first_line
        carry = b""
        overlong = False  # inside a line already longer than MAX_LINE_BYTES: discard up to its newline
        while True:
            try:
                block = handle.read(BLOCK_BYTES)
            except OSError as error:
                skipped.add(path, line_no + 1, f"read error ({error.strerror or error}); rest of file skipped")
                return
            if not block:
                break
            if on_bytes is not None:
                on_bytes(len(block))
            lines = block.split(b"\n")
            if overlong:
                if len(lines) == 1:
                    continue
                line_no += 1
                skipped.add(path, line_no, f"line longer than {MAX_LINE_BYTES >> 20} MiB")
                overlong = False
                lines = lines[1:]  # its tail; at least one element (the new carry) remains
            elif carry:
                lines[0] = carry + lines[0]
            carry = lines.pop()
            if len(carry) > MAX_LINE_BYTES:
                carry, overlong = b"", True
            for raw in lines:
                line_no += 1
                try:
                    record = loads(raw)
                except decode_error:
                    if not raw.strip():
                        continue  # blank line: nothing lost
                    record, repaired = _loads_fallback(raw)
                    if record is None:
                        skipped.add(path, line_no, "malformed JSON or invalid UTF-8")
                        continue
                    if repaired and record_problem(record) is None:
                        skipped.repair(path, line_no, repaired)
                if type(record) is dict:
                    time_us = record.get("time_us")
                    if (
                        type(time_us) is int
                        and 0 <= time_us < _MAX_TIME_US
                        and type(record.get("log_type_name")) is str
                        and type(record.get("log_type")) is str
                        and type(record.get("tid", 0)) is int
                        and type(record.get("span_id")) in _KEY_TYPES
                        and type(record.get("task_name")) in _KEY_TYPES
                    ):
                        yield record
                        continue
                reason = record_problem(record)
                if reason is None:
                    yield record
                else:
                    skipped.add(path, line_no, reason)
        if overlong:
            skipped.add(path, line_no + 1, f"line longer than {MAX_LINE_BYTES >> 20} MiB")
        elif carry.strip():
            # No newline at the end: a crash mid-write, or a process still writing.
            line_no += 1
            try:
                record, repaired = orjson.loads(carry), 0
            except decode_error:
                record, repaired = _loads_fallback(carry)
            reason = "truncated last line (no newline at end of file; crashed mid-write, or still being written)" if record is None else record_problem(record)
            if reason is None:
                if repaired:
                    skipped.repair(path, line_no, repaired)
                yield record
            else:
                skipped.add(path, line_no, reason)
