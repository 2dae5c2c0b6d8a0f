"""A query's result as a terminal table (DuckDB's own renderer), CSV or JSON, streamed in batches.

Why: a table is for a person (DuckDB shows the first and last rows and the
count, and escapes control characters in the data, so a record's text cannot
drive the terminal); CSV and JSON are for scripts and hold every row,
fetched in batches so that a million-row result never sits in memory as
Python objects all at once.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import shutil
from typing import Any, TextIO

import orjson

from otel_titan.analysis.read.safe_text import json_safe

__all__ = ["write_result"]

_BATCH = 10_000


def write_result(con: Any, query: str, fmt: str, stream: TextIO, *, max_rows: int = 40) -> int:
    """Run `query` on `con` and write its result to `stream` as `fmt` (table, csv, json); returns
    the rows written (table: shown).

    Statements without a result (CREATE, INSERT) write nothing for csv/json and ``ok`` for a table.
    """
    if fmt == "table":
        relation = con.sql(query)
        if relation is None:
            stream.write("ok\n")
            return 0
        width = shutil.get_terminal_size((200, 24)).columns if stream.isatty() else 10_000
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            relation.show(max_rows=max_rows, max_width=width)
        stream.write(buffer.getvalue())
        return max_rows
    result = con.execute(query)  # a cursor: fetched in batches
    if result.description is None:
        return 0
    names = [d[0] for d in result.description]
    rows = 0
    if fmt == "csv":
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(names)
        while batch := result.fetchmany(_BATCH):
            writer.writerows([[_csv_cell(v) for v in row] for row in batch])
            rows += len(batch)
        return rows
    stream.write("[")
    while batch := result.fetchmany(_BATCH):
        for row in batch:
            stream.write(
                ("\n" if rows == 0 else ",\n")
                + orjson.dumps({n: _json_cell(v) for n, v in zip(names, row)}, default=str).decode()
            )
            rows += 1
    stream.write("\n]\n" if rows else "]\n")
    return rows


def _csv_cell(value: Any) -> Any:
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _json_cell(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        # As the JSONL files write them (protobuf's JSON mapping): valid JSON.
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return json_safe(value) if isinstance(value, (str, list, dict)) else value
