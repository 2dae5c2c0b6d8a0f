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

Trimmed records (``file_records(..., trimmed=True)``: what summarize and
export read): a typed decoder (msgspec, into `AnalysisRecord`) keeps only
the fields the analysis reads (`ANALYSIS_FIELDS`) and skips the rest in C:
otel-titan writes a dozen identity fields on every line that no command
reads per record, and building them into each dict was most of the parse.
It takes a line only where its answer is the one orjson would give: every
kept value a scalar that orjson decodes alike (ints within 64 bits), or a
list of them (``step_tags``), and the line valid UTF-8. Anything else (NaN,
a lone surrogate, a nested value, a torn line, an int beyond 64 bits, a
line that is not an object) goes the tolerant way above, whole. Records of
kinds whose every field counts (`WHOLE_RECORDS`: the logger's own, a
``run_config``) are read whole too. So a trimmed record is the full record
less fields no command reads; a module that reads a new field of span,
instant or scalar records adds it to `ANALYSIS_FIELDS`. Without msgspec
(the analysis extra) every line is read whole by orjson.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO, TypedDict

import orjson

try:  # the analysis extra; without it, trimmed records are read by orjson (the same records, more slowly)
    import msgspec
except ImportError:  # pragma: no cover - the project's set-up installs it
    msgspec = None  # type: ignore[assignment]  # the analysis extra is optional: None marks it absent
try:
    from typing import Required  # type: ignore[attr-defined]  # Python 3.11 and later; 3.10 below
# pragma: no cover - Python 3.10 (typing_extensions comes with opentelemetry-api)
except ImportError:
    from typing_extensions import Required

from otel_titan.analysis.read.safe_text import escape_surrogates
from otel_titan.schema import MAX_LINE_BYTES as _SCHEMA_MAX_LINE_BYTES
from otel_titan.schema import META_EVENTS, Field

__all__ = [
    "SkippedLines",
    "copy_without_long_lines",
    "file_records",
    "loads_line",
    "record_problem",
    "AnalysisRecord",
    "ANALYSIS_FIELDS",
    "WHOLE_RECORDS",
    "BLOCK_BYTES",
    "MAX_LINE_BYTES",
    "WARNINGS_PER_FILE",
]

_log = logging.getLogger("otel_titan.analysis")

#: Types a lane or pairing key may have (anything else could not be a dict key).
_KEY_TYPES = (str, type(None))
#: At most this many warnings are kept per read (`SkippedLines.warnings`): five per file are logged,
#: and a run has many files.
MAX_WARNINGS_KEPT = 10_000
#: Beyond this (µs, about 146,000 years) a timestamp is not one; it also keeps every figure within
#: 64 bits.
_MAX_TIME_US = 1 << 62
# The fields every line's check reads, as module globals: one specialised global load per use, per
# line (a class attribute, `Field.TIME_US`, would be a lookup each time).
_TIME_US, _LOG_TYPE_NAME, _LOG_TYPE, _TID, _SPAN_ID, _TASK_NAME = (
    Field.TIME_US,
    Field.LOG_TYPE_NAME,
    Field.LOG_TYPE,
    Field.TID,
    Field.SPAN_ID,
    Field.TASK_NAME,
)

#: Read size: large enough that per-block overhead vanishes, small enough to be irrelevant in
#: memory.
BLOCK_BYTES = 1 << 20
#: A longer "line" is not a record (a file of binary garbage without newlines): skipped without
#: holding it (the schema's limit).
MAX_LINE_BYTES = _SCHEMA_MAX_LINE_BYTES
#: Warnings logged per file before they are only counted (a file of garbage must not flood the
#: terminal).
WARNINGS_PER_FILE = 5

#: The fields of span, instant and scalar records that the analysis reads (the timeline, the
#: summary's collector, the export's events and arguments, the checks of `record_problem`); trimmed
#: records hold these.
ANALYSIS_FIELDS = (
    "time_us",
    "time_ms",
    "time",
    "log_type",
    "log_type_name",
    "event_name",
    "step",
    "relative_step",
    "step_tags",
    "span_id",
    "parent_span_id",
    "trace_id",
    "tid",
    "task_name",
    "value",
    "caller",
    "description",
    "epoch",
    "iteration",
    "seq_id",
    "logger_name",
    "error_type",
    "error_message",
    "message",
)
#: Records read whole even when trimmed: the logger's own (every field is shown, the black box is
#: digested) and a ``run_config`` (its configuration is compared between ranks).
WHOLE_RECORDS = frozenset(META_EVENTS | {"run_config"})


def _bounded(kind: Any, **bounds: int) -> Any:
    """`kind` within `bounds` (msgspec's constraints), checked as the typed decoder reads it."""
    return Annotated[kind, msgspec.Meta(**bounds)] if msgspec is not None else kind  # type: ignore[call-overload]  # the bounds by name, as msgspec takes them


_Int64 = _bounded(int, ge=-(1 << 63), le=(1 << 63) - 1)
#: A value the typed decoder takes: what orjson decodes to the same Python object (orjson turns ints
#: beyond 64 bits into floats; msgspec bounds ints to int64, so those lines, and nested values, take
#: orjson's path).
_Scalar = _Int64 | float | str | bool | None
#: A record as the typed decoder reads it: a plain dict of the `ANALYSIS_FIELDS` present, in the
#: line's order. The fields every record must have, and those a lane or pairing key is made of, are
#: typed as the reader requires them (the checks of `file_records`, in C): a record it decodes needs
#: no check, nor any repair (`record_problem`), which a line that fails them gets on orjson's path.
# mypy cannot read a TypedDict whose fields come from a list (ANALYSIS_FIELDS): a dict to it.
if TYPE_CHECKING:
    AnalysisRecord = dict[str, Any]
else:
    AnalysisRecord = TypedDict(
        "AnalysisRecord",
        {
            # "step_tags" is a field name, not a forward reference (F821 reads it as one).
            **{
                name: (list[_Scalar] if name == "step_tags" else _Scalar)  # noqa: F821 - a field name
                for name in ANALYSIS_FIELDS
            },
            Field.TIME_US: Required[_bounded(int, ge=0, lt=_MAX_TIME_US)],
            Field.LOG_TYPE_NAME: Required[_bounded(str, min_length=1)],
            Field.LOG_TYPE: Required[str],
            Field.TID: _Int64,
            Field.SPAN_ID: str | None,
            Field.TASK_NAME: str | None,
        },
        total=False,
    )
_typed_decode = msgspec.json.Decoder(AnalysisRecord).decode if msgspec is not None else None


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
    #: Every warning about the lines, in the order they came (skipped and repaired alike), logged or
    #: not: what a command that answers from a cached read says again (`model.collect`), as a read
    #: of the files would say it.
    warnings: list[str] = field(default_factory=list)

    def _warn(self, message: str) -> None:
        if len(self.warnings) < MAX_WARNINGS_KEPT:
            self.warnings.append(message)
        if self.log:
            _log.warning("%s", message)

    def add(self, path: str, line_no: int, reason: str) -> None:
        """Count one skipped line of `path` (1-based `line_no`) and warn about the first few."""
        self.count += 1
        self.by_file[path] += 1
        seen = self.by_file[path]
        if seen <= WARNINGS_PER_FILE:
            message = f"{path}:{line_no}: {reason}; line skipped"
            if len(self.examples) < 100:
                self.examples.append(message)
            self._warn(message)
        elif seen == WARNINGS_PER_FILE + 1:
            self._warn(f"{path}: more unreadable lines; only counting them from now on")

    def repair(self, path: str, line_no: int, strings: int) -> None:
        """Count one line of `path` kept after `strings` strings with lone surrogates were escaped;
        warn about the first few.

        Example:
            >>> skipped = SkippedLines(log=False)
            >>> skipped.repair("a.jsonl", 7, 2)
            >>> skipped.repaired, skipped.count
            (1, 0)
        """
        self.repaired += 1
        self.repaired_by_file[path] += 1
        seen = self.repaired_by_file[path]
        if seen <= WARNINGS_PER_FILE:
            self._warn(
                f"{path}:{line_no}: {strings} string{'' if strings == 1 else 's'} with invalid "
                "Unicode (lone surrogate) escaped as \\uXXXX text; line kept"
            )
        elif seen == WARNINGS_PER_FILE + 1:
            self._warn(f"{path}: more lines with invalid Unicode; only counting them from now on")


def copy_without_long_lines(
    path: str, target: str, skipped: SkippedLines, placeholder: bytes = b"{"
) -> int:
    """Copy the file at `path` to `target`, each line longer than `MAX_LINE_BYTES` replaced by
    `placeholder`; how many were.

    For a reader that cannot skip such a line itself (DuckDB's JSON reader fails the whole query on
    one over its ``maximum_object_size``): the copy has the same lines, in the same order, and the
    long ones are reported in `skipped` with the words and line numbers of a full read
    (`file_records`). A long line is never held in memory: a block at a time is.

    Example:
        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     source, copy = os.path.join(folder, "a.jsonl"), os.path.join(folder, "b.jsonl")
        ...     _ = open(source, "wb").write(b'{"a": 1}\\n' + b"x" * (MAX_LINE_BYTES + 1) + b"\\n{}\\n")
        ...     copy_without_long_lines(source, copy, SkippedLines(log=False)), open(copy, "rb").read()
        (1, b'{"a": 1}\\n{\\n{}\\n')
    """
    replaced = 0
    line_no = 0
    too_long = f"line longer than {MAX_LINE_BYTES >> 20} MiB"
    with open(path, "rb") as source, open(target, "wb") as out:
        carry = b""
        overlong = (
            False  # inside a line already longer than MAX_LINE_BYTES: discard up to its newline
        )
        while True:
            block = source.read(BLOCK_BYTES)
            if not block:
                break
            if overlong:
                newline = block.find(b"\n")
                if newline < 0:
                    continue
                line_no, replaced, overlong = line_no + 1, replaced + 1, False
                skipped.add(path, line_no, too_long)
                out.write(placeholder + b"\n")
                block = block[newline + 1 :]
            data = carry + block if carry else block
            first_newline = data.find(b"\n")
            # the line carried in ended here, too long (as file_records decides)
            if first_newline > MAX_LINE_BYTES:
                line_no, replaced = line_no + 1, replaced + 1
                skipped.add(path, line_no, too_long)
                out.write(placeholder + b"\n")
                data = data[first_newline + 1 :]
            last_newline = data.rfind(b"\n")
            if last_newline >= 0:
                out.write(data[: last_newline + 1])
                line_no += data.count(b"\n", 0, last_newline + 1)
                data = data[last_newline + 1 :]
            carry = data
            if len(carry) > MAX_LINE_BYTES:
                carry, overlong = b"", True
        if overlong:
            replaced += 1
            skipped.add(path, line_no + 1, too_long)
            out.write(placeholder)
        else:
            out.write(carry)
    return replaced


def loads_line(raw: bytes) -> Any:
    """Parse one line; None when it is not JSON at all. Lone surrogates in its strings come back
    escaped.

    Example:
        >>> loads_line(b'{"value": NaN}'), loads_line(b'{"torn'), loads_line(b'{"name": "fwd\\\\ud800"}')
        ({'value': nan}, None, {'name': 'fwd\\\\ud800'})
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _loads_fallback(raw)[0]


def _utf8(raw: bytes) -> bool:
    """Whether `raw` is valid UTF-8 (as orjson requires of a whole line)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


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
    """`value` with every string (keys too) holding a lone surrogate escaped; `repaired[0]` counts
    them."""
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
        return {
            _valid_unicode(key, repaired): _valid_unicode(item, repaired)
            for key, item in value.items()
        }
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
    name = record.get(Field.LOG_TYPE_NAME)
    if type(name) is not str or not name:
        return "no log_type_name"
    time_us = record.get(Field.TIME_US)
    if type(time_us) is not int:
        time_ms, time_s = record.get(Field.TIME_MS), record.get(Field.TIME)
        if type(time_ms) is int:
            time_us = record[Field.TIME_US] = time_ms * 1000
        elif type(time_s) in (int, float) and math.isfinite(time_s):  # type: ignore[arg-type]  # an int or float: its type() was checked
            time_us = record[Field.TIME_US] = int(time_s * 1_000_000)  # type: ignore[operator]  # an int or float: its type() was checked
        else:
            return "no timestamp (time_us, time_ms or time)"
    if not 0 <= time_us < _MAX_TIME_US:
        return "timestamp out of range (before 1970, or not µs)"
    if type(record.get(Field.LOG_TYPE)) is not str:
        record[Field.LOG_TYPE] = (
            "event" if name.endswith(("_start", "_end", "_error")) else "instant"
        )
    if type(record.get(Field.TID, 0)) is not int:
        del record[Field.TID]
    if type(record.get(Field.SPAN_ID)) not in _KEY_TYPES:
        del record[Field.SPAN_ID]
    task_name = record.get(Field.TASK_NAME)
    if type(task_name) not in _KEY_TYPES:
        record[Field.TASK_NAME] = str(task_name)
    return None


def file_records(
    path: str,
    skipped: SkippedLines,
    on_bytes: Callable[[int], None] | None = None,
    source: BinaryIO | None = None,
    first_line: int = 0,
    offset_us: int = 0,
    trimmed: bool = False,
) -> Iterator[dict[str, Any]]:
    """Every usable record of one file, in order; unusable lines are counted in `skipped` with file
    and line.

    `source`: read these bytes (the tail of `path`, see `read.tails`, or a range
    of it, see `read.content.RangeReader`) instead of opening `path`;
    `first_line`: how many lines of the file come before them (for the line
    numbers of what is skipped).
    `offset_us`: taken off each record's ``time_us`` (its host's clock offset: the aligned clock),
    after the checks, which are on the time as written.
    `trimmed`: records hold only `ANALYSIS_FIELDS` (but `WHOLE_RECORDS`), read by the typed decoder
    (module docstring): the same records otherwise, lines skipped and repaired alike.

    Per line only the decoding and the fast check run here; what is done per block
    (`_LineBlocks`) or for a line that needs mending (`_repaired`, `_checked`) is kept out of the
    loop, which is the reader's hottest.

    Example:
        >>> import glob
        >>> path = sorted(glob.glob("outputs/structured_logs/*.jsonl"))[0]
        >>> skipped = SkippedLines()
        >>> sum(1 for record in file_records(path, skipped)), skipped.count
        (26, 0)
    """
    handle = _opened(path, source, skipped)
    if handle is None:
        return
    loads = orjson.loads
    decode_error = orjson.JSONDecodeError
    # None without msgspec: orjson reads every line whole
    typed = _typed_decode if trimmed else None
    whole_records = WHOLE_RECORDS
    with handle:
        blocks = _LineBlocks(handle, path, skipped, on_bytes, first_line)
        for line_no, lines in blocks:
            for raw in lines:
                line_no += 1
                if typed is not None:
                    try:
                        record = typed(raw)
                    except Exception:  # noqa: BLE001 - whatever it refuses (or chokes on, nested too deep), orjson's path decides
                        pass
                    else:
                        # Valid UTF-8 in the fields it skipped too (it only decodes those it keeps):
                        # else orjson's path.
                        if record[_LOG_TYPE_NAME] not in whole_records and (
                            raw.isascii() or _utf8(raw)
                        ):
                            if offset_us:
                                record[_TIME_US] -= offset_us
                            yield record  # checked by its type (`AnalysisRecord`)
                            continue
                try:
                    record = loads(raw)
                except decode_error:
                    record = _repaired(raw, path, line_no, skipped)
                    if record is None:
                        continue
                if type(record) is dict:
                    time_us = record.get(_TIME_US)
                    if (
                        type(time_us) is int
                        and 0 <= time_us < _MAX_TIME_US
                        and type(record.get(_LOG_TYPE_NAME)) is str
                        and type(record.get(_LOG_TYPE)) is str
                        and type(record.get(_TID, 0)) is int
                        and type(record.get(_SPAN_ID)) in _KEY_TYPES
                        and type(record.get(_TASK_NAME)) in _KEY_TYPES
                    ):
                        if offset_us:
                            record[_TIME_US] = time_us - offset_us
                        yield record
                        continue
                record = _checked(record, path, line_no, skipped, offset_us)
                if record is not None:
                    yield record
        last = blocks.last_line()
        if last is not None:
            record = _checked(last[0], path, blocks.line_no, skipped, offset_us, last[1])
            if record is not None:
                yield record


def _opened(path: str, source: BinaryIO | None, skipped: SkippedLines) -> BinaryIO | None:
    """`source`, else `path` opened; None (counted in `skipped`) when it cannot be: rotated away
    between listing and reading, or unreadable, the rest of the run stays usable."""
    if source is not None:
        return source
    try:
        return open(path, "rb")
    except OSError as error:
        skipped.add(path, 0, f"cannot open ({error.strerror or error})")
        return None


class _LineBlocks:
    """A file's complete lines, a block (`BLOCK_BYTES`) at a time: iterated, (the number of lines
    before the block's first, the block's lines); a line over `MAX_LINE_BYTES` is counted in
    `skipped` and left out, whole, however many blocks it spans.

    The line decoding loops over the lines of a block, so that what is done per block (reading,
    splitting, joining a line cut by the block's end) costs nothing per line. After the last
    block, `last_line` is what followed the last newline.
    """

    def __init__(
        self,
        handle: BinaryIO,
        path: str,
        skipped: SkippedLines,
        on_bytes: Callable[[int], None] | None,
        first_line: int,
    ) -> None:
        self._handle, self._path, self._skipped, self._on_bytes = handle, path, skipped, on_bytes
        #: Lines counted so far (those handed out, those skipped as too long).
        self.line_no = first_line
        self._carry = b""
        #: Inside a line already longer than MAX_LINE_BYTES: discard up to its newline.
        self._overlong = False

    def __iter__(self) -> Iterator[tuple[int, list[bytes]]]:
        while True:
            try:
                block = self._handle.read(BLOCK_BYTES)
            except OSError as error:
                self._skipped.add(
                    self._path,
                    self.line_no + 1,
                    f"read error ({error.strerror or error}); rest of file skipped",
                )
                self._carry, self._overlong = b"", False
                return
            if not block:
                return
            if self._on_bytes is not None:
                self._on_bytes(len(block))
            lines = self._complete_lines(block)
            if lines:
                yield self.line_no, lines
                self.line_no += len(lines)

    def _complete_lines(self, block: bytes) -> list[bytes]:
        """The lines `block` completes (the carry from the block before first), too long ones left
        out; what follows its last newline is carried to the next."""
        lines = block.split(b"\n")
        if self._overlong:
            if len(lines) == 1:
                return []
            self._too_long()
            self._overlong = False
            lines = lines[1:]  # its tail; at least one element (the new carry) remains
        elif self._carry:
            lines[0] = self._carry + lines[0]
        self._carry = lines.pop()
        if len(self._carry) > MAX_LINE_BYTES:
            self._carry, self._overlong = b"", True
        if lines and len(lines[0]) > MAX_LINE_BYTES:
            # A long line carried in that ended in this block (only the first line can be longer
            # than a block).
            self._too_long()
            del lines[0]
        return lines

    def _too_long(self) -> None:
        self.line_no += 1
        self._skipped.add(self._path, self.line_no, f"line longer than {MAX_LINE_BYTES >> 20} MiB")

    def last_line(self) -> tuple[Any, int] | None:
        """After the last block: what followed the last newline, decoded (record, strings
        repaired), its line counted in `line_no`; None when nothing did, or what did is too long
        or no JSON (cut mid-write: counted in `skipped`).

        No newline at the end: a crash mid-write, or a process still writing.
        """
        if self._overlong:
            self._skipped.add(
                self._path, self.line_no + 1, f"line longer than {MAX_LINE_BYTES >> 20} MiB"
            )
            return None
        if not self._carry.strip():
            return None
        self.line_no += 1
        try:
            record, repaired = orjson.loads(self._carry), 0
        except orjson.JSONDecodeError:
            record, repaired = _loads_fallback(self._carry)
        if record is None:
            self._skipped.add(
                self._path,
                self.line_no,
                "truncated last line (no newline at end of file; crashed mid-write, or still "
                "being written)",
            )
            return None
        return record, repaired


def _repaired(raw: bytes, path: str, line_no: int, skipped: SkippedLines) -> Any:
    """A line orjson refused, decoded after all (its lone surrogates and invalid UTF-8 repaired and
    counted in `skipped`); None for a blank line (nothing lost) or one that is no JSON (counted)."""
    if not raw.strip():
        return None
    record, repaired = _loads_fallback(raw)
    if record is None:
        skipped.add(path, line_no, "malformed JSON or invalid UTF-8")
        return None
    if repaired and record_problem(record) is None:
        skipped.repair(path, line_no, repaired)
    return record


def _checked(
    record: Any,
    path: str,
    line_no: int,
    skipped: SkippedLines,
    offset_us: int,
    repaired: int | None = None,
) -> Any:
    """A record the fast check did not pass, mended where it can be (`record_problem`) and on the
    aligned clock; None, counted in `skipped`, where it cannot. `repaired`: the last line's
    strings repaired (None: a line with its newline, whose repairs `_repaired` counted)."""
    reason = record_problem(record)
    if reason is not None:
        skipped.add(path, line_no, reason)
        return None
    if repaired:
        skipped.repair(path, line_no, repaired)
    if offset_us:
        record[_TIME_US] -= offset_us
    return record
