#!/usr/bin/env bash
# Create .venv and install otel-titan with its pinned development dependencies: what `make train` needs
# (torch, the OpenTelemetry SDK, the analysis extras), nothing more. The tools only the tests use (Chromium,
# puppeteer-core, ...) are installed by scripts/setup-tests.sh, which `make test` runs after this one.
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
  echo "setup: installing pinned dependencies into .venv (torch is the largest download: a minute or more on a fresh machine)"
  rm -f "$stamp"  # from here until the stamp is written, .venv is not known to be complete
  # pip's messages are shown as they come, less one harmless note about a --find-links folder that
  # does not exist (a pip configuration of the machine, not ours), from both installs; the `if` sees
  # pip's own exit status (pipefail, and the filter never fails).
  quiet_pip() {
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
      | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  }
  if ! quiet_pip -r requirements-dev.txt; then
    failed "pip could not install requirements-dev.txt (its messages are above)"
  fi
  if ! quiet_pip --no-deps -r requirements-nodeps.txt; then
    failed "pip could not install requirements-nodeps.txt (its messages are above)"
  fi
  if ! .venv/bin/python -c 'import otel_titan, torch, pytest, rotel' >/dev/null; then
    failed "the install finished but otel_titan, torch, pytest or rotel cannot be imported (see above)"
  fi
  echo "$want" > "$stamp"
  echo "setup: .venv is ready: run .venv/bin/otel-titan, or 'source .venv/bin/activate' first for a plain otel-titan"
fi
