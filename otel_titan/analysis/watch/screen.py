"""The watch screen: the frame drawn in place with `rich` on a terminal, plain lines everywhere
else.

`frame_lines` is the one description of what is shown (the run, its age, the
processes by state, the steps, step time and rate, where the time of the
last steps goes, who arrives last at the step-closing collective, and the
alerts newest first with what they cost); `Screen` draws those lines with
rich (imported only when drawn on a terminal: the analysis extra), falling
back to clearing the terminal and printing them when rich is missing, and to
one block of plain lines per refresh when the output is not a terminal.
Every string that comes from the records goes through `read.safe_text.printable`.
"""

from __future__ import annotations

import os
from typing import Any, TextIO

from otel_titan.analysis.read.safe_text import printable

__all__ = ["Screen", "frame_lines"]

_STATE_STYLE = {
    "running": "green",
    "stalled": "yellow",
    "hung": "bold red",
    "crashed": "bold red",
    "terminated": "magenta",
    "closed": "dim",
    "missing": "bold red",
}
_KIND_STYLE = {
    "hang": "bold red",
    "crashed": "bold red",
    "missing": "bold red",
    "terminated": "magenta",
    "slow": "yellow",
    "job_slow": "yellow",
}


def _age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _cost(alert: dict[str, Any]) -> str:
    cost = alert.get("cost") or {}
    if alert["kind"] in ("slow", "job_slow"):
        return f"costs {cost.get('pct_of_step', 0):.1f}% of every step, {cost.get('seconds_so_far', 0):,.1f} s so far"
    if alert["kind"] == "hang":
        return f"stopped {cost.get('stopped_s', 0):,.0f} s; {cost.get('ranks_waiting', 0)} ranks waiting ({cost.get('rank_seconds_lost', 0):,.0f} rank-seconds)"
    return f"{cost.get('ranks', len(alert.get('ranks') or []))} ranks"


#: One line of the screen: its text, and a rich style name or None.
_Line = tuple[str, str | None]


def frame_lines(frame: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(text, style) per line of the screen; style is a rich style name or None.

    Example:
        >>> lines = frame_lines({"run_id": "r", "attempt": 0, "age_s": 5, "processes": 2, "world_size": 2, "states": {"running": 2}, "steps": None, "alerts": []})
        >>> lines[0][0].startswith("otel-titan watch · run r")
        True
    """
    lines: list[_Line] = [(_head(frame), "bold")]
    lines += _receive_lines(frame)
    lines.append((_processes(frame), None))
    lines += _progress_lines(frame)
    lines += _alert_lines(frame)
    lines += _resolved_lines(frame)
    lines += _trigger_lines(frame)
    return lines


def _head(frame: dict[str, Any]) -> str:
    """The title: which run, how old, how many of its processes are seen, and what a refresh
    costs."""
    world = frame.get("world_size")
    head = f"otel-titan watch · run {printable(str(frame.get('run_id')))}"
    if frame.get("attempt"):
        head += f" (attempt {frame['attempt']})"
    head += (
        f" · age {_age(frame.get('age_s') or 0)} · {frame.get('processes', 0)}"
        + (f"/{world}" if world else "")
        + " processes"
    )
    read = frame.get("read")
    if read:
        head += f" · refresh {read.get('cpu_s', 0):.2f} s CPU, {read.get('bytes', 0) / 1e6:,.1f} MB"
    return head


#: The receiver's counts shown when not zero, in this order: what was lost or refused on the way.
_RECEIVE_COUNTS = (
    "duplicates",
    "lost",
    "malformed",
    "out_of_sequence",
    "refused",
    "unauthorized",
    "overloaded",
    "write_failed",
    "timed_out",
)


def _receive_lines(frame: dict[str, Any]) -> list[_Line]:
    """`watch --otlp` only: the endpoint, what came in, and its write error or hint in red."""
    receive = frame.get("receive")
    if not receive:
        return []
    # `watch --otlp`: where the records come from, and what was lost on the way (docs/watch.md).
    text = (
        f"receiving OTLP on {printable(str(receive.get('endpoint')))} · "
        f"{receive.get('processes', 0)} processes · {receive.get('records', 0):,} records"
        + "".join(
            f" · {receive[k]:,} {k.replace('_', ' ')}" for k in _RECEIVE_COUNTS if receive.get(k)
        )
    )
    lines: list[_Line] = [(text, None)]
    for key in ("write_error", "hint"):
        if receive.get(key):
            lines.append((printable(str(receive[key])), "bold red"))
    return lines


def _processes(frame: dict[str, Any]) -> str:
    """The processes by state, with their ranks when there are few enough to read (40 at most)."""
    states = frame.get("states") or {}
    by_state = frame.get("ranks_by_state") or {}
    parts = []
    for state, count in states.items():
        ranks = by_state.get(state)
        parts.append(
            f"{state} {count}" + (f" (ranks {ranks})" if ranks and len(ranks) <= 40 else "")
        )
    return "processes: " + " · ".join(parts) if parts else "processes: none yet"


def _progress_lines(frame: dict[str, Any]) -> list[_Line]:
    """How the training moves: steps and their time, where that time goes, who arrives last, pauses
    and suspicions."""
    lines: list[_Line] = []
    steps = frame.get("steps")
    if steps:
        lines.append((_steps(frame, steps), None))
    phases = frame.get("phases") or []
    if phases:
        lines.append(
            (
                "time of the last steps: "
                + " · ".join(
                    f"{printable(p['name'])} {p['ms']:,.1f} ms"
                    + (f" ({p['share_pct']:.0f}%)" if p.get("share_pct") is not None else "")
                    for p in phases
                ),
                None,
            )
        )
    late = frame.get("last_arrivals") or []
    if late:
        lines.append((_last_arrivals(late), None))
    if frame.get("pause"):
        lines.append((f"pause: {printable(frame['pause'])}", None))
    if frame.get("suspected_hang"):
        lines.append((f"suspected hang: {printable(frame['suspected_hang'])}", "yellow"))
    return lines


def _steps(frame: dict[str, Any], steps: dict[str, Any]) -> str:
    """The spread of the ranks' steps, and the median step time and rate once known."""
    text = f"steps: min {steps['min']} · median {steps['median']} · max {steps['max']}"
    if frame.get("step_ms"):
        text += f" · median step {frame['step_ms']:,.1f} ms · {frame.get('steps_per_min') or 0:,.1f} steps/min"
    return text


def _last_arrivals(late: list[dict[str, Any]]) -> str:
    """Who arrived last at the step-closing collective, on which host, and how late: the ranks the
    others wait for."""
    return f"last to arrive (step {late[0]['step']}): " + " · ".join(
        f"rank {a['rank']}"
        + (f" on {printable(str(a['host']))}" if a.get("host") else "")
        + f" +{a['late_ms']:,.1f} ms"
        for a in late
    )


def _alert_lines(frame: dict[str, Any]) -> list[_Line]:
    """The alerts, newest first, each with its cost and evidence on the line below."""
    alerts = frame.get("alerts") or []
    lines: list[_Line] = [
        (
            f"alerts ({len(alerts)}), newest first:" if alerts else "alerts: none",
            "bold" if alerts else None,
        )
    ]
    for alert in alerts:
        lines += _alert(alert)
    return lines


def _alert(alert: dict[str, Any]) -> list[_Line]:
    """One alert: when, what and where (the line only when the message does not already say it),
    then its cost."""
    when = (alert.get("detected_utc") or "")[11:19]
    text = f"  ▲ {when} {printable(alert['message'])}"
    if alert.get("line") and alert["line"] not in alert["message"]:
        text += f" at {printable(alert['line'])}"
    return [
        (text, _KIND_STYLE.get(alert["kind"])),
        (
            f"      {_cost(alert)}"
            + (f" · evidence: {', '.join(alert['evidence'])}" if alert.get("evidence") else ""),
            None,
        ),
    ]


def _resolved_lines(frame: dict[str, Any]) -> list[_Line]:
    """The alerts that went away, and after how long, dimmed: history, not news."""
    return [
        (
            f"  ✓ {(alert.get('resolved_utc') or '')[11:19]} resolved after "
            f"{alert.get('lasted_s', 0):,.0f} s: {printable(alert['message'])}",
            "dim",
        )
        for alert in frame.get("resolved") or []
    ]


def _trigger_lines(frame: dict[str, Any]) -> list[_Line]:
    """Black boxes asked for through the trigger file, and why writing the trigger failed, if it
    did."""
    lines: list[_Line] = []
    if frame.get("black_box_requested_utc"):
        lines.append(
            (
                "black boxes requested (trigger file) at "
                f"{', '.join(t[11:19] for t in frame['black_box_requested_utc'])}",
                "dim",
            )
        )
    if frame.get("trigger_error"):
        lines.append((printable(frame["trigger_error"]), "yellow"))
    return lines


class Screen:
    """Draws frames on `out`: in place with rich on a terminal, else one block of plain lines per
    refresh."""

    def __init__(self, out: TextIO, *, plain: bool | None = None) -> None:
        self.out = out
        tty = hasattr(out, "isatty") and out.isatty() and os.environ.get("TERM") != "dumb"
        self.live: Any = None
        self.console: Any = None
        self.clear = False
        if plain or not tty:
            return
        try:
            from rich.console import Console
            from rich.live import Live
        except ImportError:  # the analysis extra is not installed: clear and print, still in place
            self.clear = True
            return
        self.console = Console(file=out, highlight=False)
        self.live = Live(
            console=self.console,
            auto_refresh=False,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self.live.start()

    def show(self, frame: dict[str, Any], events: list[dict[str, Any]]) -> None:
        """Draw one frame (plain output also prints each raised or resolved alert as its own line
        first)."""
        lines = frame_lines(frame)
        if self.live is not None:
            from rich.console import Group
            from rich.padding import Padding
            from rich.table import Table
            from rich.text import Text

            # One renderable a line, indented ones padded: on a narrow window a line wraps under
            # itself, and an alert's message under its message, not under its "▲ time" (where it
            # would read as the next alert).
            parts: list[Any] = []
            for text, style in lines:
                indent = len(text) - len(text.lstrip(" "))
                body = text.lstrip(" ")
                line: Any = Text(body, style=style or "")
                mark, _, rest = body.partition(" ")
                when, _, message = rest.partition(" ")
                if mark in ("▲", "✓") and message:
                    line = Table.grid(padding=(0, 1, 0, 0))
                    line.add_column(no_wrap=True)
                    line.add_column()
                    line.add_row(
                        Text(f"{mark} {when}", style=style or ""), Text(message, style=style or "")
                    )
                parts.append(Padding(line, (0, 0, 0, indent)) if indent else line)
            self.live.update(Group(*parts), refresh=True)
            return
        if self.clear:
            self.out.write("\x1b[H\x1b[2J" + "\n".join(text for text, _ in lines) + "\n")
        else:
            for event in events:
                mark = {"alert": "ALERT", "update": "UPDATE"}.get(event["type"], "RESOLVED")
                self.out.write(f"{mark} {event['kind']}: {printable(event['message'])}\n")
            self.out.write("\n".join(text for text, _ in lines) + "\n\n")
        self.out.flush()

    def close(self, last: str | None) -> None:
        """Stop drawing in place; print `last` (why the command ends) below the last frame."""
        if self.live is not None:
            self.live.stop()
            self.live = None
        if last:
            self.out.write(printable(last) + "\n")
            self.out.flush()
