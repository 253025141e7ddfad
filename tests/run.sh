#!/usr/bin/env bash
# Runs the whole stormglass test suite on a fresh machine: installs what the tests need when
# it is missing, checks formatting and lints, then runs every test with cargo-nextest.
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

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo nextest run --workspace --locked --no-fail-fast "$@"
