"""`otel-titan report` (report/write.py, and the page it writes) on generated runs, opened in a real
browser (headless Chromium, puppeteer-core, offline).

The browser driver is `tests/browser/report_page.js` (the set-up of the Perfetto
UI tests: scripts/setup-tests.sh installs Chromium and puppeteer-core; where they are
missing the browser tests skip and say why). Every request other than the
file itself is recorded and aborted: the report must work with no network.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("plotly")

from benchmarks.generate_run import RunSpec, generate_run
from otel_titan.analysis.model.collect import read_model, summarize_run
from otel_titan.analysis.read.selection import RunSelection
from otel_titan.analysis.report import bin_size, write_report
from otel_titan.analysis.report.axes import heatmap_bins
from tests.conftest import REPO
from tests.helpers import processes

BROWSER_DIR = REPO / "tests" / "browser"
STRAGGLER = (13, "fwd", 40.0)


def _missing() -> str | None:
    if shutil.which("chromium") is None:
        return "chromium is not installed (scripts/setup-tests.sh, run by make test, installs it with apt-get when run as root)"
    if shutil.which("node") is None:
        return "node is not installed"
    if not (BROWSER_DIR / "node_modules" / "puppeteer-core").is_dir():
        return "puppeteer-core is not installed in tests/browser (scripts/setup-tests.sh, run by make test, runs npm ci there)"
    return None


browser = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def open_in_browser(report: Path, screenshot: Path | None = None) -> dict:
    command = [
        "node",
        str(BROWSER_DIR / "report_page.js"),
        str(report),
        shutil.which("chromium") or "chromium",
    ]
    if screenshot is not None:
        command.append(str(screenshot))
    # processes.run kills the node driver and its Chromium (the whole tree) on a timeout.
    result = processes.run(command, capture_output=True, text=True, timeout=180, cwd=BROWSER_DIR)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report-run")
    generate_run(
        str(out),
        RunSpec(ranks=32, steps=30, seed=7, straggler=STRAGGLER, start_us=1_796_000_000_000_000),
    )
    return out


@browser
def test_report_renders_offline(run) -> None:
    result = write_report(run)
    assert result.path == str(run / "analysis" / "report.html")
    page = open_in_browser(Path(result.path))
    assert page["console_errors"] == [] and page["page_errors"] == []
    assert page["requests"] == []
    assert page["sections"] == [
        "Headline",
        "Step time by rank",
        "Arrival at the step-closing collective",
        "Per-phase time by rank",
        "Scalars over steps",
        "Stragglers and clocks (summarize)",
        "Clock offsets",
    ]
    figures = {f["id"]: f for f in page["figures"]}
    assert list(figures) == [
        "fig-heatmap",
        "fig-arrival",
        "fig-phases",
        "fig-scalar-0",
        "fig-clocks",
    ]
    for figure in figures.values():
        assert (
            figure["traces"] > 0
            and figure["drawn"] > 0
            and figure["width"] > 300
            and figure["height"] > 200
        ), figure
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
    # The phase figure marks the straggler by name; the findings table lists it, with human
    # headings.
    end = html.index('Plotly.newPlot("fig-phases"')
    assert f"rank {rank}" in html[html.rindex("<script", 0, end) : end]
    findings = html[html.index("id=findings") :]
    assert re.search(
        rf"<td>straggler</td><td>phase {phase}</td><td><span class=named-rank "
        rf"data-source='training' data-rank='{rank}'>rank {rank}</span></td>",
        findings,
    )


@browser
def test_binning_keeps_the_slowest(tmp_path) -> None:
    out = tmp_path / "wide"
    generate_run(str(out), RunSpec(ranks=64, steps=300, seed=9, start_us=1_796_000_000_000_000))
    result = write_report(out, tmp_path / "wide.html", max_cells=1000)
    rank_bin, step_bin = heatmap_bins(64, 300, 1000)
    assert (rank_bin, step_bin) == (11, 2)
    page = open_in_browser(Path(result.path))
    assert page["console_errors"] == [] and page["requests"] == []
    heat = next(f for f in page["figures"] if f["id"] == "fig-heatmap")
    assert (heat["rows"], heat["cols"]) == (6, 150) and heat["rows"] * heat["cols"] <= 1000
    _, grid = read_model(RunSelection.of(out))
    slowest = max(
        ms
        for per_rank in grid.step_ms.values()
        for steps in per_rank.values()
        for ms in steps.values()
    )
    assert heat["zmax"] == pytest.approx(round(slowest, 1), abs=0.051)


def test_bins_for_the_target_size() -> None:
    # 1,024 ranks x 10,000 steps: 200 step columns of 50 steps, ranks in pairs: about 100,000 cells.
    rank_bin, step_bin = heatmap_bins(1024, 10_000, 200_000)
    assert (rank_bin, step_bin) == (2, 50)
    assert bin_size(10_000, 2000) == 5


def test_cli_and_missing_plotly(tmp_path, run) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_titan.cli",
            "report",
            str(run),
            "-o",
            str(tmp_path / "x.html"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "report: " in done.stdout and (tmp_path / "x.html").stat().st_size > 1_000_000
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nsys.modules['plotly'] = None\nsys.modules['plotly.graph_objects'] = None\n"
    )
    without = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_titan.cli",
            "report",
            str(run),
            "-o",
            str(tmp_path / "y.html"),
        ],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": f"{blocker}{os.pathsep}{REPO}"},
        timeout=120,
    )
    # ExitCode.UNAVAILABLE
    assert (
        without.returncode == 5
        and f"pip install '{REPO}[analysis]'" in without.stderr
        and "Traceback" not in without.stderr
    )
    assert not (tmp_path / "y.html").exists()
    missing = subprocess.run(
        [sys.executable, "-m", "otel_titan.cli", "report", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


IMPORTS = r"""
import sys
from otel_titan.cli import main
code = main(["report", sys.argv[1], "-o", sys.argv[2], "--no-progress"])
print(sorted(m for m in ("plotly.graph_objects", "plotly.graph_objs", "plotly.io", "plotly.offline", "plotly.basedatatypes") if m in sys.modules), code)
"""


def test_the_report_imports_no_plotly_module(tmp_path, run) -> None:
    """Issue 30: the figures are plain dicts, so `report` pays neither Plotly's figure classes
    (validation, copies) nor their imports."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS, str(run), str(tmp_path / "x.html")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[] 0", done.stdout
    assert (tmp_path / "x.html").stat().st_size > 1_000_000


def test_the_look_is_plotlys() -> None:
    """The template and the colour scale the figures carry are those Plotly's own figures carried
    (`update_layout(template=...)`, "Viridis")."""
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    from otel_titan.analysis.report.data import plotly_js, plotly_template
    from otel_titan.analysis.report.heatmap import VIRIDIS

    assert plotly_template("plotly_white") == pio.templates["plotly_white"].to_plotly_json()
    # read once per process
    assert plotly_template("plotly_white") is plotly_template("plotly_white")
    assert VIRIDIS == [list(stop) for stop in go.Heatmap(colorscale="Viridis").colorscale]
    assert plotly_js() == get_plotlyjs()


def _ranks_named_on_the_page(page: dict) -> set[int]:
    """Every rank the page names as a finding: in its text, its tables and the labels its figures
    draw ("rank N")."""
    return {int(n) for n in re.findall(r"\brank (\d+)\b", page["text"] + "\n" + page["svg_text"])}


def _ranks_named_by_summarize(run_dir: Path) -> set[int]:
    """The ranks summarize's own output names: hang suspects (its Hang section) and stragglers of
    every kind."""
    summary = summarize_run(run_dir)
    named = {s.rank for s in summary.hang.suspects} if summary.hang is not None else set()
    named |= {p.rank for p in summary.processes if p.hang_suspect}
    for group in summary.stragglers:
        named |= (
            set(group.straggler_ranks)
            | {row["rank"] for row in group.phase_stragglers}
            | {row["rank"] for row in group.arrival_stragglers}
        )
    return named


@browser
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_clean_run_names_no_rank(tmp_path, seed) -> None:
    """Issue 18 item 11: the report once applied its own |z| >= 3.5 to 64 ranks x 6 phases and named
    somebody on every clean run."""
    out = tmp_path / "clean"
    generate_run(str(out), RunSpec(ranks=64, steps=20, seed=seed, start_us=1_796_000_000_000_000))
    assert _ranks_named_by_summarize(out) == set()  # summarize finds nothing here ...
    page = open_in_browser(Path(write_report(out, tmp_path / "clean.html").path))
    assert page["named_ranks"] == []
    # ... and neither does the report, in any text or mark
    assert _ranks_named_on_the_page(page) == set()
    phases = page["axes"]["fig-phases"]
    # no marked points at all
    assert [t["name"] for t in phases["traces"] if t["type"] != "box"] == []


@browser
def test_a_straggler_is_named_exactly_as_summarize_names_it(tmp_path) -> None:
    out = tmp_path / "slow"
    generate_run(
        str(out),
        RunSpec(
            ranks=64, steps=20, seed=5, straggler=(41, "bwd", 30.0), start_us=1_796_000_000_000_000
        ),
    )
    assert _ranks_named_by_summarize(out) == {41}
    page = open_in_browser(Path(write_report(out, tmp_path / "slow.html").path))
    assert _ranks_named_on_the_page(page) == {41}
    assert {rank for _, rank in page["named_ranks"]} == {41}
    marked = [t for t in page["axes"]["fig-phases"]["traces"] if t["type"] != "box"]
    assert len(marked) == 1 and set(marked[0]["text"]) == {"rank 41"}


@browser
def test_a_hung_rank_is_named_as_summarize_names_it(tmp_path) -> None:
    out = tmp_path / "hung"
    generate_run(
        str(out),
        RunSpec(
            ranks=16,
            steps=20,
            seed=3,
            hung=(9, 12),
            black_boxes=True,
            start_us=1_796_000_000_000_000,
        ),
    )
    assert _ranks_named_by_summarize(out) == {9}
    page = open_in_browser(Path(write_report(out, tmp_path / "hung.html").path))
    assert _ranks_named_on_the_page(page) == {9}
    assert page["named_ranks"][0] == ["training", 9]
    assert "Hang: " in page["text"]  # summarize's Hang section, in the headline


# Strings that would run script, or change the page, if any context took them as markup.
HOSTILE = {
    "span": "</script><script>window.pwned='span'</script>",
    "tag": "<img src=x onerror=\"window.pwned='tag'\">",
    "scalar": "</script><script>window.pwned='scalar';document.title='pwned'</script>",
    "source": '"><svg onload="window.pwned=\'source\'">',
    "host": "<b onmouseover=window.pwned='host'>node</b>",
    "run": "</title><script>document.title='pwned'</script>",
    "file": "\"><img src=x onerror=window.pwned='file'>",
}


def _hostile_run(root: Path) -> Path:
    """A generated 8-rank run whose span, tag, scalar, source, host, run and file names are all
    hostile."""
    out = root / ("run " + HOSTILE["file"])
    generate_run(
        str(out),
        RunSpec(
            ranks=8, steps=12, seed=3, straggler=(5, "fwd", 40.0), start_us=1_796_000_000_000_000
        ),
    )
    logs = out / "structured_logs"
    for index, path in enumerate(sorted(logs.glob("*.jsonl"))):
        records = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            name = record.get("log_type_name") or ""
            if name in ("fwd_start", "fwd_end"):
                record["log_type_name"] = HOSTILE["span"] + name[3:]
                record["step_tags"] = [HOSTILE["tag"]]
            if record.get("event_name") == "loss":
                record["event_name"] = HOSTILE["scalar"]
            record["source"] = HOSTILE["source"]
            record["host_name"] = HOSTILE["host"] + str(index // 4)
            record["run_id"] = HOSTILE["run"]
            records.append(json.dumps(record))
        path.unlink()
        (logs / f"{HOSTILE['file']}.global_rank_{index}.jsonl").write_text(
            "\n".join(records) + "\n"
        )
    return out


@browser
def test_hostile_names_are_shown_never_run(tmp_path) -> None:
    """Issue 18 item 18: a scalar named </script><script>... ran inside report.html; every record
    string is now text."""
    out = _hostile_run(tmp_path)
    result = write_report(out, tmp_path / "hostile.html")
    html = Path(result.path).read_text()
    # No context took a record string as markup: nothing ran, the title is ours, no policy or script
    # error.
    page = open_in_browser(Path(result.path))
    assert page["pwned"] is None
    assert page["title"] == "otel-titan report: " + HOSTILE["run"]
    assert page["page_errors"] == [] and page["console_errors"] == [] and page["requests"] == []
    # The injected tags never reach the HTML as tags: only this page's own <script> elements, each
    # allowed by its hash.
    assert html.count("<script") == html.count("</script>") == 1 + len(page["figures"])
    # the page less its scripts (plotly.js holds "<svg" itself)
    markup = re.sub(r"<script[^>]*>.*?</script>", "", html, flags=re.S)
    assert "<img" not in markup and "<svg" not in markup and "<b " not in markup
    # ... and they are shown as written, in the page's text and in the figures' labels.
    seen = page["text"] + "\n" + page["svg_text"]
    for kind in ("span", "scalar", "source", "run"):
        assert HOSTILE[kind] in seen, kind
    assert HOSTILE["host"] + "0" in page["svg_text"]  # the clock-offset bars' labels
    assert HOSTILE["file"] in page["text"]  # the run folder, in the page's first line


def _reddish(colour: str) -> bool:
    """A colour that reads as a flag: red well above green and blue (``#d62728``,
    ``rgb(239,85,59)``)."""
    if colour.startswith("#"):
        r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    else:
        r, g, b = (float(v) for v in re.findall(r"[\d.]+", colour)[:3])
    return r > 1.5 * g and r > 1.5 * b


def _is_integer(label: str) -> bool:
    return re.fullmatch(r"−?\d[\d,]*", label) is not None


@browser
def test_the_pictures_read_right_at_1400_px(tmp_path) -> None:
    """Issue 18 item 22, checked as drawn in Chromium at 1,400 px: points drawn, one neutral colour,
    human tables, whole-number axes."""
    out = tmp_path / "two"
    generate_run(
        str(out),
        RunSpec(
            ranks=2, steps=12, seed=4, straggler=(1, "fwd", 60.0), start_us=1_796_000_000_000_000
        ),
    )
    # a learning rate: constant and small, as `make train`'s lr
    for path in (out / "structured_logs").glob("*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for record in lines:
            if record.get("event_name") == "loss":
                record["event_name"], record["value"] = "lr", 0.001
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    result = write_report(out, tmp_path / "two.html")
    page = open_in_browser(Path(result.path), tmp_path / "two.png")
    assert page["console_errors"] == [] and page["page_errors"] == []
    # nothing makes the page scroll sideways
    assert page["scroll_width"] <= page["client_width"] == 1400
    axes = page["axes"]
    # Per-phase: every rank drawn as a point (the text says "one point per rank"), in one neutral
    # colour; a log axis labelled at powers of ten only.
    phases = axes["fig-phases"]
    boxes = [t for t in phases["traces"] if t["type"] == "box"]
    assert boxes and all(t["boxpoints"] == "all" for t in boxes)
    assert phases["box_points_drawn"] == sum(t["points"] for t in boxes) == 2 * len(boxes)
    colours = {t["color"] for t in boxes} | {t["line_color"] for t in boxes}
    assert len(colours) == 1 and not _reddish(colours.pop())
    assert phases["y"]["type"] == "log" and len(phases["y"]["ticks"]) >= 2
    assert all(
        re.fullmatch(r"0\.0*1|10*", label.replace(",", "")) for label in phases["y"]["ticks"]
    ), phases["y"]["ticks"]
    # Red only for what summarize names: with 2 ranks there is no majority, so summarize shows the
    # difference and blames no one (issue 18 item 9), and nothing is marked
    # (test_a_straggler_is_named_exactly_as_summarize_names_it checks a named rank).
    verdicts = {f.verdict for f in summarize_run(out).straggler_findings()}
    assert "difference" in verdicts and "straggler" not in verdicts, verdicts
    assert [t for t in phases["traces"] if t["type"] != "box"] == []
    # Ranks and steps are whole numbers on every axis: 2 ranks read 0 and 1, never -0.5, 0.5.
    heat = axes["fig-heatmap"]
    assert sorted(heat["y"]["ticks"]) == ["0", "1"]
    assert heat["x"]["ticks"] and all(_is_integer(t) for t in heat["x"]["ticks"])
    assert all(_is_integer(t) for t in axes["fig-scalar-0"]["x"]["ticks"])
    # A constant 0.001 is drawn around 0.001, not on -1..1 where it looks like 0.
    low, high = axes["fig-scalar-0"]["y"]["range"]
    assert low < 0.001 < high and high - low <= 0.002, (low, high)
    assert "0.001" in axes["fig-scalar-0"]["y"]["ticks"]
    # The findings tables speak to people: no field names.
    assert page["table_headers"] and not [h for h in page["table_headers"] if "_" in h]


def _page_without_clock(path: str) -> str:
    """The page less the moment it was written (the one thing that differs between two writes of one
    run)."""
    return re.sub(r"written \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "written", Path(path).read_text())


def test_the_same_page_from_workers(tmp_path, run) -> None:
    """`--jobs 2` (worker interpreters: the grid's accumulators merged) draws the very page one
    process draws."""
    one = write_report(run, tmp_path / "one.html")
    two = write_report(run, tmp_path / "two.html", jobs=2)
    assert (one.figures, one.ranks, one.steps) == (two.figures, two.ranks, two.steps) == (5, 32, 30)
    assert _page_without_clock(one.path) == _page_without_clock(two.path)


def test_the_figures_are_the_models(tmp_path, run) -> None:
    """What the page draws is the model's: the heatmap's cells are summarize's step times, the phase
    points its per-step phase times."""
    import numpy as np

    from otel_titan.analysis.report.data import ReportData
    from otel_titan.analysis.report.heatmap import heatmap_sections
    from otel_titan.analysis.report.phases import phase_sections

    summary, grid = read_model(RunSelection.of(run))
    data = ReportData.of(summary, grid)
    assert (data.source, data.ranks, data.first_step, data.last_step) == ("training", 32, 1, 30)
    (heat, arrival), binning = heatmap_sections(np, data, 200_000)
    typed = heat[3]["data"][0]["z"]  # Plotly.js's typed array: the grid's float32 bytes
    assert (typed["dtype"], typed["shape"]) == ("f4", "32,30")
    z = np.frombuffer(base64.b64decode(typed["bdata"]), dtype="<f4").reshape(32, 30).astype(float)
    assert binning == "heatmap: one cell per rank and step" and z.shape == (32, 30)
    for rank, steps in grid.step_ms[("training", 0)].items():
        for step, ms in steps.items():
            assert z[rank, step - 1] == pytest.approx(round(ms, 1), abs=0.051)
    assert np.isnan(z[:, -1]).all()  # the last step has no end, so no time
    assert arrival[0] == "arrival" and grid.anchor == "all_reduce"
    (phases,) = phase_sections(np, data)
    fwd = next(trace for trace in phases[3]["data"] if trace["name"] == "fwd")
    per_step = grid.phases_by_rank("training")["fwd"]
    assert fwd["y"] == pytest.approx(
        [round(float(np.median(per_step[r])), 4) for r in sorted(per_step)]
    )
    rank, phase, _ = STRAGGLER
    assert max(zip(fwd["y"], fwd["text"]))[1] == f"rank {rank}"


def test_a_run_without_an_id_says_so(tmp_path) -> None:
    """torchtitan's files name no run: the page says "no run id", never "run None" or an empty "run
    ·"."""
    from tests.helpers.analysis import titan_file, titan_span, write_jsonl

    for rank in range(2):
        write_jsonl(
            titan_file(tmp_path, rank),
            [
                record
                for step in (1, 2, 3)
                for record in titan_span(
                    "fwd", step * 100.0, step * 100.0 + 50, rank=rank, step=step
                )
            ],
        )
    page = Path(write_report(tmp_path, tmp_path / "titan.html").path).read_text()
    meta = re.search(r"<p class=meta>(.*?)</p>", page).group(1)
    assert " · no run id · 2 ranks" in meta
    assert "run None" not in meta and "run  ·" not in meta
