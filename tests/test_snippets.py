"""Every code block of the README and the docs runs as written (issue 28 items 7 and 9).

The README's Quickstart failed when pasted (``NameError: loaded_step``). Here every fenced
``python``, ``bash`` or ``sh`` block of every page (README.md, collector-config/README.md and every
docs/*.md, found by globbing, so a new page is covered the day it lands) is run, each in a fresh
process, in a folder like the reader's after ``make train``: a real run as ``outputs/``, the
project's ``.venv`` (activated for bash: ``otel-titan`` on the PATH). A block that cannot run there
says so just above it, visibly in the page's source and with its reason::

    <!-- snippet: not run (starts a Dask cluster; tests/analysis/workers/test_executors.py runs one)
    -->

``<!-- snippet: preamble -->`` marks a block whose names the later python blocks of its page use: it
is run before each of them (the reader sees it on the page, above them).
``<!-- snippet: quoted from PATH -->`` marks a block copied from a file of the repository: it must
be
there verbatim, with its indentation.
``<!-- snippet: save as NAME -->`` marks a python block the page tells the reader to save as NAME (a
training script the next commands launch): it is run, and written as NAME for the page's later
blocks.

Quoted places in the code (``tests/helpers/hang_workload.py:49 read_shard``, or a frame's
``"file": ..., "line": ..., "function": ...``) must point at a line inside that function today.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers import processes

PAGES = sorted(
    {REPO / "README.md", REPO / "collector-config" / "README.md", *(REPO / "docs").rglob("*.md")}
)
LANGUAGES = {"python": "python", "bash": "bash", "sh": "bash", "shell": "bash", "console": "bash"}
_FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```\s*$", flags=re.S | re.M)
_MARKER = re.compile(r"<!--\s*snippet:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str  # "python" or "bash"
    code: str
    marker: str  # "" (run it), "preamble", "not run (...)", "quoted from PATH"

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's python and shell blocks, with the marker of the line just above each (blank lines
    skipped)."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        language = LANGUAGES.get(match.group(1).lower())
        if language is None:
            continue
        above = [line for line in text[: match.start()].splitlines() if line.strip()]
        marker = _MARKER.search(above[-1]) if above else None
        found.append(
            Block(
                page,
                text[: match.start()].count("\n") + 1,
                language,
                match.group(2),
                marker.group(1) if marker else "",
            )
        )
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
RUNNABLE = [
    block
    for block in ALL_BLOCKS
    if block.marker in ("", "preamble") or block.marker.startswith("save as ")
]


def test_every_marker_is_known_and_says_why():
    assert len(ALL_BLOCKS) > 20 and len(RUNNABLE) > 10  # the discovery saw the pages' blocks
    for block in ALL_BLOCKS:
        marker = block.marker
        ok = (
            marker in ("", "preamble")
            or re.fullmatch(r"not run \(.{10,}\)", marker)
            or re.fullmatch(r"(quoted from|save as) \S+", marker)
        )
        assert ok, (
            f"{block.name}: unknown or reasonless snippet marker {marker!r} (want 'not run "
            "(why)', 'preamble', 'save as NAME' or 'quoted from PATH')"
        )
        assert not marker.startswith("save as ") or block.language == "python", (
            f"{block.name}: only python blocks are saved as files"
        )
        assert marker != "preamble" or block.language == "python", (
            f"{block.name}: only python blocks are preambles"
        )


@pytest.mark.parametrize(
    "block", [b for b in ALL_BLOCKS if b.marker.startswith("quoted from ")], ids=lambda b: b.name
)
def test_a_quoted_block_is_in_its_file_verbatim(block):
    source = REPO / block.marker.removeprefix("quoted from ")
    assert source.is_file(), f"{block.name} quotes a missing file {source}"
    assert block.code in source.read_text(encoding="utf-8"), (
        f"{block.name}: not (or no longer) in {source.relative_to(REPO)}:\n{block.code}"
    )


@pytest.fixture(scope="module")
def reader_folder(tmp_path_factory) -> Path:
    """A folder as after `make train`: a real run as outputs/ and the project's .venv."""
    from benchmarks.generate_run import RunSpec, generate_run

    folder = tmp_path_factory.mktemp("reader")
    (folder / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    generate_run(
        str(folder / "outputs"), RunSpec(ranks=4, steps=8, seed=1, start_us=1_796_000_000_000_000)
    )
    return folder


def _preambles(block: Block) -> str:
    return "".join(
        b.code for b in blocks(block.page) if b.marker == "preamble" and b.line < block.line
    )


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.name)
def test_the_block_runs_as_written(block, reader_folder, tmp_path):
    # Each block in its own copy of the reader's folder (a block may write into outputs/).
    folder = tmp_path / "reader"
    folder.mkdir()
    (folder / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    processes.run(
        ["cp", "-r", str(reader_folder / "outputs"), str(folder / "outputs")],
        check=True,
        timeout=60,
    )
    env = {
        "PATH": f"{Path(sys.prefix) / 'bin'}{os.pathsep}/usr/bin:/bin",
        "HOME": str(tmp_path),
        "VIRTUAL_ENV": sys.prefix,
        "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(tmp_path / "cache")),
        "OTEL_TITAN_PROCESS_FIGURES": "0",
    }
    for earlier in blocks(block.page):
        if earlier.marker.startswith("save as ") and earlier.line < block.line:
            (folder / earlier.marker.removeprefix("save as ")).write_text(earlier.code)
    if block.language == "python":
        script = folder / "snippet.py"
        script.write_text(_preambles(block) + block.code)
        command = [sys.executable, str(script)]
    else:
        script = folder / "snippet.sh"
        script.write_text("set -euo pipefail\n" + block.code)
        command = ["bash", str(script)]
    done = processes.run(command, capture_output=True, text=True, env=env, cwd=folder, timeout=300)
    assert done.returncode == 0, (
        f"{block.name} fails as written:\n{block.code}\n--- stdout\n{done.stdout[-2000:]}\n--- "
        f"stderr\n{done.stderr[-3000:]}"
    )


def test_the_readme_quickstart_writes_a_run_when_pasted(tmp_path):
    """Issue 28 item 7: the Quickstart, saved as train.py as the README says and run; the run it
    writes has its spans."""
    (quickstart,) = [
        b
        for b in blocks(REPO / "README.md")
        if b.language == "python" and "init_structured_logger" in b.code and "for step" in b.code
    ]
    assert quickstart.marker == ""
    (tmp_path / "train.py").write_text(quickstart.code)
    done = processes.run(
        [sys.executable, "train.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "OTEL_TITAN_PROCESS_FIGURES": "0"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "outputs").is_dir(), done.stdout + done.stderr
    from otel_titan.analysis import summarize_run

    summary = summarize_run(str(tmp_path / "outputs"))
    (process,) = summary.processes
    assert process.closed_cleanly and process.last_step == 20
    assert {"fwd_bwd", "optimizer"} <= {phase.name for phase in summary.phases}


# -- quoted places: PATH.py:LINE FUNCTION, PATH.py:LINE:FUNCTION, and frames' file/line/function
# -------------------
_PLACE = re.compile(r"(?<![\w/.])((?:[\w.-]+/)*[\w.-]+\.py):(\d+)(?:[: ]([A-Za-z_]\w*))?")
_FRAME = re.compile(r'"file":\s*"([^"]+\.py)",\s*"line":\s*(\d+),\s*"function":\s*"(\w+)"')


@functools.cache
def _functions(path: Path) -> list[tuple[str, int, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.name, node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def _resolve(name: str) -> Path | None:
    """The repository's file a doc names: by its path, or by its bare name where one file has it."""
    if (REPO / name).is_file():
        return REPO / name
    if "/" in name:
        return None
    found = [
        path
        for folder in ("otel_titan", "tests", "examples", "benchmarks", "scripts")
        for path in (REPO / folder).rglob(name)
    ]
    return found[0] if len(found) == 1 else None


def _quoted_places() -> list[tuple[str, Path, int, str | None]]:
    places = []
    for page in [*PAGES]:
        text = page.read_text(encoding="utf-8")
        for pattern in (_PLACE, _FRAME):
            for match in pattern.finditer(text):
                path = _resolve(match.group(1))
                # an example's file (train.py) is not a place in this repository
                if path is not None:
                    places.append(
                        (
                            f"{page.relative_to(REPO)}:{text[: match.start()].count(chr(10)) + 1}",
                            path,
                            int(match.group(2)),
                            match.group(3),
                        )
                    )
    return places


def test_quoted_line_numbers_point_into_the_function_they_name():
    places = _quoted_places()
    # docs/hangs.md's walk-through is checked
    assert any(path.name == "hang_workload.py" for _, path, _, _ in places)
    stale = []
    for where, path, line, function in places:
        lines = path.read_text(encoding="utf-8").splitlines()
        if not (1 <= line <= len(lines) and lines[line - 1].strip()):
            stale.append(f"{where}: {path.relative_to(REPO)}:{line} is not a line of code")
        elif function is not None and function != "module":
            inside = [name for name, first, last in _functions(path) if first <= line <= last]
            if function not in inside:
                stale.append(
                    f"{where}: {path.relative_to(REPO)}:{line} is in {inside or 'no function'}, "
                    f"not in {function}"
                )
    assert not stale, "stale line numbers in the docs:\n" + "\n".join(stale)
