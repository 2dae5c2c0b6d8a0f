"""Records → Perfetto's native trace (protobuf ``TracePacket``/``TrackEvent``), streamed, names interned.

Why native: Perfetto treats Chrome JSON as a legacy format (it ignores colour
names, so failed and incomplete spans look like any other bar), and its
browser UI runs out of memory near 1–2 GB of JSON. The protobuf form with
interned names is several times smaller and is Perfetto's own.

The layout and every decision about what to show come from the same walk and
visitor as the JSON export (`timeline.walk_process` →
`chrome_events.ExportVisitor`), which describes events as Chrome-trace dicts;
`PerfettoStream` is the second writer: it encodes those dicts as packets with
the trace protos the ``perfetto`` package ships (`perfetto.protos`). Two
differences, because the native format can say more:

* a span is a ``SLICE_BEGIN`` written when its ``_start`` is read and a
  ``SLICE_END`` when its ``_end`` is read (`NativeVisitor`): Perfetto orders
  packets of one sequence with the same timestamp as written, so a parent's
  begin always precedes its children's and nesting is exact at any
  resolution, with no widening; a span that never ended has a begin and no
  end, which Perfetto shows as a slice that did not end (``dur = -1``);
* the steps, async-slot and unknown-thread tracks are plain named tracks of
  the process, not threads (so none of them is shown as a main thread);
* counter tracks end at their process's last record (`PerfettoStream.end_process`).

Event names, categories and argument names are interned per sequence
(``interned_data`` + ``*_iid``). Packets are encoded in batches as ``Trace``
messages; concatenated ``Trace`` messages are one valid trace, which is how
`perfetto.trace_builder.StreamingTraceProtoBuilder` streams too (one packet
per message; batching makes it several times faster).
"""

from __future__ import annotations

import math
import os
import shutil
from typing import Any, BinaryIO

import orjson
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent

from otel_titan.analysis.chrome_events import SLOT_TID_BASE, STEP_TID, UNKNOWN_TID, ExportVisitor
from otel_titan.analysis.timeline import OpenSpan

__all__ = ["PerfettoStream", "NativeVisitor", "FAILED_SUFFIX", "NATIVE_SUFFIXES"]

#: Output names that select the native format.
NATIVE_SUFFIXES = (".pftrace", ".perfetto-trace")
#: Appended to a failed span's name: Perfetto colours slices by name, so failures stand out at a glance.
FAILED_SUFFIX = " (failed)"
_BEGIN, _END, _INSTANT, _COUNTER = TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END, TrackEvent.TYPE_INSTANT, TrackEvent.TYPE_COUNTER
_CLEARED = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_NEEDS_STATE = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
#: Packets encoded per ``Trace`` message.
_BATCH_PACKETS = 4096
_INT64 = 1 << 63
#: The trace's clock (BOOTTIME, Perfetto's default), and this sequence's incremental copy of it (ids 64–127 are
#: sequence-scoped): every packet's timestamp is a delta on it, unless it names the trace clock.
_TRACE_CLOCK, _INCREMENTAL_CLOCK = 6, 64
#: Encoded (argument, value) pairs kept (callers, a few per step; cleared when full).
_ENCODED_CACHE = 4096
#: Arguments holding 64-bit hex ids (written as numbers), and those whose values repeat (interned per sequence).
_ID_ARGS = frozenset({"span_id", "parent_span_id"})
_REPEATED_ARGS = frozenset({"trace_id", "caller", "task_name", "step_tags", "description", "error_type", "error_message"})


class PerfettoStream:
    """Chrome-trace event dicts → native packets on one sequence, appended to an open binary file.

    Same interface as `chrome_events.EventStream` (`add`, `flush`,
    `add_encoded`, `count`, `events`), so `chrome_trace.write_groups` and
    the export workers feed either. `sequence_id` must differ between the
    parts of one trace (each worker's part is its own sequence).
    """

    def __init__(self, handle: BinaryIO, sequence_id: int = 1) -> None:
        self._file = handle
        self.sequence_id = sequence_id
        self._trace = Trace()
        self._packets = self._trace.packet
        self._first = True
        self._last_ns = 0
        self.events = 0
        self._pending = 0
        # Interning tables of this sequence: string → iid.
        self._names: dict[str, int] = {}
        self._categories: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._strings: dict[str, int] = {}
        self._encoded: dict[tuple[str, Any], bytes] = {}  # (argument, value) → its encoded annotation
        # Tracks: (pid, key) → uuid; key is a tid, or ("counter", name).
        self._tracks: dict[tuple[int, Any], int] = {}
        self._process_uuids: dict[int, int] = {}
        self._next_uuid = sequence_id << 16  # small: a uuid is on every packet (parts: < 65,536 tracks each)

    # -- packets --------------------------------------------------------------------------------
    def _packet(self) -> TracePacket:
        if self._first:
            # The sequence's incremental state, valid from here to its end (one writer, nothing lost in between,
            # so later packets need not repeat the flags): interned names, and timestamps as deltas on a clock
            # of this sequence (`_INCREMENTAL_CLOCK`, equal to the trace clock) that starts at 0.
            self._first = False
            self._zero_clock(_CLEARED | _NEEDS_STATE)
        packet = self._packets.add()
        packet.trusted_packet_sequence_id = self.sequence_id
        self._pending += 1
        return packet

    def _zero_clock(self, flags: int = 0) -> None:
        """A clock snapshot: the incremental clock restarts at 0 (the next timestamp is absolute, later ones deltas)."""
        packet = self._packets.add()
        packet.trusted_packet_sequence_id = self.sequence_id
        if flags:
            packet.sequence_flags = flags
            packet.trace_packet_defaults.timestamp_clock_id = _INCREMENTAL_CLOCK
        for clock_id in (_INCREMENTAL_CLOCK, _TRACE_CLOCK):
            clock = packet.clock_snapshot.clocks.add()
            clock.clock_id = clock_id
            clock.timestamp = 0
            if clock_id == _INCREMENTAL_CLOCK:
                clock.is_incremental = True
        self._pending += 1
        self._last_ns = 0

    def _stamp(self, packet: TracePacket, ns: int) -> None:
        """Set `packet`'s time: a delta from the previous packet's when later (1–3 bytes instead of 9), else absolute."""
        last = self._last_ns
        if ns >= last:
            packet.timestamp = ns - last
            self._last_ns = ns
        else:
            packet.timestamp_clock_id = _TRACE_CLOCK  # earlier than the last (another rank, an end from a monotonic clock)
            packet.timestamp = ns

    def _done(self) -> None:
        if self._pending >= _BATCH_PACKETS:
            self.flush()

    def flush(self) -> None:
        """Encode and write the batched packets."""
        if self._pending:
            self._file.write(self._trace.SerializeToString())
            self._trace = Trace()  # a new message: Clear() would detach `_packets` from it
            self._packets = self._trace.packet
            self._pending = 0

    def add_encoded(self, path: str, events: int) -> None:
        """Append a file of already encoded packets (a worker's part, on its own sequence)."""
        self.flush()
        with open(path, "rb") as part:
            shutil.copyfileobj(part, self._file, 4 << 20)
        self.events += events

    @property
    def count(self) -> int:
        """Events added so far."""
        return self.events

    # -- interning ------------------------------------------------------------------------------
    def _iid(self, table: dict[str, int], text: str, packet: TracePacket, field: str) -> int:
        iid = table.get(text)
        if iid is None:
            iid = table[text] = len(table) + 1
            entry = getattr(packet.interned_data, field).add()
            entry.iid = iid
            entry.name = text
        return iid

    def _annotate(self, event: Any, args: dict[str, Any], packet: TracePacket) -> None:
        names, strings = self._arg_names, self._strings
        add = event.debug_annotations.add
        for key, value in args.items():
            if value is None:
                continue  # unknown (``null`` in the records): Perfetto shows no value as well as a "null" string
            annotation = add()
            iid = names.get(key)
            annotation.name_iid = iid if iid is not None else self._iid(names, key, packet, "debug_annotation_names")
            kind = type(value)
            if kind is int and -_INT64 <= value < _INT64:
                annotation.int_value = value
            elif kind is str:
                if key in _ID_ARGS and len(value) == 16:
                    try:
                        annotation.pointer_value = int(value, 16)  # 64-bit ids: 9 bytes, shown as 0x…
                        continue
                    except ValueError:
                        pass
                if key in _REPEATED_ARGS:
                    iid = strings.get(value)
                    annotation.string_value_iid = iid if iid is not None else self._string_iid(value, packet)
                else:
                    annotation.string_value = value
            elif kind is bool:
                annotation.bool_value = value
            elif kind is float:
                annotation.double_value = value
            elif kind is list and key in _REPEATED_ARGS:
                annotation.string_value_iid = self._string_iid(orjson.dumps(value, default=str).decode(), packet)
            else:
                annotation.string_value = orjson.dumps(value, default=str).decode() if kind is not int else str(value)

    def _encode_argument(self, item: tuple[str, Any], packet: TracePacket) -> bytes:
        """One argument as the bytes of a `TrackEvent` holding just its annotation (its names interned in `packet`)."""
        holder = TrackEvent()
        self._annotate(holder, dict((item,)), packet)
        return holder.SerializeToString()

    def _string_iid(self, text: str, packet: TracePacket) -> int:
        table = self._strings
        iid = table.get(text)
        if iid is None:
            iid = table[text] = len(table) + 1
            entry = packet.interned_data.debug_annotation_string_values.add()
            entry.iid = iid
            entry.str = text.encode("utf-8", "surrogatepass")
        return iid

    # -- tracks ---------------------------------------------------------------------------------
    def _uuid(self) -> int:
        self._next_uuid += 1
        return self._next_uuid

    def _process(self, pid: int, name: str | None = None) -> int:
        uuid = self._process_uuids.get(pid)
        if uuid is None or name is not None:
            if uuid is None:
                uuid = self._process_uuids[pid] = self._uuid()
            if name is not None and not self._first:
                self._zero_clock()  # a new process starts back in time: deltas from its own first timestamp
            packet = self._packet()
            descriptor = packet.track_descriptor
            descriptor.uuid = uuid
            descriptor.process.pid = pid
            if name is not None:
                descriptor.process.process_name = name
            self._done()
        return uuid

    def _track(self, pid: int, tid: Any, name: str | None = None) -> int:
        key = (pid, tid)
        uuid = self._tracks.get(key)
        if uuid is not None and name is None:
            return uuid
        parent = self._process(pid)
        if uuid is None:
            uuid = self._tracks[key] = self._uuid()
        packet = self._packet()
        descriptor = packet.track_descriptor
        descriptor.uuid = uuid
        if type(tid) is int and 0 < tid < UNKNOWN_TID:
            # A real OS thread: a thread track (Perfetto appends the tid to its name).
            descriptor.thread.pid = pid
            descriptor.thread.tid = tid
            if name is not None:
                descriptor.thread.thread_name = name
        else:
            # Steps, async slots, a thread whose id the records do not give: named tracks of the process.
            descriptor.parent_uuid = parent
            descriptor.name = name if name is not None else ("steps" if tid == STEP_TID else "thread (id unknown)" if tid == UNKNOWN_TID else f"async slot {tid - SLOT_TID_BASE}")
        self._done()
        return uuid

    def _counter_track(self, pid: int, name: str) -> int:
        key = (pid, ("counter", name))
        uuid = self._tracks.get(key)
        if uuid is None:
            uuid = self._tracks[key] = self._uuid()
            packet = self._packet()
            descriptor = packet.track_descriptor
            descriptor.uuid = uuid
            descriptor.parent_uuid = self._process(pid)
            descriptor.name = name
            descriptor.counter.SetInParent()
            self._done()
        return uuid

    def end_process(self, pid: int, last_us: int) -> None:
        """End the process's counter tracks at its last record: Perfetto draws a counter's last value to the end
        of the trace, and a NaN sample stops it (a crashed rank's loss then ends where the rank did)."""
        for (track_pid, key), uuid in self._tracks.items():
            if track_pid == pid and type(key) is tuple:
                packet = self._packet()
                self._stamp(packet, last_us * 1000)
                packet.track_event.type = _COUNTER
                packet.track_event.track_uuid = uuid
                packet.track_event.double_counter_value = math.nan
                self._done()

    # -- events ---------------------------------------------------------------------------------
    def add(self, event: dict[str, Any]) -> None:
        """Encode one Chrome-trace event dict (``X``, ``B``, ``E``, ``i``, ``C``, ``M``) as packets."""
        phase = event["ph"]
        self.events += 1
        if phase == "X":
            self._slice(_BEGIN, event, event["ts"], with_args=False)
            dur = event["dur"]
            self._slice(_END, event, event["ts"] + dur, with_args=True)
        elif phase == "B":
            self._slice(_BEGIN, event, event["ts"], with_args=True)
        elif phase == "E":
            self.end(event["pid"], event["tid"], event["ts"], event.get("args"))
        elif phase == "i":
            tid = STEP_TID if event.get("s") == "p" else event["tid"]
            self._slice(_INSTANT, event, event["ts"], with_args=True, tid=tid)
        elif phase == "C":
            track = self._counter_track(event["pid"], event["name"])  # before the packet: it may flush a batch
            packet = self._packet()
            self._stamp(packet, _ns(event["ts"]))
            track_event = packet.track_event
            track_event.type = _COUNTER
            track_event.track_uuid = track
            track_event.double_counter_value = float(event["args"]["value"])
            self._done()
        elif phase == "M":
            kind = event["name"]
            if kind == "process_name":
                self._process(event["pid"], event["args"]["name"])
            elif kind == "thread_name":
                self._track(event["pid"], event["tid"], event["args"]["name"])
            # sort indexes: Perfetto orders processes by pid (the rank) and threads by their own rules

    def begin(self, pid: int, tid: Any, name: str, category: str, ts: int) -> None:
        """A slice begins (what ``{"ph": "B"}`` says, without building the dict: one per span)."""
        self.events += 1
        track = self._track(pid, tid)  # before the packet: it may flush a batch
        packet = self._packet()
        self._stamp(packet, ts * 1000)
        track_event = packet.track_event
        track_event.type = _BEGIN
        track_event.track_uuid = track
        iid = self._names.get(name)
        track_event.name_iid = iid if iid is not None else self._iid(self._names, name, packet, "event_names")
        iid = self._categories.get(category)
        track_event.category_iids.append(iid if iid is not None else self._iid(self._categories, category, packet, "event_categories"))
        self._done()

    def end(self, pid: int, tid: Any, ts: float, args: dict[str, Any] | None) -> None:
        """The slice last begun on the track ends; `args` join the slice's.

        The arguments other than the ids repeat from span to span (step, caller, trace id, tags): each one's
        encoding is cached by (name, value) and they are merged in as bytes, one call instead of one object
        per argument.
        """
        self.events += 1
        track = self._track(pid, tid)
        packet = self._packet()
        self._stamp(packet, ts * 1000 if type(ts) is int else _ns(ts))
        track_event = packet.track_event
        track_event.type = _END
        track_event.track_uuid = track
        if args:
            encoded = self._encoded
            parts = []
            ids = None
            for item in args.items():
                if item[0] in _ID_ARGS:
                    ids = ids or {}
                    ids[item[0]] = item[1]  # unique per span: not worth caching
                    continue
                kind = type(item[1])
                if kind is not str and kind is not int:
                    part = self._encode_argument(item, packet)  # tags, floats, bools (True == 1 as a key): each time
                else:
                    part = encoded.get(item)
                    if part is None:
                        part = self._encode_argument(item, packet)
                        if len(encoded) >= _ENCODED_CACHE:
                            encoded.clear()
                        encoded[item] = part
                parts.append(part)
            if parts:
                track_event.MergeFromString(b"".join(parts))  # concatenated messages merge: repeated fields append
            if ids:
                self._annotate(track_event, ids, packet)
        self._done()

    def _slice(self, kind: int, event: dict[str, Any], ts: float, with_args: bool, tid: Any = None) -> None:
        track = self._track(event["pid"], event["tid"] if tid is None else tid)  # before the packet: it may flush a batch
        packet = self._packet()
        self._stamp(packet, ts * 1000 if type(ts) is int else _ns(ts))
        track_event = packet.track_event
        track_event.type = kind
        track_event.track_uuid = track
        if kind != _END:
            name = event["name"]
            iid = self._names.get(name)
            track_event.name_iid = iid if iid is not None else self._iid(self._names, name, packet, "event_names")
            category = event.get("cat")
            if category:
                iid = self._categories.get(category)
                track_event.category_iids.append(iid if iid is not None else self._iid(self._categories, category, packet, "event_categories"))
        if with_args:
            args = event.get("args")
            if args:
                self._annotate(track_event, args, packet)
        self._done()


def _ns(us: float) -> int:
    """µs (int, or float from a monotonic duration) → ns."""
    return us * 1000 if type(us) is int else int(round(us * 1000.0)) if math.isfinite(us) else 0


class NativeVisitor(ExportVisitor):
    """`ExportVisitor` for the native writer: a begin when a span's ``_start`` is read, an end when it ends.

    What is shown (names, args, filters, counts, tracks) is the JSON export's
    (`ExportVisitor.span_event`); only the timing of the writes differs.
    A span's ``tid`` argument is left out on its own thread's track, and
    ``relative_step`` when it equals ``step``: the track and ``step`` say them.
    A failed span's end carries the error; its name gets `FAILED_SUFFIX`
    only when the failure is known at its begin (an ``_end`` without
    ``_start``), so failures are also marked by the ``ERROR:`` instant on the
    span's track, which Perfetto draws as a marker over the bar.
    """

    def span_begun(self, span: OpenSpan) -> None:
        start = span.start
        if self.steps is not None and start.get("step") not in self.steps:  # type: ignore[union-attr]
            return
        self.out.begin(self.pid, span.track, span.name, "span", span.start_us)  # type: ignore[attr-defined]

    def span(self, span: OpenSpan, end: dict[str, Any] | None, end_us: int, dur_us: float, incomplete: bool) -> None:
        event = self.span_event(span, end, end_us, dur_us, incomplete)
        if event is None:
            return
        if span.start is None:
            if span.error is not None:
                event["name"] += FAILED_SUFFIX
            self.add(event)  # never begun: a complete slice
            return
        if incomplete:
            return  # begun, never ended: Perfetto shows a slice that did not end
        args = event["args"]
        # What the track or another argument already says is not repeated (a fifth of a span's bytes).
        if args.get("tid") == span.track:
            del args["tid"]  # the thread track's own tid
        if "relative_step" in args and args["relative_step"] == args.get("step"):
            del args["relative_step"]  # no resumed run: the same as step
        self.out.end(self.pid, span.track, span.start_us + dur_us, event["args"])  # type: ignore[attr-defined]


def is_native(path: str | os.PathLike[str]) -> bool:
    """Whether an output name asks for the native format (``.pftrace``, ``.perfetto-trace``).

    Example:
        >>> is_native("out/trace.pftrace"), is_native("out/trace.json")
        (True, False)
    """
    return os.fspath(path).endswith(NATIVE_SUFFIXES)
