"""model/step_grid.py: the grid of ranks × steps the report draws, from the summary's one read; its
memory grows with what it keeps."""

from __future__ import annotations

import tracemalloc

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis.model.collect import read_model, summarize_run
from otel_titan.analysis.model.step_grid import StepGrid
from otel_titan.analysis.read.selection import RunSelection

START = 1_796_000_000_000_000


def test_the_grid_holds_what_summarize_compared(tmp_path) -> None:
    generate_run(str(tmp_path), RunSpec(ranks=8, steps=12, seed=2, restart=(3, 6), start_us=START))
    summary, grid = read_model(RunSelection.of(tmp_path))
    # the same summary as summarize's
    assert summary.to_dict(0) == summarize_run(tmp_path).to_dict(0)
    assert sorted(grid.step_ms) == [("training", 0), ("training", 1)]  # the restart kept apart
    for (source, attempt), per_rank in grid.step_ms.items():
        for rank, steps in per_rank.items():
            starts = grid.step_starts[(source, attempt)][rank]
            # every step has a start; the last has no time
            assert set(steps) == set(starts) - {max(starts)}
            assert all(
                steps[s] == (starts[min(t for t in starts if t > s)] - starts[s]) / 1000.0
                for s in steps
            )
    assert grid.anchor == "all_reduce" and grid.arrival_ms
    assert all(
        0 <= ms < 1000
        for per_rank in grid.arrival_ms.values()
        for steps in per_rank.values()
        for ms in steps.values()
    )
    assert grid.source_steps("training") == (1, 12) and grid.source_ranks("training") == 7
    fwd = grid.phases_by_rank("training")["fwd"]
    # both attempts' steps
    assert sorted(fwd) == list(range(8)) and all(len(times) >= 11 for times in fwd.values())
    assert grid.bytes_read == sum(
        p.stat().st_size for p in (tmp_path / "structured_logs").iterdir()
    )


def test_memory_grows_with_the_facts_kept_not_the_bytes_read(tmp_path) -> None:
    """Four times the scalars per step (2.5x the bytes): the grid keeps the first 12 names only (the
    bound), and the peak barely moves (what it would not do if records, or their lines, were kept:
    they are most of the bytes).

    Files of more than one read block (`read.lines.BLOCK_BYTES`) either way, and a read before the
    measured ones (what is allocated once per interpreter, imports and decoders, is no fact of the
    run): else the peak measures the block, or the first call's imports, not what grows.
    """
    warm = tmp_path / "warm"
    generate_run(str(warm), RunSpec(ranks=2, steps=3, seed=1, start_us=START))
    read_model(RunSelection.of(warm, cache=False))
    peaks, sizes = [], []
    for scalars in (12, 48):
        out = tmp_path / f"s{scalars}"
        generate_run(str(out), RunSpec(ranks=8, steps=100, seed=1, scalars=scalars, start_us=START))
        sizes.append(sum(p.stat().st_size for p in (out / "structured_logs").iterdir()))
        tracemalloc.start()
        try:
            _, grid = read_model(RunSelection.of(out))
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert len(grid.scalars) == 12
    assert sizes[1] > 2 * sizes[0]
    assert peaks[1] < 1.5 * peaks[0], (peaks, sizes)


def test_an_empty_grid() -> None:
    grid = StepGrid()
    assert grid.source_steps("training") == (None, None) and grid.source_ranks("training") is None
    assert grid.rows(grid.step_ms, "training") == [] and grid.phases_by_rank("training") == {}
