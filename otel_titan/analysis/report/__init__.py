"""`otel-titan report`: one self-contained HTML file with the pictures of a run, from one read of
it.

Why: people would rather look than read. A heatmap of step time by rank
shows a straggler (a row), a slow host (a band of 8 rows), a periodic stall
(columns) at a glance, where a table needs study. The file is for a laptop
on a train: Plotly's JavaScript is embedded once, nothing is fetched, and big
runs are binned so it stays small and opens quickly.

The run is read once, as ``summarize`` reads it (`model.collect.read_model`):
the figures are drawn from the model's grid of ranks × steps
(`model.step_grid`), every verdict is summarize's, and the report runs no
rule of its own. One module per part, in the order the page is built:

* `data`: what is drawn (the source, its ranks and steps) and the ranks summarize names;
* `heatmap`: step time, and arrival at the step-closing collective, by rank and step;
* `phases`: per-phase time by rank; `scalars`: the scalars over steps;
* `findings`: summarize's straggler tables and the clock offsets;
* `page`: the HTML, its scripts allowed by hash; `markup`: escaping; `axes`: ticks, bins, colours;
* `write`: `write_report`, which reads, draws and writes.

Example:
    >>> from otel_titan.analysis.report import write_report
    >>> import os; os.path.relpath(write_report("outputs").path)
    'outputs/analysis/report.html'
"""

from otel_titan.analysis.report.axes import bin_size
from otel_titan.analysis.report.data import NamedRank, named_ranks
from otel_titan.analysis.report.write import ReportResult, write_report

__all__ = ["ReportResult", "NamedRank", "named_ranks", "write_report", "bin_size"]
