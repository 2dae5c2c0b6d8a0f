"""The native Perfetto trace read back with Perfetto's own protos: format choice, interning,
workers, filters."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from collections import Counter

import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

from otel_titan.analysis import generate_gantt_trace
from otel_titan.analysis.export.perfetto import TRACK_UUID_STRIDE, PerfettoStream, is_native
from tests.conftest import REPO
from tests.helpers.analysis import T0, titan_file, titan_record, titan_span, write_jsonl


def read_trace(path):
    """The trace's packets, those in ``compressed_packets`` (deflated batches) expanded in place."""
    trace = Trace()
    trace.ParseFromString(path.read_bytes())
    packets = []
    for packet in trace.packet:
        if packet.HasField("compressed_packets"):
            inner = Trace()
            inner.ParseFromString(zlib.decompress(packet.compressed_packets))
            assert not any(p.HasField("compressed_packets") for p in inner.packet)
            packets.extend(inner.packet)
        else:
            packets.append(packet)
    return packets


def slices(packets):
    """(process pid, name, begin ns, end ns or None) per slice, from begins and ends matched per
    track."""
    names, pids, parents, stacks, out, last, unit = {}, {}, {}, {}, [], {}, {}
    for packet in packets:
        # Timestamps: deltas on the sequence's incremental clock (in its unit), or absolute ns on
        # the trace clock (6).
        sequence = packet.trusted_packet_sequence_id
        if packet.HasField("clock_snapshot"):
            last[sequence] = 0  # the incremental clock restarts at 0
            unit[sequence] = next(
                c.unit_multiplier_ns or 1 for c in packet.clock_snapshot.clocks if c.clock_id == 64
            )
        if packet.timestamp_clock_id == 6:
            time = packet.timestamp
        else:
            time = last[sequence] = last.get(sequence, 0) + packet.timestamp * unit[sequence]
        for entry in packet.interned_data.event_names:
            names[(packet.trusted_packet_sequence_id, entry.iid)] = entry.name
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            if d.HasField("process"):
                pids[d.uuid] = d.process.pid
            elif d.HasField("thread"):
                pids[d.uuid] = d.thread.pid
            else:
                parents[d.uuid] = d.parent_uuid
        event = packet.track_event
        if event.type == TrackEvent.TYPE_SLICE_BEGIN:
            item = [
                event.track_uuid,
                event.name
                if event.HasField("name")
                else names[(packet.trusted_packet_sequence_id, event.name_iid)],
                time,
                None,
            ]
            stacks.setdefault(event.track_uuid, []).append(item)
            out.append(item)
        elif event.type == TrackEvent.TYPE_SLICE_END:
            stacks[event.track_uuid].pop()[3] = time
    return sorted(
        (pids.get(u, pids.get(parents.get(u))), name, begin, end) for u, name, begin, end in out
    )


def two_rank_run(run_dir):
    for rank in (0, 1):
        write_jsonl(
            titan_file(run_dir, rank=rank),
            [
                *titan_span("fwd", 10, 20, rank=rank, step=1)[:1],
                *titan_span("inner", 10, 20, rank=rank, step=1),
                titan_span("fwd", 10, 20, rank=rank, step=1)[1],
                *titan_span("fwd", 30, 40, rank=rank, step=2),
                titan_record("optim_start", 50, rank=rank, step=2),  # never ends
            ],
        )


def test_the_output_name_or_the_flag_chooses_the_native_format(run_dir):
    two_rank_run(run_dir)
    assert is_native("t.pftrace") and is_native("t.perfetto-trace") and not is_native("t.json")
    stats = generate_gantt_trace(run_dir, run_dir / "t.perfetto-trace")
    assert not (run_dir / "t.perfetto-trace").read_bytes().startswith(b"{") and stats.spans == 8
    stats = generate_gantt_trace(run_dir, native=True)
    assert stats.output_path.endswith("analysis/trace.pftrace")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_titan.cli",
            "export",
            str(run_dir),
            "--format",
            "perfetto",
            "-o",
            str(run_dir / "x.trace"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    read_trace(run_dir / "x.trace")  # parses as a Perfetto trace


def test_slices_nest_exactly_and_an_unended_span_has_no_end(run_dir):
    two_rank_run(run_dir)
    generate_gantt_trace(run_dir, run_dir / "t.pftrace")
    got = [
        s for s in slices(read_trace(run_dir / "t.pftrace")) if s[1] in ("fwd", "inner", "optim")
    ]
    ms = lambda t: (t - T0 * 1000) // 1_000_000 if t is not None else None  # noqa: E731 - a one-line local helper
    # the same start and end as their parent: no widening in the native trace
    assert [(pid, name, ms(b), ms(e)) for pid, name, b, e in got] == [
        (rank, name, b, e)
        for rank in (0, 1)
        for name, b, e in (("fwd", 10, 20), ("fwd", 30, 40), ("inner", 10, 20), ("optim", 50, None))
    ]


def test_names_are_interned_once_per_sequence(run_dir):
    two_rank_run(run_dir)
    generate_gantt_trace(run_dir, run_dir / "t.pftrace")
    packets = read_trace(run_dir / "t.pftrace")
    interned = Counter(e.name for p in packets for e in p.interned_data.event_names)
    assert interned["fwd"] == 1 and max(interned.values()) == 1
    assert (
        Counter(e.name for p in packets for e in p.interned_data.debug_annotation_names)["step"]
        == 1
    )


def test_workers_write_the_same_slices_on_their_own_sequences(run_dir):
    two_rank_run(run_dir)
    generate_gantt_trace(run_dir, run_dir / "one.pftrace", jobs=1)
    generate_gantt_trace(run_dir, run_dir / "two.pftrace", jobs=2)
    one, two = read_trace(run_dir / "one.pftrace"), read_trace(run_dir / "two.pftrace")
    assert slices(one) == slices(two)
    assert {p.trusted_packet_sequence_id for p in two} == {2, 3}
    # each part clears its own incremental state
    assert sum(1 for p in two if p.sequence_flags & 1) == 2


def test_step_filter_keeps_exactly_its_slices(run_dir):
    two_rank_run(run_dir)
    stats = generate_gantt_trace(run_dir, run_dir / "t.pftrace", steps="2")
    names = [name for _, name, _, _ in slices(read_trace(run_dir / "t.pftrace"))]
    assert stats.spans == 4 and sorted(n for n in names if not n.startswith("step")) == [
        "fwd",
        "fwd",
        "optim",
        "optim",
    ]


def annotations(packets):
    """Per ended slice (and step bar), in order of ends: (name, {argument: value} of its begin and
    end, source location or None)."""
    names, arg_names, strings, locations, stacks, out = {}, {}, {}, {}, {}, []
    for packet in packets:
        data = packet.interned_data
        names.update((e.iid, e.name) for e in data.event_names)
        arg_names.update((e.iid, e.name) for e in data.debug_annotation_names)
        strings.update((e.iid, e.str.decode()) for e in data.debug_annotation_string_values)
        locations.update(
            (e.iid, (e.file_name, e.line_number, e.function_name)) for e in data.source_locations
        )
        event = packet.track_event
        args = {}
        for a in event.debug_annotations:
            kind = a.WhichOneof("value")
            args[arg_names[a.name_iid]] = (
                strings[a.string_value_iid] if kind == "string_value_iid" else getattr(a, kind)
            )
        if event.type == TrackEvent.TYPE_SLICE_BEGIN:
            # step bars: their own name, not interned
            name = event.name if event.HasField("name") else names[event.name_iid]
            stacks.setdefault(event.track_uuid, []).append(
                (name, args, locations.get(event.source_location_iid))
            )
        elif event.type == TrackEvent.TYPE_SLICE_END:
            name, begun, location = stacks[event.track_uuid].pop()
            assert not (begun.keys() & args.keys())  # nothing said twice
            out.append(
                (name, {**begun, **args}, location or locations.get(event.source_location_iid))
            )
    return out


def test_arguments_said_elsewhere_are_left_out_and_the_rest_kept(run_dir):
    ids = {
        name: f"{n:016x}"
        for n, name in enumerate(("step1", "fwd", "inner", "other"), start=0xA000_0000_0000_0001)
    }
    trace_a, trace_b = "a" * 32, "b" * 32
    write_jsonl(
        titan_file(run_dir),
        [
            titan_record("fwd_start", 10, step=1, span_id=ids["fwd"], trace_id=trace_a),
            titan_record(
                "inner_start",
                11,
                step=1,
                span_id=ids["inner"],
                parent_span_id=ids["fwd"],
                trace_id=trace_a,
                caller="model.py:42:forward",
            ),
            # On the same track, but its parent is another span (not the enclosing slice), and
            # another trace.
            titan_record(
                "other_start",
                12,
                step=1,
                span_id=ids["other"],
                parent_span_id=ids["step1"],
                trace_id=trace_b,
                caller="odd caller",
            ),
            titan_record(
                "other_end",
                13,
                step=1,
                span_id=ids["other"],
                parent_span_id=ids["step1"],
                trace_id=trace_b,
                value=1.0,
                caller="odd caller",
            ),
            titan_record(
                "inner_end",
                14,
                step=1,
                span_id=ids["inner"],
                parent_span_id=ids["fwd"],
                trace_id=trace_a,
                value=3.0,
            ),
            titan_record("fwd_end", 20, step=1, span_id=ids["fwd"], trace_id=trace_a, value=10.0),
        ],
    )
    generate_gantt_trace(run_dir, run_dir / "t.pftrace")
    packets = read_trace(run_dir / "t.pftrace")
    got = {name: (args, location) for name, args, location in annotations(packets)}
    # The parent id is the enclosing slice's: left out; the trace id is the step's: on the step bar
    # only.
    assert got["inner"] == (
        {"step": 1, "span_id": int(ids["inner"], 16)},
        ("model.py", 42, "forward"),
    )
    # Another parent and another trace: kept; a caller not of the form file:line:function stays an
    # argument.
    assert got["other"] == (
        {
            "step": 1,
            "caller": "odd caller",
            "span_id": int(ids["other"], 16),
            "parent_span_id": int(ids["step1"], 16),
            "trace_id": trace_b,
        },
        None,
    )
    assert got["fwd"] == ({"step": 1, "span_id": int(ids["fwd"], 16)}, ("train.py", 8, "main"))
    assert got["step 1"][0]["trace_id"] == trace_a
    # Each source location interned once on the sequence.
    assert Counter(e.file_name for p in packets for e in p.interned_data.source_locations) == {
        "model.py": 1,
        "train.py": 1,
    }


def test_a_span_whose_step_bar_is_not_written_keeps_its_trace_id(run_dir):
    # The step filter drops step 1's bar and spans alike; a span of step 2 still names its trace
    # once, on its bar.
    write_jsonl(
        titan_file(run_dir),
        [
            *titan_span("fwd", 10, 20, step=1, trace_id="a" * 32),
            *titan_span("fwd", 30, 40, step=2, trace_id="b" * 32),
        ],
    )
    generate_gantt_trace(run_dir, run_dir / "t.pftrace", steps="2")
    got = annotations(read_trace(run_dir / "t.pftrace"))
    assert [(name, args.get("trace_id")) for name, args, _ in got] == [
        ("fwd", None),
        ("step 2", "b" * 32),
    ]


def test_every_packet_shape_decodes_field_by_field_uncompressed_too(tmp_path):
    from otel_titan.analysis.export.perfetto import PerfettoStream

    for compress in (True, False):
        path = tmp_path / f"t{compress}.pftrace"
        with open(path, "wb") as handle:
            out = PerfettoStream(handle, sequence_id=7, compress=compress)
            out.add(
                {
                    "name": "process_name",
                    "ph": "M",
                    "pid": 3,
                    "tid": 0,
                    "args": {"name": "training rank"},
                }
            )
            out.add(
                {"name": "thread_name", "ph": "M", "pid": 3, "tid": 77, "args": {"name": "main"}}
            )
            out.begin(3, 77, "fwd", "span", 2_000)
            out.end(
                3,
                77,
                2_010.5,
                {
                    "step": -2,
                    "x": 2**63 - 1,
                    "big": 2**64,
                    "f": 1.5,
                    "ok": False,
                    "tags": ["a", 1],
                    "none": None,
                    "span_id": "ffffffffffffffff",
                    "note": "é\ud800",
                },
            )
            out.add(
                {"name": "loss", "ph": "C", "ts": 2_005, "pid": 3, "tid": 0, "args": {"value": 2.5}}
            )
            out.add(
                {
                    "name": "mark",
                    "cat": "instant",
                    "ph": "i",
                    "s": "t",
                    "ts": 1_000,
                    "pid": 3,
                    "tid": 77,
                    "args": {},
                }
            )
            out.end_process(3, 2_100)
            out.flush()
        raw = Trace.FromString(path.read_bytes()).packet
        assert all(p.HasField("compressed_packets") for p in raw) == compress
        packets = read_trace(path)
        assert {p.trusted_packet_sequence_id for p in packets} == {7}
        first = packets[0]
        assert first.sequence_flags == 3 and first.trace_packet_defaults.timestamp_clock_id == 64
        assert [
            (c.clock_id, c.timestamp, c.is_incremental, c.unit_multiplier_ns)
            for c in first.clock_snapshot.clocks
        ] == [(64, 0, True, 1000), (6, 0, False, 0)]
        process, thread = packets[1].track_descriptor, packets[2].track_descriptor
        assert (process.process.pid, process.process.process_name) == (3, "training rank")
        assert (thread.thread.pid, thread.thread.tid, thread.thread.thread_name) == (3, 77, "main")
        begin, end = packets[3], packets[4]
        # µs
        assert (
            begin.timestamp,
            begin.track_event.track_uuid,
            list(begin.track_event.category_iids),
        ) == (2_000, thread.uuid, [1])
        assert [(e.iid, e.name) for e in begin.interned_data.event_names] == [(1, "fwd")]
        # a fraction of a µs: ns
        assert (end.timestamp_clock_id, end.timestamp, end.track_event.type) == (
            6,
            2_010_500,
            TrackEvent.TYPE_SLICE_END,
        )
        ((_, args, _),) = annotations(packets)
        # a lone surrogate as its escape
        assert args == {
            "step": -2,
            "x": 2**63 - 1,
            "big": str(2**64),
            "f": 1.5,
            "ok": False,
            "tags": '["a",1]',
            "span_id": 2**64 - 1,
            "note": "é\\ud800",
        }
        counter_track, counter = packets[5].track_descriptor, packets[6]
        assert (
            counter_track.HasField("counter")
            and counter_track.parent_uuid == process.uuid
            and counter_track.name == "loss"
        )
        # a delta from the begin
        assert (
            counter.timestamp_clock_id,
            counter.timestamp,
            counter.track_event.double_counter_value,
        ) == (0, 5, 2.5)
        instant = packets[7]
        assert (instant.track_event.type, instant.timestamp_clock_id, instant.timestamp) == (
            TrackEvent.TYPE_INSTANT,
            6,
            1_000_000,
        )
        nan = packets[8]
        assert (
            nan.timestamp == 2_100 - 2_005
            and nan.track_event.double_counter_value != nan.track_event.double_counter_value
        )


def test_varints_are_protobufs_own_encoding():
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import DebugAnnotation

    from otel_titan.analysis.export.perfetto import _varint

    edges = [
        0,
        1,
        127,
        128,
        16_383,
        16_384,
        2**21,
        2**28 - 1,
        2**35,
        2**56,
        2**63 - 1,
        -1,
        -2,
        -(2**31),
        -(2**63),
    ]
    randoms = [((n * 0x9E3779B97F4A7C15) >> (n % 64)) % 2**63 for n in range(1, 2000)]
    for value in edges + randoms:
        assert b"\x20" + _varint(value) == DebugAnnotation(int_value=value).SerializeToString(), (
            value
        )
    assert (
        b"\x38" + _varint(2**64 - 1) == DebugAnnotation(pointer_value=2**64 - 1).SerializeToString()
    )


def _scalar_rank(run_dir, rank, names, span=True):
    """A rank's file: one span (a thread track) and one scalar per name (a counter track each),
    written as lines."""
    head = titan_record(
        "metric_value", 1, log_type="instant", rank=rank, event_name="NAME", value=1.0
    )
    before, after = json.dumps(head).split('"NAME"')
    lines = [json.dumps(r) for r in titan_span("fwd", 0, 2, rank=rank, step=1)] if span else []
    lines += [before + json.dumps(name) + after for name in names]
    write_jsonl(titan_file(run_dir, rank=rank), lines)


def track_identities(packets):
    """uuid → every (sequence, what the track is) its descriptors said; and the uuids events were
    put on."""
    said, used = {}, set()
    for packet in packets:
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            what = (
                ("process", d.process.pid)
                if d.HasField("process")
                else ("thread", d.thread.pid, d.thread.tid)
                if d.HasField("thread")
                else ("child of", d.parent_uuid, d.name)
            )
            said.setdefault(d.uuid, set()).add((packet.trusted_packet_sequence_id, what))
        if packet.HasField("track_event"):
            used.add((packet.trusted_packet_sequence_id, packet.track_event.track_uuid))
    return said, used


def assert_track_uuids_unique(path, tracks):
    said, used = track_identities(read_trace(path))
    clashes = {uuid: whats for uuid, whats in said.items() if len(whats) > 1}
    assert not clashes, (
        f"{len(clashes)} track uuids name two tracks, e.g. {next(iter(clashes.items()))}"
    )
    assert len(said) == tracks
    owner = {uuid: next(iter(whats))[0] for uuid, whats in said.items()}
    # every event on a track its own part described
    assert all(owner.get(uuid) == sequence for sequence, uuid in used)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", ["one process with 70,000 scalar names", "512 ranks x 128 metrics in each part"]
)
def test_track_uuids_are_unique_in_a_trace_written_by_workers(tmp_path, case):
    # Issue 18 item 16: each part used to number its tracks from sequence_id << 16, so a part with
    # more than 65,536 tracks reused the next part's uuids (a process track among them).
    run_dir = tmp_path / "run"
    if case.startswith("one process"):
        _scalar_rank(run_dir, 0, [f"m{i}" for i in range(70_000)])
        _scalar_rank(run_dir, 1, ["loss"])
        # per process: its track, its thread, its steps, its counters
        tracks = (1 + 1 + 1 + 70_000) + (1 + 1 + 1 + 1)
    else:
        ranks = 1024  # two parts of 512 ranks each
        for rank in range(ranks):
            _scalar_rank(run_dir, rank, [f"m{i}" for i in range(128)], span=False)
        tracks = ranks * (1 + 1 + 128)  # per process: its track, its steps, its counters
    stats = generate_gantt_trace(run_dir, run_dir / "t.pftrace", jobs=2)
    assert stats.processes == (2 if case.startswith("one process") else 1024)
    assert_track_uuids_unique(run_dir / "t.pftrace", tracks)


@pytest.mark.parametrize("sequence_id", [0, TRACK_UUID_STRIDE, -1, 1.0])
def test_a_sequence_id_outside_the_track_uuid_scheme_is_refused(tmp_path, sequence_id):
    with (
        open(tmp_path / "t.pftrace", "wb") as handle,
        pytest.raises(ValueError, match="sequence_id"),
    ):
        PerfettoStream(handle, sequence_id)
