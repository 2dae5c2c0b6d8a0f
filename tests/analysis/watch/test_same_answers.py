"""`watch` and `summarize` give the same answers on the same data at the end (issue 20: "one set of
rules in `model/`").

Each run is generated with a known fault (benchmarks/generate_run.py), then
read twice: by `summarize` (`RunAnalysis`, after the fact) and replayed
through `watch`'s detector as if live. The ranks and phases each names must
be the same: the hang's culprit (in a span, or between spans: "behind in the
step"), the straggler, the crashed and terminated ranks, the missing rank,
the job's own slowdown and the phase that grew; and nothing at all for a
restart that recovered. The wording differs (a live
alert, a section of a report); the verdict may not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis.run_analysis import RunAnalysis
from otel_titan.analysis.watch.replay import replay

RANKS, STEP_MS = 32, 200.0

CASES = {
    # The watchdog's black boxes come 120 s after the last progress: `summarize` needs them to call
    # a rank stuck.
    "hang in a span": dict(hung=(13, 60), black_boxes=True),
    "hang between spans": dict(hung=(13, 60), black_boxes=True, hung_between=True),
    "fail-slow rank": dict(straggler=(9, "fwd", 25.0), slow_from=30),
    "slow host": dict(straggler=(17, "bwd", 25.0), slow_from=30, slow_host=True),
    "crash": dict(crashed=(5, 40)),
    "missing rank": dict(hung=(7, 1), missing=(7,), black_boxes=True),
    # The others ran 29 steps with rank 7: its logs are elsewhere. Missing, and nobody blamed for
    # the hang.
    "missing rank the others ran with": dict(hung=(7, 30), missing=(7,), black_boxes=True),
    "restart": dict(restart=(5, 40), steps=70),
    # Issue 26 A and item 9: a slowdown over part of the run. summarize finds it between its change
    # points ("since step 91", "in steps 31-60 only"); watch, by the same function over its sliding
    # window, while it lasts.
    "slowdown in the last quarter": dict(straggler=(9, "fwd", 100.0), slow_from=91),
    "slowdown that came and went": dict(straggler=(9, "fwd", 100.0), slow_from=31, slow_to=60),
    # Every rank slower (`model.job_speed`): summarize judges the run's end against the steps before
    # the change, watch holds the past it raised on; the same phase grew.
    "the job slowed down": dict(job_slow=("data_fetch", 400.0, 40), steps=140),
    "the job slowed down late": dict(job_slow=("fwd", 100.0, 100), steps=140),
}


Answers = dict[str, dict[int, set]]


def summarize_answers(path: str) -> Answers:
    """kind → rank → the phases `summarize` names it in, over its verdicts about the run's latest
    attempt.

    A straggler has one finding per piece of evidence (its arrival at the
    step-closing collective, each slow phase and the spans around it); `watch`
    names a rank once, in the innermost phase: it must be one of these.
    """
    run = RunAnalysis(path, log_skipped=False)
    out: Answers = {}
    hang = run.hang()
    if hang is not None and hang.verdict == "named":
        places = {p.label: p for p in hang.places}
        for s in hang.suspects:
            place = places.get(s.label)
            phase = (
                s.span
                if s.span
                else ("between spans" if place is not None and place.between_spans else None)
            )
            out.setdefault("crashed" if s.rule == "crashed" else "hang", {}).setdefault(
                s.rank, set()
            ).add(phase)
    for m in run.missing():
        for rank in m["ranks"]:
            out.setdefault("missing", {})[rank] = {None}
    for f in run.stragglers(headline_only=True):
        if f.kind == "phase":
            out.setdefault("slow", {}).setdefault(f.rank, set()).add(f.what)
    latest = max((p.attempt or 0) for p in run.processes())
    for group in run.summary.stragglers:
        if group.job_slowdown is not None and (group.attempt or 0) == latest:
            out.setdefault("job_slow", {})[None] = {group.job_slowdown.phase}
    for p in run.processes():
        if (p.attempt or 0) == latest and p.signal and not p.closed_cleanly:
            out.setdefault("terminated", {})[p.rank] = {None}
    return out


def watch_answers(path: str) -> Answers:
    """kind → rank → the phase of every alert `watch` raised about the run's latest attempt, as last
    updated."""
    result = replay(path, tail_s=200.0)
    latest: dict[str, dict] = {}
    for event in result.events:
        if event["type"] in ("alert", "update"):
            latest[event["id"]] = event
    attempt = result.last_frame["attempt"]
    out: Answers = {}
    for alert in latest.values():
        if alert["attempt"] != attempt:
            continue
        if alert["kind"] == "job_slow":
            out.setdefault("job_slow", {})[None] = {alert["phase"]}
            continue
        phase = (
            None
            if alert["kind"] in ("missing", "terminated") or alert.get("rule") == "missing"
            else alert["phase"]
        )
        for rank in alert["ranks"]:
            out.setdefault(alert["kind"], {}).setdefault(rank, set()).add(phase)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_watch_names_at_the_end_what_summarize_names(tmp_path: Path, case: str) -> None:
    spec = dict(CASES[case])
    path = str(tmp_path / "run")
    generate_run(
        path, RunSpec(ranks=RANKS, steps=spec.pop("steps", 120), step_ms=STEP_MS, seed=1, **spec)
    )
    expected = summarize_answers(path)
    # Each case has a verdict to compare (but the restart's, which is "nothing": the second attempt
    # ran to its end).
    assert expected or case == "restart", expected
    got = watch_answers(path)
    assert {kind: sorted(ranks) for kind, ranks in got.items()} == {
        kind: sorted(ranks) for kind, ranks in expected.items()
    }
    for kind, ranks in got.items():
        for rank, phases in ranks.items():
            assert len(phases) == 1 and phases <= expected[kind][rank], (
                kind,
                rank,
                phases,
                expected[kind][rank],
            )


#: A rank 10 % slower in `fwd` (the effect the straggler rule is built to find) on a 32-rank run,
#: over seeds: `watch` raised `slow` while `summarize` kept it out of "Look first at" (issue 26, A:
#: "3 of 4 seeds disagree at 10 %").
SLOW_SEEDS = (1, 2, 3, 4)


@pytest.mark.parametrize("pct", [10.0, 12.0])
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_a_rank_slower_by_the_rules_effect_is_named_by_both_or_neither(
    tmp_path: Path, seed: int, pct: float
) -> None:
    path = str(tmp_path / "run")
    generate_run(
        path, RunSpec(ranks=RANKS, steps=120, step_ms=STEP_MS, seed=seed, straggler=(9, "fwd", pct))
    )
    expected = summarize_answers(path)
    got = watch_answers(path)
    assert {kind: sorted(ranks) for kind, ranks in got.items()} == {
        kind: sorted(ranks) for kind, ranks in expected.items()
    }, (got, expected)
    assert set(expected) <= {"slow"} and set(expected.get("slow", {})) <= {9}, expected
    for rank, phases in got.get("slow", {}).items():
        assert phases == {"fwd"} and phases <= expected["slow"][rank], (rank, phases, expected)
    # Named by summarize at all (a straggler verdict in the Stragglers section) is named where the
    # user looks first.
    named = [
        f for f in RunAnalysis(path, log_skipped=False).stragglers() if f.verdict == "straggler"
    ]
    assert all(f.headline for f in named), [(f.rank, f.what, f.why_not_headline) for f in named]
    if pct >= 12.0:
        # 12 %: over the rule's 10 %, on 120 steps of 32 ranks
        assert expected == {"slow": {9: {"fwd"}}}, expected
