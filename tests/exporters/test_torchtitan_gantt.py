"""torchtitan's own Gantt generator reads our JSONL files, with the one exception docs/schema.md
states.

torchtitan 0.3.0 is installed without its dependencies (requirements-nodeps.txt,
scripts/setup.sh): its generator needs only torch. These tests run its code,
unchanged, on files our writer produced, so the compatibility claim in
docs/schema.md is checked, not assumed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import pytest

from otel_titan import structured_logger as sl
from otel_titan.analysis import generate_gantt_trace
from tests.conftest import REPO, jsonl_files, read_records
from tests.helpers.analysis import load_trace

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="torchtitan 0.3.0 needs Python >= 3.11 (enum.StrEnum)"
)


def torchtitan_gantt():
    """torchtitan's `generate_gantt_trace`; fails (not skips) when set-up did not install it."""
    from torchtitan.observability.structured_logger.gantt_generator import (
        generate_gantt_trace as titan_generate,
    )

    return titan_generate


def _every_record_kind(run_dir, *scalars: dict, step_rollups: bool = False) -> None:
    """A run with every kind of record: nested spans, a failed span, asyncio tasks, instants,
    scalars, a heartbeat (and, asked, step rollups)."""
    sl.init_structured_logger(
        "training",
        run_dir,
        rank=0,
        world_size=1,
        run_id="titan",
        heartbeat_interval_s=0.1,
        step_rollups=step_rollups,
    )
    sl.log_trace_instant("training_start")
    for step in (1, 2):
        sl.set_step(step)
        sl.add_step_tag("gc")
        with sl.log_trace_span("fwd_bwd"):
            with sl.log_trace_span("forward"):
                pass
            sl.log_trace_scalar({"loss": 2.5, "tokens": 7})
        try:
            with sl.log_trace_span("optim"):
                raise ValueError("boom")
        except ValueError:
            pass

    async def rollout() -> None:
        with sl.log_trace_span("rollout"):
            await asyncio.sleep(0.01)

    async def both() -> None:
        await asyncio.gather(rollout(), rollout())

    asyncio.run(both())
    with sl.log_trace_span("quiet"):
        time.sleep(0.5)  # long enough for heartbeat records
    for values in scalars:
        sl.log_trace_scalar(values)
    sl.shutdown_structured_logger()


def test_torchtitans_gantt_generator_reads_every_kind_of_record_we_write(run_dir):
    _every_record_kind(run_dir)
    records = read_records(jsonl_files(run_dir)[0])
    assert {"heartbeat", "structured_logger_opened", "structured_logger_closed", "optim_error"} <= {
        r["log_type_name"] for r in records
    }

    trace = torchtitan_gantt()(str(run_dir / "structured_logs"), str(run_dir / "titan.json"))

    bars = sorted(
        (e["name"], e["args"].get("step")) for e in trace["traceEvents"] if e["ph"] == "X"
    )
    ends = sorted(
        (r["log_type_name"][: -len("_end")], r.get("step"))
        for r in records
        if r["log_type_name"].endswith("_end")
    )
    assert bars == ends and len(bars) == 9  # every span, in its step
    instants = {e["name"] for e in trace["traceEvents"] if e["ph"] == "i"}
    assert {"training_start", "loss=2.5000", "tokens=7.0000", "ERROR: optim"} <= instants
    # Its bars agree with ours: same spans, same start times.
    ours = load_trace(
        generate_gantt_trace(run_dir, run_dir / "ours.json", log_skipped=False).output_path
    )
    assert sorted(
        (e["name"], e["ts"]) for e in ours["traceEvents"] if e.get("cat") == "span"
    ) == sorted((e["name"], e["ts"]) for e in trace["traceEvents"] if e["ph"] == "X")


def test_torchtitans_gantt_generator_still_reads_files_with_step_rollups(run_dir):
    """A rollup line is one more instant to it; its bars, the spans, are the same as without
    rollups."""
    _every_record_kind(run_dir, step_rollups=True)
    records = read_records(jsonl_files(run_dir)[0])
    rollups = [r for r in records if r["log_type_name"] == "step_rollup"]
    assert [r["step"] for r in rollups] == [1, 2]

    trace = torchtitan_gantt()(str(run_dir / "structured_logs"), str(run_dir / "titan.json"))

    bars = sorted(
        (e["name"], e["args"].get("step"), e["ts"]) for e in trace["traceEvents"] if e["ph"] == "X"
    )
    starts = {r["span_id"]: r["time_us"] for r in records if r["log_type_name"].endswith("_start")}
    ends = sorted(
        (r["log_type_name"][: -len("_end")], r.get("step"), starts[r["span_id"]])
        for r in records
        if r["log_type_name"].endswith("_end")
    )
    assert bars == ends and len(bars) == 9
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert sorted(e["args"].get("step") for e in instants if e["name"] == "step_rollup") == [1, 2]
    assert {"training_start", "loss=2.5000", "ERROR: optim"} <= {e["name"] for e in instants}
    # And the same file, with its rollup lines taken out, gives torchtitan the same bars and other
    # instants.
    stripped = run_dir / "stripped" / "structured_logs"
    stripped.mkdir(parents=True)
    (stripped / os.path.basename(jsonl_files(run_dir)[0])).write_text(
        "".join(json.dumps(r) + "\n" for r in records if r not in rollups)
    )
    without = torchtitan_gantt()(str(stripped), str(run_dir / "titan-without.json"))
    assert sorted((e["name"], e["ts"]) for e in without["traceEvents"] if e["ph"] == "X") == sorted(
        (e["name"], e["ts"]) for e in trace["traceEvents"] if e["ph"] == "X"
    )
    assert sorted(e["name"] for e in without["traceEvents"] if e["ph"] == "i") == sorted(
        e["name"] for e in instants if e["name"] != "step_rollup"
    )


@pytest.mark.parametrize(
    "value, written",
    [(float("nan"), "NaN"), (float("inf"), "Infinity"), (float("-inf"), "-Infinity")],
)
def test_the_one_exception_a_non_finite_scalar_stops_torchtitans_generator_but_not_ours(
    run_dir, value, written
):
    """docs/schema.md: our files stay strict JSON, so ±∞/NaN are strings, which torchtitan formats
    with ``:.4f``."""
    _every_record_kind(run_dir, {"loss": value})
    records = read_records(jsonl_files(run_dir)[0])
    assert [r["value"] for r in records if r.get("event_name") == "loss"][-1] == written
    with open(jsonl_files(run_dir)[0], "rb") as handle:
        for line in handle:
            json.loads(
                line, parse_constant=lambda token: pytest.fail(f"non-standard JSON token {token}")
            )

    with pytest.raises(ValueError, match="Unknown format code 'f' for object of type 'str'"):
        torchtitan_gantt()(str(run_dir / "structured_logs"), str(run_dir / "titan.json"))

    ours = load_trace(
        generate_gantt_trace(run_dir, run_dir / "ours.json", log_skipped=False).output_path
    )
    assert any(e["name"] == f"loss={written}" for e in ours["traceEvents"])


def test_docs_schema_names_the_torchtitan_tool_that_reads_our_files_and_its_one_exception():
    text = (REPO / "docs" / "schema.md").read_text(encoding="utf-8")
    assert "## Read by torchtitan's tools" in text
    section = text.split("## Read by torchtitan's tools", 1)[1].split("\n## ", 1)[0]
    for claim in (
        "torchtitan 0.3.0",
        "gantt_generator.generate_gantt_trace",
        "one exception: a scalar whose value is NaN",
        "Unknown format code 'f'",
        "test_torchtitan_gantt.py",
    ):
        assert claim in " ".join(section.split()), claim
