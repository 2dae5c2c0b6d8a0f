"""Answers that fit a model's context: a budget in tokens, lists cut to fit, and what was cut said
in the answer.

Why: at 1,024 ranks ``summarize --json`` is megabytes; a model given it
whole loses the verdict in the rows. Every answer of the MCP tools is a JSON
document of at most `Budget.tokens` (counted as 4 characters a token, the
usual rough rate for JSON), made to fit by shortening its longest lists
first (each keeps its first items, in the order the model wrote them: most
telling first) and, last, its longest strings; each cut is listed under
``budget.omitted`` with the path, how many items were kept of how many, so
that the model knows to ask a narrower question (the tool's cursor, or
another tool) rather than believe it saw everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from otel_titan.analysis.read.safe_text import json_safe

__all__ = ["Budget", "CHARS_PER_TOKEN", "DEFAULT_TOKENS", "MAX_TOKENS", "fit", "size_of"]

#: The rough rate of characters per token for JSON text (the budget is an estimate, said as one).
CHARS_PER_TOKEN = 4
#: The default budget of one answer, in tokens: a few thousand, so that several answers fit one
#: context.
DEFAULT_TOKENS = 4000
#: The most a caller may ask for in one answer.
MAX_TOKENS = 32000
#: A string longer than this is cut last, after every list (an error message, a stack line).
_MIN_STRING = 200


@dataclass(frozen=True)
class Budget:
    """The size one answer may take, in tokens (`CHARS_PER_TOKEN` characters each)."""

    tokens: int = DEFAULT_TOKENS

    @classmethod
    def of(cls, tokens: int | None) -> Budget:
        """The budget a caller asked for (None: the default), kept within 500 and `MAX_TOKENS`."""
        return cls(DEFAULT_TOKENS if tokens is None else max(500, min(int(tokens), MAX_TOKENS)))

    @property
    def chars(self) -> int:
        return self.tokens * CHARS_PER_TOKEN


def size_of(value: Any) -> int:
    """The characters of `value` as compact JSON."""
    return len(orjson.dumps(json_safe(value), option=orjson.OPT_NON_STR_KEYS, default=str))


def fit(answer: dict[str, Any], budget: Budget) -> dict[str, Any]:
    """`answer` (a JSON-ready dict) with a ``budget`` entry, cut to `budget` if needed: longest
    lists first, then longest strings.

    Cuts only what is under ``answer["data"]``; every cut is listed in
    ``budget.omitted`` as ``{"path", "kept", "of"}`` (strings: characters).

    Example:
        >>> out = fit({"data": {"rows": list(range(5000))}}, Budget(500))
        >>> out["budget"]["omitted"][0]["path"], out["budget"]["omitted"][0]["of"], out["budget"]["used_tokens"] <= 500
        ('data.rows', 5000, True)
    """
    data = json_safe(answer.get("data"))
    omitted: dict[str, dict[str, Any]] = {}
    # the budget entry itself
    room = budget.chars - size_of({k: v for k, v in answer.items() if k != "data"}) - 400
    for _ in range(200):
        size = size_of(data)
        if size <= room:
            break
        target = _largest(data, "data")
        if target is None:
            break
        path, container, key, value = target
        excess = size - room
        if isinstance(value, list):
            kept = _keep_items(value, excess)
            container[key] = value[:kept]
            entry = omitted.setdefault(path, {"path": path, "kept": kept, "of": len(value)})
            entry["kept"] = kept
        else:
            kept = max(_MIN_STRING // 2, len(value) - excess - 16)
            container[key] = value[:kept] + "…"
            entry = omitted.setdefault(
                path, {"path": path, "kept": kept, "of": len(value), "unit": "characters"}
            )
            entry["kept"] = kept
    out = {**answer, "data": data}
    out["budget"] = {
        "tokens": budget.tokens,
        "used_tokens": 0,
        "complete": not omitted,
        "omitted": list(omitted.values()),
    }
    out["budget"]["used_tokens"] = -(-size_of(out) // CHARS_PER_TOKEN)
    return out


def _keep_items(items: list[Any], excess: int) -> int:
    """How many of `items` to keep (a prefix) so that about `excess` characters go: at least 1,
    fewer than all."""
    if len(items) <= 1:
        return 0
    sizes = [size_of(item) + 1 for item in items]
    dropped, kept = 0, len(items)
    while kept > 1 and dropped < excess:
        kept -= 1
        dropped += sizes[kept]
    return kept if dropped >= excess or kept > 1 else (1 if len(items) > 1 else 0)


def _largest(value: Any, path: str) -> tuple[str, Any, Any, Any] | None:
    """The longest list of two or more items (by characters), else the longest string over
    `_MIN_STRING`, under `value`: (path, parent, key, it)."""
    lists: list[tuple[int, str, Any, Any, Any]] = []
    strings: list[tuple[int, str, Any, Any, Any]] = []

    def walk(node: Any, where: str) -> None:
        children = (
            node.items()
            if isinstance(node, dict)
            else enumerate(node)
            if isinstance(node, list)
            else ()
        )
        for key, child in children:
            at = f"{where}.{key}" if isinstance(node, dict) else f"{where}[{key}]"
            if isinstance(child, list):
                if len(child) > 1:
                    lists.append((size_of(child), at, node, key, child))
                walk(child, at)
            elif isinstance(child, dict):
                walk(child, at)
            elif isinstance(child, str) and len(child) > _MIN_STRING:
                strings.append((len(child), at, node, key, child))

    walk(value, path)
    for found in (lists, strings):
        if found:
            _, at, parent, key, child = max(found, key=lambda item: item[0])
            return at, parent, key, child
    return None
