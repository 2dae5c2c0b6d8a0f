#!/usr/bin/env bash
# The tests' own tools, beyond .venv (scripts/setup.sh, run first by `make test`): what only the tests use,
# so that `make train` never waits for them. Each step says what it installs before it starts and how
# long it took; each is idempotent (instant when already there). A failed install fails the set-up.
#
#   1. Chromium and Node.js/npm (apt-get, as root; elsewhere the browser tests are skipped and say why), and
#      puppeteer-core (npm ci, pinned by tests/browser/package-lock.json, into tests/browser/node_modules):
#      the Perfetto UI tests (tests/analysis/test_perfetto_ui.py) and the report tests
#      (tests/analysis/report/test_write.py) open pages in headless Chromium driven by puppeteer-core.
#      tmux, for the tests that read a real terminal (tests/analysis/watch/test_screen.py, tests/analysis/test_workers_io.py).
#   2. scripts/setup-prometheus.sh, where it exists: the Prometheus server of the metrics tests.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup-tests: $*"; }
failed() {
  echo "setup-tests: FAILED: $1." >&2
  exit 1
}
step_started=0
begin() { step_started=$SECONDS; say "$*"; }
finish() { say "$* ($((SECONDS - step_started)) s)"; }

if [ -f tests/browser/package-lock.json ]; then
  as_root_with_apt=false
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then as_root_with_apt=true; fi
  missing=""
  command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
  command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
  command -v tmux >/dev/null 2>&1 || missing="$missing tmux"  # the terminal tests (watch's screen, escaping)
  if [ -z "$missing" ]; then
    say "chromium, npm and tmux: found"
  elif $as_root_with_apt; then
    begin "installing$missing with apt-get, for the browser tests (a few minutes on a fresh machine) ..."
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing; } \
      | { grep -E "^(Get|Unpacking|Setting up) " || true; } \
      || failed "apt-get could not install$missing (its messages are above)"
    finish "installed$missing"
  else
    say "note:$missing not installed and this is not root with apt-get: the browser tests will be skipped (they say why)" >&2
  fi
  if command -v npm >/dev/null 2>&1; then
    npm_stamp=tests/browser/node_modules/.otel-titan-setup
    npm_want=$(sha256sum tests/browser/package-lock.json | cut -d' ' -f1)
    if [ "$(cat "$npm_stamp" 2>/dev/null || true)" != "$npm_want" ]; then
      begin "installing puppeteer-core (npm ci) into tests/browser/node_modules ..."
      (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error) \
        || failed "npm ci in tests/browser could not install puppeteer-core (its messages are above)"
      echo "$npm_want" > "$npm_stamp"
      finish "installed puppeteer-core"
    else
      say "puppeteer-core: already installed"
    fi
  fi
fi

if [ -f scripts/setup-prometheus.sh ]; then
  begin "running scripts/setup-prometheus.sh (the metrics tests' Prometheus) ..."
  bash scripts/setup-prometheus.sh || failed "scripts/setup-prometheus.sh failed (its messages are above)"
  finish "scripts/setup-prometheus.sh done"
fi
say "ready"
