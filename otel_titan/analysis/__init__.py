"""Analysis of structured-log runs: Chrome Trace export for Perfetto, and a run summary.

The command line (`otel-titan export`, `otel-titan summarize`) calls these.
Modules: `reader` (run → processes → records) and `record_lines` (tolerant
line parsing); `timeline` (span pairing, steps); `chrome_events`,
`chrome_trace` and `export_parallel` (the trace); `summary`,
`summary_model` and `summary_text` (the summary); `filters`.

Example:
    >>> from otel_titan.analysis import generate_gantt_trace, summarize_run, format_summary
    >>> # generate_gantt_trace("outputs", "outputs/analysis/trace.json")   # → ExportStats
    >>> # print(format_summary(summarize_run("outputs")))
"""

from otel_titan.analysis.chrome_events import ExportStats
from otel_titan.analysis.chrome_trace import generate_gantt_trace
from otel_titan.analysis.filters import StepRange, parse_rank_list, parse_step_range
from otel_titan.analysis.reader import NoRecordsError, NotARunError, ProcessLog, RunLogs, find_log_dir, read_run
from otel_titan.analysis.record_lines import SkippedLines
from otel_titan.analysis.summary import summarize_run
from otel_titan.analysis.summary_model import OpenSpanInfo, PhaseStats, ProcessSummary, RankSlowness, RunSummary, StepTimes, StopGroup, Stragglers
from otel_titan.analysis.summary_text import format_summary
from otel_titan.analysis.timeline import OpenSpan, ProcessExtent, TimelineVisitor, walk_process

__all__ = [
    "ExportStats",
    "NoRecordsError",
    "NotARunError",
    "OpenSpan",
    "OpenSpanInfo",
    "PhaseStats",
    "ProcessExtent",
    "ProcessLog",
    "ProcessSummary",
    "RankSlowness",
    "RunLogs",
    "RunSummary",
    "SkippedLines",
    "StepRange",
    "StepTimes",
    "StopGroup",
    "Stragglers",
    "TimelineVisitor",
    "find_log_dir",
    "format_summary",
    "generate_gantt_trace",
    "parse_rank_list",
    "parse_step_range",
    "read_run",
    "summarize_run",
    "walk_process",
]
