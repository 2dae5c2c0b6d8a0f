"""`watch.replay`: a run replayed as `watch` would have seen it, and one long run replayed chunk by
chunk as the one job it is."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.generate_run import GAP_MS, RunSpec, generate_run
from benchmarks.watch_false_alarms import rank_key
from otel_titan.analysis.watch.replay import Replayer, replay

RANKS, STEP_MS, START_US = 32, 200.0, 1_790_000_000_000_000


def chunks(tmp_path: Path, n: int, steps: int, **faults) -> list[tuple[str, dict]]:
    """One run in `n` chunks of `steps` steps (benchmarks/watch_false_alarms.py's way), each folder
    written when asked for."""
    t, first = float(START_US), 1
    for k in range(n):
        out = str(tmp_path / f"chunk-{k}")
        truth = generate_run(
            out,
            RunSpec(
                ranks=RANKS,
                steps=steps,
                seed=3,
                noise_seed=1000 + k,
                step_ms=STEP_MS,
                start_us=int(t),
                first_step=first,
                opened=k == 0,
                closed=k == n - 1,
                **faults,
            ),
        )
        yield out, truth
        t, first = truth["end_us"] + GAP_MS * 1000.0, first + steps


def test_a_run_in_chunks_is_one_job_to_the_detector(tmp_path):
    replayer = Replayer(key=rank_key)
    for out, _ in chunks(tmp_path, 3, 40):
        replayer.feed(out)
        # what the long benchmark does: the next chunk is judged without this one on disk
        shutil.rmtree(out)
    result = replayer.finish(30.0)
    # One process per rank across the chunks' differently named files, every one of them closed by
    # the last chunk.
    assert len(replayer.detector.processes) == RANKS
    assert result.last_frame["states"] == {"closed": RANKS}
    assert result.last_frame["steps"] == {"min": 120, "median": 120, "max": 120}
    assert result.alerts() == []  # a chunk's boundary is no pause, no restart, no new run


def test_a_fail_slow_that_begins_in_a_later_chunk_is_found_once(tmp_path):
    # Rank 9's +15 % fwd from step 70 (the second chunk): named once, within the target, the chunk
    # boundary no reset.
    replayer = Replayer(key=rank_key, frames=False)
    onset = None
    for out, truth in chunks(tmp_path, 2, 60, straggler=(9, "fwd", 15.0), slow_from=70):
        # the chunk that holds step 70 says when it began
        onset = truth["onset_us"].get("slow", onset)
        replayer.feed(out)
    alerts = replayer.finish(0.0).alerts()
    assert [(a["kind"], a["ranks"], a["phase"]) for a in alerts] == [("slow", [9], "fwd")], alerts
    assert onset is not None and 0 < alerts[0]["at"] - onset / 1e6 <= max(60.0, 30 * STEP_MS / 1000)
    assert replayer.result.last_frame is None  # frames off: events only


def test_replaying_one_folder_is_one_chunk(tmp_path):
    out = str(tmp_path / "run")
    generate_run(out, RunSpec(ranks=RANKS, steps=60, seed=4, step_ms=STEP_MS, hung=(5, 40)))
    whole = replay(out)
    replayer = Replayer()
    replayer.feed(out)
    assert replayer.finish(60.0).events == whole.events and [
        a["ranks"] for a in whole.alerts("hang")
    ] == [[5]]
