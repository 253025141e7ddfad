#!/usr/bin/env bash
# The benchmark in one run: decode floor, rotel-agent pass-through, stormglass serve with full
# analytics, stormglass analyze/query against DuckDB on 10 M spans of Parquet; then how long
# a retry storm takes to reach a real Alertmanager, idle and under background traffic.
# Writes the tables to benches/latest.md (benches/README.md shows it) and prints them.
#
#   bash benches/run.sh                      # defaults: 20 s per server, 64 in flight, 3 rounds
#   DURATION=30s SPANS=2000000 ROUNDS=5 bash benches/run.sh
#   PARTS=detection bash benches/run.sh      # only the detection table (~10 min)
#   PARTS=width bash benches/run.sh          # only the width table: 1 vs WIDTH=3000 services per layer
#
# Installs what it needs when missing: rotel-agent from PyPI's `rotel` wheel and DuckDB in a
# virtualenv, both under $BENCH_CACHE; Debian's prometheus-alertmanager and valgrind (the
# width table's instruction counts). Builds the release binary into $CARGO_TARGET_DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${BENCH_CACHE:-/var/cache/stormglass/bench}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/stormglass/release-target}
mkdir -p "$cache"

cargo build --release --bin stormglass --manifest-path "$root/Cargo.toml"
stormglass=$CARGO_TARGET_DIR/release/stormglass

rotel=$cache/rotel/rotel/rotel-agent
if [ ! -x "$rotel" ]; then
  rm -rf "$cache/wheel" "$cache/rotel"
  python3 -m pip download --quiet --no-deps --pre rotel -d "$cache/wheel"
  python3 -m zipfile -e "$cache"/wheel/rotel-*.whl "$cache/rotel"
  chmod +x "$rotel"
fi
parts=${PARTS:-throughput,detection}
missing=""
command -v prometheus-alertmanager >/dev/null || missing="$missing prometheus-alertmanager"
case ",$parts," in
  *,width,*) command -v valgrind >/dev/null || missing="$missing valgrind" ;;
esac
if [ -n "$missing" ]; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  # shellcheck disable=SC2086 # one word per package
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends $missing
fi

python=$cache/venv/bin/python
if ! "$python" -c 'import duckdb' 2>/dev/null; then
  python3 -m venv "$cache/venv"
  "$python" -m pip install --quiet duckdb
fi
echo "rotel-agent: $("$rotel" --version 2>&1 | head -1); duckdb $("$python" -c 'import duckdb; print(duckdb.__version__)')" >&2

spans=${SPANS:-10000000}
exec python3 "$root/benches/run.py" \
  --stormglass "$stormglass" --rotel "$rotel" --python "$python" \
  --parquet "$cache/spans-$spans.parquet" --spans "$spans" \
  --duration "${DURATION:-20s}" --concurrency "${CONCURRENCY:-64}" --rounds "${ROUNDS:-3}" \
  --parts "$parts" --width "${WIDTH:-3000}" \
  --width-spans "${WIDTH_SPANS:-456000}" \
  --out "${OUT:-$root/benches/latest.md}"
