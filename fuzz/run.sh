#!/usr/bin/env bash
# Runs every fuzz target (libFuzzer, via cargo fuzz) for a bounded time from the committed
# seeds plus the corpus earlier runs grew; fails on any crash, and leaves the crashing input
# in fuzz/artifacts/<target>/ (replay it with `cargo fuzz run <target> <file>`).
# Usage: bash fuzz/run.sh [seconds per target, default 60]
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz/run.sh: installing cargo-fuzz" >&2
  cargo install --locked cargo-fuzz
fi
# The coverage instrumentation needs rustc's unstable flags; the machines have the stable
# toolchain only, which takes them when told it is bootstrapping itself.
export RUSTC_BOOTSTRAP=1
# Its own target directory: instrumented builds must not replace the test suite's artifacts.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../target}-fuzz"
for target in otlp_protobuf otlp_json config; do
  corpus="$CARGO_TARGET_DIR/corpus/$target"
  mkdir -p "$corpus"
  if [ "$target" = config ]; then
    # The shipped example configuration, every key at its default, as it is today.
    cp ../crates/cli/stormglass.example.yaml "$corpus/example.yaml"
  fi
  echo "fuzz/run.sh: $target for ${seconds}s" >&2
  # No sanitizer: the code is safe Rust (unsafe_code = forbid), so a bug is a panic, which
  # libFuzzer catches as it is.
  cargo fuzz run --sanitizer none "$target" "$corpus" "seeds/$target" -- \
    -max_total_time="$seconds" -max_len=262144 -rss_limit_mb=2048 -print_final_stats=1
done
