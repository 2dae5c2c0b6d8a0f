"""The reader: what `otel-titan export`, `summarize`, `sql`, `report` and `watch` do, as a library.

Layered as the data flows, each layer importing only those below
(pyproject.toml's analysis contract, tests/test_layers.py):

* `read` — finding runs and their files, lines (torn lines, lone surrogates,
  rotated segments), run selection, tails, filters, following growing files;
* `workers` — where the per-file work runs: in-process, ``--jobs N`` worker
  interpreters, or a Dask cluster (``--scheduler``), one code path;
* `model` — the model of a run, built once per read: spans paired into a
  timeline, steps, per-process facts (`RunSummary`), clock alignment, and the
  rules (straggler, stall, step-closing span), each written once;
* `summarize`, `export`, `query` — one command's question each, from the model;
* `report` (HTML) and `watch` (the live view) — on top of those;
* `RunAnalysis` — the front: one run, read once, one method per question.

Example:
    >>> from otel_titan.analysis import RunAnalysis, export_trace, summarize_run, format_summary
    >>> export_trace("outputs", "outputs/analysis/trace.json").spans
    18
    >>> print(format_summary(summarize_run("outputs")))
    Run outputs  (2 processes, logs in outputs/structured_logs)
    ...
    >>> RunAnalysis("outputs").hang() is None   # it did not stop in a hang (else a `HangReport`)
    True
"""

from otel_titan.analysis.export.chrome_events import ExportStats
from otel_titan.analysis.export.chrome_trace import export_trace, generate_gantt_trace
from otel_titan.analysis.model.collect import summarize_run
from otel_titan.analysis.model.facts import (
    OpenSpanInfo,
    PhaseStats,
    ProcessSummary,
    RankSlowness,
    RunSummary,
    StepTimes,
    StopGroup,
    Stragglers,
)
from otel_titan.analysis.model.hang import HangGroup, HangReport, RankPlace, Suspect
from otel_titan.analysis.model.timeline import (
    OpenSpan,
    ProcessExtent,
    TimelineVisitor,
    walk_process,
)
from otel_titan.analysis.read.filters import StepRange, parse_rank_list, parse_step_range
from otel_titan.analysis.read.lines import SkippedLines
from otel_titan.analysis.read.records import (
    NoRecordsError,
    NotARunError,
    ProcessLog,
    RunLogs,
    find_log_dir,
    read_run,
)
from otel_titan.analysis.read.selection import RunSelection
from otel_titan.analysis.run_analysis import RunAnalysis
from otel_titan.analysis.summarize.json_form import summary_json
from otel_titan.analysis.summarize.text import format_summary

__all__ = [
    "ExportStats",
    "HangGroup",
    "HangReport",
    "NoRecordsError",
    "NotARunError",
    "OpenSpan",
    "OpenSpanInfo",
    "PhaseStats",
    "ProcessExtent",
    "ProcessLog",
    "ProcessSummary",
    "RankPlace",
    "RankSlowness",
    "RunLogs",
    "RunAnalysis",
    "RunSelection",
    "RunSummary",
    "SkippedLines",
    "StepRange",
    "StepTimes",
    "StopGroup",
    "Stragglers",
    "Suspect",
    "TimelineVisitor",
    "find_log_dir",
    "format_summary",
    "export_trace",
    "generate_gantt_trace",
    "parse_rank_list",
    "parse_step_range",
    "read_run",
    "summarize_run",
    "summary_json",
    "walk_process",
]
