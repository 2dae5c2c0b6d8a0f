"""The first lines of a summary: how many ranks ended how, where each group stopped, and what to
look at first.

Why: at 1,000 ranks a row per rank buries the one that matters (a hung rank on
line 784). Processes whose ends look the same — same attempt, same state
(`ProcessSummary.state`), same step, stopped inside the same spans or after
the same event — form one group; groups are listed largest first, and a group
smaller than the largest of its attempt is marked as differing. The
diagnosis lists, most telling first: crashed processes (file ends mid-line),
processes that logged nothing, the minority of a stall (one rank inside
``bwd`` while the rest wait inside the collective), and stragglers found on
evidence (`model.collect`). `headline_data` is the ``--json`` form; `headline_lines`
the text.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from otel_titan.analysis.model.ending import describe_crash, is_interrupt
from otel_titan.analysis.model.facts import ProcessSummary, RunSummary, innermost_open

if TYPE_CHECKING:  # model.hang imports this module (`compress`): for the annotations alone
    from otel_titan.analysis.model.hang import HangReport, Suspect

__all__ = ["headline_data", "headline_lines", "state_groups", "compress"]


def compress(ranks: list[int]) -> str:
    """``[0, 1, 2, 4]`` → ``"0-2,4"``.

    Example:
        >>> compress([0, 1, 2, 4, 6, 7])
        '0-2,4,6-7'
    """
    ordered = sorted(set(ranks))
    parts: list[str] = []
    index = 0
    while index < len(ordered):
        end = index
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        parts.append(str(ordered[index]) if end == index else f"{ordered[index]}-{ordered[end]}")
        index = end + 1
    return ",".join(parts)


def _where(p: ProcessSummary) -> str:
    """``inside fwd_bwd > bwd`` (the most recent nest of open spans), ``RuntimeError inside
    fwd_bwd`` (a crash) or ``after training_end``."""
    crash = p.crash
    if crash is not None and crash.get("type") != "killed" and not is_interrupt(crash):
        return f"{crash['type']} " + (
            f"inside {crash['span']}"
            if crash.get("span")
            else f"after {p.last_event or 'its first record'}"
        )
    latest = innermost_open(p.open_spans)
    if latest is not None:
        return "inside " + " > ".join(latest.path)
    if p.last_event is None:
        return "nothing logged"
    return f"after {p.last_event}"


def _who(processes: list[ProcessSummary]) -> str:
    by_source: dict[str, list[int]] = {}
    others: list[str] = []
    for p in processes:
        if p.rank is None:
            others.append(p.label)
        else:
            by_source.setdefault(p.source, []).append(p.rank)
    parts = [
        f"{source} rank{'s' if len(ranks) > 1 else ''} {compress(ranks)}"
        for source, ranks in by_source.items()
    ]
    return " · ".join(parts + others)


def state_groups(summary: RunSummary, now_us: float) -> list[dict[str, Any]]:
    """Processes grouped by (attempt, state, last step, where they stopped), largest first within
    each attempt."""
    groups: dict[tuple, list[ProcessSummary]] = {}
    hang = getattr(summary, "hang", None)
    # Its black box says it is stuck between spans at a step its records never reached: say so, as
    # the Hang section does.
    between = {
        place.label: place
        for place in (hang.places if hang is not None else [])
        if place.between_spans
    }
    for p in summary.processes:
        place = between.get(p.label)
        where, step = (
            (f"between spans ({_where(p)})", place.step if place.step is not None else p.last_step)
            if place is not None
            else (_where(p), p.last_step)
        )
        key = (p.attempt if p.attempt is not None else -1, p.source, p.state(now_us), step, where)
        groups.setdefault(key, []).append(p)
    largest: dict[tuple, int] = {}
    for (attempt, source, *_), members in groups.items():
        largest[(attempt, source)] = max(largest.get((attempt, source), 0), len(members))
    count_per: dict[tuple, int] = {}
    for attempt, source, *_ in groups:
        count_per[(attempt, source)] = count_per.get((attempt, source), 0) + 1
    out = []
    for (attempt, source, state, step, where), members in sorted(
        groups.items(), key=lambda item: (item[0][0], item[0][1], -len(item[1]), item[0][3] or 0)
    ):
        out.append(
            {
                "attempt": None if attempt == -1 else attempt,
                "source": source,
                "state": state,
                "step": step,
                "where": where,
                "count": len(members),
                "who": _who(members),
                "processes": [p.label for p in members],
                "differs": count_per[(attempt, source)] > 1
                and len(members) < largest[(attempt, source)],
            }
        )
    return out


def _diagnosis(summary: RunSummary, groups: list[dict[str, Any]]) -> list[str]:
    """The "Look first at" lines, most telling first: what cannot be seen elsewhere, then what
    failed, then who stands out.

    Missing ranks first (a rank with no file is invisible everywhere else,
    and often the one the others wait for), then crashes (a crash explains
    what its peers did after it), the Hang section's other suspects, files
    torn mid-line, files with nothing logged, the processes that stopped
    apart from their peers, and last the stragglers found on evidence.
    """
    latest_attempt = max((g["attempt"] for g in groups if g["attempt"] is not None), default=None)
    hang = getattr(summary, "hang", None)
    lines = _missing_lines(summary, hang, latest_attempt)
    lines += _crash_lines(summary, latest_attempt)
    lines += _hang_suspect_lines(hang, len(lines))
    lines += _torn_lines(summary, groups)
    lines += _silent_lines(groups)
    lines += _stopped_apart_lines(hang, groups, latest_attempt)
    for group in summary.stragglers:
        lines += straggler_lines(group, latest_attempt is not None and latest_attempt > 0)
    return lines


def _missing_lines(
    summary: RunSummary, hang: HangReport | None, latest_attempt: int | None
) -> list[str]:
    """``missing: training rank 3: no file, of world_size 8 (…)``: one line per source and attempt
    with ranks that left no file."""
    # The Hang section knows whether the others ran steps with a rank that has no file (then it got
    # past init).
    ran = {
        (m["source"], m["attempt"])
        for m in (hang.missing if hang is not None else [])
        if m.get("ran_with_others")
    }
    return [
        _missing_line(m, (m["source"], m["attempt"]) in ran, latest_attempt)
        for m in getattr(summary, "missing", None) or []
    ]


def _missing_line(
    missing: dict[str, Any], ran_with_others: bool, latest_attempt: int | None
) -> str:
    """One source and attempt's ranks with no file, and the likelier reason: they logged elsewhere
    (or nothing) when the others ran steps with them, else they never started."""
    attempt = f" (attempt {missing['attempt']})" if latest_attempt else ""
    one = len(missing["ranks"]) == 1
    its, it, log = ("its", "it", "logs") if one else ("their", "they", "log")
    why = (
        f"took part in the steps: {its} logs are not in this folder, or {it} {log} nothing"
        if ran_with_others
        else "never reached init_structured_logger, or its logs are not in this folder"
    )
    return f"missing: {missing['source']} rank{'s' if len(missing['ranks']) > 1 else ''} {compress(missing['ranks'])}{attempt}: no file, of world_size {missing['world_size']} ({why})"


def _hang_suspect_lines(hang: HangReport | None, before: int) -> list[str]:
    """The Hang section's suspects but the missing and the crashed (said above), while the diagnosis
    holds fewer than 4 lines (`before` so far)."""
    if hang is None:
        return []
    suspects = [suspect for suspect in hang.suspects if suspect.rule not in ("missing", "crashed")]
    return [_hang_suspect_line(suspect) for suspect in suspects[: max(0, 4 - before)]]


def _hang_suspect_line(suspect: Suspect) -> str:
    """``hang suspect: training rank 3: …`` (by label for a process with no rank)."""
    if suspect.rank is not None:
        return f"hang suspect: {suspect.source} rank {suspect.rank}: {suspect.why}"
    return f"hang suspect: {suspect.label}: {suspect.why}"


def _torn_lines(summary: RunSummary, groups: list[dict[str, Any]]) -> list[str]:
    """Crashed groups whose files end mid-line with no crash record: killed, or died while writing
    (a crash with a record has its own line)."""
    lines = []
    for g in groups:
        if g["state"] != "crashed":
            continue
        # labels repeat across attempts
        torn = [
            p
            for p in summary.processes
            if p.label in g["processes"] and p.attempt == g["attempt"] and p.crash is None
        ]
        if torn:
            lines.append(
                f"crashed (file ends mid-line: killed or died while writing): {_who(torn)} at "
                f"step {g['step']}, {g['where']}"
            )
    return lines


def _silent_lines(groups: list[dict[str, Any]]) -> list[str]:
    """Groups that logged nothing since their files were created: hung or died before their first
    record."""
    return [
        "logged nothing since its file was created (hung or died before its first record): "
        f"{g['who']}"
        for g in groups
        if g["state"] == "hung before first record"
    ]


def _stopped_apart_lines(
    hang: HangReport | None, groups: list[dict[str, Any]], latest_attempt: int | None
) -> list[str]:
    """The groups that stopped apart from the largest of their attempt: "look at them first", or,
    among hung processes, what the Hang section says."""
    # The Hang section has compared these processes on evidence (black boxes, collectives, steps):
    # "the odd group" would only echo its suspects or, where it cannot tell, contradict it. A
    # healthy job killed mid-step stops each rank wherever it was, so a smaller group there is no
    # evidence: the headline says what the Hang section says.
    in_hang = {place.label for place in hang.places} if hang is not None else set()
    lines: list[str] = []
    cannot_tell = False
    for g in groups:
        if hang is not None and in_hang and set(g["processes"]) <= in_hang:
            if not hang.suspects and not cannot_tell and _hang_split(g, groups, in_hang):
                cannot_tell = True
                lines.append(_cannot_tell_line(hang))
            continue
        line = _odd_group_line(g, groups, latest_attempt)
        if line is not None:
            lines.append(line)
    return lines


def _hang_split(group: dict[str, Any], groups: list[dict[str, Any]], in_hang: set[str]) -> bool:
    """Whether a group of hung processes is not where all of them are: it differs from the largest
    group, or is one of groups all of one size (2 ranks in 2 places).

    Either way never "nothing stands out".
    """
    if group["differs"]:
        return True
    alike = sum(
        1
        for o in groups
        if set(o["processes"]) <= in_hang
        and (o["attempt"], o["source"]) == (group["attempt"], group["source"])
    )
    return alike > 1


def _cannot_tell_line(hang: HangReport) -> str:
    """The Hang section named no one while the hung processes stopped in different places: why it
    cannot tell, and that the places alone blame no one."""
    why = (
        hang.notes[0]
        if hang.notes
        else "every stuck process is in the same place and no record shows one behind"
    )
    return f"hang: cannot tell who holds the others up: {why}; the processes stopped in different places (below), which alone blames no one"


def _odd_group_line(
    group: dict[str, Any], groups: list[dict[str, Any]], latest_attempt: int | None
) -> str | None:
    """``training rank 3: stalled at step 6, inside fwd_bwd > bwd, while 7 processes stalled at step
    6, inside all_reduce → look at training rank 3 first``.

    None for a group like the largest of its attempt, or one whose state has a line of its own
    (crashed, nothing logged) or is no trouble (closed).
    """
    if not group["differs"] or group["state"] in ("crashed", "hung before first record", "closed"):
        return None
    peers = [
        o
        for o in groups
        if o["attempt"] == group["attempt"] and o["source"] == group["source"] and not o["differs"]
    ]
    rest = _while_the_others(peers[0]) if peers else ""
    attempt = f" (attempt {group['attempt']})" if latest_attempt else ""
    return f"{group['who']}{attempt}: {group['state']} at step {group['step']}, {group['where']}{rest} → look at {group['who']} first"


def _while_the_others(peers: dict[str, Any]) -> str:
    """``, while 7 processes stalled at step 6, inside all_reduce``: where the largest group of the
    same attempt stopped."""
    return f", while {peers['count']:,} {'processes' if peers['count'] > 1 else 'process'} {peers['state']} at step {peers['step']}, {peers['where']}"


#: Crashed processes given a line each in the headline, per source and attempt (the first to fail
#: first).
CRASHES_SHOWN = 3


def _crash_lines(summary: RunSummary, latest_attempt: int | None) -> list[str]:
    """``crashed: training rank 1: RuntimeError: … at train.py:88 in oom, inside span fwd_bwd, step
    8; 2 other processes stopped after it``.

    Per source and attempt (an earlier attempt's crash stays shown after a
    restart replaced it), the first to fail first: a crash explains what its
    peers did after it (`model.ending.failed_first`, the Hang section's rule).
    """
    by_run: dict[tuple[Any, str], list[ProcessSummary]] = {}
    for p in summary.processes:
        if p.crash is not None and not is_interrupt(p.crash):
            by_run.setdefault((p.attempt, p.source), []).append(p)
    hang = getattr(summary, "hang", None)
    first = {
        s.label: s.why for s in (hang.suspects if hang is not None else []) if s.rule == "crashed"
    }
    lines = []
    for (attempt, _), crashed in sorted(
        by_run.items(), key=lambda item: (-1 if item[0][0] is None else item[0][0], item[0][1])
    ):
        crashed.sort(key=lambda p: (p.label not in first, p.crash.get("time_us") or 0))  # type: ignore[union-attr]  # crashed processes have a crash record
        culprits = [p for p in crashed if p.label in first]
        shown = culprits or crashed[:CRASHES_SHOWN]
        label = f" (attempt {attempt})" if latest_attempt else ""
        for p in shown:
            why = first.get(p.label, "")
            victims = (
                why.rsplit("; ", 1)[1] if why.endswith(("(its victims)", "(its victim)")) else ""
            )
            lines.append(
                f"crashed: {_who([p])}{label}: {describe_crash(p.crash)}"  # type: ignore[arg-type]  # crashed processes have a crash record
                + (f"; {victims}" if victims else "")
            )
        rest = crashed[len(shown) :]
        if rest:
            # After the first: their collective failed because it was gone (gloo), or they died of
            # their own error later.
            lines.append(
                f"crashed after {'it' if len(shown) == 1 else 'them'}{label}: {_who(rest)} ({describe_crash(rest[0].crash, step=False)}{'' if len(rest) == 1 else ', …'})"  # type: ignore[arg-type]  # crashed processes have a crash record
            )
    return lines


def _z(z: float | None) -> str:
    return "∞" if z is None else f"{z:.1f}"


def describe_finding(item: Any) -> str:
    """What one finding says: ``last to arrive at all_reduce in 25/29 steps (+6.20 ms, z 9.9)`` or
    ``data_fetch +40% (+12.00 ms, z 37.1)``."""
    if item.kind == "arrival":
        return f"last to arrive at {item.what} in {item.slowest_steps}/{item.compared_steps} steps ({item.excess_ms:+.2f} ms, z {_z(item.robust_z)})"
    others = item.others_median_ms
    # Twice the others' time or more reads better as a factor than as a percentage.
    size = (
        f"{item.median_ms / others:.1f}×"
        if others > 0 and item.median_ms >= 2 * others
        else ("" if item.excess_pct is None else f"{item.excess_pct:+.0f}%")
    )
    name = "slower steps" if item.kind == "step" else item.what
    return f"{name} {size} ({item.excess_ms:+.2f} ms, z {_z(item.robust_z)})".replace("  ", " ")


def describe_cost(item: Any) -> str:
    """``costs the run 6.20 ms per step (5.8% of the step), 180 ms over 29 steps``."""
    share = "" if item.share_of_step is None else f" ({item.share_of_step:.1%} of the step)"
    return f"costs the run {item.cost_per_step_ms:.2f} ms per step{share}, {item.cost_run_ms:,.0f} ms over {item.compared_steps} steps"


def straggler_lines(group: Any, show_attempt: bool) -> list[str]:
    """The "Look first at" lines of one source and attempt: the job's own slowdown
    (`model.job_speed`), then findings that cost ≥ `HEADLINE_MIN_SHARE` (1 %) of the step in both
    halves of the run, costliest first.

    A rank with fewer than three peers is never called a straggler: its
    difference is shown, nobody is blamed (with two ranks, either could be the
    odd one).
    """
    attempt = f", attempt {group.attempt}" if show_attempt else ""
    by_rank: dict[int, list[Any]] = {}
    for item in group.findings:
        if item.headline:
            by_rank.setdefault(item.rank, []).append(item)
    lines = []
    job = group.job_slowdown
    if job is not None:
        # Every rank slower at once (`model.job_speed`): `watch`'s ``job_slow``, no rank to blame.
        lines.append(f"{job.describe()}: {group.source}{attempt}, every rank")
    order = sorted(
        by_rank.items(), key=lambda entry: (-max(f.cost_per_step_ms for f in entry[1]), entry[0])
    )
    for rank, found in order:
        # The arrival first (where every rank pays), then the step time, then phases in the order
        # found.
        found.sort(key=lambda f: {"arrival": 0, "step": 1}.get(f.kind, 2))
        costliest = max(found, key=lambda f: f.cost_per_step_ms)
        what = "; ".join(describe_finding(f) for f in found)
        where = (
            f" [{', '.join(f'{k} {v}' for k, v in costliest.group.items())}]"
            if costliest.group
            else ""
        )
        if all(f.verdict == "straggler" for f in found):
            since = (
                f", since step {costliest.since_step}, to the end of the run"
                if costliest.since_step is not None
                else (
                    f", in steps {costliest.window_from_step}–{costliest.window_to_step} only"
                    if costliest.window_from_step is not None
                    else ""
                )
            )
            lines.append(
                f"straggler: {group.source} rank {rank}{attempt}{where}: {what}; "
                f"{describe_cost(costliest)}{since}"
            )
        else:
            others = ",".join(str(r) for r in costliest.peers if r != rank)
            lines.append(
                f"ranks differ ({len(costliest.peers)} ranks: no majority, nobody blamed): "
                f"{group.source} rank {rank}{attempt}{where} vs rank {others}: {what}; "
                f"{describe_cost(costliest).replace('costs the run', 'the difference is')}"
            )
    return lines


def headline_data(summary: RunSummary, now_us: float | None = None) -> dict[str, Any]:
    """The headline as data (in ``--json``): counts per state, groups, the diagnosis."""
    now_us = time.time() * 1e6 if now_us is None else now_us
    groups = state_groups(summary, now_us)
    states: dict[str, int] = {}
    for p in summary.processes:
        state = p.state(now_us)
        states[state] = states.get(state, 0) + 1
    missing = sum(len(m["ranks"]) for m in getattr(summary, "missing", None) or [])
    return {
        "processes": len(summary.processes),
        "missing": missing,
        "states": states,
        "attempts": sorted({p.attempt for p in summary.processes if p.attempt is not None}),
        "hosts": len({p.host_name for p in summary.processes if p.host_name}),
        "groups": groups,
        "diagnosis": _diagnosis(summary, groups),
    }


_STATE_ORDER = [
    "closed",
    "running",
    "stalled",
    "stopped",
    "crashed",
    "interrupted",
    "terminated (SIGTERM)",
    "hung before first record",
]


def headline_lines(
    summary: RunSummary, data: dict[str, Any], show_all_groups: bool = False, groups_shown: int = 6
) -> list[str]:
    """The headline as text: a count per state, the diagnosis, the clocks, then the groups."""
    states = data["states"]
    order = sorted(
        states, key=lambda s: (_STATE_ORDER.index(s) if s in _STATE_ORDER else len(_STATE_ORDER), s)
    )
    attempts = data["attempts"]
    missing = data.get("missing") or 0
    count = (
        f"{data['processes']:,} of {data['processes'] + missing:,}"
        if missing
        else f"{data['processes']:,}"
    )
    who = f"{count} process{'es' if data['processes'] + missing != 1 else ''}" + (
        f" on {data['hosts']:,} host{'s' if data['hosts'] != 1 else ''}" if data["hosts"] else ""
    )
    if len(attempts) > 1:
        who += f", {len(attempts)} attempts (restarts: {', '.join(map(str, attempts))})"
    lines = [
        f"Summary: {who}: "
        + ", ".join(
            ([f"{missing:,} missing (no file)"] if missing else [])
            + [f"{states[s]:,} {s}" for s in order]
        )
    ]
    diagnosis = data["diagnosis"]
    if diagnosis:
        lines.append("  Look first at:")
        lines += [f"  ▶ {line}" for line in diagnosis[:8]]
        if len(diagnosis) > 8:
            lines.append(f"    … {len(diagnosis) - 8} more (see below)")
    else:
        # A straggler kept out of the headline (small, or it came and went) is still one: never "no
        # straggler" above it.
        kept_out = any(
            f.verdict == "straggler" for group in summary.stragglers for f in group.findings
        )
        no_straggler = (
            ""
            if summary.tail_only
            else (
                "; no straggler costs the run enough for here (see Stragglers)"
                if kept_out
                else "; no straggler on evidence"
            )
        )
        lines.append(
            f"  nothing stands out: every group of processes ended the same way{no_straggler}"
        )
    if summary.clock is not None and not summary.tail_only:
        lines.append(f"  clocks: {summary.clock.describe()}")
    groups = data["groups"]
    shown = groups if show_all_groups else groups[:groups_shown]
    lines += [
        "",
        "Where the processes stopped (grouped; ▶ differs from the largest group of its attempt)",
    ]
    multi = len(attempts) > 1
    for g in shown:
        attempt = f"attempt {g['attempt']}: " if multi and g["attempt"] is not None else ""
        mark = "▶" if g["differs"] else " "
        count = f"{g['count']:,} process{'es' if g['count'] > 1 else ''}"
        step = "" if g["step"] is None else f" at step {g['step']}"
        lines.append(f"  {mark} {attempt}{count}: {g['state']}{step}, {g['where']}  ({g['who']})")
    if len(groups) > len(shown):
        lines.append(
            f"    … {len(groups) - len(shown)} more groups (--all lists every group and process)"
        )
    return lines
