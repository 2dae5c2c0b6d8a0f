"""The layering of pyproject.toml's [tool.importlinter] holds, and the check would catch a break.

Layers, lowest first: schema → core → exporters → structured_logger → cli;
analysis on schema alone. An upward import (an exporter importing the `sl`
API) or a cycle fails here, in CI, rather than as "partially initialized
module" in a user's process.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"]


def _lint(cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LINT, "--no-cache"], cwd=cwd, env={**os.environ, "PYTHONPATH": cwd}, capture_output=True, text=True, timeout=300)


def test_contracts_hold() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_is_caught(tmp_path) -> None:
    shutil.copytree(os.path.join(ROOT, "otel_titan"), tmp_path / "otel_titan", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    records = tmp_path / "otel_titan" / "exporters" / "records.py"
    records.write_text(records.read_text() + textwrap.dedent("""
        from otel_titan.structured_logger import lifecycle  # an exporter reaching up into the sl.* API
    """))
    result = _lint(str(tmp_path))
    assert result.returncode != 0
    assert "otel_titan.exporters.records -> otel_titan.structured_logger.lifecycle" in result.stdout, result.stdout


def test_no_function_local_import_of_the_package() -> None:
    """No import of otel_titan hides inside a function to dodge a cycle (the layers make none necessary)."""
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
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                    if any(n == "otel_titan" or n.startswith("otel_titan.") for n in names):
                        offenders.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == [], "\n".join(offenders)


def test_the_receiver_reads_only_otlps_protobuf_classes_of_opentelemetry() -> None:
    """otel_titan.receive may import `opentelemetry.proto` (decoding), in `decode` only: never the SDK nor an exporter.

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
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for module in names:
                if module == "opentelemetry" or module.startswith("opentelemetry."):
                    found.setdefault(name, set()).add(module)
    assert set(found) == {"decode.py"}, found
    assert all(module.startswith("opentelemetry.proto.") for module in found["decode.py"]), found
