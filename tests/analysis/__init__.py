"""Tests of otel_titan/analysis/; their helpers live in tests/helpers/analysis.py.

The names are re-exported here only so that tests written before the move
(on other branches) still import; new tests import tests.helpers.analysis.
"""

from tests.helpers.analysis import *  # noqa: F401,F403
