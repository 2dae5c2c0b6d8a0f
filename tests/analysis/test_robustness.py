"""Whatever the records hold, export and summary finish, and the trace stays valid Chrome Trace
JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_titan import structured_logger as sl
from otel_titan.analysis import NoRecordsError, format_summary, generate_gantt_trace, summarize_run
from otel_titan.analysis.read.safe_text import json_bytes
from tests.conftest import REPO
from tests.helpers.analysis import (
    T0,
    load_trace,
    process_pids,
    titan_file,
    titan_record,
    titan_span,
    write_jsonl,
)

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    # lone surrogates, control characters
    st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=12),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=5),
            inner,
            max_size=3,
        ),
    ),
    max_leaves=8,
)
_names = st.sampled_from(
    [
        "fwd_start",
        "fwd_end",
        "fwd_error",
        "opt_start",
        "opt_end",
        "metric_value",
        "mark",
        "records_dropped",
        "signal_received",
        "structured_logger_closed",
        "_start",
        "_end",
    ]
)


@st.composite
def records(draw):
    record = {
        "log_type": draw(st.one_of(st.sampled_from(["event", "instant"]), _json)),
        "log_type_name": draw(st.one_of(_names, _json)),
        "time_us": draw(st.one_of(st.integers(min_value=T0, max_value=T0 + 10_000_000), _json)),
    }
    for key in (
        "tid",
        "task_name",
        "span_id",
        "parent_span_id",
        "step",
        "relative_step",
        "step_tags",
        "value",
        "event_name",
        "seq_id",
        "error_type",
        "message",
        "dropped_records",
        "signal",
    ):
        if draw(st.booleans()):
            record[key] = draw(_json)
    return record


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(lines=st.lists(records(), min_size=1, max_size=25))
def test_arbitrary_records_never_break_export_or_summary(tmp_path, lines):
    run_dir = tmp_path / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    path = titan_file(run_dir)
    path.parent.mkdir(parents=True)
    # NaN, Infinity, big ints: the fallback parser's job
    path.write_text("".join(json.dumps(record) + "\n" for record in lines))
    try:
        generate_gantt_trace(run_dir, run_dir / "t.json", log_skipped=False)
    except NoRecordsError:
        pass
    else:
        load_trace(run_dir / "t.json")
        orjson.loads((run_dir / "t.json").read_bytes())  # strict UTF-8 too
    try:
        summary = summarize_run(run_dir, log_skipped=False)
    except NoRecordsError:
        return
    json.dumps(summary.to_dict(), allow_nan=False)
    # what `summarize --json` prints
    orjson.loads(json_bytes(summary.to_dict(), option=orjson.OPT_NON_STR_KEYS))
    format_summary(summary).encode("utf-8")  # what `summarize` prints


# -- bad strings that are valid JSON, and text that would drive the terminal (issue 9, items 8 and
# 10) --------------
def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    """`otel-titan` in a real process: its stdout and stderr are real pipes with their real
    encoding."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "otel_titan.cli", *args],
        capture_output=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )


def _no_terminal_control(data: bytes) -> None:
    text = data.decode("utf-8")  # strict: every byte is valid UTF-8
    bad = [
        c
        for c in text
        if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0 or c in "\u202e\u2066\u2028"
    ]
    assert not bad, bad


def _surrogate_run(run_dir) -> None:
    """A real run whose span name, tag, instant and scalar name hold lone surrogates (the writer
    escapes them as \\udXXX)."""
    sl.init_structured_logger("training", run_dir, rank=0, world_size=1, run_id="bad-unicode")
    sl.set_step(1)
    sl.add_step_tag("ckpt\udc80")
    with sl.log_trace_span("fwd\ud800"):
        sl.log_trace_instant("mark\udfff")
        sl.log_trace_scalar({"loss\ud800": 1.0})
    with sl.log_trace_span("optimizer"):
        pass
    sl.shutdown_structured_logger()


def test_lone_surrogates_never_break_export_or_summarize_and_are_counted(run_dir):
    _surrogate_run(run_dir)
    # valid JSON, as written
    assert b"\\ud800" in next((run_dir / "structured_logs").iterdir()).read_bytes()

    export = _cli("export", str(run_dir))
    assert export.returncode == 0, export.stderr.decode(errors="replace")
    # Both spans' _start and _end (the tag), the instant and the scalar: 6 lines, each named (5 per
    # file, then counted).
    assert b"6 lines with invalid Unicode kept, escaped" in export.stdout
    assert (
        export.stderr.count(b"with invalid Unicode (lone surrogate) escaped") == 5
        and b"more lines with invalid Unicode" in export.stderr
    )
    trace = load_trace(run_dir / "analysis" / "trace.json")
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"fwd\\ud800", "optimizer", "mark\\udfff", "loss\\ud800"} <= names
    assert trace["otherData"]["stats"]["repaired_lines"] == 6
    assert any(e.get("args", {}).get("step_tags") == ["ckpt\\udc80"] for e in trace["traceEvents"])

    text = _cli("summarize", str(run_dir))
    assert text.returncode == 0, text.stderr.decode(errors="replace")
    _no_terminal_control(text.stdout)
    assert (
        "fwd\\ud800" in text.stdout.decode()
        and "; 6 lines with invalid Unicode kept, escaped" in text.stdout.decode()
    )

    as_json = _cli("summarize", str(run_dir), "--json")
    assert as_json.returncode == 0, as_json.stderr.decode(errors="replace")
    data = orjson.loads(as_json.stdout)  # strict UTF-8 JSON
    assert (
        "fwd\\ud800" in {phase["name"] for phase in data["phases"]} and data["repaired_lines"] == 6
    )


def test_the_parallel_export_carries_bad_strings_and_undecodable_file_names(run_dir, tmp_path):
    for rank in (0, 1):
        path = write_jsonl(
            titan_file(run_dir, rank=rank, source="train\udcffing"),
            [
                titan_record("fwd\ud800_start", 0, rank=rank),
                titan_record("fwd\ud800_end", 1, value=1.0, rank=rank),
            ],
        )
        assert os.fsencode(path).count(b"\xff") == 1  # a real undecodable byte on disk
    for jobs in ("1", "2"):
        result = _cli("export", str(run_dir), "-o", str(tmp_path / f"t{jobs}.json"), "--jobs", jobs)
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        _no_terminal_control(result.stdout)
        _no_terminal_control(result.stderr)
        trace = load_trace(tmp_path / f"t{jobs}.json")
        assert sorted(process_pids(trace)) == ["train\\udcffing rank 0", "train\\udcffing rank 1"]
        assert trace["otherData"]["stats"]["repaired_lines"] == 4
    for args in (["summarize", str(run_dir)], ["summarize", str(run_dir), "--json"]):
        result = _cli(*args)
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        assert (
            b"train\\\\udcffing rank 1" in result.stdout
            or b"train\\udcffing rank 1" in result.stdout
        )


def test_control_characters_in_records_and_file_names_never_reach_the_terminal(run_dir):
    hostile = ["\x1b[2J\x1b[Hfwd", "\x9b31mred", "abc\u202edcba", "a\rb", "new\nline"]
    records = []
    for index, name in enumerate(hostile):
        records += [
            titan_record(f"{name}_start", 10 * index, step=1, step_tags=["\x1b]0;title\x07"]),
            titan_record(f"{name}_end", 10 * index + 5, value=5.0, step=1),
        ]
    records.append(titan_record("\x1b[31mhung_start", 100, step=2))
    write_jsonl(titan_file(run_dir), records)
    # a warning naming an ESC file name
    write_jsonl(titan_file(run_dir, rank=1, source="ev\x1bil"), ["{torn"] + records)
    for args in (["summarize", str(run_dir)], ["export", str(run_dir)]):
        result = _cli(*args)
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        _no_terminal_control(result.stdout)
        _no_terminal_control(result.stderr)
    shown = _cli("summarize", str(run_dir)).stdout.decode()
    assert (
        "\\x1b[2J\\x1b[Hfwd" in shown and "\\x1b[31mhung" in shown and "ev\\x1bil rank 1" in shown
    )
    missing = _cli("summarize", str(run_dir / "no\x1b[2Jsuch"))
    assert missing.returncode == 2 and b"no\\x1b[2Jsuch" in missing.stderr
    _no_terminal_control(missing.stderr)


def test_a_rank_beyond_64_bits_in_a_file_name(run_dir):
    write_jsonl(titan_file(run_dir, rank=1 << 70), titan_span("fwd", 0, 1, step=1))
    write_jsonl(titan_file(run_dir, rank=0), titan_span("fwd", 0, 1, step=1))
    as_json = _cli("summarize", str(run_dir), "--json")
    assert as_json.returncode == 0, as_json.stderr.decode(errors="replace")
    ranks = [p["rank"] for p in orjson.loads(as_json.stdout)["processes"]]
    # JSON numbers beyond 64 bits are not portable: written as decimal strings
    assert ranks == [
        0,
        str(1 << 70),
    ]
    assert _cli("summarize", str(run_dir)).returncode == 0
    exported = _cli("export", str(run_dir))
    assert exported.returncode == 0, exported.stderr.decode(errors="replace")
    assert f"training rank {1 << 70}" in process_pids(
        load_trace(run_dir / "analysis" / "trace.json")
    )


def test_a_timestamp_past_the_year_9999_is_summarised_not_fatal(tmp_path):
    """The reader keeps any time_us below 2**62; the text, the JSON and the run's grouping all date
    them: one that rounds into year 10000 (found by the random records above) stopped `summarize`
    with ``ValueError: year 10000 is out of range``."""
    late = 253_402_300_799_999_984
    write_jsonl(
        titan_file(tmp_path),
        [
            {"log_type": "event", "log_type_name": "fwd_start", "time_us": late, "rank": 0},
            {"log_type": "event", "log_type_name": "fwd_end", "time_us": late + 10, "rank": 0},
        ],
    )
    summary = summarize_run(tmp_path, log_skipped=False)
    text = format_summary(summary)
    facts = json.loads(json.dumps(summary.to_dict(), allow_nan=False))
    assert f"{late}" in text and facts["processes"][0]["last_utc"] is None
