"""The file format is defined once (otel_titan/schema.py): writer and reader use the same names."""

from __future__ import annotations

import ast
import re

from otel_titan import schema
from otel_titan.analysis.model import collect as summary
from otel_titan.analysis.model import timeline
from otel_titan.analysis.read import records as reader
from tests.conftest import REPO, jsonl_files, read_records, run_python


def test_one_set_of_meta_records_for_both_sides():
    assert schema.META_EVENTS == {
        "structured_logger_opened",
        "records_dropped",
        "signal_received",
        "uncaught_exception",
        "heartbeat",
        "stall",
        "structured_logger_closed",
        "step_rollup",
        "mesh_found",
    }
    assert {
        value for name, value in vars(schema.MetaEvent).items() if not name.startswith("_")
    } == schema.META_EVENTS
    assert reader.META_EVENTS is timeline.META_EVENTS is summary.META_EVENTS is schema.META_EVENTS


def test_what_the_writer_writes_is_what_the_schema_says(tmp_path):
    code = """
import sys
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=1, step_rollups=True)
sl.set_step(1)
with sl.log_trace_span("fwd_bwd"):
    sl.log_trace_scalar({"loss": 1.0})
sl.shutdown_structured_logger()
"""
    assert run_python(code, str(tmp_path)).returncode == 0
    records = read_records(jsonl_files(tmp_path)[0])
    rollups = [r for r in records if r[schema.Field.LOG_TYPE_NAME] == schema.MetaEvent.STEP_ROLLUP]
    assert len(rollups) == 1 and rollups[0][schema.RollupField.VERSION] == schema.ROLLUP_VERSION
    # A rollup carries the short identity (docs/schema.md): the file names the rest.
    assert {r[schema.Field.LOGGER_NAME] for r in records if r not in rollups} == {
        schema.LOGGER_NAME
    }
    assert schema.Field.LOGGER_NAME not in rollups[0] and rollups[0]["attempt"] == 0
    assert {r[schema.Field.SCHEMA_VERSION] for r in records} == {schema.SCHEMA_VERSION}
    names = [r[schema.Field.LOG_TYPE_NAME] for r in records]
    assert (
        names[0] == schema.MetaEvent.OPENED
        and names[-1] == schema.MetaEvent.CLOSED
        and names[-2] == schema.MetaEvent.STEP_ROLLUP
    )
    closing = records[-1]
    assert closing[schema.Field.DROPPED_RECORDS] == 0 and closing[schema.Field.SKIPPED_VALUES] == 0
    for record in records:
        for field in (
            schema.Field.LOG_TYPE,
            schema.Field.SEQ_ID,
            schema.Field.TIME_MS,
            schema.Field.TIME_US,
            schema.Field.RANK,
            schema.Field.SOURCE,
        ):
            assert field in record, (field, record)


def test_int64_bounds():
    assert schema.INT64_MAX == 2**63 - 1 and schema.INT64_MIN == -(2**63)


# -- `Field`: the one spelling of every record field, used by both sides ---------------------------
_WRITER = ["otel_titan/exporters/records.py", "otel_titan/exporters/jsonl.py"]
_READER = [
    "otel_titan/analysis/read/lines.py",
    "otel_titan/analysis/read/records.py",
    "otel_titan/analysis/read/runs.py",
    "otel_titan/analysis/read/tails.py",
]


def test_every_field_a_real_run_writes_is_a_schema_field(tmp_path):
    # Every kind of record but the black box's `stall` and `run_config` (fields of their own,
    # docs/schema.md).
    code = """
import asyncio, sys
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=2, mesh={"dp": 2}, stall_after_s=0)
sl.set_step(1, relative_step=1)
sl.add_step_tag("gc")
with sl.log_trace_span("fwd_bwd", "the forward and backward pass"):
    sl.log_trace_scalar({"loss": 1.0, "bad": None})
    sl.log_trace_instant("checkpoint")
try:
    with sl.log_trace_span("optimizer"):
        raise ValueError("nan")
except ValueError:
    pass
async def task():
    with sl.log_trace_span("rollout"):
        pass
asyncio.run(task())
sl.shutdown_structured_logger()
"""
    result = run_python(code, str(tmp_path))
    assert result.returncode == 0, result.stderr
    records = read_records(jsonl_files(tmp_path)[0])
    written = {key for record in records for key in record}
    assert written - schema.FIELDS == set(), (
        "written but not in schema.Field (and so maybe not in docs/schema.md)"
    )
    # The run wrote the fields of each kind: the check above saw them (span, error, scalar, instant,
    # task, mesh, closing).
    assert {
        schema.Field.ERROR_TYPE,
        schema.Field.STEP_TAGS,
        schema.Field.TASK_NAME,
        schema.Field.DESCRIPTION,
        schema.Field.MESH,
        schema.Field.WRITTEN_RECORDS,
    } <= written


def test_docs_schema_lists_every_field():
    text = (REPO / "docs" / "schema.md").read_text(encoding="utf-8")
    table = text[text.index("## Fields") : text.index("\n## ", text.index("## Fields") + 1)]
    documented = {
        name
        for row in re.findall(r"^\| ([^|]+) \|", table, flags=re.M)
        for name in re.findall(r"`([a-z_.]+)`", row)
    }
    assert schema.FIELDS - documented == set(), (
        "in schema.Field but not in docs/schema.md's table of fields"
    )


def test_neither_writer_nor_reader_spells_a_field_out():
    """A record field used by name (a dict key, ``record[...]``, ``.get(...)``) goes through
    `schema.Field`."""
    offenders = []
    for relative in _WRITER + _READER:
        tree = ast.parse((REPO / relative).read_text(encoding="utf-8"), relative)
        for node in ast.walk(tree):
            keys: list[ast.AST] = []
            if isinstance(node, ast.Dict):
                keys = [k for k in node.keys if k is not None]
            elif isinstance(node, ast.Subscript):
                keys = [node.slice]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "pop", "setdefault")
                and node.args
            ):
                keys = [node.args[0]]
            offenders += [
                f"{relative}:{k.lineno}: {k.value!r}"
                for k in keys
                if isinstance(k, ast.Constant) and k.value in schema.FIELDS
            ]
    assert offenders == [], "spell these through schema.Field:\n" + "\n".join(offenders)
    assert all(
        "Field" in (REPO / relative).read_text(encoding="utf-8") for relative in _WRITER + _READER
    )
