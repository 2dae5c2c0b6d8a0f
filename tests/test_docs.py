"""The docs say only what is true, where a machine can check it.

Every docs page is listed in the README (its Documentation section and its
Layout); no link or path in the docs leaves the repository (a reader of the
repository has nothing else); the README's data flow names the clocks the
training thread really reads; and docs/schema.md names the line a decorated
span's ``caller`` really points at, checked on a real record.
"""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path

from otel_titan import structured_logger as sl
from tests.conftest import REPO, data_records, jsonl_files, read_records

DOCS = sorted((REPO / "docs").glob("*.md"))
README = (REPO / "README.md").read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"no '## {title}' section"
    return match.group(1)


def test_every_docs_page_is_listed_in_the_readme():
    assert len(DOCS) >= 6
    documentation = _section(README, "Documentation")
    layout_docs = re.search(r"^docs/\s+(.*)$", _section(README, "Layout"), flags=re.M)
    assert layout_docs, "the Layout has no docs/ line"
    for page in DOCS:
        assert f"[docs/{page.name}](docs/{page.name})" in documentation, (
            f"{page.name} is missing from the README's Documentation section"
        )
        assert re.search(rf"\b{re.escape(page.stem)}\b", layout_docs.group(1)), (
            f"{page.stem} is missing from the README's Layout ({layout_docs.group(0)!r})"
        )


# Relative paths: markdown link targets, and any `../…` path written in the text.
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_UPWARD = re.compile(r"(?<![\w/.])((?:\.\./)+[\w.\-/]*)")


def _relative_targets(text: str) -> list[str]:
    targets = [
        t
        for t in _LINK.findall(text)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")
    ]
    return targets + _UPWARD.findall(text)


def test_no_link_or_path_in_the_docs_leaves_the_repository():
    checked = 0
    for page in [*DOCS, REPO / "README.md", REPO / "collector-config" / "README.md"]:
        for target in _relative_targets(page.read_text(encoding="utf-8")):
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(REPO), (
                f"{page.relative_to(REPO)} points outside the repository: {target}"
            )
            assert path.exists(), f"{page.relative_to(REPO)} points at a missing file: {target}"
            checked += 1
    assert checked > 10  # the check saw the docs' links


def test_the_readme_data_flow_names_the_clocks_the_training_thread_reads():
    """capture.py (the training thread's side) reads one clock; the README's diagram says so."""
    tree = ast.parse((REPO / "otel_titan" / "core" / "capture.py").read_text(encoding="utf-8"))
    clocks = {
        "time",
        "time_ns",
        "monotonic",
        "monotonic_ns",
        "perf_counter",
        "perf_counter_ns",
        "process_time",
        "process_time_ns",
        "thread_time",
        "thread_time_ns",
    }
    read = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "time"
        for alias in node.names
        if alias.name in clocks
    }
    read |= {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "time"
        and node.attr in clocks
    }
    assert read == {"perf_counter_ns"}
    flow = _section(README, "Data flow")
    assert "one clock" in flow and "two clocks" not in flow


_DECORATED = """\
import functools
from otel_titan import structured_logger as sl

def passthrough(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper

@sl.log_trace_span("alone")
async def alone():
    pass

@passthrough
@sl.log_trace_span("under_another")
async def under_another():
    pass

@sl.log_trace_span("called")
def called():
    pass

def calls_it():
    called()
"""


def test_a_decorated_span_s_caller_is_the_line_docs_schema_names(run_dir, tmp_path, monkeypatch):
    module = tmp_path / "decorated_module.py"
    module.write_text(_DECORATED)
    monkeypatch.syspath_prepend(str(tmp_path))
    import decorated_module

    sl.init_structured_logger("training", run_dir, rank=0, world_size=1)
    asyncio.run(decorated_module.alone())  # started by the event loop: no call site of user code
    asyncio.run(decorated_module.under_another())
    decorated_module.calls_it()
    assert sl.shutdown_structured_logger(timeout=10)
    starts = {
        r["log_type_name"]: r
        for r in data_records(read_records(jsonl_files(run_dir)[0]))
        if r["log_type_name"].endswith("_start")
    }
    lines = _DECORATED.splitlines()

    def line_of(record):
        return lines[int(record["caller"].split(":")[-2]) - 1]

    # Called from user code: the call site. Started by the event loop: the decorator line, not the
    # `def` line; with several decorators, the topmost one.
    assert line_of(starts["called_start"]) == "    called()" and starts["called_start"][
        "caller"
    ].endswith(":calls_it")
    assert line_of(starts["alone_start"]) == '@sl.log_trace_span("alone")'
    assert line_of(starts["under_another_start"]) == "@passthrough"
    assert starts["alone_start"]["caller"].endswith(":alone")

    caller_row = next(
        line
        for line in (REPO / "docs" / "schema.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| `caller` |")
    )
    decorator_part = caller_row.split("Decorator:", 1)[1]
    assert (
        "call site" in decorator_part
        and "`def` line" not in decorator_part
        and "topmost decorator" in decorator_part
    ), caller_row


def test_the_readme_cli_examples_run_as_written(tmp_path):
    """Issue 18 item 20: the README's CLI examples called `otel-titan`, which only .venv/bin holds:
    `command not found`.

    The "After the run" block is run as written, line by line, by bash with a plain PATH, in a
    folder holding the project's .venv and a real run as `outputs`: every command must succeed.
    """
    import shutil
    import sys

    from benchmarks.generate_run import RunSpec, generate_run
    from tests.helpers import processes

    block = re.search(
        r"```bash\n(.*?)```",
        _section(README, "After the run: which rank, which step, which phase?"),
        flags=re.S,
    )
    assert block, "no bash block in the README's 'After the run'"
    lines = [
        line
        for line in block.group(1).splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert any(line.startswith("otel-titan ") for line in lines)
    # nothing to install in the project's venv
    assert not [line for line in lines if line.startswith("pip ")]
    venv = Path(sys.prefix)
    assert (venv / "bin" / "otel-titan").exists(), "the tests run from the project's .venv"
    (tmp_path / ".venv").symlink_to(venv, target_is_directory=True)
    generate_run(
        str(tmp_path / "outputs"), RunSpec(ranks=4, steps=8, seed=1, start_us=1_796_000_000_000_000)
    )
    script = tmp_path / "readme.sh"
    script.write_text("set -euo pipefail\n" + "\n".join(lines) + "\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = processes.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "command not found" not in done.stderr
    for made in ("trace.json", "trace.pftrace", "report.html"):
        assert (tmp_path / "outputs" / "analysis" / made).stat().st_size > 0, made
    # it worked without the venv on the PATH beforehand
    assert shutil.which("otel-titan", path=env["PATH"]) is None
