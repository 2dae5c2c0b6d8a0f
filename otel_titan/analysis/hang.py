"""The Hang section of `otel-titan summarize`: which rank, which frame, which collective.

Read from what each process left (docs/hangs.md): its latest ``stall`` record
(the black box: open spans, every thread's stack, torch's flight recorder), the
faulthandler side file (``<file>.stacks``, `side_file_of`: the stacks of a process whose
interpreter lock was held by a C call, so that Python could not write), and the
summary's own facts (closed or not, open spans).

Ranks are grouped by where they are: innermost open span, the main thread's
frame (the innermost frame of the program's own code: not the standard
library, site-packages or otel-titan), and the last flight-recorder collective
(process group, ``collective_seq_id``, op, state). Then the odd ones out:

* a rank *behind* in a process group's collective sequence (it never entered
  the collective the others wait in) is a suspect;
* a rank whose collective at the others' sequence number is another op (or
  other sizes) is a suspect: a mismatch;
* without a flight recorder: a rank alone in a group while most ranks share
  another is a suspect;
* a process that logged nothing since its file was created is a suspect;
* the majority, waiting in the same place, are victims.

Only digests are kept per process (`digest_black_box`): a few frames, the last
collective of each process group; never a whole record, so 1,000 ranks cost
little memory.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from otel_titan.analysis.headline import compress
from otel_titan.schema import MetaEvent, stacks_file_name

__all__ = ["digest_black_box", "read_faulthandler_stacks", "build_hang", "format_hang", "HangReport", "HangGroup", "Suspect", "RankPlace"]

#: Groups listed in the text (all are in --json); suspects listed in the text.
GROUPS_SHOWN = 4
SUSPECTS_SHOWN = 5
#: Bytes read from the end of a faulthandler side file.
SIDE_FILE_TAIL = 256 << 10
_LIBRARY = re.compile(r"(^|/)(site-packages|dist-packages|otel_titan|lib/python\d+\.\d+)/|^<frozen |^<string>")


def _program_frame(frames: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost frame of the program's own code (`frames` innermost first), else the innermost."""
    for frame in frames:
        if not _LIBRARY.search(str(frame.get("file", ""))):
            return frame
    return frames[0] if frames else None


def _where(frame: dict[str, Any] | None) -> str | None:
    if not frame:
        return None
    return f"{frame.get('file')}:{frame.get('line')} {frame.get('function')}"


def digest_black_box(record: dict[str, Any]) -> dict[str, Any]:
    """What the Hang section needs from one ``stall`` record (small: kept per process)."""
    threads = record.get("threads") or []
    main = next((t for t in threads if t.get("main")), None)
    frames = (main or {}).get("frames") or []
    last_by_pg: dict[Any, dict[str, Any]] = {}
    recorder = record.get("flight_recorder")
    if isinstance(recorder, dict):
        for entry in recorder.get("entries") or []:
            if entry.get("is_p2p"):
                continue
            pg = entry.get("pg_id")
            seq = entry.get("collective_seq_id")
            if type(seq) is not int:
                continue
            held = last_by_pg.get(pg)
            if held is None or seq >= held["seq"]:
                last_by_pg[pg] = {"pg": pg, "seq": seq, "op": _op(entry.get("op")), "state": "completed" if entry.get("retired") and entry.get("state") == "scheduled" else entry.get("state"), "sizes": entry.get("input_sizes")}
    open_spans = record.get("open_spans") or []
    innermost = max(open_spans, key=lambda s: -(s.get("open_s") or 0), default=None)
    return {
        "reason": record.get("reason"),
        "time_us": record.get("time_us"),
        "stalled_s": record.get("stalled_s"),
        "frame": _program_frame(frames),
        "top_frame": frames[0] if frames else None,
        "thread_frames": [(t.get("thread_name"), _where(_program_frame(t.get("frames") or []))) for t in threads[:8]],
        "collectives": last_by_pg,
        "span": innermost.get("name") if innermost else None,
        "recorder": "on" if isinstance(recorder, dict) and "entries" in recorder else ("error" if isinstance(recorder, dict) else "off"),
    }


def _op(name: Any) -> Any:
    # "gloo:all_reduce", "nccl:all_reduce" → "all_reduce"
    return name.split(":", 1)[1] if isinstance(name, str) and ":" in name else name


_THREADS_NOTE = re.compile(r"^# otel-titan threads \(pid \d+, main (0x[0-9a-f]+)\): (.*)$")
_ARMED_NOTE = re.compile(r"^# otel-titan armed at (\d+) us, fires at (\d+) us")
_NAME = re.compile(r"(0x[0-9a-f]+)='((?:[^'\\]|\\.)*)'")
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)(?: \[(.*?)\])? \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_OUR_CODE = re.compile(r"(^|/)otel_titan/")
_THREADING = re.compile(r"(^|/)threading\.py$")


def _ours(name: Any, frames: Sequence[dict[str, Any]]) -> bool:
    """otel-titan's own thread (its writer, its signal watcher): by name, or, unnamed, by what it runs.

    The outermost frame past `threading`'s bootstrap is the thread's target:
    in otel_titan, it is one of ours (a program's thread may call into
    otel-titan, but never has it as its target).
    """
    if isinstance(name, str) and name.startswith("otel-titan-"):
        return True
    outer = [f for f in frames if not _THREADING.search(str(f.get("file", "")))]
    return bool(outer) and len(outer) < len(frames) and bool(_OUR_CODE.search(str(outer[-1].get("file", ""))))


def read_faulthandler_stacks(path: str) -> dict[str, Any] | None:
    """The last faulthandler dump in a ``.stacks`` side file, or None.

    Returns ``{"reason": "faulthandler", "time_us", "armed_us", "threads"}``:
    `time_us` is when the dump fired (the ``fires at`` of the note the writer
    put before arming it; for files without one, older runs, the file's
    modification time, which is never earlier), so a caller can tell a dump
    of a stall the process recovered from (records after it) from one of the
    end. `threads`: every thread's frames (innermost first), the main one
    marked, otel-titan's own threads left out.
    """
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            handle.seek(max(0, info.st_size - SIDE_FILE_TAIL))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    start = text.rfind("Timeout (")
    if start < 0:
        return None
    main_ident, names = None, {}
    time_us, armed_us = info.st_mtime_ns // 1000, None
    for line in text[:start].splitlines():
        note = _THREADS_NOTE.match(line)
        if note:
            main_ident = note.group(1)
            names = dict(_NAME.findall(note.group(2)))
            continue
        armed = _ARMED_NOTE.match(line)
        if armed:
            armed_us, time_us = int(armed.group(1)), int(armed.group(2))
    threads: list[dict[str, Any]] = []
    for line in text[start:].splitlines():
        head = _THREAD.match(line)
        if head:
            ident = head.group(1)
            threads.append({"thread_id": ident, "thread_name": names.get(ident, head.group(2)), "main": ident == main_ident, "frames": []})
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1]["frames"].append({"file": _short(frame.group(1)), "line": int(frame.group(2)), "function": frame.group(3)})
    threads = [t for t in threads if t["main"] or not _ours(t["thread_name"], t["frames"])]
    if not threads:
        return None
    return {"reason": "faulthandler", "time_us": time_us, "armed_us": armed_us, "threads": threads}


def side_file_of(base: str) -> str:
    """The faulthandler side file of the process whose active JSONL file is `base`.

    Named by the ``stacks_file`` field of its opening record (the first line of
    its oldest segment still on disk); else by `stacks_file_name` (the opening
    record rotated away); else ``<base>.stacks``, the name older runs used (named
    like a rotated segment, which ``*.jsonl*`` globs took for one).
    """
    folder = os.path.dirname(base)
    oldest = max(glob.glob(glob.escape(base) + ".[0-9]*"), key=lambda p: int(p.rsplit(".", 1)[1]) if p.rsplit(".", 1)[1].isdigit() else -1, default=base)
    try:
        with open(oldest, "rb") as handle:
            first = json.loads(handle.readline(64 << 10) or b"{}")
    except (OSError, ValueError):
        first = {}
    named = first.get("stacks_file") if isinstance(first, dict) and first.get("log_type_name") == MetaEvent.OPENED else None
    candidates = [os.path.join(folder, os.path.basename(named))] if isinstance(named, str) and named else []
    candidates += [os.path.join(folder, stacks_file_name(os.path.basename(base))), base + ".stacks"]
    return next((c for c in candidates if os.path.exists(c)), candidates[0])


def _short(path: str) -> str:
    cwd = os.getcwd()
    return path[len(cwd) + 1 :] if path.startswith(cwd + os.sep) else path


@dataclass
class RankPlace:
    """Where one process is: its group key and the facts behind it."""

    label: str
    source: str
    rank: int | None
    status: str
    span: str | None
    where: str | None
    evidence: str
    collective: dict[str, Any] | None = None
    threads: list[Any] = field(default_factory=list)


@dataclass
class HangGroup:
    """Processes in the same place."""

    count: int
    ranks: list[int]
    labels: list[str]
    span: str | None
    where: str | None
    collective: dict[str, Any] | None
    role: str


@dataclass
class Suspect:
    """A process the evidence points at, and why."""

    source: str
    rank: int | None
    label: str
    where: str | None
    span: str | None
    why: str


@dataclass
class HangReport:
    """The Hang section: `groups` (largest first), `suspects`, and per-process places (in --json only)."""

    affected: int
    processes: int
    headline: str
    groups: list[HangGroup]
    suspects: list[Suspect]
    places: list[RankPlace]


def _status(process: Any, box: dict[str, Any] | None) -> str | None:
    if box is not None and box.get("reason") == "stall":
        return "stalled"
    if process.closed_cleanly is False:
        if process.signal:
            return f"killed ({process.signal})"
        return "did not close"
    if process.hang_suspect:
        return "nothing logged"
    return None


def build_hang(processes: Sequence[Any], boxes: dict[str, dict[str, Any]], bases: dict[str, str]) -> HangReport | None:
    """The Hang section, or None when every process closed cleanly and none stalled.

    `boxes`: label → `digest_black_box` of its latest ``stall`` record; `bases`:
    label → its JSONL base path (for the faulthandler side file).
    """
    places: list[RankPlace] = []
    for process in processes:
        box = boxes.get(process.label)
        status = _status(process, box)
        if status is None:
            continue
        # A faulthandler dump, when no black box followed the last event: the interpreter lock was held.
        dump = None
        base = bases.get(process.label)
        if base and (box is None or (process.last_event_us and (box.get("time_us") or 0) < process.last_event_us)):
            dump = read_faulthandler_stacks(side_file_of(base))
            if dump is not None and (process.last_us or 0) > dump["time_us"]:
                dump = None  # written before the process's last record: a stall it recovered from, not where it is
        if dump is not None:
            main = next((t for t in dump["threads"] if t["main"]), None)
            frame = _program_frame((main or {}).get("frames") or [])
            threads = [(t["thread_name"], _where(_program_frame(t["frames"]))) for t in dump["threads"] if not str(t.get("thread_name") or "").startswith("otel-titan-")][:8]
            evidence = "faulthandler (interpreter lock held)"
            status = "stalled, interpreter lock held" if status != "stalled" else status
        elif box is not None:
            frame, threads, evidence = box.get("frame"), box.get("thread_frames") or [], f"black box ({box.get('reason')})"
        else:
            frame, threads, evidence = None, [], "records only"
        span = process.last_phase or (box or {}).get("span")
        collectives = (box or {}).get("collectives") or {}
        collective = collectives.get(0) if 0 in collectives else (next(iter(collectives.values())) if collectives else None)
        places.append(RankPlace(process.label, process.source, process.rank, status, span, _where(frame), evidence, collective, [list(t) for t in threads]))
    if not places:
        return None
    suspects = _suspects(places, processes)
    suspect_labels = {s.label for s in suspects}
    groups = _groups(places, suspect_labels)
    stalled = sum(1 for p in places if p.status.startswith("stalled"))
    headline = f"{len(places)} of {len(processes)} processes hung or did not close ({stalled} stalled)"
    if not stalled and not any(p.evidence.startswith("black box") for p in places):
        headline += "; no black box: still running, or killed before a stall was detected (places from the records only)"
    return HangReport(affected=len(places), processes=len(processes), headline=headline, groups=groups, suspects=suspects, places=places)


def _key(place: RankPlace) -> tuple[Any, ...]:
    c = place.collective or {}
    return (place.source, place.span, place.where, c.get("pg"), c.get("seq"), c.get("op"), c.get("state"))


def _groups(places: list[RankPlace], suspect_labels: set[str]) -> list[HangGroup]:
    by_key: dict[tuple[Any, ...], list[RankPlace]] = {}
    for place in places:
        by_key.setdefault(_key(place), []).append(place)
    ordered = sorted(by_key.values(), key=lambda g: -len(g))
    out = []
    for members in ordered:
        first = members[0]
        role = "suspect" if any(m.label in suspect_labels for m in members) else ("victims" if len(members) > 1 or len(ordered) == 1 else "other")
        out.append(
            HangGroup(
                count=len(members),
                ranks=sorted(m.rank for m in members if m.rank is not None),
                labels=[m.label for m in members],
                span=first.span,
                where=first.where,
                collective=first.collective,
                role=role,
            )
        )
    return out


def _suspects(places: list[RankPlace], processes: Sequence[Any]) -> list[Suspect]:
    suspects: dict[str, Suspect] = {}

    def add(place: RankPlace, why: str) -> None:
        if place.label not in suspects:
            suspects[place.label] = Suspect(place.source, place.rank, place.label, place.where, place.span, why)

    # Collective sequence: per (source, pg), who is behind, who called another op at the same seq.
    by_pg: dict[tuple[str, Any], list[RankPlace]] = {}
    for place in places:
        if place.collective is not None:
            by_pg.setdefault((place.source, place.collective.get("pg")), []).append(place)
    for (_source, pg), members in by_pg.items():
        top = max(m.collective["seq"] for m in members)  # type: ignore[index]
        at_top = [m for m in members if m.collective["seq"] == top]  # type: ignore[index]
        ops = Counter(m.collective.get("op") for m in at_top)  # type: ignore[union-attr]
        common_op = ops.most_common(1)[0][0]
        for m in members:
            c = m.collective or {}
            if c.get("seq", top) < top:
                add(m, f"behind in pg {pg}: never entered seq {top} {common_op} (its last: seq {c.get('seq')} {c.get('op')}, {c.get('state')})")
        if len(at_top) > 1 and len(ops) > 1:
            for m in at_top:
                if (m.collective or {}).get("op") != common_op:
                    add(m, f"mismatch in pg {pg} seq {top}: called {(m.collective or {}).get('op')} while {ops[common_op]} rank(s) called {common_op}")
    # Processes with a place but no collective while others have one (no black box: a held interpreter lock).
    if by_pg:
        (_source, pg), members = max(by_pg.items(), key=lambda item: len(item[1]))
        top = max(m.collective["seq"] for m in members)  # type: ignore[index]
        op = Counter(m.collective.get("op") for m in members if m.collective["seq"] == top).most_common(1)[0][0]  # type: ignore[index,union-attr]
        for place in places:
            if place.collective is None and place.status.startswith("stalled"):
                add(place, f"the others wait in seq {top} {op} (pg {pg}); it has no collective on record ({place.evidence})")
    # Nothing logged at all.
    for place in places:
        if place.status == "nothing logged":
            add(place, "logged nothing since its file was created")
    # Without a flight recorder: the odd ones out of the (span, frame) groups.
    if not suspects and len(places) >= 3:
        counts = Counter((p.span, p.where) for p in places)
        (common, n), = counts.most_common(1)
        if n >= 2 and n > len(places) / 2:
            for place in places:
                if (place.span, place.where) != common:
                    add(place, f"elsewhere than the {n} others (in {common[0]} at {common[1]})")
    if not suspects:
        # Every process in the same place (or one alone): a process stuck in its own code with no collective.
        for place in places:
            if place.status.startswith("stalled") and place.where and not _LIBRARY.search(place.where):
                add(place, "stalled in its own code")
    return sorted(suspects.values(), key=lambda s: (s.rank is None, s.rank if s.rank is not None else 0, s.label))


def _ranks(ranks: Sequence[int]) -> str:
    text = compress(list(ranks))
    return text if len(text) <= 60 else text[:57] + "..."


def _collective(c: dict[str, Any] | None) -> str:
    if not c:
        return ""
    return f"{c.get('op')} (pg {c.get('pg')}, seq {c.get('seq')}, {c.get('state')})"


def format_hang(report: HangReport | None) -> list[str]:
    """The Hang section as text lines (empty when there was no hang); printed before everything else."""
    if report is None:
        return []
    lines = [f"Hang: {report.headline}"]
    for group in report.groups[:GROUPS_SHOWN]:
        who = f"rank{'s' if len(group.ranks) != 1 else ''} {_ranks(group.ranks)}" if group.ranks else ", ".join(group.labels[:3])
        where = []
        if group.collective:
            if group.collective.get("state") == "completed":
                where.append(f"last collective {_collective(group.collective)}")
            else:
                where.append(f"{'waits' if group.count == 1 else 'wait'} in {_collective(group.collective)}")
        if group.span:
            where.append(f"span {group.span}")
        if group.where:
            where.append(f"main thread at {group.where}")
        mark = "▶" if group.role == "suspect" else " "
        lines.append(f" {mark} {group.count} × {who}: {'; '.join(where) or 'no location recorded'}" + ("   (victims)" if group.role == "victims" and report.suspects else ""))
    if len(report.groups) > GROUPS_SHOWN:
        lines.append(f"   … {len(report.groups) - GROUPS_SHOWN} more groups (--json)")
    if report.suspects:
        lines.append("Suspects:")
        for suspect in report.suspects[:SUSPECTS_SHOWN]:
            rank = f"rank {suspect.rank}" if suspect.rank is not None else suspect.label
            lines.append(f"  {rank} ({suspect.source}): {suspect.where or 'frame unknown'}" + (f" in span {suspect.span}" if suspect.span else "") + f": {suspect.why}")
        if len(report.suspects) > SUSPECTS_SHOWN:
            lines.append(f"  … {len(report.suspects) - SUSPECTS_SHOWN} more (--json)")
    else:
        lines.append("Suspects: none stands out (every process is in the same place)")
    place_by_label = {p.label: p for p in report.places}
    for suspect in report.suspects[:2]:
        place = place_by_label.get(suspect.label)
        if place and len(place.threads) > 1:
            lines.append(f"  threads of {suspect.label}: " + "; ".join(f"{name}: {where}" for name, where in place.threads[:4]))
    lines.append("")
    return lines


def bases_of(processes: Iterable[Any]) -> dict[str, str]:
    """label → base JSONL path of each `ProcessLog`."""
    return {p.label: p.base for p in processes}
