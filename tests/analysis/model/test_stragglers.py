"""Straggler verdicts on clocks that cannot be compared: evidence on each rank's own clock, or
nothing judged and said so (issue 18 item 10)."""

from __future__ import annotations

import json

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis import format_summary, summarize_run
from otel_titan.analysis.model.headline import headline_data
from otel_titan.analysis.model.stragglers import (
    arrivals,
    compare_ranks,
    lateness,
    peer_groups,
    peer_key,
)
from tests.analysis.model.test_collect import healthy_ranks


def _named(summary) -> set[int]:
    """Ranks any verdict blames (straggler lists and findings), and ranks a "Look first at" line
    names as a straggler."""
    ranks = {f.rank for f in summary.straggler_findings() if f.verdict == "straggler"}
    for group in summary.stragglers:
        ranks |= (
            set(group.straggler_ranks)
            | {row["rank"] for row in group.phase_stragglers}
            | {row["rank"] for row in group.arrival_stragglers}
        )
    for line in headline_data(summary)["diagnosis"]:
        if line.startswith("straggler: "):
            ranks.add(int(line.split(" rank ")[1].split(":")[0].split(" ")[0]))
    return ranks


def _generated(tmp_path, name, **spec) -> str:
    run = str(tmp_path / name)
    generate_run(run, RunSpec(ranks=64, steps=30, **spec))
    return run


@pytest.mark.parametrize("seed", [9, 10, 11])
def test_hosts_whose_clocks_drift_3_ms_make_no_false_straggler(tmp_path, seed):
    # On 93dec39, seed 11: alignment refused, then the raw clocks made ranks 42, 45, 46 "last to
    # arrive at all_reduce".
    run = _generated(
        tmp_path, "run", seed=seed, noise=0.05, offset_ms=5.0, drift_hosts=(1, 5), drift_ms=3.0
    )
    summary = summarize_run(run, log_skipped=False)
    assert _named(summary) == set() and headline_data(summary)["diagnosis"] == []
    # arrival still judged, on each rank's own clock
    assert summary.stragglers[0].arrival_collective == "all_reduce"


@pytest.mark.parametrize("seed", range(6))
def test_without_alignment_clean_runs_make_no_false_straggler(tmp_path, seed):
    # On 93dec39, seed 0: "straggler: training rank 4: all_reduce +30% (+4.82 ms, z 3.9)": the rank
    # that waited longest in it.
    run = _generated(tmp_path, "run", seed=seed, noise=0.08, offset_ms=5.0)
    summary = summarize_run(run, log_skipped=False, align=False)
    assert _named(summary) == set() and headline_data(summary)["diagnosis"] == []


@pytest.mark.parametrize("clocks", [{"drift_hosts": (1, 5), "drift_ms": 3.0}, {"align": False}])
def test_a_real_straggler_is_still_named_on_drifting_or_unaligned_clocks(tmp_path, clocks):
    align = clocks.pop("align", True)
    run = _generated(
        tmp_path, "run", seed=3, noise=0.05, offset_ms=5.0, straggler=(40, "bwd", 25.0), **clocks
    )
    summary = summarize_run(run, log_skipped=False, align=align)
    assert _named(summary) == {40}
    (line,) = [
        line for line in headline_data(summary)["diagnosis"] if line.startswith("straggler: ")
    ]
    assert (
        line.startswith("straggler: training rank 40: last to arrive at all_reduce")
        and "bwd +" in line
        and "costs the run" in line
    )


def test_clocks_that_cannot_be_compared_withhold_wait_and_arrival_and_say_why(run_dir):
    # 8 ranks, each on its own host, no collective that every rank leaves together: rank 7's
    # data_fetch is 12 ms longer.
    healthy_ranks(run_dir, ranks=8, slow=(7, "data_fetch", 12.0))
    for path in (run_dir / "structured_logs").iterdir():
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for record in lines:
            record["host_name"] = f"host-{record['rank']}"
        path.write_text("".join(json.dumps(record) + "\n" for record in lines))
    summary = summarize_run(run_dir)
    (group,) = summary.stragglers
    assert not summary.clock.simultaneous and group.arrival_collective is None
    fetch = next(f for f in group.findings if f.what == "data_fetch")
    assert (fetch.rank, fetch.verdict, fetch.headline) == (
        7,
        "cannot tell",
        False,
    ) and group.phase_stragglers == []
    # its steps are longer: a duration on its own clock, needs no shared clock
    assert group.straggler_ranks == [7]
    (wait,) = [
        line
        for line in group.withheld
        if line.startswith(
            "wait or work in each phase: not judged: 8 hosts whose clocks cannot be compared"
        )
    ]
    assert "(1 such phase listed as 'cannot tell'; nobody named)" in wait
    assert any(
        line.startswith("arrival at the step-closing collective: not judged")
        for line in group.withheld
    )
    text = format_summary(summary)
    assert (
        "Withheld (not judged, and why):" in text
        and "(cannot tell whether it waited or worked: not judged)" in text
    )


def test_evidence_on_each_ranks_own_clock_ignores_any_clock_offset():
    # Three ranks leave the collective together (true time 100 ms); rank 2 ends data_fetch 30 ms
    # later. Clocks: 0, +7 s, -3 s.
    skew = {0: 0, 1: 7_000_000, 2: -3_000_000}
    ends = {rank: {1: 50_000 + (30_000 if rank == 2 else 0) + skew[rank]} for rank in skew}
    exits = {rank: {1: 100_000 + skew[rank]} for rank in skew}
    # the median of ranks 1 and 2: their mean
    assert lateness(2, ends, exits) == pytest.approx(30.0) and lateness(
        0, ends, exits
    ) == pytest.approx(-15.0)
    anchors = {
        rank: {
            1: (90_000 + skew[rank], 100_000 + skew[rank]),
            2: (190_000 + skew[rank] + (20_000 if rank == 2 else 0), 200_000 + skew[rank]),
        }
        for rank in skew
    }
    assert arrivals(anchors) == {0: {2: 90.0}, 1: {2: 90.0}, 2: {2: 110.0}}


def test_peers_share_every_coordinate_but_data_parallel():
    assert peer_key({"dp_shard": 1, "dp_replicate": 0, "tp": 2}) == (("tp", 2),)
    groups = peer_groups({r: {"pp": r // 4, "dp": r % 4} for r in range(8)} | {8: None})
    assert groups == {(("pp", 0),): [0, 1, 2, 3], (("pp", 1),): [4, 5, 6, 7], (): [8]}


# -- a declared mesh: ranks compared only with ranks that should do the same work (issue 18 item 12)
# ----
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_pipelines_longer_last_stage_is_no_straggler(tmp_path, seed):
    # On 93dec39 the last stage's ranks (48-63, forward +40% by design) were named stragglers on
    # every seed.
    run = _generated(tmp_path, "run", seed=seed, pp=4, last_stage_fwd_pct=40.0)
    summary = summarize_run(run, log_skipped=False)
    assert _named(summary) == set() and headline_data(summary)["diagnosis"] == []
    (group,) = summary.stragglers
    assert group.peer_groups == [
        {"group": {"pp": stage}, "ranks": list(range(16 * stage, 16 * stage + 16))}
        for stage in range(4)
    ]
    assert (
        "each rank compared only with its peers (same mesh coordinates but data-parallel): 4 "
        "groups: pp 0: ranks 0-15; pp 1: ranks 16-31" in format_summary(summary)
    )


def test_a_straggler_within_a_stage_is_still_named(tmp_path):
    run = _generated(
        tmp_path, "run", seed=4, pp=4, last_stage_fwd_pct=40.0, straggler=(53, "bwd", 25.0)
    )
    summary = summarize_run(run, log_skipped=False)
    assert _named(summary) == {53}
    (item,) = [f for f in summary.straggler_findings(headline_only=True) if f.kind == "arrival"]
    assert item.group == {"pp": 3} and item.peers == list(range(48, 64))
    (line,) = [
        line for line in headline_data(summary)["diagnosis"] if line.startswith("straggler: ")
    ]
    assert (
        line.startswith("straggler: training rank 53 [pp 3]: last to arrive at all_reduce")
        and "bwd +2" in line
    )


def test_two_peers_in_a_stage_show_a_difference_and_blame_nobody(tmp_path):
    run = str(tmp_path / "run")
    # 4 stages of 2 ranks
    generate_run(run, RunSpec(ranks=8, steps=30, seed=2, pp=4, straggler=(5, "bwd", 25.0)))
    summary = summarize_run(run, log_skipped=False)
    assert _named(summary) == set()
    (item,) = [f for f in summary.straggler_findings(headline_only=True) if f.kind == "arrival"]
    assert (item.rank, item.verdict, item.peers) == (5, "difference", [4, 5])
    assert any(
        line.startswith(
            "ranks differ (2 ranks: no majority, nobody blamed): training rank 5 [pp 2] vs rank 4: "
        )
        for line in headline_data(summary)["diagnosis"]
    )


def test_workers_carry_the_mesh(tmp_path):
    run = _generated(
        tmp_path, "run", seed=5, pp=4, last_stage_fwd_pct=40.0, straggler=(20, "fwd", 40.0)
    )
    one, two = (summarize_run(run, log_skipped=False, jobs=jobs).stragglers[0] for jobs in (1, 2))
    assert one.peer_groups == two.peer_groups and len(one.peer_groups) == 4
    assert [(f.rank, f.kind, f.what, f.verdict) for f in one.findings] == [
        (f.rank, f.kind, f.what, f.verdict) for f in two.findings
    ] and _named_in(one) == {20}


def _named_in(group) -> set[int]:
    return {f.rank for f in group.findings if f.verdict == "straggler"}


def test_a_rank_without_peers_is_not_compared_and_the_summary_says_so(tmp_path):
    run = str(tmp_path / "run")
    # pp=4, dp=1: every rank alone in its stage
    generate_run(run, RunSpec(ranks=4, steps=20, seed=1, pp=4, last_stage_fwd_pct=40.0))
    (group,) = summarize_run(run, log_skipped=False).stragglers
    assert group.findings == [] and group.ranks_by_slowness == []
    assert (
        "ranks 0-3: not compared: no other rank has the same mesh coordinates but data-parallel "
        "ones" in group.withheld
    )


def test_the_median_without_each_value_is_the_slow_rules_to_the_bit() -> None:
    """`compare_ranks` asks every rank of every step for the median of the others: the
    one-comparison form must be exact, duplicates included."""
    import random

    from otel_titan.analysis.model.stragglers import _median_without, _median_without_each

    rng = random.Random(7)
    # (never asked of one value: there is no other)
    for size in [
        *range(2, 12),
        63,
        64,
        1024,
        1025,
    ]:
        for _ in range(20):
            values = sorted(
                rng.choice([rng.random() * 100, round(rng.random() * 5, 1)]) for _ in range(size)
            )
            without = _median_without_each(values)
            assert [without(v) for v in values] == [_median_without(values, v) for v in values], (
                size,
                values,
            )


@pytest.mark.parametrize("ranks", [3, 4, 7, 64, 65, 130])
@pytest.mark.parametrize("steps", [1, 2, 9, 10])
def test_the_numpy_pass_is_the_general_ones_to_the_bit(ranks: int, steps: int) -> None:
    """`_dense` (every rank in every step: the common shape, in numpy) gives what `_per_step` gives,
    bit for bit: ties, a straggler, coarse values."""
    import random

    from otel_titan.analysis.model.stragglers import _dense, _per_step

    rng = random.Random(ranks * 100 + steps)
    for coarse in (False, True):  # coarse: many equal values (ties at the median and at the top)
        per_rank = {
            rank: {
                step: (round(rng.uniform(10, 12), 1) if coarse else rng.uniform(10, 12))
                + (5.0 if rank == 2 else 0.0)
                for step in range(3, 3 + steps)
            }
            for rank in rng.sample(range(ranks * 2), ranks)
        }
        dense = _dense(per_rank)
        assert dense is not None
        general = _per_step(per_rank, [], False)
        assert [list(part.items()) for part in dense] != [] and all(
            list(d.items()) == list(g.items()) for d, g in zip(dense[1:], general[1:])
        )
        assert dense[0] == general[0]
        # to the bit, -0.0 included
        assert all(
            repr(a) == repr(b)
            for d, g in zip(dense[2:], general[2:])
            for a, b in zip(d.values(), g.values())
        )
        rows: list = []
        assert _dense(per_rank, rows) == dense
        general_rows: list = []
        _per_step(per_rank, general_rows, True)
        assert rows == general_rows and [list(row.ms.items()) for row in rows] == [
            list(row.ms.items()) for row in general_rows
        ]
        assert repr([row.excess_ms for row in rows]) == repr(
            [row.excess_ms for row in general_rows]
        )
        assert compare_ranks(per_rank, table=False)[1] == compare_ranks(per_rank)[1]


def test_the_numpy_pass_leaves_other_shapes_to_the_general_one() -> None:
    from otel_titan.analysis.model.stragglers import _dense

    assert _dense({0: {1: 1.0, 2: 1.0}, 1: {1: 2.0, 2: 2.0}}) is None  # two ranks
    assert _dense({0: {1: 1.0, 2: 1.0}, 1: {1: 2.0}, 2: {1: 3.0, 2: 3.0}}) is None  # a step missing
    # ints: Python's median of ints is an int
    assert _dense({0: {1: 1, 2: 1}, 1: {1: 2, 2: 2}, 2: {1: 3, 2: 3}}) is None
    assert _dense({0: {1: float("nan")}, 1: {1: 2.0}, 2: {1: 3.0}}) is None
