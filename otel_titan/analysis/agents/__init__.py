"""The run as tools for an agent: `otel-titan mcp` (Model Context Protocol over stdio), a thin front
over the analysis.

* `tools` — each tool's answer, from `RunAnalysis`, summarize's ``--json`` form,
  `query.sql` and watch's `Watch` (no rule of its own), in one envelope that
  keeps the records' strings as data;
* `budget` — every answer fits a budget of tokens, and says what it cut;
* `server` — the tools, the guide (``guide.md``) and the record schema on the
  official MCP SDK (imported only by the ``mcp`` command: the ``mcp`` extra).
"""
