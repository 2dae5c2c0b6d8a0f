"""Alerts: raised once, kept while their condition holds, resolved (with how long they lasted) when
it ends.

An `Alert` is what `watch` tells a person or a script: the kind (``hang``,
``slow``, ``job_slow``, ``crashed``, ``terminated``, ``missing``), the ranks it
names (the culprits: never the victims of a hang), where (step, phase, line
of code), since when, and what it costs. `AlertBook` keeps them by key so a
condition seen on every refresh is one alert, not one per refresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Alert", "AlertBook", "KINDS"]

#: Every kind of alert, in the order the screen groups them.
KINDS = ("hang", "missing", "crashed", "terminated", "slow", "job_slow")


@dataclass
class Alert:
    """One alert (see the module docstring); times are seconds on the watcher's clock (epoch seconds
    live)."""

    kind: str
    key: tuple
    message: str
    ranks: list[int] = field(default_factory=list)
    source: str | None = None
    attempt: int | None = None
    host: str | None = None
    step: int | None = None
    phase: str | None = None
    where: str | None = None
    line: str | None = None
    since: float | None = None
    detected: float | None = None
    resolved: float | None = None
    cost: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    victims: list[int] = field(default_factory=list)
    confirmed: bool = True
    #: For a hang: the model's rule that named the culprits (`model.hang`: ``behind in step``,
    #: ``behind``, ``desync``, ``p2p``, ``missing``, ``nothing logged``, ``odd one out``, …, or
    #: ``cannot tell``) and its reasoning, as `summarize` words it.
    rule: str | None = None
    why: str | None = None

    def to_json(self, kind: str = "alert") -> dict[str, Any]:
        """The ``{"type": "alert", …}`` (or ``"resolved"``) line of ``watch --json`` (docs/watch.md
        lists the fields)."""
        out: dict[str, Any] = {
            "type": kind,
            "kind": self.kind,
            "id": _alert_id(self.key),
            "message": self.message,
            "ranks": self.ranks,
            "source": self.source,
            "attempt": self.attempt,
            "host": self.host,
            "step": self.step,
            "phase": self.phase,
            "where": self.where,
            "line": self.line,
            "since_utc": _utc(self.since),
            "detected_utc": _utc(self.detected),
            "cost": self.cost,
            "evidence": self.evidence,
            "victims": len(self.victims),
            "confirmed": self.confirmed,
        }
        if self.rule is not None:
            out["rule"], out["why"] = self.rule, self.why
        if self.resolved is not None:
            out["resolved_utc"] = _utc(self.resolved)
            out["lasted_s"] = round(
                self.resolved
                - (self.since if self.since is not None else self.detected or self.resolved),
                3,
            )
        return out


def _alert_id(key: tuple) -> str:
    """``slow/training/0/pp=1/11/bwd``: the key's parts, a peer group's mesh coordinates spelled
    out.

    Example:
        >>> _alert_id(("slow", ("training", 0, (("pp", 1),)), 11, "bwd")), _alert_id(("hang", "training", 0))
        ('slow/training/0/pp=1/11/bwd', 'hang/training/0')
    """
    parts: list[str] = []
    for part in key:
        if isinstance(part, tuple):
            for item in part:
                if isinstance(item, tuple):
                    parts.extend(f"{k}={v}" for k, v in item) if item and isinstance(
                        item[0], tuple
                    ) else parts.append("=".join(map(str, item)) if item else "")
                else:
                    parts.append(str(item))
        else:
            parts.append(str(part))
    return "/".join(p for p in parts if p)


def _utc(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    import datetime

    return (
        datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


class AlertBook:
    """Active alerts by key, and the ones resolved (newest last, the last `keep` only).

    Example:
        >>> book = AlertBook()
        >>> a = Alert("slow", ("slow", 3, "fwd"), "rank 3 slow in fwd", ranks=[3], detected=10.0, since=5.0)
        >>> [e.kind for e in book.update([a], now=10.0)[0]], book.update([a], now=11.0)
        (['slow'], ([], []))
        >>> raised, resolved = book.update([], now=20.0)
        >>> resolved[0].resolved, resolved[0].to_json("resolved")["lasted_s"]
        (20.0, 15.0)
    """

    def __init__(self, keep: int = 50) -> None:
        self.active: dict[tuple, Alert] = {}
        self.history: list[Alert] = []
        self.keep = keep
        #: Active alerts whose culprits or line of code changed at the last `update` (a black box
        #: arrived): shown again.
        self.updated: list[Alert] = []

    def update(
        self, current: list[Alert], now: float, *, keep_keys: set | None = None
    ) -> tuple[list[Alert], list[Alert]]:
        """Alerts now true → (newly raised, newly resolved). An active one seen again is refreshed
        in place.

        `keep_keys`: keys that stay active even when absent from `current` (their detector did not
        run this refresh).
        """
        raised, resolved = [], []
        self.updated = []
        seen = set()
        for alert in current:
            seen.add(alert.key)
            old = self.active.get(alert.key)
            if old is None:
                self.active[alert.key] = alert
                raised.append(alert)
            else:
                # Same condition: its facts may sharpen (a black box arrived, the cost grew, a crash
                # first seen as a state is now the first failure its peers' evidence names); it is
                # not raised again, but its new facts are written as an update.
                alert.detected, alert.since = (
                    old.detected,
                    old.since if old.since is not None else alert.since,
                )
                if (alert.ranks, alert.line, alert.where, alert.rule, alert.victims) != (
                    old.ranks,
                    old.line,
                    old.where,
                    old.rule,
                    old.victims,
                ):
                    self.updated.append(alert)
                self.active[alert.key] = alert
        for key in list(self.active):
            if key in seen or (keep_keys is not None and key in keep_keys):
                continue
            alert = self.active.pop(key)
            alert.resolved = now
            resolved.append(alert)
            self.history.append(alert)
        del self.history[: max(0, len(self.history) - self.keep)]
        return raised, resolved

    def newest_first(self) -> list[Alert]:
        """Active alerts, newest first."""
        return sorted(self.active.values(), key=lambda a: -(a.detected or 0.0))
