"""The package root: importing it loads nothing heavy, and the CLI never loads the writer."""

from __future__ import annotations

import json

from tests.conftest import run_python

_WRITE_RUN = """
import sys
from otel_titan import structured_logger as sl
sl.init_structured_logger("training", sys.argv[1], rank=0, world_size=1)
with sl.log_trace_span("fwd_bwd"):
    pass
sl.shutdown_structured_logger()
"""

_SUMMARIZE = """
import json, sys
from otel_titan import cli
status = cli.main(["summarize", sys.argv[1], "--json"])
sys.stdout.flush()
with open(sys.argv[2], "w") as handle:
    json.dump({"status": status, "modules": sorted(sys.modules)}, handle)
"""


def test_otel_titan_summarize_loads_no_opentelemetry_and_no_writer(tmp_path):
    assert run_python(_WRITE_RUN, str(tmp_path)).returncode == 0
    result = run_python(_SUMMARIZE, str(tmp_path), str(tmp_path / "modules.json"))
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["processes"]) == 1  # it did read the run
    report = json.loads((tmp_path / "modules.json").read_text())
    assert report["status"] == 0
    loaded = report["modules"]
    assert [m for m in loaded if m.split(".")[0] == "opentelemetry"] == []
    writer = ("otel_titan.core", "otel_titan.exporters", "otel_titan.structured_logger")
    assert [m for m in loaded if m.startswith(writer)] == []


def test_importing_the_package_loads_neither_side_until_asked():
    result = run_python(
        "import sys, otel_titan\n"
        "before = sorted(m for m in sys.modules if m.startswith('otel_titan'))\n"
        "otel_titan.structured_logger.set_step(1)\n"
        "print(before, 'otel_titan.structured_logger' in sys.modules, otel_titan.__version__)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("] ")[0] + "]" == "['otel_titan', 'otel_titan._version']"
    assert result.stdout.strip().endswith("True 0.1.0")
