"""Issue 19: `report` reads the run once (it once loaded it into DuckDB, then read it again for the
summary).

Measured for real, in fresh interpreters: an audit hook (`sys.addaudithook`) counts every
``open`` of the run's files, and the kernel's own count of bytes read (``rchar`` in
``/proc/self/io``: every read of the process, DuckDB's threads included) is taken around the
call. The report must open each file as often as ``summarize`` does, read no more of the run,
and never load DuckDB. Plotly's lazy imports are paid first on a tiny run, and its
JavaScript (read again for the page) is counted out. Without the analysis cache (a cached
command reads what is cached, not the run: the second test), so that the two commands read alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("plotly")

from benchmarks.generate_run import RunSpec, generate_run
from tests.conftest import REPO

PROBE = r"""
import json, os, sys
run, mode, out, warm, cache = sys.argv[1:6]
cache = cache == "cache"
logs = os.path.realpath(os.path.join(run, "structured_logs"))
from plotly.offline import get_plotlyjs
from otel_titan.analysis.model.collect import summarize_run
from otel_titan.analysis.report import write_report
write_report(warm, out + ".warm.html")  # Plotly's lazy imports and data files: read here, not below
opens = {}

def hook(event, args):
    if event == "open" and isinstance(args[0], str) and os.path.realpath(args[0]).startswith(logs + os.sep):
        name = os.path.basename(args[0])
        opens[name] = opens.get(name, 0) + 1

def rchar():
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])

sys.addaudithook(hook)
before = rchar()
if mode == "report":
    write_report(run, out, cache=cache)
else:
    summarize_run(run, cache=cache)
print(json.dumps({"opens": opens, "read": rchar() - before, "plotly_js": len(get_plotlyjs().encode()), "duckdb": "duckdb" in sys.modules}))
"""


def _probe(run: Path, mode: str, out: Path, warm: Path, cache: bool = False) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE,
            str(run),
            mode,
            str(out),
            str(warm),
            "cache" if cache else "no-cache",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=str(out.parent),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(
    not os.path.exists("/proc/self/io"),
    reason="the kernel's count of bytes read (/proc/self/io) is Linux's",
)
def test_report_reads_the_run_once(tmp_path) -> None:
    run, warm = tmp_path / "run", tmp_path / "warm"
    generate_run(
        str(run),
        RunSpec(
            ranks=16, steps=60, seed=7, straggler=(5, "fwd", 30.0), start_us=1_796_000_000_000_000
        ),
    )
    generate_run(str(warm), RunSpec(ranks=2, steps=8, seed=7, start_us=1_796_000_000_000_000))
    size = sum(path.stat().st_size for path in (run / "structured_logs").iterdir())
    assert size > 4_000_000  # large enough that a second read stands out from everything else read
    report = _probe(run, "report", tmp_path / "report.html", warm)
    summary = _probe(run, "summarize", tmp_path / "unused.html", warm)
    assert (tmp_path / "report.html").stat().st_size > 1_000_000
    assert report["duckdb"] is False  # no second reader loaded ...
    # ... each file opened as summarize opens it ...
    assert report["opens"] == summary["opens"] and len(report["opens"]) == 16
    # ... and no more of the run read than summarize reads (its heads and torn-tail checks
    # included): a second read would add `size` again. Plotly's JavaScript, embedded in the page, is
    # read once more for it.
    extra = report["read"] - report["plotly_js"] - summary["read"]
    assert extra < size // 4, (extra, size, report, summary)


@pytest.mark.skipif(
    not os.path.exists("/proc/self/io"),
    reason="the kernel's count of bytes read (/proc/self/io) is Linux's",
)
def test_a_second_report_reads_what_summarize_cached_not_the_run(tmp_path) -> None:
    """The report's one read is summarize's, cache included: after a cached summarize, a report
    reads a fraction of the run."""
    run, warm = tmp_path / "run", tmp_path / "warm"
    generate_run(
        str(run),
        RunSpec(
            ranks=16, steps=60, seed=7, straggler=(5, "fwd", 30.0), start_us=1_796_000_000_000_000
        ),
    )
    generate_run(str(warm), RunSpec(ranks=2, steps=8, seed=7, start_us=1_796_000_000_000_000))
    size = sum(path.stat().st_size for path in (run / "structured_logs").iterdir())
    first = _probe(run, "summarize", tmp_path / "unused.html", warm, cache=True)
    report = _probe(run, "report", tmp_path / "report.html", warm, cache=True)
    assert first["read"] > size and report["duckdb"] is False
    assert report["read"] - report["plotly_js"] < size // 4, (report, size)
    assert (tmp_path / "report.html").stat().st_size > 1_000_000
