"""The native Perfetto trace read back with Perfetto's own protos: format choice, interning, workers, filters."""

from __future__ import annotations

import subprocess
import sys
import zlib
from collections import Counter

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

from otel_titan.analysis import generate_gantt_trace
from otel_titan.analysis.perfetto_trace import is_native
from tests.analysis import T0, titan_file, titan_record, titan_span, write_jsonl
from tests.conftest import REPO


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
    """(process pid, name, begin ns, end ns or None) per slice, from begins and ends matched per track."""
    names, pids, parents, stacks, out, last = {}, {}, {}, {}, [], {}
    for packet in packets:
        # Timestamps: deltas on the sequence's incremental clock, or absolute on the trace clock (6).
        sequence = packet.trusted_packet_sequence_id
        if packet.HasField("clock_snapshot"):
            last[sequence] = 0  # the incremental clock restarts at 0
        if packet.timestamp_clock_id == 6:
            time = packet.timestamp
        else:
            time = last[sequence] = last.get(sequence, 0) + packet.timestamp
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
            item = [event.track_uuid, names[(packet.trusted_packet_sequence_id, event.name_iid)], time, None]
            stacks.setdefault(event.track_uuid, []).append(item)
            out.append(item)
        elif event.type == TrackEvent.TYPE_SLICE_END:
            stacks[event.track_uuid].pop()[3] = time
    return sorted((pids.get(u, pids.get(parents.get(u))), name, begin, end) for u, name, begin, end in out)


def two_rank_run(run_dir):
    for rank in (0, 1):
        write_jsonl(titan_file(run_dir, rank=rank), [
            *titan_span("fwd", 10, 20, rank=rank, step=1)[:1], *titan_span("inner", 10, 20, rank=rank, step=1), titan_span("fwd", 10, 20, rank=rank, step=1)[1],
            *titan_span("fwd", 30, 40, rank=rank, step=2),
            titan_record("optim_start", 50, rank=rank, step=2),  # never ends
        ])


def test_the_output_name_or_the_flag_chooses_the_native_format(run_dir):
    two_rank_run(run_dir)
    assert is_native("t.pftrace") and is_native("t.perfetto-trace") and not is_native("t.json")
    stats = generate_gantt_trace(run_dir, run_dir / "t.perfetto-trace")
    assert not (run_dir / "t.perfetto-trace").read_bytes().startswith(b"{") and stats.spans == 8
    stats = generate_gantt_trace(run_dir, native=True)
    assert stats.output_path.endswith("analysis/trace.pftrace")
    result = subprocess.run([sys.executable, "-m", "otel_titan.cli", "export", str(run_dir), "--format", "perfetto", "-o", str(run_dir / "x.trace")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    read_trace(run_dir / "x.trace")  # parses as a Perfetto trace


def test_slices_nest_exactly_and_an_unended_span_has_no_end(run_dir):
    two_rank_run(run_dir)
    generate_gantt_trace(run_dir, run_dir / "t.pftrace")
    got = [s for s in slices(read_trace(run_dir / "t.pftrace")) if s[1] in ("fwd", "inner", "optim")]
    ms = lambda t: (t - T0 * 1000) // 1_000_000 if t is not None else None  # noqa: E731
    assert [(pid, name, ms(b), ms(e)) for pid, name, b, e in got] == [
        (rank, name, b, e) for rank in (0, 1) for name, b, e in (("fwd", 10, 20), ("fwd", 30, 40), ("inner", 10, 20), ("optim", 50, None))
    ]  # the same start and end as their parent: no widening in the native trace


def test_names_are_interned_once_per_sequence(run_dir):
    two_rank_run(run_dir)
    generate_gantt_trace(run_dir, run_dir / "t.pftrace")
    packets = read_trace(run_dir / "t.pftrace")
    interned = Counter(e.name for p in packets for e in p.interned_data.event_names)
    assert interned["fwd"] == 1 and max(interned.values()) == 1
    assert Counter(e.name for p in packets for e in p.interned_data.debug_annotation_names)["step"] == 1


def test_workers_write_the_same_slices_on_their_own_sequences(run_dir):
    two_rank_run(run_dir)
    generate_gantt_trace(run_dir, run_dir / "one.pftrace", jobs=1)
    generate_gantt_trace(run_dir, run_dir / "two.pftrace", jobs=2)
    one, two = read_trace(run_dir / "one.pftrace"), read_trace(run_dir / "two.pftrace")
    assert slices(one) == slices(two)
    assert {p.trusted_packet_sequence_id for p in two} == {2, 3}
    assert sum(1 for p in two if p.sequence_flags & 1) == 2  # each part clears its own incremental state


def test_step_filter_keeps_exactly_its_slices(run_dir):
    two_rank_run(run_dir)
    stats = generate_gantt_trace(run_dir, run_dir / "t.pftrace", steps="2")
    names = [name for _, name, _, _ in slices(read_trace(run_dir / "t.pftrace"))]
    assert stats.spans == 4 and sorted(n for n in names if not n.startswith("step")) == ["fwd", "fwd", "optim", "optim"]
