"""The layering of pyproject.toml's [tool.importlinter] holds, and the check would catch a break.

Layers, lowest first: schema → core → exporters → structured_logger → cli;
analysis on schema alone, itself layered read → workers → model →
summarize | export | query → report | watch. An upward import (an exporter
importing the `sl` API, the reader importing the model) or a cycle fails here,
in CI, rather than as "partially initialized module" in a user's process.
Each forbidden edge is tried (`FORBIDDEN_EDGES`): a contract that no longer
catches one fails this test, not a user.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT = [
    sys.executable,
    "-c",
    "import sys; from importlinter.cli import lint_imports_command; "
    "sys.exit(lint_imports_command())",
]


def _lint(cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LINT, "--no-cache"],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": cwd},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_contracts_hold() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


#: (module file, the import added to it, what the linter must name): one of each kind of edge the
#: contracts forbid.
FORBIDDEN_EDGES = [
    (
        "exporters/records.py",
        "from otel_titan.structured_logger import lifecycle",
        "otel_titan.exporters.records -> otel_titan.structured_logger.lifecycle",
    ),
    (
        "core/clock.py",
        "from otel_titan.analysis.read import records",
        "otel_titan.core.clock -> otel_titan.analysis.read.records",
    ),
    (
        "structured_logger/runtime.py",
        "from otel_titan.analysis.read import runs",
        "otel_titan.structured_logger.runtime -> otel_titan.analysis.read.runs",
    ),
    (
        "analysis/read/filters.py",
        "import otel_titan.cli",
        "otel_titan.analysis.read.filters -> otel_titan.cli",
    ),
    (
        "analysis/model/timeline.py",
        "from otel_titan.core import clock",
        "otel_titan.analysis.model.timeline -> otel_titan.core.clock",
    ),
    (
        "analysis/model/hang.py",
        "import opentelemetry.trace",
        "otel_titan.analysis.model.hang -> opentelemetry",
    ),
    (
        "analysis/read/lines.py",
        "from otel_titan.analysis.model import wording",
        "otel_titan.analysis.read.lines -> otel_titan.analysis.model.wording",
    ),
    (
        "analysis/workers/shares.py",
        "from otel_titan.analysis.model import wording",
        "otel_titan.analysis.workers.shares -> otel_titan.analysis.model.wording",
    ),
    (
        "analysis/model/stragglers.py",
        "from otel_titan.analysis.summarize import text",
        "otel_titan.analysis.model.stragglers -> otel_titan.analysis.summarize.text",
    ),
    (
        "analysis/export/checks.py",
        "from otel_titan.analysis.summarize import text",
        "otel_titan.analysis.export.checks -> otel_titan.analysis.summarize.text",
    ),
    (
        "analysis/query/output.py",
        "from otel_titan.analysis.export import perfetto",
        "otel_titan.analysis.query.output -> otel_titan.analysis.export.perfetto",
    ),
    (
        "analysis/summarize/text.py",
        "from otel_titan.analysis import report",
        "otel_titan.analysis.summarize.text -> otel_titan.analysis.report",
    ),
    (
        "analysis/watch/screen.py",
        "from otel_titan.analysis import report",
        "otel_titan.analysis.watch.screen -> otel_titan.analysis.report",
    ),
    ("cli.py", "from otel_titan.core import clock", "otel_titan.cli -> otel_titan.core.clock"),
    ("schema.py", "import orjson", "otel_titan.schema -> orjson"),
]


def test_each_forbidden_edge_is_caught(tmp_path) -> None:
    """All the edges at once in a copy of the package: the linter must name every one (it reports
    each broken import)."""
    shutil.copytree(
        os.path.join(ROOT, "otel_titan"),
        tmp_path / "otel_titan",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    for module, line, _ in FORBIDDEN_EDGES:
        path = tmp_path / "otel_titan" / module
        path.write_text(
            path.read_text() + "\n" + line + "  # a forbidden edge, added by tests/test_layers.py\n"
        )
    result = _lint(str(tmp_path))
    assert result.returncode != 0
    report = " ".join(result.stdout.split())  # the linter wraps long lines
    missed = [expected for _, _, expected in FORBIDDEN_EDGES if expected not in report]
    assert missed == [], result.stdout


def test_a_new_analysis_module_must_join_a_layer(tmp_path) -> None:
    """The analysis contract is exhaustive: a module dropped into analysis/ without a place in the
    layers fails."""
    shutil.copytree(
        os.path.join(ROOT, "otel_titan"),
        tmp_path / "otel_titan",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    (tmp_path / "otel_titan" / "analysis" / "stray.py").write_text('"""Belongs to no layer."""\n')
    result = _lint(str(tmp_path))
    assert result.returncode != 0
    assert "otel_titan.analysis.stray" in result.stdout, result.stdout


def _outside_stdlib(source: str) -> list[str]:
    """Top-level names `source` imports that are not in the standard library (``from __future__``
    is)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return sorted(name for name in names if name not in sys.stdlib_module_names)


def test_the_schema_imports_the_standard_library_only() -> None:
    """schema.py is what any reader (ours, torchtitan's, a user's script) can import without
    installing anything."""
    with open(os.path.join(ROOT, "otel_titan", "schema.py"), encoding="utf-8") as handle:
        assert _outside_stdlib(handle.read()) == []
    # and the check itself is not blind: it sees a third-party import, a package import and a
    # function-local one
    assert _outside_stdlib(
        "import os\nimport msgspec\nfrom otel_titan import core\ndef f():\n    import orjson\n"
    ) == ["msgspec", "orjson", "otel_titan"]


def test_no_function_local_import_of_the_package() -> None:
    """No import of otel_titan hides inside a function to dodge a cycle (the layers make none
    necessary)."""
    offenders = []
    for folder, _, files in os.walk(os.path.join(ROOT, "otel_titan")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read(), path)
            for function in ast.walk(tree):
                if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(function):
                    names = (
                        [a.name for a in node.names]
                        if isinstance(node, ast.Import)
                        else [node.module or ""]
                        if isinstance(node, ast.ImportFrom)
                        else []
                    )
                    if any(n == "otel_titan" or n.startswith("otel_titan.") for n in names):
                        offenders.append(
                            f"{os.path.relpath(path, ROOT)}:{node.lineno}: {ast.unparse(node)}"
                        )
    assert offenders == [], "\n".join(offenders)


def test_the_receiver_reads_only_otlps_protobuf_classes_of_opentelemetry() -> None:
    """otel_titan.receive may import `opentelemetry.proto` (decoding), in `decode` only: never the
    SDK nor an exporter.

    The import contracts cannot say it (grimp sees every ``opentelemetry.*``
    import as ``opentelemetry``), so it is checked here on the source.
    """
    found = {}
    folder = os.path.join(ROOT, "otel_titan", "receive")
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for module in names:
                if module == "opentelemetry" or module.startswith("opentelemetry."):
                    found.setdefault(name, set()).add(module)
    assert set(found) == {"decode.py"}, found
    assert all(module.startswith("opentelemetry.proto.") for module in found["decode.py"]), found
