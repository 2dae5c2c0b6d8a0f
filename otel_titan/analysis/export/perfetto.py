"""Records → Perfetto's native trace (protobuf ``TracePacket``/``TrackEvent``), streamed, names
interned.

Why native: Perfetto treats Chrome JSON as a legacy format (it ignores colour
names, so failed and incomplete spans look like any other bar), and its
browser UI runs out of memory near 1–2 GB of JSON. The protobuf form with
interned names is several times smaller and is Perfetto's own.

The layout and every decision about what to show come from the same walk and
visitor as the JSON export (`model.timeline.walk_process` →
`export.chrome_events.ExportVisitor`), which describes events as Chrome-trace dicts;
`PerfettoStream` is the second writer: it encodes those events as packets. Three
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

Size and speed (targets in docs/performance.md): packets are encoded
straight to bytes, not built as protobuf objects field by field from Python
(~3 µs a packet, more than the JSON export spends on a span); names, argument
names, repeated values and callers (source locations) are interned per
sequence; what the trace says elsewhere is not repeated per span
(`NativeVisitor`); timestamps are µs deltas; and batches of packets are
deflated into ``compressed_packets``, as Perfetto's tracing service writes
them (random 64-bit span ids and timestamps are most of what is left).
"""

from __future__ import annotations

import math
import os
import shutil
import struct
import zlib
from typing import Any, BinaryIO

import orjson

from otel_titan.analysis.export.chrome_events import (
    ARG_FIELDS,
    SLOT_TID_BASE,
    STEP_TID,
    UNKNOWN_TID,
    ExportVisitor,
)
from otel_titan.analysis.model.timeline import OpenSpan

__all__ = [
    "PerfettoStream",
    "NativeVisitor",
    "FAILED_SUFFIX",
    "NATIVE_SUFFIXES",
    "TRACK_UUID_STRIDE",
    "MAX_SEQUENCES",
]

#: Output names that select the native format.
NATIVE_SUFFIXES = (".pftrace", ".perfetto-trace")
#: Appended to a failed span's name: Perfetto colours slices by name, so failures stand out at a
#: glance.
FAILED_SUFFIX = " (failed)"
#: ``TrackEvent.Type``: SLICE_BEGIN, SLICE_END, INSTANT, COUNTER.
_BEGIN, _END, _INSTANT, _COUNTER = 1, 2, 3, 4
#: ``TracePacket.SequenceFlags``: SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE.
_CLEARED, _NEEDS_STATE = 1, 2
#: Encoded packets written (and deflated) at a time.
_BATCH_BYTES = 1 << 20
#: Deflate level of ``compressed_packets`` (zlib's default: most of level 9's size for a fraction of
#: its time).
_ZLIB_LEVEL = 6
_INT64 = 1 << 63
#: The trace's clock (BOOTTIME, Perfetto's default), and this sequence's incremental copy of it (ids
#: 64–127 are sequence-scoped): every packet's timestamp is a delta on it, unless it names the trace
#: clock.
_TRACE_CLOCK, _INCREMENTAL_CLOCK = 6, 64
_ON_TRACE_CLOCK = b"\xd0\x03\x06"  # TracePacket.timestamp_clock_id = _TRACE_CLOCK
#: Encoded (argument, value) pairs kept (callers, a few per step; cleared when full).
_ENCODED_CACHE = 4096
#: Arguments holding 64-bit hex ids (written as numbers), and those whose values repeat (interned
#: per sequence;
#: a step's ``trace_id`` is on each rank's step bar).
#: A span's arguments that repeat from span to span (all but its ids), as `span_prefix` encodes
#: them.
_CACHED_ARGS = tuple(
    name
    for name in ARG_FIELDS
    if name not in ("span_id", "parent_span_id", "step", "relative_step", "trace_id")
)
#: What a span's end adds to the arguments its begin carried (a failure;
#: `ExportVisitor.span_event`).
_END_ARGS = ("status", "error_type", "error_message")
_ID_ARGS = frozenset({"span_id", "parent_span_id"})
_REPEATED_ARGS = frozenset(
    {"trace_id", "caller", "task_name", "step_tags", "description", "error_type", "error_message"}
)


#: Track uuids are interleaved between the packet sequences of one trace: sequence ``s`` numbers its
#: tracks ``s``, ``s + STRIDE``, ``s + 2·STRIDE``…, so two parts (the export's workers) never give
#: the same uuid, however many tracks each makes (a process with 70,000 scalar names, 256 ranks ×
#: 128 metrics in one part). Sequence ids are therefore 1 … ``TRACK_UUID_STRIDE - 1``; uuids stay
#: small (a varint on every packet).
TRACK_UUID_STRIDE = 256
#: The most packet sequences (the parent's and one per export worker) one trace can have.
MAX_SEQUENCES = TRACK_UUID_STRIDE - 1


class PerfettoStream:
    """Chrome-trace event dicts → native packets on one sequence, appended to an open binary file.

    Same interface as `export.chrome_events.EventStream` (`add`, `flush`,
    `add_encoded`, `count`, `events`), so `export.chrome_trace.write_groups` and
    the export workers feed either. `sequence_id` must differ between the
    parts of one trace (each worker's part is its own sequence), from 1 to
    `MAX_SEQUENCES`; it also makes the part's track uuids its own
    (`TRACK_UUID_STRIDE`).

    Packets are encoded straight to bytes (`_varint`, `_field`): the few
    packet shapes written here, field numbers from Perfetto's protos
    (tests decode every shape back with them). Building protobuf objects
    field by field from Python cost ~3 µs a packet, more than the JSON
    export spends on a whole span.
    """

    def __init__(self, handle: BinaryIO, sequence_id: int = 1, compress: bool = True) -> None:
        if type(sequence_id) is not int or not 1 <= sequence_id <= MAX_SEQUENCES:
            raise ValueError(
                f"sequence_id must be an int from 1 to {MAX_SEQUENCES} (track uuids are unique "
                f"per sequence), got {sequence_id!r}"
            )
        self._file = handle
        self.sequence_id = sequence_id
        self.compress = compress
        self._seq = b"\x50" + _varint(sequence_id)  # trusted_packet_sequence_id, on every packet
        self._seq_len = len(self._seq)
        self._out = bytearray()  # encoded ``Trace.packet`` fields not yet written
        self._first = True
        self._last_us = 0
        self.events = 0
        self._interned: list[bytes] = []  # ``InternedData`` fields for the next packet
        # Interning tables of this sequence: string → iid.
        self._names: dict[str, int] = {}
        self._categories: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._strings: dict[str, int] = {}
        self._locations: dict[str, int] = {}  # caller ("file:line:function") → source location iid
        # (argument, value) → its encoded annotation
        self._encoded: dict[tuple[str, Any], bytes] = {}
        # Tracks: (pid, key) → uuid; key is a tid, or ("counter", name).
        self._tracks: dict[tuple[int, Any], int] = {}
        # (pid, tid) → encoded ``track_uuid`` field
        self._track_bytes: dict[tuple[int, Any], bytes] = {}
        # (pid, tid) → a slice end's encoded ``track_event``
        self._ends: dict[tuple[int, Any], bytes] = {}
        # (pid, name) → a sample's bytes before its value
        self._counter_heads: dict[tuple[int, str], bytes] = {}
        self._steps: dict[Any, bytes] = {}  # step → its encoded annotation
        # argument → an id annotation's bytes before the number
        self._id_heads: dict[str, bytes] = {}
        #: A span begin's ``TrackEvent`` fields but its ids, by what decides them
        #: (`NativeVisitor.span_begun`).
        self.span_prefixes: dict[tuple, bytes] = {}
        self._process_uuids: dict[int, int] = {}
        # the first is `sequence_id` itself (see TRACK_UUID_STRIDE)
        self._next_uuid = sequence_id - TRACK_UUID_STRIDE

    # -- packets --------------------------------------------------------------------------------
    def _emit(self, body: bytes, us: float | None = None) -> None:
        """One packet: `body` (its fields but the sequence id and time), with the names interned
        since the last one, at `us` (µs) if given.

        Field order is free in protobuf; the one chosen puts what varies from packet to packet (ids,
        time) at the end, so that deflate finds the rest of a packet as one match, not two (a tenth
        of the compressed size).
        """
        if self._first:
            # The sequence's incremental state, valid from here to its end (one writer, nothing lost
            # in between, so later packets need not repeat the flags): interned names, and
            # timestamps as deltas on a clock of this sequence (`_INCREMENTAL_CLOCK`, in µs, on the
            # trace clock) that starts at 0.
            self._first = False
            self._zero_clock(_CLEARED | _NEEDS_STATE)
        if us is None:
            stamp = b""
        elif type(us) is int and us >= self._last_us:  # the common case of `_stamp`, inline
            delta = us - self._last_us
            self._last_us = us
            stamp = _STAMPS[delta] if delta < _SMALL else b"\x40" + _varint(delta)
        else:
            stamp = self._stamp(us)
        if self._interned:
            body += _field(b"\x62", b"".join(self._interned))
            self._interned = []
        out = self._out
        size = self._seq_len + len(body) + len(stamp)
        out += _PACKET_HEADS[size] if size < _SMALL else b"\x0a" + _varint(size)
        out += self._seq
        out += body
        out += stamp
        if len(out) >= _BATCH_BYTES:
            self.flush()

    def _zero_clock(self, flags: int = 0) -> None:
        """A clock snapshot: the incremental clock restarts at 0 (the next timestamp is absolute,
        later ones deltas)."""
        # in µs
        incremental = _field(
            b"\x0a", b"\x08" + _varint(_INCREMENTAL_CLOCK) + b"\x10\x00\x18\x01\x20" + _varint(1000)
        )
        trace_clock = _field(b"\x0a", b"\x08" + _varint(_TRACE_CLOCK) + b"\x10\x00")
        body = _field(b"\x32", incremental + trace_clock)
        if flags:
            body += (
                b"\x68"
                + _varint(flags)
                + _field(b"\xda\x03", b"\xd0\x03" + _varint(_INCREMENTAL_CLOCK))
            )
        body += self._seq
        self._out += b"\x0a" + _varint(len(body)) + body
        self._last_us = 0

    def _stamp(self, us: float) -> bytes:
        """A packet's time fields: in whole µs, a delta from the previous packet's when later (1–3
        bytes instead of 9, and deflate finds them: ns deltas, multiples of 1000, look random byte
        by byte); else absolute, in ns, on the trace clock (earlier: another rank; a fraction of a
        µs: an end from a monotonic clock)."""
        if type(us) is not int:
            if not us.is_integer():
                return b"\x40" + _varint(_ns(us)) + _ON_TRACE_CLOCK
            us = int(us)
        last = self._last_us
        if us >= last:
            self._last_us = us
            return b"\x40" + _varint(us - last)
        return b"\x40" + _varint(us * 1000) + _ON_TRACE_CLOCK

    def flush(self) -> None:
        """Write the batched packets: deflated into one ``compressed_packets`` packet (`compress`),
        as Perfetto's own tracing service writes them, or as they are."""
        out = self._out
        if out:
            if self.compress:
                self._file.write(
                    _field(b"\x0a", _field(b"\x92\x03", zlib.compress(out, _ZLIB_LEVEL)))
                )
            else:
                self._file.write(out)
            self._out = bytearray()

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
    def _iid(self, table: dict[str, int], text: str, field: bytes) -> int:
        """`text`'s iid in `table`, interned in the next packet if new (`field`: its
        ``InternedData`` field)."""
        iid = table.get(text)
        if iid is None:
            iid = table[text] = len(table) + 1
            self._interned.append(
                _field(field, b"\x08" + _varint(iid) + _field(b"\x12", _utf8(text)))
            )
        return iid

    def _location_iid(self, caller: str) -> int | None:
        """A caller ``file:line:function`` as an interned source location (Perfetto shows it as the
        slice's ``source``), or None when it is not in that form."""
        iid = self._locations.get(caller)
        if iid is None:
            parts = caller.rsplit(":", 2)
            if (
                len(parts) != 3
                or not (parts[1].isascii() and parts[1].isdigit())
                or len(parts[1]) > 9
            ):
                return None
            iid = self._locations[caller] = len(self._locations) + 1
            location = (
                b"\x08"
                + _varint(iid)
                + _field(b"\x12", _utf8(parts[0]))
                + _field(b"\x1a", _utf8(parts[2]))
                + b"\x20"
                + _varint(int(parts[1]))
            )
            self._interned.append(_field(b"\x22", location))
        return iid

    def _annotation(self, key: str, value: Any) -> bytes:
        """One argument as a ``debug_annotations`` field (its name, and its value when it repeats,
        interned)."""
        iid = self._arg_names.get(key)
        body = b"\x08" + _varint(
            iid if iid is not None else self._iid(self._arg_names, key, b"\x1a")
        )
        kind = type(value)
        if kind is int and -_INT64 <= value < _INT64:
            body += b"\x20" + _varint(value)
        elif kind is str:
            if key in _ID_ARGS and len(value) == 16:
                try:
                    # 64-bit ids: shown as 0x…
                    return _field(b"\x22", body + b"\x38" + _varint(int(value, 16)))
                except ValueError:
                    pass
            if key in _REPEATED_ARGS:
                body += b"\x88\x01" + _varint(self._string_iid(value))
            else:
                body += _field(b"\x32", _utf8(value))
        elif kind is bool:
            body += b"\x10\x01" if value else b"\x10\x00"
        elif kind is float:
            body += b"\x29" + _DOUBLE.pack(value)
        elif kind is list and key in _REPEATED_ARGS:
            body += b"\x88\x01" + _varint(
                self._string_iid(orjson.dumps(value, default=str).decode())
            )
        else:
            body += _field(
                b"\x32",
                _utf8(orjson.dumps(value, default=str).decode() if kind is not int else str(value)),
            )
        return _field(b"\x22", body)

    def _annotations(self, args: dict[str, Any]) -> bytes:
        """The arguments as ``debug_annotations`` (and a caller as ``source_location_iid``); the
        encoding of each (argument, value) that repeats (step, trace id, tags, task) is cached."""
        encoded = self._encoded
        parts = []
        for item in args.items():
            key, value = item
            kind = type(value)
            if value is None:
                continue  # unknown (``null`` in the records): Perfetto shows no value as well as a "null" string
            if key in _ID_ARGS or (kind is not str and kind is not int):
                # unique per span, or a kind not worth caching
                parts.append(self._annotation(key, value))
                continue
            part = encoded.get(item)
            if part is None:
                location = self._location_iid(value) if key == "caller" and kind is str else None
                part = (
                    b"\x90\x02" + _varint(location)
                    if location is not None
                    else self._annotation(key, value)
                )
                if len(encoded) >= _ENCODED_CACHE:
                    encoded.clear()
                encoded[item] = part
            parts.append(part)
        return b"".join(parts)

    def _string_iid(self, text: str) -> int:
        return self._iid(self._strings, text, b"\xea\x01")

    def _name_fields(self, name: str, category: str | None) -> bytes:
        if category == "step":
            # a step bar's name is its own (``step 12``): interning it only adds
            body = _field(b"\xba\x01", _utf8(name))
        else:
            iid = self._names.get(name)
            body = b"\x50" + _varint(
                iid if iid is not None else self._iid(self._names, name, b"\x12")
            )
        if category:
            iid = self._categories.get(category)
            body += b"\x18" + _varint(
                iid if iid is not None else self._iid(self._categories, category, b"\x0a")
            )
        return body

    # -- tracks ---------------------------------------------------------------------------------
    def _uuid(self) -> int:
        """A new track uuid: ≡ `sequence_id` modulo `TRACK_UUID_STRIDE`, so unique in the whole
        trace by construction."""
        self._next_uuid += TRACK_UUID_STRIDE
        return self._next_uuid

    def _process(self, pid: int, name: str | None = None) -> int:
        uuid = self._process_uuids.get(pid)
        if uuid is None or name is not None:
            if uuid is None:
                uuid = self._process_uuids[pid] = self._uuid()
            if name is not None and not self._first:
                self._zero_clock()  # a new process starts back in time: deltas from its own first timestamp
            process = b"\x08" + _varint(pid)
            if name is not None:
                process += _field(b"\x32", _utf8(name))
            self._emit(_field(b"\xe2\x03", b"\x08" + _varint(uuid) + _field(b"\x1a", process)))
        return uuid

    def _track(self, pid: int, tid: Any, name: str | None = None) -> bytes:
        """The track's ``track_uuid`` field (its descriptor written first when new or named)."""
        key = (pid, tid)
        field = self._track_bytes.get(key)
        if field is not None and name is None:
            return field
        parent = self._process(pid)
        uuid = self._tracks.get(key)
        if uuid is None:
            uuid = self._tracks[key] = self._uuid()
            field = self._track_bytes[key] = b"\x58" + _varint(uuid)
        descriptor = b"\x08" + _varint(uuid)
        if type(tid) is int and 0 < tid < UNKNOWN_TID:
            # A real OS thread: a thread track (Perfetto appends the tid to its name).
            thread = b"\x08" + _varint(pid) + b"\x10" + _varint(tid)
            if name is not None:
                thread += _field(b"\x2a", _utf8(name))
            descriptor += _field(b"\x22", thread)
        else:
            # Steps, async slots, a thread whose id the records do not give: named tracks of the
            # process.
            if name is None:
                name = (
                    "steps"
                    if tid == STEP_TID
                    else "thread (id unknown)"
                    if tid == UNKNOWN_TID
                    else f"async slot {tid - SLOT_TID_BASE}"
                )
            descriptor += b"\x28" + _varint(parent) + _field(b"\x12", _utf8(name))
        self._emit(_field(b"\xe2\x03", descriptor))
        return field  # type: ignore[return-value]  # the track's field bytes, made above on every path

    def _counter_track(self, pid: int, name: str) -> int:
        key = (pid, ("counter", name))
        uuid = self._tracks.get(key)
        if uuid is None:
            parent = self._process(pid)
            uuid = self._tracks[key] = self._uuid()
            descriptor = (
                b"\x08"
                + _varint(uuid)
                + b"\x28"
                + _varint(parent)
                + _field(b"\x12", _utf8(name))
                + b"\x42\x00"
            )
            self._emit(_field(b"\xe2\x03", descriptor))
        return uuid

    def _counter(self, uuid: int, us: float, value: float) -> None:
        self._emit(
            _field(b"\x5a", b"\x48\x04\x58" + _varint(uuid) + b"\xe1\x02" + _DOUBLE.pack(value)), us
        )

    def end_process(self, pid: int, last_us: int) -> None:
        """End the process's counter tracks at its last record: Perfetto draws a counter's last
        value to the end of the trace, and a NaN sample stops it (a crashed rank's loss then ends
        where the rank did)."""
        for (track_pid, key), uuid in list(self._tracks.items()):
            if track_pid == pid and type(key) is tuple:
                self._counter(uuid, last_us, math.nan)

    # -- events ---------------------------------------------------------------------------------
    def add(self, event: dict[str, Any]) -> None:
        """Encode one Chrome-trace event dict (``X``, ``B``, ``E``, ``i``, ``C``, ``M``) as
        packets."""
        phase = event["ph"]
        self.events += 1
        if phase == "C":  # the most frequent (scalars)
            key = (event["pid"], event["name"])
            head = self._counter_heads.get(key)
            if head is None:
                head = self._counter_heads[key] = (
                    b"\x5a"
                    + _SMALL_VARINTS[13 + len(_varint(self._counter_track(*key)))]
                    + b"\x48\x04\x58"
                    + _varint(self._counter_track(*key))
                    + b"\xe1\x02"
                )
            self._emit(head + _DOUBLE.pack(float(event["args"]["value"])), event["ts"])
        elif phase == "X":
            self._slice(_BEGIN, event, event["ts"], with_args=False)
            self._slice(_END, event, event["ts"] + event["dur"], with_args=True)
        elif phase == "B":
            self._slice(_BEGIN, event, event["ts"], with_args=True)
        elif phase == "E":
            self.end(event["pid"], event["tid"], event["ts"], event.get("args"))
        elif phase == "i":
            tid = STEP_TID if event.get("s") == "p" else event["tid"]
            self._slice(_INSTANT, event, event["ts"], with_args=True, tid=tid)
        elif phase == "M":
            kind = event["name"]
            if kind == "process_name":
                self._process(event["pid"], event["args"]["name"])
            elif kind == "thread_name":
                self._track(event["pid"], event["tid"], event["args"]["name"])
            # sort indexes: Perfetto orders processes by pid (the rank) and threads by their own
            # rules

    def begin(
        self,
        pid: int,
        tid: Any,
        name: str,
        category: str,
        ts: int,
        args: dict[str, Any] | None = None,
    ) -> None:
        """A slice begins (what ``{"ph": "B"}`` says, without building the dict: one per span)."""
        self.events += 1
        track = self._track(pid, tid)
        body = b"\x48\x01" + track + self._name_fields(name, category)
        if args:
            body += self._annotations(args)
        self._emit(_field(b"\x5a", body), ts)

    def end(self, pid: int, tid: Any, ts: float, args: dict[str, Any] | None) -> None:
        """The slice last begun on the track ends; `args` join the slice's."""
        self.events += 1
        track = self._track(pid, tid)
        body = b"\x48\x02" + track
        if args:
            body += self._annotations(args)
        self._emit(_field(b"\x5a", body), ts)

    def span_prefix(self, pid: int, tid: Any, name: str, args: dict[str, Any]) -> bytes:
        """A span begin's ``TrackEvent`` fields but its ids: type, track, name, category, arguments
        (the names interned in the next packet, which is this begin). Cached by the caller in
        `span_prefixes`."""
        if len(self.span_prefixes) >= _ENCODED_CACHE:
            self.span_prefixes.clear()
        return (
            b"\x48\x01"
            + self._track(pid, tid)
            + self._name_fields(name, "span")
            + self._annotations(args)
        )

    def begin_span(
        self,
        ts: int,
        prefix: bytes,
        step: Any,
        extra: dict[str, Any] | None,
        span_id: Any,
        parent_id: Any,
    ) -> None:
        """A span begins: `prefix` (`span_prefix`, on this sequence), its step, `extra` arguments,
        its own ids."""
        self.events += 1
        if type(step) is not int:
            if step is not None:
                prefix += self._annotations({"step": step})
        else:
            part = self._steps.get(step)
            if part is None:
                part = self._steps[step] = self._annotations({"step": step})
                if len(self._steps) >= _ENCODED_CACHE:
                    self._steps.clear()
            prefix += part
        if extra:
            prefix += self._annotations(extra)
        if span_id is not None:
            head = self._id_heads.get("span_id")
            if (
                head is not None
                and type(span_id) is str
                and len(span_id) == 16
                and span_id.isalnum()
            ):
                # `_id_annotation`'s common case, inline (one per span)
                try:
                    data = head + _varint(int(span_id, 16))
                    prefix += b"\x22" + _SMALL_VARINTS[len(data)] + data
                except ValueError:
                    prefix += self._id_annotation("span_id", span_id)
            else:
                prefix += self._id_annotation("span_id", span_id)
        if parent_id is not None:
            prefix += self._id_annotation("parent_span_id", parent_id)
        self._emit(b"\x5a" + _varint(len(prefix)) + prefix, ts)

    def end_span(self, pid: int, tid: Any, ts: float) -> None:
        """The slice last begun on the track ends, with nothing to add."""
        self.events += 1
        key = (pid, tid)
        body = self._ends.get(key)
        if body is None:
            body = self._ends[key] = _field(b"\x5a", b"\x48\x02" + self._track(pid, tid))
        self._emit(body, ts)

    def _id_annotation(self, key: str, value: Any) -> bytes:
        """A 64-bit hex id as a number (``pointer_value``: 9–10 bytes, shown as 0x…); anything else
        as it is."""
        if type(value) is str and len(value) == 16:
            try:
                number = int(value, 16)
            except ValueError:
                number = -1
            if number >= 0:
                head = self._id_heads.get(key)
                if head is None:
                    iid = self._arg_names.get(key)
                    head = self._id_heads[key] = (
                        b"\x08"
                        + _varint(
                            iid if iid is not None else self._iid(self._arg_names, key, b"\x1a")
                        )
                        + b"\x38"
                    )
                data = head + _varint(number)
                return b"\x22" + _SMALL_VARINTS[len(data)] + data
        return self._annotation(key, value)

    def _slice(
        self, kind: int, event: dict[str, Any], ts: float, with_args: bool, tid: Any = None
    ) -> None:
        track = self._track(event["pid"], event["tid"] if tid is None else tid)
        body = b"\x48" + _varint(kind) + track
        if kind != _END:
            body += self._name_fields(event["name"], event.get("cat"))
        if with_args:
            args = event.get("args")
            if args:
                body += self._annotations(args)
        self._emit(_field(b"\x5a", body), ts)


def _varint(value: int) -> bytes:
    """A protobuf varint (negative numbers as their 64-bit two's complement, as protobuf writes
    int64).

    14 bits at a time from two tables (a 64-bit id is 5 lookups, not 10 rounds of bit twiddling).
    """
    if 0 <= value < _SMALL:
        return _SMALL_VARINTS[value]
    if value < 0:
        value &= _UINT64
    out = b""
    while value >= _SMALL:
        out += _CONTINUED[value & 0x3FFF]
        value >>= 14
    return out + _SMALL_VARINTS[value]


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field: its tag (already encoded), the length, the bytes."""
    return tag + _varint(len(data)) + data


def _utf8(text: str) -> bytes:
    """Valid UTF-8 (protobuf strings must be): a lone surrogate (from a ``\\ud800`` escape in a
    record) as that escape."""
    return text.encode("utf-8", "backslashreplace")


_UINT64 = (1 << 64) - 1
_SMALL = 1 << 14


def _slow_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# 1 or 2 bytes: the last 14 bits of any varint
_SMALL_VARINTS = [_slow_varint(value) for value in range(_SMALL)]
_STAMPS = [b"\x40" + encoded for encoded in _SMALL_VARINTS]  # TracePacket.timestamp = n
_PACKET_HEADS = [b"\x0a" + encoded for encoded in _SMALL_VARINTS]  # Trace.packet of n bytes
# 14 bits, more follow
_CONTINUED = [bytes(((value & 0x7F) | 0x80, (value >> 7) | 0x80)) for value in range(_SMALL)]
_DOUBLE = struct.Struct("<d")


def _ns(us: float) -> int:
    """µs (int, or float from a monotonic duration) → ns."""
    return us * 1000 if type(us) is int else int(round(us * 1000.0)) if math.isfinite(us) else 0


class NativeVisitor(ExportVisitor):
    """`ExportVisitor` for the native writer: a begin when a span's ``_start`` is read, an end when
    it ends.

    What is shown (names, args, filters, counts, tracks) is the JSON export's
    (`ExportVisitor.span_event`); only the timing of the writes differs, and
    what the trace already says elsewhere is not repeated per span (most of a
    span's bytes were its arguments):

    * ``tid`` on its own thread's track (the track says it);
    * ``relative_step`` when it equals ``step`` (no resumed run);
    * ``parent_span_id`` when it is the span id of the enclosing slice on
      the same track (Perfetto shows that slice as the parent); kept when
      the parent is elsewhere (another thread, a task);
    * ``trace_id`` when it is the step's trace id, which the step's bar
      carries (one trace per step); kept on a span whose trace differs, or
      whose step has no bar.

    A failed span's end carries the error; its name gets `FAILED_SUFFIX`
    only when the failure is known at its begin (an ``_end`` without
    ``_start``), so failures are also marked by the ``ERROR:`` instant on the
    span's track, which Perfetto draws as a marker over the bar.
    """

    def begin_process(self, tracks: Any, os_pid: Any, alive_until_us: int | None = None) -> None:
        """As `ExportVisitor.begin_process`; what is left out is decided per process (its own tracks
        and steps)."""
        super().begin_process(tracks, os_pid, alive_until_us)
        self._open_ids: dict[Any, list[Any]] = {}  # track → span ids of its begun, unended slices
        # step → its trace id (the first begun span's, or the step's first record's)
        self._step_traces: dict[Any, Any] = {}
        # steps whose bar will be written (every begun step gets one)
        self._steps_begun: set[Any] = set()

    def step_begun(self, step: int, begin_us: int) -> None:
        """Every begun step gets its bar (`model.timeline.walk_process`), so its spans may leave
        their trace id to it."""
        super().step_begun(step, begin_us)
        self._steps_begun.add(step)

    def step_arguments(self, step: int, first: dict[str, Any], args: dict[str, Any]) -> None:
        """The step's trace id on its bar (the one its spans left out); ``relative_step`` only when
        it differs."""
        # fixed from here: later spans compare to it
        trace_id = self._step_traces.setdefault(step, first.get("trace_id"))
        if trace_id is not None:
            args["trace_id"] = trace_id
        if "relative_step" in args and args["relative_step"] == step:
            del args["relative_step"]  # no resumed run: the same as step, as on spans

    def span_begun(self, span: OpenSpan) -> None:
        """The begin carries the span's arguments (so a span that never ends has them too); its end
        only the error.

        All but the span's ids repeat from span to span (track, name, step, caller, tags): the
        begin's encoding of them is cached by their values (`PerfettoStream.span_prefixes`)."""
        start: dict[str, Any] = span.start  # type: ignore[assignment]  # a span's start record is a dict
        get = start.get
        step = get("step")
        if self.steps is not None and step not in self.steps:
            return
        track = span.track
        open_ids = self._open_ids.get(track)
        if open_ids is None:
            open_ids = self._open_ids[track] = []
        span_id, parent_id, trace_id = get("span_id"), get("parent_span_id"), get("trace_id")
        if parent_id is not None and open_ids and open_ids[-1] == parent_id:
            parent_id = None  # the enclosing slice's id
        open_ids.append(span_id)
        if (
            trace_id is not None
            and step in self._steps_begun
            and self._step_traces.setdefault(step, trace_id) == trace_id
        ):
            trace_id = None  # the step's, on its bar
        relative_step = get("relative_step")
        extra = None
        if relative_step is not None and relative_step != step:
            extra = {"relative_step": relative_step}  # a resumed run
        if trace_id is not None:
            extra = extra or {}
            extra["trace_id"] = trace_id  # another trace than its step's
        # What the rest of the begin depends on (the step, which changes every few spans, is added
        # apart).
        key: tuple | None = (self.pid, track, span.name, *map(get, _CACHED_ARGS))
        out = self.out
        try:
            prefix = out.span_prefixes.get(key)  # type: ignore[attr-defined]  # the native stream's own cache (NativeVisitor writes a PerfettoStream)
        # a list (step tags): as a tuple; still unhashable (tags holding lists): not cached
        except TypeError:
            key = tuple(tuple(value) if type(value) is list else value for value in key)  # type: ignore[union-attr]  # the key was made just above, not None
            try:
                prefix = out.span_prefixes.get(key)  # type: ignore[attr-defined]  # the native stream's own cache (NativeVisitor writes a PerfettoStream)
            except TypeError:
                key, prefix = None, None
        if prefix is None:
            args = {name: start[name] for name in _CACHED_ARGS if name in start}
            if args.get("tid") == track:
                del args["tid"]  # the thread track's own tid
            prefix = out.span_prefix(self.pid, track, span.name, args)  # type: ignore[attr-defined]  # a PerfettoStream method (NativeVisitor writes one)
            if key is not None:
                out.span_prefixes[key] = prefix  # type: ignore[attr-defined]  # the native stream's own cache (NativeVisitor writes a PerfettoStream)
        out.begin_span(span.start_us, prefix, step, extra, span_id, parent_id)  # type: ignore[attr-defined]  # a PerfettoStream method (NativeVisitor writes one)

    def span(
        self,
        span: OpenSpan,
        end: dict[str, Any] | None,
        end_us: int,
        dur_us: float,
        incomplete: bool,
    ) -> None:
        if span.start is not None and span.error is None and not incomplete:
            # The common case, without the event dict `span_event` builds (its begin said
            # everything): counted and filtered as `span_event` does.
            if self.steps is not None and span.start.get("step") not in self.steps:
                return
            self.stats.spans += 1
            open_ids = self._open_ids.get(span.track)
            if open_ids:
                open_ids.pop()
            self.out.end_span(self.pid, span.track, span.start_us + dur_us)  # type: ignore[attr-defined]  # a PerfettoStream method (NativeVisitor writes one)
            return
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
        open_ids = self._open_ids.get(span.track)
        if open_ids:
            open_ids.pop()  # Perfetto ends the slice last begun on the track
        args = event["args"]
        self.out.end(  # type: ignore[attr-defined]  # a PerfettoStream method (NativeVisitor writes one)
            self.pid,
            span.track,
            span.start_us + dur_us,
            {key: args[key] for key in _END_ARGS if key in args} if "status" in args else None,
        )


def is_native(path: str | os.PathLike[str]) -> bool:
    """Whether an output name asks for the native format (``.pftrace``, ``.perfetto-trace``).

    Example:
        >>> is_native("out/trace.pftrace"), is_native("out/trace.json")
        (True, False)
    """
    return os.fspath(path).endswith(NATIVE_SUFFIXES)
