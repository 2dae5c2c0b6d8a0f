"""What `otel-titan sql` runs: the run loaded into DuckDB, and its output."""
