"""`RunSummary` → the tables `otel-titan summarize` prints (plain text, fits a terminal)."""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Sequence

from otel_titan.analysis.model import job_speed
from otel_titan.analysis.model.facts import (
    ProcessSummary,
    RankSlowness,
    RunSummary,
    StragglerFinding,
    Stragglers,
)
from otel_titan.analysis.model.hang import format_hang, format_history
from otel_titan.analysis.model.headline import compress as compress_ranks
from otel_titan.analysis.model.headline import describe_cost, headline_data, headline_lines
from otel_titan.analysis.model.stragglers import (
    HEADLINE_MIN_SHARE,
    MIN_ARRIVAL_EFFECT,
    MIN_EFFECT,
    MIN_MAJORITY,
    MIN_STEP_SHARE,
    MIN_STEPS,
    MIN_Z,
    MIN_Z_BELOW_EFFECT,
    describe_group,
    effect_bar,
)
from otel_titan.analysis.model.wording import plural
from otel_titan.analysis.read.runs import RunChoice
from otel_titan.analysis.read.safe_text import printable

__all__ = ["format_summary", "format_ms", "compress_ranks"]

#: Steps shown per straggler table (the JSON has all of them).
STEPS_SHOWN = 10
#: Rank columns shown in a step table before it switches to slowest/median columns.
RANK_COLUMNS = 8


def format_ms(ms: float | None) -> str:
    """Milliseconds with precision that suits their size.

    Example:
        >>> format_ms(0.01234), format_ms(3.14159), format_ms(42.42), format_ms(12345.6)
        ('0.012', '3.14', '42.4', '12,346')
    """
    if ms is None:
        return "-"
    size = abs(ms)
    if size < 1:
        return f"{ms:.3f}"
    if size < 10:
        return f"{ms:.2f}"
    if size < 100:
        return f"{ms:.1f}"
    return f"{ms:,.0f}"


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _clock(time_us: int | None, with_date: bool = False) -> str:
    if time_us is None:
        return "-"
    try:
        moment = _dt.datetime.fromtimestamp(time_us / 1e6, tz=_dt.timezone.utc)
    except (ValueError, OverflowError, OSError):
        return (
            f"{time_us} µs"  # past the calendar's year 9999: a corrupt timestamp the reader keeps
        )
    text = moment.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S")
    return f"{text}.{moment.microsecond // 1000:03d}"


def _who(labels: list[str], processes: dict[str, ProcessSummary]) -> str:
    """Labels grouped by source: ``training ranks 0-2,4 · rollouter rank 0``."""
    by_source: dict[str, list[int]] = {}
    others: list[str] = []
    for label in labels:
        process = processes.get(label)
        if process is None or process.rank is None:
            others.append(label)
        else:
            by_source.setdefault(process.source, []).append(process.rank)
    parts = [
        f"{source} rank{'s' if len(set(ranks)) > 1 else ''} {compress_ranks(ranks)}"
        for source, ranks in by_source.items()
    ]
    return " · ".join(parts + others)


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: Sequence[int] = (),
    indent: str = "  ",
) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = []
    for row in (headers, *rows):
        cells = [
            str(cell).rjust(width) if index in right else str(cell).ljust(width)
            for index, (cell, width) in enumerate(zip(row, widths))
        ]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


#: Up to this many processes, every process gets a row by default (it fits a screen); beyond, only
#: groups.
ROWS_PER_PROCESS_UP_TO = 8


def format_summary(summary: RunSummary, show_all: bool = False) -> str:
    """The summary as terminal tables: the headline (states, diagnosis, clocks, groups) first.

    `show_all`: a row per process and every group, whatever the number of processes.

    Example:
        >>> from otel_titan.analysis import summarize_run
        >>> print(format_summary(summarize_run("outputs")))
        Run outputs  (2 processes, logs in outputs/structured_logs)
          run id doc-run; ...
        Summary: 2 processes on 1 host: 2 closed
        ...
    """
    lines: list[str] = format_hang(summary.hang)  # first: after a hang, the first question
    duration = (
        None
        if summary.first_us is None or summary.last_us is None
        else (summary.last_us - summary.first_us) / 1e6
    )
    lines.append(
        f"Run {summary.run_dir}  ({plural(len(summary.processes), 'process')}, logs in "
        f"{summary.log_dir})"
    )
    choice = RunChoice(summary.run_id, summary.run_selection, summary.runs)
    if summary.run_selection != "only":
        # Several runs in one folder: say which one these tables are about.
        lines.append(f"  {choice.describe()}")
    run_ids = ", ".join(summary.run_ids) if summary.run_ids else "unknown"
    if summary.tail_only:
        # Only the files' ends were read: their time range and record count are the tails', not the
        # run's.
        lines.append(
            f"  run id {run_ids}; tails only: {plural(summary.records, 'record')} read from the "
            "files' ends, "
            f"{_clock(summary.first_us, True)} → {_clock(summary.last_us)} UTC; the run's whole "
            "time range and record count "
            "need a full read (summarize without --tail)"
            + (
                f"; {plural(summary.skipped_lines, 'unreadable line')} skipped"
                if summary.skipped_lines
                else ""
            )
        )
    else:
        lines.append(
            f"  run id {run_ids}; {_clock(summary.first_us, True)} → {_clock(summary.last_us)} UTC"
            + (f" ({_seconds(duration)})" if duration is not None else "")
            + f"; {plural(summary.records, 'record')}; {plural(summary.skipped_lines, 'unreadable line')} skipped"
            + (
                f"; {plural(summary.repaired_lines, 'line')} with invalid Unicode kept, escaped"
                if summary.repaired_lines
                else ""
            )
        )
    if summary.last_us is not None:
        # Is it still running? A live run's last record is recent; a hung or dead one's is not.
        lines.append(
            f"  last record {_seconds(max(time.time() - summary.last_us / 1e6, 0.0))} before now"
        )
    for example in summary.skipped_examples[:3]:
        lines.append(f"    skipped: {example}")
    data = headline_data(summary)
    lines += headline_lines(summary, data, show_all_groups=show_all)
    # (with a Hang section, they are listed in it)
    if summary.hang is None and summary.stalls_ended:
        lines += [""] + format_history(summary.stalls_ended)
    every = show_all or len(summary.processes) <= ROWS_PER_PROCESS_UP_TO
    if every:
        lines += ["", "Processes"]
        lines += _processes_table(summary.processes)
    lines += _hang_suspects(summary, every)
    if every:  # (where they stopped is in the headline's groups)
        lines += _open_spans(summary.processes)
    else:
        lines += _open_spans(_examples(summary, data), per_group=True)
    if summary.tail_only:
        lines += [
            "",
            "(from the files' tails only: run without --tail for phases, stragglers and clock "
            "alignment)",
        ]
    lines += _phases(summary)
    attempts: dict[str, int] = {}
    for group in summary.stragglers:
        attempts[group.source] = attempts.get(group.source, 0) + 1
    for group in summary.stragglers:
        lines += _stragglers(group, show_attempt=attempts[group.source] > 1)
    if summary.slow_steps:  # only steps the memory/host figures explain (step_figures.py)
        lines += ["", "Slow steps and the machine"] + [f"  {note}" for note in summary.slow_steps]
    if summary.config_drift:  # ranks whose logged configuration differs (config_drift.py)
        lines += ["", "Configuration drift"] + [f"  {note}" for note in summary.config_drift]
    # the records' text is shown, never run by the terminal
    return "\n".join(map(printable, lines)) + "\n"


def _processes_table(processes: list[ProcessSummary]) -> list[str]:
    rows = []
    for p in processes:
        step = (
            "-"
            if p.last_step is None
            else (
                f"{p.last_step} ({p.last_relative_step})"
                if p.last_relative_step not in (None, p.last_step)
                else str(p.last_step)
            )
        )
        if p.closed_cleanly is None:
            closed = "unknown"
        else:
            closed = "yes" if p.closed_cleanly else "NO"
        if p.signal:
            closed += f" ({p.signal})"
        # an uncaught exception (or a silent kill) before any closing record: no clean end
        if p.crash is not None:
            closed = (
                f"{'NO' if p.crash.get('type') == 'killed' else 'after'} {p.crash.get('type')}"
                + (f" ({p.signal})" if p.signal else "")
            )
        lost = p.records_dropped + p.records_failed
        extra = []
        if p.lost_lines:
            extra.append(plural(p.lost_lines, "seq gap"))
        if p.first_seq_id is not None and p.first_seq_id > 1:
            extra.append(f"starts at seq {p.first_seq_id}")
        if p.skipped_lines:
            extra.append(f"{p.skipped_lines} unreadable")
        rows.append(
            [
                p.label,
                "-" if p.attempt is None else str(p.attempt),
                step,
                p.last_event or ("(nothing logged)" if p.hang_suspect else "-"),
                _clock(p.last_event_us),
                _seconds(p.behind_s),
                closed,
                f"{lost:,}" + (f" ({', '.join(extra)})" if extra else ""),
                str(p.open_span_count) if p.open_span_count else "-",
            ]
        )
    return _table(
        [
            "process",
            "attempt",
            "last step (rel)",
            "last event",
            "at (UTC)",
            "behind",
            "closed",
            "lost records",
            "open spans",
        ],
        rows,
        right=(1, 5, 8),
    )


def _examples(summary: RunSummary, data: dict) -> list[ProcessSummary]:
    """Whose open spans to show without --all: every process of a differing group, one of each other
    group."""
    by_label = {p.label: p for p in summary.processes}
    chosen: list[ProcessSummary] = []
    for group in data["groups"]:
        labels = group["processes"] if group["differs"] else group["processes"][:1]
        chosen += [by_label[label] for label in labels[:ROWS_PER_PROCESS_UP_TO]]
    return chosen


def _hang_suspects(summary: RunSummary, every: bool = True) -> list[str]:
    suspects = [p for p in summary.processes if p.hang_suspect]
    if not suspects:
        return []
    lines = [
        "",
        "Hang suspects (no record since the file was created: hung, or died, before the first "
        "record)",
    ]
    now = time.time()
    if not every and len(suspects) > ROWS_PER_PROCESS_UP_TO:
        lines.append(
            f"  {len(suspects):,} processes: "
            f"{_who([p.label for p in suspects], {p.label: p for p in suspects})} (--all lists "
            "each)"
        )
        return lines
    for p in suspects:
        if p.created_us is None:
            lines.append(f"  {p.label}: nothing logged; when its file was created is unknown")
            continue
        before = (
            f", {_seconds(p.behind_s)} before the run's last record"
            if summary.last_us is not None and p.created_us <= summary.last_us
            else ""
        )
        lines.append(
            f"  {p.label}: nothing logged since its file was created at {_clock(p.created_us)} "
            f"UTC ({_seconds(max(now - p.created_us / 1e6, 0.0))} before now{before})"
        )
    return lines


def _open_spans(processes: list[ProcessSummary], per_group: bool = False) -> list[str]:
    with_open = [p for p in processes if p.open_spans]
    if not with_open:
        return []
    lines = [
        "",
        "Open spans (a _start without _end: the process died, hung, or is still running; ≥: until "
        "its last record)"
        + (
            "; one process per group, every one of a group that differs (--all: all)"
            if per_group
            else ""
        ),
    ]
    for p in with_open:
        nests: dict[tuple, list] = {}
        for span in p.open_spans:
            # the deepest span of each lane has the full path
            nests[(span.thread, span.task_name)] = [span]
        for (thread, task), (span,) in sorted(nests.items(), key=lambda item: item[1][0].start_us):
            where = (
                f"task {task}"
                if task
                else ("main thread" if thread == p.pid else f"thread {thread}")
            )
            step = "" if span.step is None else f"step {span.step}, "
            failed = ", failed" if span.failed else ""
            lines.append(
                f"  {p.label}: {' > '.join(span.path)}  ({step}open since "
                f"{_clock(span.start_us)}, ≥ {_seconds(span.open_s)}{failed}; {where})"
            )
        if p.open_span_count > len(p.open_spans):
            lines.append(
                f"  {p.label}: … and {p.open_span_count - len(p.open_spans)} open spans that "
                "started earlier"
            )
    return lines


def _phases(summary: RunSummary) -> list[str]:
    if not summary.phases:
        return []
    rows = []
    for phase in sorted(summary.phases, key=lambda ph: (ph.source, -ph.total_ms, ph.name)):
        slowest = "-"
        if phase.count:
            slowest = (
                phase.slowest
                + ("" if phase.slowest_step is None else f", step {phase.slowest_step}")
                + ("" if not phase.slowest_attempt else f", attempt {phase.slowest_attempt}")
            )
        rows.append(
            [
                phase.source,
                phase.name,
                f"{phase.count:,}",
                str(phase.errors) if phase.errors else "-",
                str(phase.incomplete) if phase.incomplete else "-",
                format_ms(phase.total_ms) if phase.count else "-",
                format_ms(phase.p50_ms) if phase.count else "-",
                format_ms(phase.p95_ms) if phase.count else "-",
                format_ms(phase.max_ms) if phase.count else "-",
                slowest,
            ]
        )
    return ["", "Phases (completed spans, by total time; durations in ms)"] + _table(
        [
            "source",
            "phase",
            "count",
            "errors",
            "open",
            "total",
            "p50",
            "p95",
            "max",
            "slowest (where)",
        ],
        rows,
        right=(2, 3, 4, 5, 6, 7, 8),
    )


def _z(r: RankSlowness) -> str:
    if r.robust_z is not None:
        return f"{r.robust_z:.1f}"
    return "∞" if r.median_excess_ms > 0 else "-"  # no noise at all: any difference is systematic


def _excess(ms: float, pct: float | None, inline: bool = False) -> str:
    """The difference of the medians, and relative to the others' median: ``+5.00 ms (+10.0%)``,
    inline ``+5.00 ms, +10.0%``."""
    if pct is None:
        return f"{ms:+.2f} ms"
    return f"{ms:+.2f} ms, {pct:+.1f}%" if inline else f"{ms:+.2f} ms ({pct:+.1f}%)"


def _stragglers(group: Stragglers, show_attempt: bool) -> list[str]:
    """One straggler section of a source (and attempt): its ranks, arrivals, slowest steps and
    phases, in that order."""
    lines = ["", _stragglers_title(group, show_attempt)]
    if not group.steps:
        return lines + ["  no step was completed by two or more ranks"]
    lines += _peer_groups_line(group)
    lines += _ranks_table(group)
    lines.append(_straggler_verdict(group))
    lines += _job_slowdown_line(group)
    lines += _arrival_section(group)
    lines += _largest_steps_table(group)
    lines += _phase_section(group)
    lines += _step_costs(group)
    lines += _withheld(group)
    return lines


def _stragglers_title(group: Stragglers, show_attempt: bool) -> str:
    """The section's title: what was compared, and what a step time is, so the figures below can be
    read."""
    attempt = f", attempt {group.attempt}" if show_attempt and group.attempt is not None else ""
    compared = f"; steps {group.steps_compared} only (--steps)" if group.steps_compared else ""
    return f"Stragglers: {group.source}{attempt} ({len(group.ranks)} ranks{compared}; step time = first record of step N → first record of step N+1 on that rank)"


def _peer_groups_line(group: Stragglers) -> list[str]:
    """The peer groups, when there are several: a declared mesh compares a rank only with ranks that
    should do the same work."""
    if len(group.peer_groups) <= 1:
        return []
    shown = "; ".join(
        f"{describe_group(tuple(g['group'].items())) or 'no mesh'}: "
        f"rank{'s' if len(g['ranks']) > 1 else ''} {compress_ranks(g['ranks'])}"
        for g in group.peer_groups[:6]
    )
    more = f"; … {len(group.peer_groups) - 6} more" if len(group.peer_groups) > 6 else ""
    return [
        "  each rank compared only with its peers (same mesh coordinates but data-parallel): "
        f"{len(group.peer_groups)} groups: {shown}{more}"
    ]


def _rank_row(r: RankSlowness) -> list[str]:
    """One rank's row of the ranks table: its median step against the others', the noise, and its
    verdict."""
    return [
        str(r.rank),
        str(r.compared_steps),
        f"{r.slowest_steps}",
        format_ms(r.median_ms),
        format_ms(r.others_median_ms),
        _excess(r.median_excess_ms, r.median_excess_pct),
        format_ms(r.noise_ms),
        _z(r),
        "← straggler" if r.straggler else ("← differs (no majority)" if r.differs else ""),
    ]


def _ranks_table(group: Stragglers) -> list[str]:
    """The slowest ranks first, at most `RANK_COLUMNS` of them (the JSON has all): a screen, not a
    dump."""
    rows = [_rank_row(r) for r in group.ranks_by_slowness[:RANK_COLUMNS]]
    lines = []
    if rows:
        lines += _table(
            [
                "rank",
                "steps",
                "alone slowest in",
                "median step ms",
                "others' median",
                "difference",
                "noise ms",
                "z",
                "",
            ],
            rows,
            right=(0, 1, 2, 3, 4, 6, 7),
        )
    if len(group.ranks_by_slowness) > RANK_COLUMNS:
        lines.append(f"  … {len(group.ranks_by_slowness) - RANK_COLUMNS} more ranks (see --json)")
    return lines


def _straggler_verdict(group: Stragglers) -> str:
    """Who is a straggler, or why nobody is, with the rule spelled out so a reader can judge the
    verdict."""
    rule = f"≥ {MIN_STEPS} steps, a median ≥ {effect_bar(1.0):.1%} and ≥ {MIN_Z:g} × noise ({MIN_Z_BELOW_EFFECT:g} × under {MIN_EFFECT:.0%}) above the others' median"
    step_differs = [
        f.rank for f in group.findings if f.kind == "step" and f.verdict == "difference"
    ]
    if group.straggler_ranks:
        return f"  straggler{'s' if len(group.straggler_ranks) > 1 else ''}: rank{'s' if len(group.straggler_ranks) > 1 else ''} {compress_ranks(group.straggler_ranks)} ({rule})"
    if step_differs:
        return f"  no straggler: rank {compress_ranks(step_differs)}'s steps differ from its peers', but with fewer than {MIN_MAJORITY} ranks there is no majority to call one abnormal ({rule})"
    return f"  no straggler: no rank's step time is slower on evidence ({rule})"


def _job_slowdown_line(group: Stragglers) -> list[str]:
    """Every rank slower than the job's own earlier steps (`model.job_speed`), with the rule."""
    found = group.job_slowdown
    if found is None:
        return []
    return [
        f"  {found.describe()}: every rank, no rank behind the others (the last "
        f"{job_speed.WINDOW} steps' median against the {job_speed.BASELINE} before the change, "
        f"≥ {effect_bar(1.0):.1%} and ≥ {MIN_Z:g} × noise)"
    ]


def _arrival_section(group: Stragglers) -> list[str]:
    """Who arrives last at the step-closing collective: a late rank there makes every other rank
    wait."""
    if group.arrival_collective is None:
        return []
    lines = [
        "",
        f"  Arrival at {group.arrival_collective} (the step-closing collective; time from leaving "
        "the previous one, which all ranks leave together, on each rank's own clock; over "
        f"{group.arrival_steps} steps)",
    ]
    last = (
        ", ".join(f"rank {row['rank']} in {row['steps']}" for row in group.last_arrivals[:3])
        or "nobody alone (ties)"
    )
    lines.append(f"    last to arrive most often: {last} of {group.arrival_steps} steps")
    arrivals = [f for f in group.findings if f.kind == "arrival"]
    for item in arrivals:
        lines.append(
            f"    rank {item.rank} arrives {item.excess_ms:+.2f} ms ({item.excess_pct:+.1f}%) "
            "after the others' median, "
            f"z {'∞' if item.robust_z is None else format(item.robust_z, '.1f')} {_verdict(item)}"
        )
        lines.append(f"      {_cost_line(item)}")
    if not arrivals:
        lines.append(
            f"    no rank arrives late on evidence (≥ {MIN_STEPS} steps, ≥ "
            f"{effect_bar(1.0, MIN_ARRIVAL_EFFECT):.1%} and ≥ {MIN_Z:g} × noise "
            f"({MIN_Z_BELOW_EFFECT:g} × under {MIN_ARRIVAL_EFFECT:.0%}) after the others' median)"
        )
    return lines


def _largest_steps_table(group: Stragglers) -> list[str]:
    """The `STEPS_SHOWN` steps with the largest excess: a column per rank when they fit, else the
    slowest rank's time only."""
    largest = sorted(group.steps, key=lambda s: (-s.excess_ms, s.step))[:STEPS_SHOWN]
    lines = [
        "",
        f"  Steps with the largest excess, largest first ({len(largest)} of {len(group.steps)}; "
        "step time in ms; excess = slowest − the others' median)",
    ]
    if len(group.ranks) <= RANK_COLUMNS:
        headers = ["step"] + [f"rank {rank}" for rank in group.ranks] + ["slowest", "excess"]
        rows = [
            [str(s.step)]
            + [format_ms(s.ms.get(rank)) for rank in group.ranks]
            + [_slowest(s.slowest_rank), f"+{format_ms(s.excess_ms)}"]
            for s in largest
        ]
        return lines + _table(headers, rows, right=tuple(range(len(headers))), indent="    ")
    rows = [
        [
            str(s.step),
            _slowest(s.slowest_rank),
            format_ms(max(s.ms.values())),
            f"+{format_ms(s.excess_ms)}",
        ]
        for s in largest
    ]
    return lines + _table(
        ["step", "slowest", "its ms", "excess"], rows, right=(0, 1, 2, 3), indent="    "
    )


def _phase_section(group: Stragglers) -> list[str]:
    """Phase stragglers in the order the phases start in a step: the first one listed is the likely
    cause."""
    phase_findings = [f for f in group.findings if f.kind == "phase"]
    if not phase_findings:
        return [
            "",
            "  no phase straggler (no phase's time per step is slower on one rank on evidence)",
        ]
    offsets = {row["phase"]: row["median_start_in_step_ms"] for row in group.phase_stragglers}
    phase_findings.sort(
        key=lambda f: (
            offsets.get(f.what) is None,
            offsets.get(f.what) or 0.0,
            f.what,
            -f.excess_ms,
        )
    )
    lines = [
        "",
        f"  Phase stragglers (time per step in the phase; the same rule, ≥ {MIN_STEP_SHARE:.0%} "
        "of the median step, and it ends the phase late: it did not wait)",
    ]
    for item in phase_findings:
        lines += _phase_finding_lines(item)
    if any(f.verdict == "straggler" for f in phase_findings):
        lines.append(
            "    In synchronous training, ranks waiting for a straggler spend the wait in a later "
            "collective phase"
        )
        lines.append(
            "    (e.g. backward's all-reduce): the first phase listed is the likely cause."
        )
    return lines


def _phase_difference(item: StragglerFinding) -> str:
    """How much slower the rank is in the phase than the others."""
    others = item.others_median_ms
    # Twice the others' time or more reads better as a factor than as a percentage.
    if others > 0 and item.median_ms >= 2 * others:
        return f"{item.excess_ms:+.2f} ms, {item.median_ms / others:.1f}×"
    return _excess(item.excess_ms, item.excess_pct, inline=True)


def _phase_finding_lines(item: StragglerFinding) -> list[str]:
    """One phase finding: the rank's median against the others', its evidence and verdict, then its
    cost."""
    z = "∞" if item.robust_z is None else f"{item.robust_z:.1f}"
    return [
        f"    {item.what}: rank {item.rank} median {format_ms(item.median_ms)} ms vs "
        f"{format_ms(item.others_median_ms)} ms on the others "
        f"({_phase_difference(item)}; z {z}; alone slowest in "
        f"{item.slowest_steps}/{item.compared_steps} steps) {_verdict(item)}",
        f"      {_cost_line(item)}",
    ]


def _step_costs(group: Stragglers) -> list[str]:
    """What each rank's slower step time costs the run, and whether it made "Look first at"."""
    return [
        f"  rank {item.rank}'s step time {_verdict(item)}: {_cost_line(item)}"
        for item in group.findings
        if item.kind == "step"
    ]


def _withheld(group: Stragglers) -> list[str]:
    """What was not judged, and why: silence must not read as "no straggler"."""
    if not group.withheld:
        return []
    return ["", "  Withheld (not judged, and why):"] + [f"    {line}" for line in group.withheld]


def _verdict(item: StragglerFinding) -> str:
    if item.verdict == "straggler":
        return "← straggler"
    if item.verdict == "difference":
        return f"(a difference: {len(item.peers)} ranks, no majority to call one abnormal; nobody blamed)"
    return "(cannot tell whether it waited or worked: not judged)"


def _cost_line(item: StragglerFinding) -> str:
    """Its cost, and why it is or is not in "Look first at"."""
    if item.verdict == "cannot tell":
        return "no cost stated: it may be time spent waiting for another rank"
    text = describe_cost(item)
    if item.window_from_step is not None and item.since_step is None:
        text += f"; in steps {item.window_from_step}–{item.window_to_step} only (judged on those steps: it came and went)"
    elif item.persistent:
        text += f"; in both halves of the run (steps {item.large_from_step}–{item.large_to_step})"
    elif item.since_step is not None:
        text += f"; since step {item.since_step}, to the end of the run (steps {item.since_step}–{item.large_to_step})"
    if item.headline:
        return text + "; in Look first at"
    return (
        text
        + f"; not in Look first at: {item.why_not_headline} (needs ≥ {HEADLINE_MIN_SHARE:.0%} of the step in both halves of the run, or from its start to the end)"
    )


def _slowest(rank: int | None) -> str:
    return "tie" if rank is None else str(rank)
