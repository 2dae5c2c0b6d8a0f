"""What `otel-titan summarize` prints, from the model: the text (`format_summary`) and the
``--json`` form (`summary_json`)."""

from otel_titan.analysis.summarize.json_form import summary_json
from otel_titan.analysis.summarize.text import format_summary

__all__ = ["format_summary", "summary_json"]
