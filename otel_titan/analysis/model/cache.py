"""The analysis cache: what a read of each process learned, kept so that a second question of the
same run is free.

What is kept, per process (one file group): the read itself, stopped after
its last complete line (`model.collect.ProcessRead`: the timeline's open
spans and current step, the collector's accumulators for this process, its
summary so far, the lines it skipped), as plain data (`read.plain_data`:
MessagePack that is read without running anything, never pickle). Facts on the clocks as
written: the hang and the headline are computed again from the facts on
every command, so ``--no-align`` needs no new read (the stragglers and the
clock fit, the costly ones, are kept per question: below).

Keyed by content (`read.content.ContentKey`: per segment, the length up to
its last complete line and hashes of its first and last 16 KiB), never by
device, inode or mtime; the entry is found by the process's file name.
A later read of the process is then one of:

* a *hit*: every segment holds the same content: nothing is read but the
  partial last line, if any (never cached: it is "not written yet");
* a *resume*: the run grew (appended to, or rotated: a rotated segment keeps
  its bytes under a new name) and the cached content is still where it was,
  its first and last blocks hashing the same: the read goes on from the
  cached offset, and only the bytes appended since are read;
* a *miss*: anything else (no entry, another version, a rewritten or
  truncated file, a segment rotated away): the process is read whole.

The reads of all the folder's processes are one entry (``reads.pack``),
read once and written once per command. The facts merged from all of a
command's processes (what their reads merge into, before any verdict) are
one more entry per selection of processes (`ProcessCache.lookup_run`),
looked up first, from the content keys alone (partial last lines included):
an unchanged run is then one entry read and no per-process work (on a
parallel filesystem, where each file opened costs a round trip to the
metadata server, that is the difference).

The costly verdicts drawn from those facts (the stragglers, a few seconds at
1,024 ranks, and the clock fit they start from) are kept too, one entry per
question (``run-*-<question>.verdicts``: the clocks; the stragglers per
``--steps`` and ``--no-align``), keyed by the same
content keys and version: they are what the rules make of exactly those facts,
so a changed rule (a new `cache_version`) or a changed file misses, and they
are drawn again (`lookup_verdicts`).

Versioned by the rules and the reader that made it: `cache_version` hashes the
source of ``analysis/read/`` and ``analysis/model/`` and the schema, so any
change to how records are read or facts are gathered misses.

Where, and why no command sees half an entry: `read.cache_folder`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from otel_titan.analysis.read import plain_data
from otel_titan.analysis.read.cache_folder import CacheFolder
from otel_titan.analysis.read.content import ContentKey, content_key, is_prefix
from otel_titan.analysis.read.records import ProcessLog

__all__ = [
    "CACHE_FORMAT",
    "ProcessCache",
    "ReadPlan",
    "cache_version",
    "plan_reads",
    "segment_keys",
]

#: Bumped when an entry's layout changes in a way the source hash would not see.
CACHE_FORMAT = 2


@lru_cache(maxsize=1)
def cache_version() -> str:
    """A hash of what makes the cached facts: the reader (``analysis/read``), the model
    (``analysis/model``), the schema, the entry format and Python's version.

    Example:
        >>> len(cache_version())
        32
    """
    analysis = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # otel_titan/analysis
    digest = hashlib.blake2b(
        f"{CACHE_FORMAT}|{sys.version_info[:2]}|plain-data-{plain_data.FORMAT}".encode(),
        digest_size=16,
    )
    files = [os.path.join(os.path.dirname(analysis), "schema.py")]
    for package in ("read", "model"):
        folder = os.path.join(analysis, package)
        try:
            files += [
                os.path.join(folder, name)
                for name in sorted(os.listdir(folder))
                if name.endswith(".py")
            ]
        except OSError:
            files.append(folder)
    for path in files:
        try:
            with open(path, "rb") as handle:
                digest.update(os.path.basename(path).encode() + b"\0" + handle.read())
        except OSError:
            digest.update(b"?")  # no source (a zipped install): still one version per build
    return digest.hexdigest()


@dataclass
class ReadPlan:
    """What to read of one process, and what to go on from.

    `keys`: each segment's content now (None when one cannot be read: the
    process is then read whole, to the end of its files, and not cached).
    The cacheable read covers segments ``0 .. stop`` up to their keys'
    lengths; ``stop`` is the first segment with bytes after its last complete
    line (or the last one): what follows it is read again on every command.
    `resume`: the cached read to go on from (plain data) (a hit or a resume), which
    covers up to `start_offset` of segment `start_segment` (`start_line`
    lines of it). `hit`: it covers all of ``0 .. stop``: nothing to read.
    """

    keys: list[ContentKey] | None
    stop: int
    resume: bytes | None = None
    start_segment: int = 0
    start_offset: int = 0
    start_line: int = 0
    lines: tuple[int, ...] = ()
    hit: bool = False

    @property
    def cached_bytes(self) -> int:
        """Bytes of the process the resumed read already covers (for progress)."""
        if self.resume is None or self.keys is None:
            return 0
        return sum(key.length for key in self.keys[: self.start_segment]) + self.start_offset

    @property
    def bytes_to_read(self) -> int:
        """Bytes of its written content still to read."""
        if self.keys is None:
            return 1
        return sum(key.length for key in self.keys[: self.stop + 1]) - self.cached_bytes


#: All processes' reads in one entry: one file written per command, not one per rank (on ext4 a
#: rename over a file costs milliseconds under load; on a parallel filesystem each file is a
#: metadata round trip).
_READS = "reads.pack"


class ProcessCache:
    """One run's cached reads, per process: `lookup` the entries of a process, `save` a new one,
    `flush` what was saved.

    The reads of every process of the log folder are one entry (`_READS`: file name → version,
    content keys, lines, pickled read), read once and written once per command that read something,
    as plain data (never pickle). Nothing is cached without msgspec (`read.plain_data.available`).
    Two commands that save at once: the last one's entry stands (the other's reads are read again
    next time: a miss, never a wrong answer).

    Example (a summary keeps each process's read; a second command's plans are then hits):
        >>> from otel_titan.analysis import summarize_run
        >>> from otel_titan.analysis.read.records import read_run
        >>> _ = summarize_run("outputs")
        >>> run = read_run("outputs")
        >>> [plan.hit for plan in plan_reads(run.processes, ProcessCache(run.run_dir, run.log_dir))]
        [True, True]
    """

    def __init__(self, run_dir: str, log_dir: str) -> None:
        self.folder = CacheFolder(run_dir, log_dir)
        self.version = cache_version()
        self._found: dict[str, list[tuple[Any, ...]]] | None = None
        self._saved: dict[str, tuple[Any, ...]] = {}
        self._codec = _entries_codec()

    def _entries(self) -> dict[str, list[tuple[Any, ...]]]:
        if self._found is None:
            self._found = {}
            # beside the run first, then the user's folder
            for payload in self.folder.read(_READS) if self._codec is not None else ():
                try:
                    entries = self._codec.decode(payload)  # type: ignore[union-attr]  # the loop runs only with a codec
                except plain_data.PlainDataError:  # a signed entry of another layout: a miss
                    continue
                if not isinstance(entries, dict):
                    continue
                for name, entry in entries.items():
                    if (
                        isinstance(entry, tuple)
                        and len(entry) == 4
                        and entry[0] == self.version
                        and isinstance(entry[3], bytes)
                        and isinstance(entry[1], list)
                        and all(type(key) is ContentKey for key in entry[1])
                    ):
                        self._found.setdefault(name, []).append(entry)
        return self._found

    def lookup(self, process: ProcessLog) -> list[tuple[list[ContentKey], tuple[int, ...], bytes]]:
        """(content keys, lines per segment, the read as plain data) of every entry of `process` of
        this version."""
        return [
            (keys, lines, blob)
            for _, keys, lines, blob in self._entries().get(os.path.basename(process.base), [])
        ]

    def save(
        self, process: ProcessLog, keys: list[ContentKey], lines: tuple[int, ...], blob: bytes
    ) -> None:
        """Keep the read `blob` of `process`, which covers `keys` (its segments ``0 .. len(keys) -
        1``), on the next `flush`."""
        self._saved[os.path.basename(process.base)] = (self.version, keys, lines, blob)

    def flush(self) -> bool:
        """Write the saved reads with the others kept (of this version: older ones are dropped);
        False when nothing to write or nowhere to."""
        if not self._saved or self._codec is None:
            return False
        kept = {
            name: entries[0] for name, entries in self._entries().items() if name not in self._saved
        }
        kept.update(self._saved)
        self._saved = {}
        return self.folder.write(_READS, self._codec.encode(kept))

    def _run_entry(
        self, processes: list[ProcessLog], keys: list[list[ContentKey] | None]
    ) -> tuple[str, str] | None:
        """(entry name, key) of the merged facts of these processes, whose segments' keys are
        `keys`; None when a file cannot be keyed."""
        if any(segment_keys is None for segment_keys in keys) or any(
            process.clock_offset_us for process in processes
        ):
            return None
        names = [os.path.basename(process.base) for process in processes]
        content = [
            [(k.length, k.head, k.tail, k.size, k.rest) for k in segment_keys or []]
            for segment_keys in keys
        ]
        name = "run-" + hashlib.blake2b(_key_bytes(names), digest_size=16).hexdigest() + ".facts"
        key = hashlib.blake2b(
            _key_bytes([self.version, self.folder.log_dir, names, content]), digest_size=16
        ).hexdigest()
        return name, key

    def lookup_run(
        self, processes: list[ProcessLog], keys: list[list[ContentKey] | None]
    ) -> bytes | None:
        """The merged facts of all of `processes` (`collect.collect_run`'s), when kept for exactly
        the files as they are now (`keys`, partial lines included), in this folder.

        Checked before any process's read is looked up: an unchanged run
        needs neither `reads.pack` nor any per-process work.
        """
        return self._read_keyed(self._run_entry(processes, keys))

    def save_run(
        self, processes: list[ProcessLog], keys: list[list[ContentKey] | None], payload: bytes
    ) -> bool:
        """Keep the merged facts of all of `processes` (one entry per selection of processes,
        replaced as the files change)."""
        entry = self._run_entry(processes, keys)
        return entry is not None and self.folder.write(entry[0], entry[1].encode() + payload)

    def _verdicts_entry(
        self, processes: list[ProcessLog], keys: list[list[ContentKey] | None], question: str
    ) -> tuple[str, str] | None:
        """(entry name, key) of the verdicts drawn from the merged facts of these files for
        `question` (the options that shape them)."""
        entry = self._run_entry(processes, keys)
        if entry is None:
            return None
        name = (
            entry[0][: -len(".facts")]
            + "-"
            + hashlib.blake2b(question.encode(), digest_size=8).hexdigest()
            + ".verdicts"
        )
        return name, hashlib.blake2b(
            (entry[1] + "\0" + question).encode(), digest_size=16
        ).hexdigest()

    def lookup_verdicts(
        self, processes: list[ProcessLog], keys: list[list[ContentKey] | None], question: str
    ) -> bytes | None:
        """The verdicts kept for `question` from exactly these files' facts (as `lookup_run`: the
        same files, partial lines included), or None."""
        return self._read_keyed(self._verdicts_entry(processes, keys, question))

    def _read_keyed(self, entry: tuple[str, str] | None) -> bytes | None:
        """The payload of the entry named `entry[0]` whose first 32 bytes are its key `entry[1]`, or
        None."""
        if entry is None:
            return None
        for payload in self.folder.read(entry[0]):
            if payload[:32] == entry[1].encode():
                return payload[32:]
        return None

    def save_verdicts(
        self,
        processes: list[ProcessLog],
        keys: list[list[ContentKey] | None],
        question: str,
        payload: bytes,
    ) -> bool:
        """Keep the verdicts drawn for `question` from these files' facts (one entry per question,
        replaced as the files change)."""
        entry = self._verdicts_entry(processes, keys, question)
        return entry is not None and self.folder.write(entry[0], entry[1].encode() + payload)


def _key_bytes(value: Any) -> bytes:
    """`value` (lists of names and numbers) as bytes to hash: JSON, a file name's undecodable bytes
    escaped."""
    return json.dumps(value, ensure_ascii=True).encode()


@lru_cache(maxsize=1)
def _entries_codec() -> plain_data.PlainCodec | None:
    """The codec of `_READS` (file name → version, content keys, lines, the read's own plain
    data)."""
    return plain_data.PlainCodec([ContentKey]) if plain_data.available else None


def segment_keys(process: ProcessLog) -> list[ContentKey] | None:
    """The content keys of `process`'s segments now, oldest first; None when one cannot be read."""
    keys = [content_key(path) for path in process.segments]
    return None if any(key is None for key in keys) else keys  # type: ignore[return-value]  # no None left: checked in the same expression


def plan_reads(
    processes: list[ProcessLog],
    cache: ProcessCache | None,
    keys: list[list[ContentKey] | None] | None = None,
) -> list[ReadPlan]:
    """One `ReadPlan` per process: a hit, a resume from its cached read, or a read from the start
    (always, without `cache`).

    `keys`: the processes' `segment_keys`, when known already.
    """
    keys = [segment_keys(process) for process in processes] if keys is None else keys
    return [
        _plan(process, segment, cache) for process, segment in zip(processes, keys, strict=True)
    ]


def _plan(
    process: ProcessLog, keys: list[ContentKey] | None, cache: ProcessCache | None
) -> ReadPlan:
    if keys is None or process.clock_offset_us:
        return ReadPlan(keys=None, stop=-1)
    current = keys
    stop = next(
        (index for index, key in enumerate(current) if key.size > key.length), len(current) - 1
    )
    plan = ReadPlan(keys=current, stop=stop)
    if cache is None or stop < 0:
        return plan
    for cached, lines, blob in cache.lookup(process):
        resumed = _resume_point(process, current, stop, cached)
        if resumed is not None:
            segment, hit = resumed
            return ReadPlan(
                keys=current,
                stop=stop,
                resume=blob,
                start_segment=segment,
                start_offset=cached[segment].length,
                start_line=lines[segment],
                lines=tuple(lines),
                hit=hit,
            )
    return plan


def _resume_point(
    process: ProcessLog, current: list[ContentKey], stop: int, cached: list[ContentKey]
) -> tuple[int, bool] | None:
    """(the segment the cached read ends in, whether it covers everything readable now), or None
    when it is no prefix of the files now."""
    last = len(cached) - 1
    if last < 0 or last > stop:
        return (
            None  # it read further than what is complete now: the files were truncated or rewritten
        )
    if any(not mine.same_content(theirs) for mine, theirs in zip(current[:last], cached[:last])):
        return None  # an older segment changed (rotated away, or rewritten)
    if current[last].same_content(cached[last]):
        return last, last == stop and current[last].length == cached[last].length
    if current[last].length > cached[last].length and is_prefix(
        process.segments[last], cached[last]
    ):
        return last, False  # appended to since: go on from where the cached read ended
    return None
