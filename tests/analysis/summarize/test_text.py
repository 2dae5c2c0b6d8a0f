"""The summary's terminal tables: what a person reads after a hang."""

from __future__ import annotations

import os

from otel_titan.analysis import format_summary, summarize_run
from otel_titan.analysis.summarize.text import compress_ranks, format_ms
from tests.analysis.model.test_collect import healthy_ranks, synchronous_run
from tests.analysis.runs import rank_file
from tests.helpers.analysis import T0, titan_file, titan_record, write_jsonl


def test_numbers_and_rank_lists_are_short():
    assert [format_ms(v) for v in (0.0123, 5.0, 35.15, 1234.5, None)] == [
        "0.012",
        "5.00",
        "35.1",
        "1,234",
        "-",
    ]
    assert compress_ranks([7, 0, 1, 2, 4, 5, 6, 9]) == "0-2,4-7,9" and compress_ranks([3]) == "3"


def test_tables_show_processes_phases_and_the_phase_straggler(run_dir):
    synchronous_run(run_dir)
    text = format_summary(summarize_run(run_dir))
    lines = text.splitlines()
    assert lines[0].startswith(f"Run {run_dir}  (3 processes")
    header = next(i for i, line in enumerate(lines) if line == "Processes")
    assert lines[header + 1].split() == [
        "process",
        "attempt",
        "last",
        "step",
        "(rel)",
        "last",
        "event",
        "at",
        "(UTC)",
        "behind",
        "closed",
        "lost",
        "records",
        "open",
        "spans",
    ]
    rank2 = lines[header + 4].split()
    # torchtitan files: no closing record to check
    assert (
        rank2[:4] == ["training", "rank", "2", "-"]
        and rank2[4:6] == ["6", "metric_value"]
        and "unknown" in rank2
    )
    (fetch,) = [line for line in lines if line.split()[:2] == ["training", "data_fetch"]]
    assert fetch.split()[2:9] == ["18", "-", "-", "271", "5.00", "35.1", "36.0"] and fetch.endswith(
        "training rank 2, step 4"
    )
    phase_rows = [line.split()[1] for line in lines if line.startswith("  training  ")]
    assert phase_rows == ["fwd_bwd", "data_fetch", "optimizer"]  # by total time
    (straggler,) = [line for line in lines if line.strip().startswith("data_fetch: rank 2")]
    assert "slowest in 6/6 steps" in straggler and "+30.00 ms" in straggler and "7.0×" in straggler
    # torchtitan files: no closing record, their end unknown
    assert "    3 processes: stopped at step 6, after metric_value  (training ranks 0-2)" in text


def test_skipped_lines_and_lost_records_are_visible(run_dir):
    write_jsonl(
        titan_file(run_dir),
        [
            titan_record("a_start", 0, seq_id=1),
            "garbage",
            titan_record("a_end", 1, value=1.0, seq_id=3),
        ],
    )
    text = format_summary(summarize_run(run_dir, log_skipped=False))
    assert (
        "1 unreadable line skipped" in text and "skipped: " in text and ":2: malformed JSON" in text
    )
    assert "0 (1 seq gap, 1 unreadable)" in text


def _section(text, heading):
    """The lines of one section (from its heading to the next blank line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(heading))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def test_largest_excess_steps_come_largest_first(run_dir):
    excess = [3.0, 9.0, 1.0, 7.0, 5.0, 8.0, 2.0, 6.0, 4.0, 0.5, 10.0, 0.25]
    for rank in (0, 1, 2):
        rank_file(run_dir, rank, [100.0 + (e if rank == 2 else 0.0) for e in excess], world_size=3)
    table = _section(format_summary(summarize_run(run_dir)), "Steps with the largest excess")
    rows = [line.split() for line in table[2:]]
    assert [float(row[-1]) for row in rows] == sorted(excess, reverse=True)[:10]
    assert [int(row[0]) for row in rows] == [11, 2, 6, 4, 8, 5, 9, 1, 7, 3]


def test_identical_ranks_print_ties_and_no_straggler(run_dir):
    for rank in (0, 1):
        rank_file(run_dir, rank, [100.0] * 100, world_size=2)
    text = format_summary(summarize_run(run_dir))
    assert "99/99" not in text and "100/100" not in text and "repeatedly slowest" not in text
    assert (
        "  no straggler: no rank's step time is slower on evidence (≥ 6 steps, a median ≥ 7.5% "
        "and ≥ 3.5 × noise (5 × under 10%) above the others' median)" in text
    )
    table = _section(text, "Steps with the largest excess")
    assert all(line.split()[3:] == ["tie", "+0.000"] for line in table[2:])


def test_a_healthy_run_prints_no_culprit_and_no_advice(run_dir):
    healthy_ranks(run_dir)  # rank 1's gc_collect is 8% slower in 5 samples
    text = format_summary(summarize_run(run_dir))
    assert "no straggler" in text and "no phase straggler" in text
    assert (
        "gc_collect: rank" not in text and "likely cause" not in text and "← straggler" not in text
    )


def test_a_phase_straggler_line_shows_figures_that_agree(run_dir):
    healthy_ranks(run_dir, ranks=4, slow=(2, "data_fetch", 30.0))
    summary = summarize_run(run_dir)
    (row,) = summary.stragglers[0].phase_stragglers
    (line,) = [
        line
        for line in format_summary(summary).splitlines()
        if line.strip().startswith("data_fetch: rank 2")
    ]
    assert (
        f"median {format_ms(row['median_ms'])} ms vs {format_ms(row['others_median_ms'])} ms on "
        f"the others (+{row['median_excess_ms']:.2f} ms, " in line
    )
    assert row["median_excess_ms"] == round(row["median_ms"] - row["others_median_ms"], 6)
    straggler_rows = [
        line
        for line in format_summary(summary).splitlines()
        if line.endswith("← straggler") and line.split()[0].isdigit()
    ]
    # the step times show it too, first in the table
    assert [line.split()[0] for line in straggler_rows] == ["2"]


def test_several_runs_in_one_folder_say_which_one_is_shown(run_dir):
    for run_id, start in (("older", T0), ("newer", T0 + 3_600_000_000)):
        for rank in (0, 1):
            rank_file(run_dir, rank, [100.0] * 8, run_id=run_id, world_size=2, start_us=start)
    text = format_summary(summarize_run(run_dir))
    assert (
        "  run newer: the latest of 2 runs in this folder (others: older; pick one with --run "
        "RUN_ID)" in text.splitlines()
    )
    assert "(2 processes," in text.splitlines()[0]
    assert (
        "  run older: chosen with --run, one of 2 runs in this folder (others: newer; pick one "
        "with --run RUN_ID)" in format_summary(summarize_run(run_dir, run_id="older"))
    )


def test_a_hang_suspect_has_its_own_section_and_no_up_to_date_row(run_dir):
    for rank in (0, 2):
        rank_file(run_dir, rank, [100.0] * 8, world_size=3)
    empty = run_dir / "structured_logs" / "training.global_rank_1.20260101-000000-zzzzzz.jsonl"
    empty.touch()
    os.utime(empty, (T0 / 1e6, T0 / 1e6))
    text = format_summary(summarize_run(run_dir))
    (row,) = [line for line in text.splitlines() if line.startswith("  training rank 1 ")]
    assert "(nothing logged)" in row and " 0.0 s" not in row and "0.8 s" in row
    (suspect,) = _section(text, "Hang suspects")[1:]
    assert suspect.startswith(
        "  training rank 1: nothing logged since its file was created at 05:17:00.000 UTC ("
    ) and suspect.endswith(", 0.8 s before the run's last record)")
