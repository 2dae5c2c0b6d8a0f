#!/usr/bin/env bash
# Install a real Prometheus server (Debian's `prometheus` package) for the metrics tests
# (tests/exporters/test_metrics_prometheus.py). Idempotent: instant when `prometheus` is on PATH.
# As root with apt-get it is installed; elsewhere nothing happens and the tests skip, saying why.
# Never fails the set-up: a machine without apt still runs every other test.
set -uo pipefail
if command -v prometheus >/dev/null 2>&1; then
  echo "setup-prometheus: prometheus is installed ($(prometheus --version 2>&1 | head -n 1))"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-prometheus: prometheus is not installed and this is not root with apt-get: the Prometheus tests will be skipped"
  exit 0
fi
echo "setup-prometheus: installing Debian's prometheus package (apt; about a minute)"
# --no-install-recommends: the server binary alone, without the node exporter and its service.
if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }; then
  # The package may start a system service on :9090; the tests run their own on free ports.
  if command -v systemctl >/dev/null 2>&1; then systemctl stop prometheus >/dev/null 2>&1 || true; fi
  echo "setup-prometheus: installed ($(prometheus --version 2>&1 | head -n 1))"
else
  echo "setup-prometheus: apt-get could not install prometheus: the Prometheus tests will be skipped" >&2
fi
exit 0
