"""Tests of otel_titan/analysis/; their helpers live in tests/helpers/analysis.py."""
