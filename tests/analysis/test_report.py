"""`otel-titan report` on generated runs, opened in a real browser (headless Chromium, puppeteer-core, offline).

The browser driver is `tests/browser/report_page.js` (the set-up of the Perfetto
UI tests: scripts/setup.sh installs Chromium and puppeteer-core; where they are
missing the browser tests skip and say why). Every request other than the
file itself is recorded and aborted: the report must work with no network.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("plotly")

from benchmarks.generate_run import RunSpec, generate_run  # noqa: E402
from otel_titan.analysis.report import _heatmap_bins, bin_size, write_report  # noqa: E402
from otel_titan.analysis.sql import open_run  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.helpers import processes  # noqa: E402

BROWSER_DIR = REPO / "tests" / "browser"
STRAGGLER = (13, "fwd", 40.0)


def _missing() -> str | None:
    if shutil.which("chromium") is None:
        return "chromium is not installed (scripts/setup.sh installs it with apt-get when run as root)"
    if shutil.which("node") is None:
        return "node is not installed"
    if not (BROWSER_DIR / "node_modules" / "puppeteer-core").is_dir():
        return "puppeteer-core is not installed in tests/browser (scripts/setup.sh runs npm ci there)"
    return None


browser = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def open_in_browser(report: Path, screenshot: Path | None = None) -> dict:
    command = ["node", str(BROWSER_DIR / "report_page.js"), str(report), shutil.which("chromium") or "chromium"]
    if screenshot is not None:
        command.append(str(screenshot))
    # processes.run kills the node driver and its Chromium (the whole tree) on a timeout.
    result = processes.run(command, capture_output=True, text=True, timeout=180, cwd=BROWSER_DIR)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report-run")
    generate_run(str(out), RunSpec(ranks=32, steps=30, seed=7, straggler=STRAGGLER, start_us=1_796_000_000_000_000))
    return out


@browser
def test_report_renders_offline(run) -> None:
    result = write_report(run)
    assert result.path == str(run / "analysis" / "report.html")
    page = open_in_browser(Path(result.path))
    assert page["console_errors"] == [] and page["page_errors"] == []
    assert page["requests"] == []
    assert page["sections"] == ["Headline", "Step time by rank", "Arrival at the step-closing collective", "Per-phase time by rank",
                                "Scalars over steps", "Stragglers and clocks (summarize)", "Clock offsets"]
    figures = {f["id"]: f for f in page["figures"]}
    assert list(figures) == ["fig-heatmap", "fig-arrival", "fig-phases", "fig-scalar-loss", "fig-clocks"]
    for figure in figures.values():
        assert figure["traces"] > 0 and figure["drawn"] > 0 and figure["width"] > 300 and figure["height"] > 200, figure
    # Small run: one cell per rank and step (the last step's column is empty: it has no end).
    assert (figures["fig-heatmap"]["rows"], figures["fig-heatmap"]["cols"]) == (32, 30)
    html = Path(result.path).read_text()
    # Plotly's JavaScript is in the file once; nothing is loaded from elsewhere.
    assert "<script src" not in html and "<link" not in html and "<iframe" not in html
    assert len(re.findall(r"plotly\.js v\d", html)) == 1


@browser
def test_straggler_is_marked(run) -> None:
    rank, phase, _ = STRAGGLER
    result = write_report(run, run / "r2.html")
    html = Path(result.path).read_text()
    # The phase figure marks the straggler by name; the findings table lists it.
    phases = html[html.index('id="fig-phases"'):]
    assert f"rank {rank}" in phases[: phases.index("</script>")]
    findings = html[html.index("id=findings"):]
    assert re.search(rf"<td>{phase}</td><td>{rank}</td>", findings)


@browser
def test_binning_keeps_the_slowest(tmp_path) -> None:
    out = tmp_path / "wide"
    generate_run(str(out), RunSpec(ranks=64, steps=300, seed=9, start_us=1_796_000_000_000_000))
    result = write_report(out, tmp_path / "wide.html", max_cells=1000)
    rank_bin, step_bin = _heatmap_bins(64, 300, 1000)
    assert (rank_bin, step_bin) == (11, 2)
    page = open_in_browser(Path(result.path))
    assert page["console_errors"] == [] and page["requests"] == []
    heat = next(f for f in page["figures"] if f["id"] == "fig-heatmap")
    assert (heat["rows"], heat["cols"]) == (6, 150) and heat["rows"] * heat["cols"] <= 1000
    db = open_run(out)
    db.load()
    slowest = db.con.execute("SELECT max(duration_ms) FROM steps").fetchone()[0]
    assert heat["zmax"] == pytest.approx(round(slowest, 1), abs=0.051)


def test_bins_for_the_target_size() -> None:
    # 1,024 ranks x 10,000 steps: 200 step columns of 50 steps, ranks in pairs: about 100,000 cells.
    rank_bin, step_bin = _heatmap_bins(1024, 10_000, 200_000)
    assert (rank_bin, step_bin) == (2, 50)
    assert bin_size(10_000, 2000) == 5


def test_cli_and_missing_plotly(tmp_path, run) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "otel_titan.cli", "report", str(run), "-o", str(tmp_path / "x.html")], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "report: " in done.stdout and (tmp_path / "x.html").stat().st_size > 1_000_000
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['plotly'] = None\nsys.modules['plotly.graph_objects'] = None\n")
    without = subprocess.run([sys.executable, "-m", "otel_titan.cli", "report", str(run), "-o", str(tmp_path / "y.html")], capture_output=True, text=True,
                             env={**env, "PYTHONPATH": f"{blocker}{os.pathsep}{REPO}"}, timeout=120)
    assert without.returncode == 2 and "pip install otel-titan[analysis]" in without.stderr and "Traceback" not in without.stderr
    assert not (tmp_path / "y.html").exists()
    missing = subprocess.run([sys.executable, "-m", "otel_titan.cli", "report", str(tmp_path / "nowhere")], capture_output=True, text=True, env=env, timeout=60)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
