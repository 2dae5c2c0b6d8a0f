#!/usr/bin/env bash
# Create .venv and install otel-titan with its pinned development dependencies.
# Idempotent: re-running is instant unless requirements-dev.txt, requirements-nodeps.txt or
# pyproject.toml changed. A failed install fails the set-up (exit status 1, says so) and leaves
# no stamp, so the next run installs again instead of trusting a half-built .venv.
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
failed() {
  echo "setup: FAILED: $1." >&2
  echo "setup: .venv is not marked as set up: fix the cause and run 'make setup' again." >&2
  exit 1
}
want=$(cat requirements-dev.txt requirements-nodeps.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "setup: installing pinned dependencies into .venv (torch is the slow one, about a minute)"
  rm -f "$stamp"  # from here until the stamp is written, .venv is not known to be complete
  # pip's messages are shown as they come, less one harmless note about a missing --find-links
  # folder; the `if` sees pip's own exit status (pipefail, and the filter never fails).
  if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt 2>&1 \
      | { grep -v "is ignored: it is neither a file nor a directory" || true; }; then
    failed "pip could not install requirements-dev.txt (its messages are above)"
  fi
  if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-nodeps.txt; then
    failed "pip could not install requirements-nodeps.txt (its messages are above)"
  fi
  if ! .venv/bin/python -c 'import otel_titan, torch, pytest, rotel' >/dev/null; then
    failed "the install finished but otel_titan, torch, pytest or rotel cannot be imported (see above)"
  fi
  echo "$want" > "$stamp"
fi
