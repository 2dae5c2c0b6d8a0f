"""Bytes and spans per OTLP trace for one training step of a large job, against Tempo's and Jaeger's
limits.

    python -m benchmarks.trace_sizes [--ranks 1024] [--group-size N] [--json FILE]

Each rank's step is produced by the real pipeline in this process: the real
logger (`init_structured_logger` with that rank, the world size and a shared
run id), a typical step's calls (20 spans: data loading, 4 micro-batches of
forward and backward, 3 all-reduces, clipping, optimizer, scheduler; an
instant; 4 top-level scalars, which OTLP carries as 4 zero-length spans), the
`TitanSpan`s the processor builds, encoded by the OTLP exporter's encoder as
one request per rank (the Resource once per request, as the exporter sends
it). Spans are grouped into traces by the trace ids they actually carry.

A trace's size is the sum of its ranks' encoded requests (Tempo counts a
trace's protobuf bytes across all the requests that carry it). The same
per-rank figures are also added up for other group sizes (every rank in one
trace; a host of 8 ranks; …), since a rank's spans cost the same bytes
whatever trace they are in.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_titan import structured_logger as sl
from otel_titan.core.trace_ids import DEFAULT_TRACE_GROUP_SIZE
from otel_titan.exporters.otlp import is_sent_as_span
from otel_titan.exporters.otlp_encoder import OtlpSpanEncoder

#: Grafana Tempo's default ``max_bytes_per_trace`` (overrides), and where Jaeger's UI starts to
#: struggle.
TEMPO_MAX_BYTES_PER_TRACE = 5_000_000
JAEGER_UI_SPANS = 2_000


def one_rank_step(
    rank: int, ranks: int, group_size: int | None, directory: str, step: int = 812
) -> list[Any]:
    """The spans OTLP would send for `rank`'s step `step` (the real logger, in this process)."""
    memory = InMemorySpanExporter()

    def register(*, add_span_exporter: Any, **_: Any) -> None:
        add_span_exporter(memory)

    sl.init_structured_logger(
        "training",
        directory,
        rank=rank,
        world_size=ranks,
        local_rank=rank % 8,
        run_id="trace-sizes",
        handlers=[register],
        handle_sigterm=False,
        trace_group_size=group_size,
    )
    try:
        sl.set_step(step)
        with sl.log_trace_span("data_fetch"):
            pass
        with sl.log_trace_span("fwd_bwd"):
            for _ in range(4):
                with sl.log_trace_span("forward"):
                    pass
                with sl.log_trace_span("backward"):
                    pass
            for bucket in range(3):
                with sl.log_trace_span("all_reduce", f"bucket {bucket}"):
                    pass
        with sl.log_trace_span("clip_grad_norm"):
            pass
        with sl.log_trace_span("optimizer"):
            sl.log_trace_instant("optimizer_step_done")
        with sl.log_trace_span("lr_scheduler"):
            pass
        sl.log_trace_scalar({"loss": 2.31, "grad_norm": 0.93, "lr": 3e-4, "num_tokens": 524288})
        assert sl.flush_structured_logger(timeout=30)
    finally:
        sl.shutdown_structured_logger()
    return [span for span in memory.get_finished_spans() if is_sent_as_span(span)]


def measure(ranks: int, group_size: int | None) -> dict[str, Any]:
    encoder = OtlpSpanEncoder()
    per_trace_spans: dict[int, int] = defaultdict(int)
    per_trace_bytes: dict[int, int] = defaultdict(int)
    per_trace_ranks: dict[int, set[int]] = defaultdict(set)
    rank_spans, rank_bytes = [], []
    tty = sys.stderr.isatty()
    with tempfile.TemporaryDirectory(prefix="trace-sizes-") as directory:
        for rank in range(ranks):
            spans = one_rank_step(rank, ranks, group_size, directory)
            by_trace: dict[int, list[Any]] = defaultdict(list)
            for span in spans:
                by_trace[span.context.trace_id].append(span)
            total = 0
            for trace_id, trace_spans in by_trace.items():
                size = len(encoder.encode(trace_spans))
                per_trace_spans[trace_id] += len(trace_spans)
                per_trace_bytes[trace_id] += size
                per_trace_ranks[trace_id].add(rank)
                total += size
            rank_spans.append(len(spans))
            rank_bytes.append(total)
            if tty and (rank + 1) % 32 == 0:
                print(
                    f"\rtrace sizes: {rank + 1}/{ranks} ranks", end="", file=sys.stderr, flush=True
                )
    if tty:
        print(file=sys.stderr)

    def regrouped(size: int) -> dict[str, Any]:
        groups = [range(start, min(ranks, start + size)) for start in range(0, ranks, size)]
        return {
            "ranks_per_trace": size,
            "traces_per_step": len(groups),
            "max_spans_per_trace": max(sum(rank_spans[r] for r in g) for g in groups),
            "max_bytes_per_trace": max(sum(rank_bytes[r] for r in g) for g in groups),
        }

    return {
        "ranks": ranks,
        "group_size_used": group_size if group_size is not None else DEFAULT_TRACE_GROUP_SIZE,
        "spans_per_rank": rank_spans[0],
        "bytes_per_rank": sorted(rank_bytes)[len(rank_bytes) // 2],
        "measured": {
            "traces_per_step": len(per_trace_spans),
            "max_ranks_per_trace": max(len(r) for r in per_trace_ranks.values()),
            "max_spans_per_trace": max(per_trace_spans.values()),
            "max_bytes_per_trace": max(per_trace_bytes.values()),
        },
        "other_group_sizes": [
            regrouped(size)
            for size in sorted(
                {ranks, 256, 128, 64, 32, 8} - {s for s in (256, 128, 64, 32, 8) if s > ranks},
                reverse=True,
            )
        ],
        "limits": {
            "tempo_max_bytes_per_trace": TEMPO_MAX_BYTES_PER_TRACE,
            "jaeger_ui_spans_per_trace": JAEGER_UI_SPANS,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument("--ranks", type=int, default=1024, help="ranks in the job (default 1024)")
    parser.add_argument(
        "--group-size",
        type=int,
        default=None,
        help=f"trace_group_size to run with (default: the logger's, {DEFAULT_TRACE_GROUP_SIZE})",
    )
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    if args.ranks < 1:
        parser.error(f"--ranks must be >= 1, got {args.ranks}")
    result = measure(args.ranks, args.group_size)
    m = result["measured"]
    print(
        f"{result['ranks']} ranks, one step: {result['spans_per_rank']} OTLP spans and "
        f"{result['bytes_per_rank']:,} bytes per rank"
    )
    print(
        f"trace group size {result['group_size_used']}: {m['traces_per_step']} traces per step, "
        f"at most {m['max_ranks_per_trace']} ranks, {m['max_spans_per_trace']:,} spans, "
        f"{m['max_bytes_per_trace']:,} bytes per trace"
    )
    print(
        "| ranks per trace | traces per step | max spans per trace | max bytes per trace | Tempo "
        "5 MB | Jaeger ~2,000 spans |"
    )
    print("| ---: | ---: | ---: | ---: | --- | --- |")
    for row in result["other_group_sizes"]:
        print(
            f"| {row['ranks_per_trace']} | {row['traces_per_step']} | "
            f"{row['max_spans_per_trace']:,} | {row['max_bytes_per_trace']:,} | "
            f"{'fits' if row['max_bytes_per_trace'] <= TEMPO_MAX_BYTES_PER_TRACE else 'rejected'} "
            f"| {'fits' if row['max_spans_per_trace'] <= JAEGER_UI_SPANS else 'too many'} |"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
