#!/usr/bin/env bash
# Create .venv and install otel-titan with its pinned development dependencies.
# Idempotent: re-running is instant unless requirements-dev.txt or pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "otel-titan needs Python >= 3.10 (found: $("$PYTHON" --version 2>&1)); set PYTHON=..." >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PYTHON" --version)"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.otel-titan-setup
want=$(cat requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "setup: installing pinned dependencies into .venv (torch is the slow one, about a minute)"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
  .venv/bin/python -c 'import otel_titan, torch, pytest, rotel' >/dev/null
  echo "$want" > "$stamp"
fi
