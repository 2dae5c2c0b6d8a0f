"""summarize's findings as the report shows them: how processes crashed, the straggler tables, slow
steps, configuration drift, and the clock offsets.

Only a ``straggler`` verdict names (marks) its rank: a ``difference`` (fewer
than three peers) or a ``cannot tell`` is shown as summarize shows it,
blaming no one, and what summarize withheld is said with its reason.
"""

from __future__ import annotations

import html
from typing import Any

from otel_titan.analysis.model.ending import describe_crash, is_interrupt
from otel_titan.analysis.model.wording import plural
from otel_titan.analysis.report.axes import NEUTRAL, plot_text
from otel_titan.analysis.report.markup import ms, named_rank, table

__all__ = ["findings_html", "crashes_html", "clock_sections"]


def crashes_html(summary: Any) -> str:
    """The processes that crashed (an uncaught exception, or killed), each with its error, where,
    and whether it failed first; "" when none did."""
    crashed = [
        p
        for p in summary.processes
        if getattr(p, "crash", None) is not None and not is_interrupt(p.crash)
    ]
    if not crashed:
        return ""
    first = {
        s.label
        for s in (summary.hang.suspects if summary.hang is not None else [])
        if s.rule == "crashed"
    }
    crashed.sort(key=lambda p: (p.attempt or 0, p.label not in first, p.crash.get("time_us") or 0))
    rows = [
        [
            p.label,
            "-" if p.attempt is None else str(p.attempt),
            describe_crash(p.crash),
            "failed first" if p.label in first else "after it",
        ]
        for p in crashed[:40]
    ]
    return "<h2 id=crashes>Crashes (summarize)</h2>" + table(
        ["process", "attempt", "how it ended", "order"], rows
    )


def findings_html(summary: Any) -> str:
    """summarize's straggler findings (`StragglerFinding`: step time, phases, arrival), each with
    its verdict and cost, as HTML (its crashes first)."""
    parts = [crashes_html(summary), "<h2 id=findings>Stragglers and clocks (summarize)</h2>"]
    kinds = {"step": "step time", "phase": "phase", "arrival": "arrival at"}
    for group in summary.stragglers:
        label = f"{group.source}" + (f", attempt {group.attempt}" if group.attempt else "")
        parts.append(f"<h3>{html.escape(label)}</h3>")
        step = (
            f"median step time {group.median_step_ms:,.1f} ms over "
            f"{plural(len(group.ranks), 'rank')}. "
            if group.median_step_ms is not None
            else ""
        )
        findings = list(group.findings)
        named = [f for f in findings if f.verdict == "straggler"]
        parts.append(
            f"<p>{html.escape(step)}"
            + (
                f"summarize names {plural(len(named), 'straggler finding')}."
                if named
                else "summarize names no straggler in this group."
            )
            + "</p>"
        )
        if findings:
            rows = []
            for f in findings[:40]:
                who: Any = (
                    named_rank(group.source, f.rank)
                    if f.verdict == "straggler"
                    else f"rank {int(f.rank)}"
                )
                pct = f" ({f.excess_pct:+.0f}%)" if f.excess_pct is not None else ""
                share = (
                    f"{100 * f.share_of_step:.1f}% of the step"
                    if f.share_of_step is not None
                    else ""
                )
                look = "yes" if f.headline else (f.why_not_headline or "no")
                rows.append(
                    [
                        f.verdict,
                        f"{kinds.get(f.kind, f.kind)} {f.what}".strip(),
                        who,
                        ms(f.median_ms),
                        ms(f.others_median_ms),
                        f"{f.excess_ms:+,.2f} ms{pct}",
                        f"{f.cost_per_step_ms:,.2f} ms",
                        f"{f.cost_run_ms / 1000:,.2f} s",
                        share,
                        look,
                    ]
                )
            parts.append(
                table(
                    [
                        "verdict",
                        "what",
                        "rank",
                        "its median (ms)",
                        "peers' median (ms)",
                        "difference",
                        "cost per step",
                        "cost over the run",
                        "share",
                        "in Look first at",
                    ],
                    rows,
                )
            )
        for reason in group.withheld:
            parts.append(f"<p>Withheld: {html.escape(str(reason))}</p>")
    # slow steps next to a memory peak or a busy host (model/step_figures.py)
    if getattr(summary, "slow_steps", None):
        parts.append(
            "<h3>Slow steps and the machine</h3><ul>"
            + "".join(f"<li>{html.escape(note)}</li>" for note in summary.slow_steps)
            + "</ul>"
        )
    # ranks whose logged configuration differs (model/config_drift.py)
    if getattr(summary, "config_drift", None):
        parts.append(
            "<h3>Configuration drift</h3><ul>"
            + "".join(f"<li>{html.escape(note)}</li>" for note in summary.config_drift)
            + "</ul>"
        )
    if summary.clock is not None:
        parts.append(f"<p>Clocks: {html.escape(summary.clock.describe())}</p>")
    return "\n".join(parts)


def clock_sections(summary: Any) -> list[tuple[str, str, str, dict[str, Any]]]:
    """The clock offset per host that summarize's alignment subtracted (a bar each), when it applied
    any."""
    clock = summary.clock
    if clock is None or not clock.applied or not clock.offsets_us:
        return []
    hosts = sorted(clock.offsets_us)
    bar = {
        "data": [
            {
                "type": "bar",
                "x": [plot_text(h) for h in hosts],
                "y": [round(clock.offsets_us[h] / 1000, 3) for h in hosts],
                "marker": {"color": NEUTRAL},
                "hovertemplate": "%{x}: %{y:.3f} ms<extra></extra>",
            }
        ],
        "layout": {
            "title": {"text": "Clock offset per host (subtracted from its times to align them)"},
            "yaxis": {"title": {"text": "ms"}},
            "height": 360,
        },
    }
    return [("clocks", "Clock offsets", clock.describe(), bar)]
