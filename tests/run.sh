#!/usr/bin/env bash
# Runs the whole stormglass test suite on a fresh machine: installs what the tests need when
# it is missing (cargo-nextest; Debian's prometheus and prometheus-alertmanager), checks
# formatting and lints, then runs every test with cargo-nextest.
# Usage: bash tests/run.sh [extra nextest args]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "tests/run.sh: cargo is required (https://rustup.rs)" >&2
  exit 1
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "tests/run.sh: installing cargo-nextest" >&2
  cargo install --locked cargo-nextest
fi

# The Prometheus tests start real Prometheus and Alertmanager servers and use promtool and
# amtool: Debian's packages (the services they would start are not needed and stay off).
if ! command -v promtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null; then
  echo "tests/run.sh: installing prometheus and prometheus-alertmanager" >&2
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
    prometheus prometheus-alertmanager
fi

# The coarse-clock test sends spans with the OpenTelemetry JS SDK's own OTLP exporters
# (tests/js, versions pinned by its package-lock.json): Node.js from Debian if missing.
if ! command -v npm >/dev/null; then
  echo "tests/run.sh: installing nodejs and npm" >&2
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends nodejs npm
fi
if [ ! -d tests/js/node_modules ]; then
  (cd tests/js && npm ci --no-audit --no-fund --loglevel=error)
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo nextest run --workspace --locked --no-fail-fast "$@"
