"""The last records of a process, read backwards from the end of its files: the same as a full
read's end."""

from __future__ import annotations

import json

from otel_titan.analysis.read.lines import SkippedLines, file_records
from otel_titan.analysis.read.records import read_run
from otel_titan.analysis.read.tails import tail_records


def test_a_bad_line_in_the_tail_is_counted_once_with_the_line_number_a_full_read_gives(tmp_path):
    """A tail window is parsed once, and its skipped lines are counted once (not per window tried,
    not twice)."""
    folder = tmp_path / "structured_logs"
    folder.mkdir()
    path = folder / "training.global_rank_0.20260101-000000-abc123.jsonl"
    lines = [
        json.dumps(
            {
                "time_us": 1_000 + i,
                "log_type": "event",
                "log_type_name": f"s{i}_start",
                "pad": "x" * 400,
            }
        )
        for i in range(400)
    ]
    lines[-10] = '{"torn": '  # within the last 24 lines
    path.write_text("\n".join(lines) + "\n")
    (process,) = read_run(str(tmp_path), log_skipped=False).processes
    skipped = SkippedLines(log=False)
    records, whole = tail_records(process, skipped, min_lines=24)
    full_skipped = SkippedLines(log=False)
    full = list(file_records(str(path), full_skipped))
    assert not whole and 24 <= len(records) < 400 and records == full[-len(records) :]
    assert skipped.count == full_skipped.count == 1
    # Numbered within the bytes read from the end (line 60 of them), not the file's line 391: as
    # before.
    assert skipped.examples == [f"{path}:60: malformed JSON or invalid UTF-8; line skipped"]
