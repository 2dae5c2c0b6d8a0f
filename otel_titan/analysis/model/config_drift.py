"""Configuration drift: the ranks whose ``run_config`` hash differs from the others'.

Every rank writes a ``run_config`` record per configuration it logged
(``sl.log_run_config``: name, hash, size; the content itself only in the file
of the first rank with that content). Grouping the ranks by hash, per name,
shows drift: when one hash is held by a strict majority of the ranks, the
others are named, with the top-level keys whose values differ when both
contents were written; with no strict majority the odd ones cannot be told
apart from the rest, and the finding says so instead of guessing.

Example:
    >>> drift = ConfigDrift()
    >>> for rank in range(4):
    ...     drift.observe({"log_type_name": "run_config", "config_name": "job", "config_hash": "a" if rank != 2 else "b", "config_per": "job"}, rank)
    >>> [f.message for f in drift.findings()]
    ["configuration 'job': rank 2 differs from the other 3 ranks"]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_titan.analysis.model.headline import compress
from otel_titan.analysis.read.records import read_run

__all__ = ["ConfigDrift", "DriftFinding", "find_config_drift"]

RUN_CONFIG = "run_config"


@dataclass
class DriftFinding:
    """One configuration name whose ranks disagree."""

    name: str
    #: hash → ranks holding it, largest group first.
    groups: list[tuple[str, list[int]]]
    #: The ranks named as different (empty when no hash has a strict majority).
    odd_ranks: list[int]
    #: Top-level keys whose values differ between the majority's content and the others' (when both
    #: were written).
    differing_keys: list[str] = field(default_factory=list)
    message: str = ""


class ConfigDrift:
    """Accumulate ``run_config`` records (one streaming pass, per record) and report the names that
    drift."""

    def __init__(self) -> None:
        self._ranks: dict[str, dict[str, set[int]]] = {}
        self._contents: dict[tuple[str, str], Any] = {}

    def observe(self, record: dict[str, Any], rank: int | None) -> None:
        """Take one record (others are ignored cheaply); `rank` is its process's rank."""
        if (
            record.get("log_type_name") != RUN_CONFIG
            or rank is None
            or record.get("config_per", "job") != "job"
        ):
            return
        name, digest = record.get("config_name"), record.get("config_hash")
        if not isinstance(name, str) or not isinstance(digest, str):
            return
        self._ranks.setdefault(name, {}).setdefault(digest, set()).add(rank)
        if "config" in record:
            self._contents.setdefault((name, digest), record["config"])

    def merge(self, other: ConfigDrift) -> None:
        """Add another pass's records (a worker's disjoint processes, `model.parallel`) to these."""
        for name, by_hash in other._ranks.items():
            mine = self._ranks.setdefault(name, {})
            for digest, ranks in by_hash.items():
                mine.setdefault(digest, set()).update(ranks)
        for key, content in other._contents.items():
            self._contents.setdefault(key, content)

    def findings(self) -> list[DriftFinding]:
        """Every name with more than one hash, with the odd ranks named when a strict majority says
        which they are."""
        out = []
        for name, by_hash in sorted(self._ranks.items()):
            if len(by_hash) < 2:
                continue
            groups = sorted(
                ((digest, sorted(ranks)) for digest, ranks in by_hash.items()),
                key=lambda item: (-len(item[1]), item[0]),
            )
            total = len({rank for _, ranks in groups for rank in ranks})
            majority_hash, majority = groups[0]
            if 2 * len(majority) > total:
                odd = sorted(rank for _, ranks in groups[1:] for rank in ranks)
                keys = self._differing_keys(
                    name, majority_hash, [digest for digest, _ in groups[1:]]
                )
                noun = "rank" if len(odd) == 1 else "ranks"
                message = f"configuration {name!r}: {noun} {compress(odd)} {'differs' if len(odd) == 1 else 'differ'} from the other {len(majority)} ranks"
                if keys:
                    message += f" (in {', '.join(keys[:8])}{', …' if len(keys) > 8 else ''})"
            else:
                odd, keys = [], []
                sizes = ", ".join(f"{len(ranks)} with {digest}" for digest, ranks in groups)
                message = f"configuration {name!r}: the ranks disagree with no majority ({sizes}); cannot tell which ranks are the odd ones"
            out.append(
                DriftFinding(
                    name=name, groups=groups, odd_ranks=odd, differing_keys=keys, message=message
                )
            )
        return out

    def _differing_keys(self, name: str, majority: str, others: list[str]) -> list[str]:
        base = self._contents.get((name, majority))
        if not isinstance(base, dict):
            return []
        keys: set[str] = set()
        for digest in others:
            other = self._contents.get((name, digest))
            if not isinstance(other, dict):
                continue
            keys.update(
                k
                for k in base.keys() | other.keys()
                if base.get(k, _MISSING) != other.get(k, _MISSING)
            )
        return sorted(keys)


_MISSING = object()


def find_config_drift(path: str, ranks: Iterable[int] | None = None) -> list[DriftFinding]:
    """Read a run's files (every record: a full pass) and return its configuration drift findings.

    Example (a run whose ranks all logged the same configuration, or none: nothing to say):
        >>> [finding.message for finding in find_config_drift("outputs")]
        []
    """
    run = read_run(path, ranks=ranks)
    drift = ConfigDrift()
    for process in run.processes:
        for record in process.records(run.skipped):
            drift.observe(record, process.rank)
    return drift.findings()
