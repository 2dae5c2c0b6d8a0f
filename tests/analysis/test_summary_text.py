"""The summary's terminal tables: what a person reads after a hang."""

from __future__ import annotations

from otel_titan.analysis import format_summary, summarize_run
from otel_titan.analysis.summary_text import compress_ranks, format_ms
from tests.analysis import titan_file, titan_record, write_jsonl
from tests.analysis.test_summary import synchronous_run


def test_numbers_and_rank_lists_are_short():
    assert [format_ms(v) for v in (0.0123, 5.0, 35.15, 1234.5, None)] == ["0.012", "5.00", "35.1", "1,234", "-"]
    assert compress_ranks([7, 0, 1, 2, 4, 5, 6, 9]) == "0-2,4-7,9" and compress_ranks([3]) == "3"


def test_tables_show_processes_phases_and_the_phase_straggler(run_dir):
    synchronous_run(run_dir)
    text = format_summary(summarize_run(run_dir))
    lines = text.splitlines()
    assert lines[0].startswith(f"Run {run_dir}  (3 processes")
    header = next(i for i, line in enumerate(lines) if line == "Processes")
    assert lines[header + 1].split() == ["process", "attempt", "last", "step", "(rel)", "last", "event", "at", "(UTC)", "behind", "closed", "lost", "records", "open", "spans"]
    rank2 = lines[header + 4].split()
    assert rank2[:4] == ["training", "rank", "2", "-"] and rank2[4:6] == ["6", "metric_value"] and "unknown" in rank2  # torchtitan files: no closing record to check
    (fetch,) = [line for line in lines if line.split()[:2] == ["training", "data_fetch"]]
    assert fetch.split()[2:9] == ["18", "-", "-", "271", "5.00", "35.1", "36.0"] and fetch.endswith("training rank 2, step 4")
    phase_rows = [line.split()[1] for line in lines if line.startswith("  training  ")]
    assert phase_rows == ["fwd_bwd", "data_fetch", "optimizer"]  # by total time
    (straggler,) = [line for line in lines if line.strip().startswith("data_fetch: rank 2")]
    assert "slowest in 6/6 steps" in straggler and "+30.00 ms" in straggler and "7.0×" in straggler
    assert "All 3 processes' last event: metric_value" in text


def test_skipped_lines_and_lost_records_are_visible(run_dir):
    write_jsonl(titan_file(run_dir), [titan_record("a_start", 0, seq_id=1), "garbage", titan_record("a_end", 1, value=1.0, seq_id=3)])
    text = format_summary(summarize_run(run_dir, log_skipped=False))
    assert "1 unreadable lines skipped" in text and "skipped: " in text and ":2: malformed JSON" in text
    assert "0 (1 seq gaps, 1 unreadable)" in text
