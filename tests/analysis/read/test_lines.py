"""One file → its usable records: whatever the bytes, nothing crashes, and every skipped line is
named."""

from __future__ import annotations

import json
import logging

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_titan import structured_logger as sl
from otel_titan.analysis.read import lines as record_lines
from otel_titan.analysis.read.lines import SkippedLines, file_records
from tests.conftest import jsonl_files
from tests.helpers.analysis import titan_record, write_jsonl


def read(path, **kwargs):
    skipped = SkippedLines(**kwargs)
    return list(file_records(str(path), skipped)), skipped


def test_a_real_file_reads_back_record_for_record(logged, run_dir):
    logged()
    sl.set_step(1)
    with sl.log_trace_span("fwd_bwd"):
        sl.log_trace_scalar({"loss": 2.5})
    sl.shutdown_structured_logger()
    (path,) = jsonl_files(run_dir)
    records, skipped = read(path)
    with open(path) as handle:
        assert records == [json.loads(line) for line in handle]
    assert skipped.count == 0 and [r["log_type_name"] for r in records][1:4] == [
        "fwd_bwd_start",
        "metric_value",
        "fwd_bwd_end",
    ]


def test_torn_last_line_is_skipped_with_file_and_line_and_the_rest_kept(tmp_path, caplog):
    good = [titan_record("a_start", 0), titan_record("a_end", 1, value=1.0)]
    path = write_jsonl(tmp_path / "x.jsonl", good)
    with open(path, "ab") as handle:
        # a crash mid-write: no newline
        handle.write(json.dumps(titan_record("b_start", 2)).encode()[:57])
    with caplog.at_level(logging.WARNING, logger="otel_titan.analysis"):
        records, skipped = read(path)
    assert records == good
    assert skipped.count == 1 and skipped.by_file[str(path)] == 1
    assert f"{path}:3: truncated last line" in caplog.text


def test_every_kind_of_bad_line_is_skipped_counted_and_named(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(record_lines, "WARNINGS_PER_FILE", 20)
    lines = [
        titan_record("ok_start", 0),  # 1
        b"\xff\xfe not utf-8 \xc3\x28",  # 2
        "[1, 2, 3]",  # 3: JSON, not an object
        '{"time_us": 5, "log_type": "event"}',  # 4: no log_type_name
        '{"log_type_name": "x_start", "log_type": "event"}',  # 5: no timestamp
        '{"log_type_name": "x_start", "time_us": "soon"}',  # 6: timestamp of the wrong type
        "",  # 7: blank: nothing lost, not counted
        '{"unterminated": ',  # 8
        "null",  # 9
        titan_record("ok_end", 1, value=1.0),  # 10
    ]
    path = write_jsonl(tmp_path / "x.jsonl", lines)
    with caplog.at_level(logging.WARNING, logger="otel_titan.analysis"):
        records, skipped = read(path)
    assert [r["log_type_name"] for r in records] == ["ok_start", "ok_end"]
    assert skipped.count == 7
    messages = [r.getMessage() for r in caplog.records]
    for line_no, reason in [
        (2, "malformed JSON or invalid UTF-8"),
        (3, "not a JSON object (list)"),
        (4, "no log_type_name"),
        (5, "no timestamp"),
        (6, "no timestamp"),
        (8, "malformed JSON"),
    ]:
        assert any(m.startswith(f"{path}:{line_no}: {reason}") for m in messages), (
            line_no,
            messages,
        )


def test_warnings_stop_after_a_few_per_file_but_counting_goes_on(tmp_path, caplog):
    path = write_jsonl(tmp_path / "garbage.jsonl", ["not json"] * 50 + [titan_record("a_start", 0)])
    with caplog.at_level(logging.WARNING, logger="otel_titan.analysis"):
        records, skipped = read(path)
    assert len(records) == 1 and skipped.count == 50
    assert len(caplog.records) == record_lines.WARNINGS_PER_FILE + 1
    assert "only counting them from now on" in caplog.records[-1].getMessage()


def test_torchtitan_bare_nan_and_infinity_are_read(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"log_type": "instant", "log_type_name": "metric_value", "event_name": "loss", "value": NaN, "time_us": 5}\n{"log_type": "instant", "log_type_name": "metric_value", "event_name": "gnorm", "value": Infinity, "time_us": 6}\n'
    )
    records, skipped = read(path)
    assert (
        skipped.count == 0
        and records[0]["value"] != records[0]["value"]
        and records[1]["value"] == float("inf")
    )


def test_missing_time_us_and_log_type_are_derived(tmp_path):
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [{"log_type_name": "fwd_start", "time_ms": 12}, {"log_type_name": "ping", "time": 3.5}],
    )
    records, _ = read(path)
    assert [(r["time_us"], r["log_type"]) for r in records] == [
        (12_000, "event"),
        (3_500_000, "instant"),
    ]


def test_crlf_and_a_final_line_without_newline_that_parses_are_kept(tmp_path):
    path = tmp_path / "t.jsonl"
    first, second = (json.dumps(titan_record(n, i)) for i, n in enumerate(["a_start", "a_end"]))
    path.write_bytes(first.encode() + b"\r\n" + second.encode())
    records, skipped = read(path)
    assert [r["log_type_name"] for r in records] == ["a_start", "a_end"] and skipped.count == 0


def test_a_line_longer_than_the_limit_is_skipped_without_being_held(tmp_path, monkeypatch):
    monkeypatch.setattr(record_lines, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(record_lines, "BLOCK_BYTES", 256)
    path = tmp_path / "t.jsonl"
    good = json.dumps(titan_record("a_start", 0)).encode()
    path.write_bytes(good + b"\n" + b"x" * 5000 + b"\n" + good + b"\n" + b"y" * 3000)
    records, skipped = read(path, log=False)
    assert len(records) == 2 and skipped.count == 2
    assert skipped.examples == [
        f"{path}:2: line longer than 0 MiB; line skipped",
        f"{path}:4: line longer than 0 MiB; line skipped",
    ]


def test_lines_spanning_block_boundaries_are_reassembled(tmp_path, monkeypatch):
    monkeypatch.setattr(record_lines, "BLOCK_BYTES", 7)  # every line crosses several blocks
    wanted = [titan_record(f"s{i}_start", i) for i in range(20)]
    records, skipped = read(write_jsonl(tmp_path / "t.jsonl", wanted))
    assert records == wanted and skipped.count == 0


def test_an_unreadable_file_is_skipped_and_named(tmp_path):
    records, skipped = read(tmp_path / "gone.jsonl", log=False)
    assert (
        records == [] and skipped.count == 1 and "gone.jsonl:0: cannot open" in skipped.examples[0]
    )


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    noise=st.lists(st.binary(max_size=80), max_size=8),
    position=st.integers(min_value=0, max_value=3),
)
def test_random_bytes_between_good_lines_never_crash_and_never_lose_the_good_lines(
    tmp_path, noise, position
):
    good = [json.dumps(titan_record(f"p{i}_start", i)).encode() for i in range(3)]
    garbage = [n.replace(b"\n", b" ") for n in noise]
    lines = good[:position] + garbage + good[position:]
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    records, skipped = read(path, log=False)
    names = [r["log_type_name"] for r in records]
    assert [n for n in names if n in ("p0_start", "p1_start", "p2_start")] == [
        "p0_start",
        "p1_start",
        "p2_start",
    ]
    assert len(records) + skipped.count <= len(lines)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(blob=st.binary(max_size=2000))
def test_any_file_content_reads_without_an_exception(tmp_path, blob):
    path = tmp_path / "blob.jsonl"
    path.write_bytes(blob)
    records, skipped = read(path, log=False)
    assert all(isinstance(r, dict) and type(r["time_us"]) is int for r in records)


def test_lone_surrogates_in_valid_json_are_escaped_counted_and_the_line_kept(tmp_path, caplog):
    """``"\\ud800"`` is valid JSON (our writer writes it for a lone surrogate), but no encoder can
    write it back."""
    lines = [
        # json.dumps writes the \ud800 escapes
        titan_record("fwd\ud800_start", 0, step_tags=["a\udc80"]),
        b'{"log_type_name": "raw\xed\xa0\x80_start", "time_us": 7, "k\\udfff": 1}',  # a surrogate as raw bytes, one in a key
        titan_record("ok_end", 1, value=1.0),
    ]
    path = write_jsonl(tmp_path / "x.jsonl", lines)
    with open(path, "ab") as handle:
        # the last line, without its newline
        handle.write(b'{"log_type_name": "torn\\udfff", "time_us": 9}')
    with caplog.at_level(logging.WARNING, logger="otel_titan.analysis"):
        records, skipped = read(path)
    assert [r["log_type_name"] for r in records] == [
        "fwd\\ud800_start",
        "raw\\ud800_start",
        "ok_end",
        "torn\\udfff",
    ]
    assert records[0]["step_tags"] == ["a\\udc80"] and records[1]["k\\udfff"] == 1
    assert skipped.count == 0 and skipped.repaired == 3 and skipped.repaired_by_file[str(path)] == 3
    messages = [r.getMessage() for r in caplog.records]
    # name, message, tag
    assert (
        f"{path}:1: 3 strings with invalid Unicode (lone surrogate) escaped as \\uXXXX text; line "
        "kept" in messages
    )
    assert any(m.startswith(f"{path}:2: 2 strings") for m in messages) and any(
        m.startswith(f"{path}:4: 1 string ") for m in messages
    )
    for record in records:
        orjson.dumps(record)  # nothing left that an encoder refuses


# -- the typed decoder (trimmed records): the full records less the fields no command reads --------
_NAMES = [
    "fwd_start",
    "fwd_end",
    "bwd_error",
    "metric_value",
    "training_start",
    "run_config",
    "stall",
    "heartbeat",
    "structured_logger_opened",
    "",
    "x",
]
_ODD_STRINGS = st.sampled_from(
    ["plain", "naïve 步骤", "\ud800", "a\udfffb", "\x00", "\\", '"', "emoji 😀"]
)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | _ODD_STRINGS
    | st.sampled_from([(1 << 63) - 1, 1 << 63, (1 << 64) - 1, 1 << 64, -(1 << 63), -(1 << 63) - 1]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
_FIELDS = st.sampled_from(
    [*record_lines.ANALYSIS_FIELDS, "rank", "host_name", "log_level", "config_name", "mesh"]
)


@st.composite
def _line(draw) -> bytes:
    record = {
        "time_us": draw(st.integers(min_value=0, max_value=1 << 53) | _JSON),
        "log_type": draw(st.sampled_from(["event", "instant"]) | _JSON),
        "log_type_name": draw(st.sampled_from(_NAMES) | _JSON),
    }
    for name in draw(st.lists(_FIELDS, max_size=6)):
        record[name] = draw(_JSON)
    line = json.dumps(record, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    how = draw(
        st.sampled_from(
            ["as is"] * 6
            + [
                "torn",
                "bad utf-8 in an extra field",
                "duplicate key",
                "escaped key",
                "crlf",
                "not an object",
            ]
        )
    )
    if how == "torn":
        line = line[: draw(st.integers(min_value=0, max_value=len(line)))]
    elif how == "bad utf-8 in an extra field":
        line = line[:-1] + b', "junk": "\xff\xfe"}'
    elif how == "duplicate key":
        line = line[:-1] + b', "step": 7, "time_us": 5}'
    elif how == "escaped key":
        line = line[:-1] + b', "st\\u0065p": 3}'
    elif how == "crlf":
        line += b"\r"
    elif how == "not an object":
        line = b"[" + line + b"]"
    return line


def _comparable(record: dict) -> str:
    """The record's analysis fields, in order, as text (NaN equals NaN)."""
    if record.get("log_type_name") in record_lines.WHOLE_RECORDS:
        return repr(list(record.items()))
    return repr([(k, v) for k, v in record.items() if k in record_lines.ANALYSIS_FIELDS])


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    lines=st.lists(_line(), min_size=1, max_size=12), tail=st.sampled_from([b"\n", b"", b"\0" * 8])
)
def test_trimmed_records_are_the_full_records_less_the_fields_no_command_reads(
    tmp_path, lines, tail
):
    """The typed decoder (msgspec) never answers differently from the tolerant path: same records,
    same skips and repairs."""
    path = tmp_path / "typed.jsonl"
    path.write_bytes(b"\n".join(lines) + tail)
    full_skipped, trimmed_skipped = SkippedLines(log=False), SkippedLines(log=False)
    full = list(file_records(str(path), full_skipped))
    trimmed = list(file_records(str(path), trimmed_skipped, trimmed=True))
    assert [_comparable(r) for r in trimmed] == [_comparable(r) for r in full]
    assert (trimmed_skipped.count, trimmed_skipped.examples, trimmed_skipped.repaired) == (
        full_skipped.count,
        full_skipped.examples,
        full_skipped.repaired,
    )


def test_trimmed_records_drop_the_identity_fields_and_keep_the_loggers_own_whole(tmp_path):
    """What the typed decoder buys: a span record without the dozen identity fields; a black box or
    run_config record whole."""
    span = titan_record("fwd_start", 0, step=3, span_id="00000000000000aa")
    stall = titan_record(
        "stall", 1, log_type="instant", reason="stall", open_spans=[{"name": "fwd"}]
    )
    config = titan_record(
        "run_config", 2, log_type="instant", config_name="job", config_hash="ab", config={"lr": 0.1}
    )
    path = write_jsonl(tmp_path / "x.jsonl", [span, stall, config])
    skipped = SkippedLines(log=False)
    first, second, third = file_records(str(path), skipped, trimmed=True)
    assert (
        first == {k: v for k, v in span.items() if k in record_lines.ANALYSIS_FIELDS}
        and "host_name" not in first
        and first["step"] == 3
    )
    assert second == stall and third == config
