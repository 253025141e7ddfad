#!/usr/bin/env python3
"""One benchmark run, side by side: the decode floor, Rotel, stormglass serve, and
stormglass analyze/query against DuckDB on the same Parquet file.

Called by benches/run.sh, which builds the release binary and installs rotel-agent and
DuckDB. Prints a table of ratios (stormglass / each baseline) and writes it, with the
machine and the settings, as Markdown to --out.

Every number comes from this one run on this machine: no figure is copied from elsewhere.
Server CPU comes from /proc/PID/stat (utime + stime) around the load, after the server has
finished the work the load gave it; for stormglass that includes assembling every trace
and the DataFusion analysis of every span (full analytics on).
"""

import argparse
import glob
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

TICKS = os.sysconf("SC_CLK_TCK")

# The two representative figures, as one SQL text both engines run unchanged on the spans
# table (Parquet). Edge success rates: attempts are CLIENT spans, their callee the SERVER
# child (or the callee hint for an uninstrumented callee), grouped into logical calls by
# calling span, callee and operation, as METRICS.md defines raw (final ok), effective
# (first attempt ok) and attempt success rates.
EDGES_SQL = """
WITH attempts AS (
  SELECT c.trace_id, c.parent_span_id AS calling_span, c.service_name AS caller,
         COALESCE(s.service_name, c.callee_hint, 'unknown') AS callee, c.operation,
         COALESCE(c.attempt, 0) AS attempt, c.outcome
  FROM spans c
  LEFT JOIN spans s
    ON s.trace_id = c.trace_id AND s.parent_span_id = c.span_id AND s.kind = 'server'
  WHERE c.kind = 'client'
), calls AS (
  SELECT caller, callee, operation, COUNT(*) AS attempts,
         SUM(CASE WHEN outcome = 'ok' THEN 1 ELSE 0 END) AS ok_attempts,
         MAX(CASE WHEN outcome = 'ok' THEN 1 ELSE 0 END) AS final_ok,
         MAX(CASE WHEN attempt = 0 AND outcome = 'ok' THEN 1 ELSE 0 END) AS first_ok
  FROM attempts
  GROUP BY trace_id, calling_span, caller, callee, operation
)
SELECT caller, callee, operation, COUNT(*) AS logical_calls, SUM(attempts) AS attempts,
       CAST(SUM(final_ok) AS DOUBLE) / COUNT(*) AS raw_success_rate,
       CAST(SUM(first_ok) AS DOUBLE) / COUNT(*) AS effective_success_rate,
       CAST(SUM(ok_attempts) AS DOUBLE) / SUM(attempts) AS attempt_success_rate
FROM calls
GROUP BY caller, callee, operation
ORDER BY caller, callee, operation
"""

# Per-layer quantiles: exact P99 and P99.9 of SERVER span durations per service.
LAYERS_SQL = """
SELECT service_name AS service, COUNT(*) AS spans,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ns) AS p99_ns,
       percentile_cont(0.999) WITHIN GROUP (ORDER BY duration_ns) AS p999_ns
FROM spans
WHERE kind = 'server'
GROUP BY service_name
ORDER BY service_name
"""

DUCKDB_RUNNER = """
import json, sys, time, duckdb
path, sql = sys.argv[1], sys.stdin.read()
con = duckdb.connect()
con.execute("SET enable_progress_bar = false")
con.execute(f"CREATE VIEW spans AS SELECT * FROM read_parquet('{path}')")
rows = con.execute(sql).fetchall()
cols = [d[0] for d in con.description]
print(json.dumps([dict(zip(cols, r)) for r in rows], default=str))
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def stat_cpu_seconds(path):
    """utime + stime of a /proc stat file, and the process's or thread's name."""
    with open(path) as f:
        name, fields = f.read().split("(", 1)[1].rsplit(")", 1)
    fields = fields.split()
    return (int(fields[11]) + int(fields[12])) / TICKS, name


def cpu_seconds(pid):
    return stat_cpu_seconds(f"/proc/{pid}/stat")[0]


def thread_cpu_seconds(pid, prefix):
    """CPU seconds of a process's threads whose name starts with `prefix` (Linux cuts
    thread names to 15 characters)."""
    threads = (stat_cpu_seconds(stat) for stat in glob.glob(f"/proc/{pid}/task/*/stat"))
    return sum(seconds for seconds, name in threads if name.startswith(prefix))


def metrics(api):
    """Prometheus exposition as {name: sum over series}."""
    text = urllib.request.urlopen(f"http://{api}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name = series.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


def run_load(sg, args, endpoint, pid):
    command = [
        sg, "load", "--endpoint", endpoint, "--pid", str(pid), "--json",
        "--duration", args.duration, "--concurrency", str(args.concurrency),
        "--spans-per-request", str(args.spans_per_request),
    ]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def peak_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def bench_rotel(sg, rotel, args):
    grpc, http = free_port(), free_port()
    server = subprocess.Popen(
        [rotel, "start", "--exporter", "blackhole",
         "--otlp-grpc-endpoint", f"127.0.0.1:{grpc}", "--otlp-http-endpoint", f"127.0.0.1:{http}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(grpc)
        time.sleep(0.5)
        before = cpu_seconds(server.pid)
        report = run_load(sg, args, f"127.0.0.1:{grpc}", server.pid)
        time.sleep(2)  # anything still queued reaches the blackhole
        cpu = cpu_seconds(server.pid) - before
        return dict(report=report, cpu=cpu, peak_rss=peak_rss(server.pid))
    finally:
        server.terminate()
        server.wait()


# How far above limits.memory the process may go (docs/operating.md, "Memory").
SLACK = 0.15


def bench_stormglass(sg, args):
    grpc, http, api = free_port(), free_port(), free_port()
    env = dict(os.environ, RUST_LOG="warn",
               # Each synthetic trace arrives in one request: 2 s of idle is plenty, and keeps
               # the spans held (and so the memory bound) proportional to the rate.
               STORMGLASS_ASSEMBLY__IDLE="2s")
    server = subprocess.Popen(
        [sg, "serve", "--grpc-listen", f"127.0.0.1:{grpc}", "--http-listen", f"127.0.0.1:{http}",
         "--api-listen", f"127.0.0.1:{api}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    samples = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            try:
                m = metrics(f"127.0.0.1:{api}")
                samples.append((m.get("stormglass_assembly_spans", 0),
                                m.get("stormglass_assembly_memory_bytes", 0)))
            except OSError:
                pass
            stop.wait(0.5)

    try:
        wait_port(api)
        time.sleep(0.5)
        before = cpu_seconds(server.pid)
        sampler = threading.Thread(target=sample)
        sampler.start()
        report = run_load(sg, args, f"127.0.0.1:{grpc}", server.pid)
        # Wait until every accepted span has been assembled and analysed (bounded).
        deadline = time.time() + 300
        while True:
            m = metrics(f"127.0.0.1:{api}")
            if m.get("stormglass_analysis_spans_total", 0) >= report["accepted_spans"]:
                break
            if time.time() > deadline:
                raise SystemExit("stormglass did not analyse every accepted span within 300 s")
            time.sleep(0.5)
        cpu = cpu_seconds(server.pid) - before
        # The analysis runs on one thread of its own: its CPU time is the analysis's work,
        # without the waits for a core that the wall-clock chunk durations include.
        analysis_cpu = thread_cpu_seconds(server.pid, "stormglass-anal")
        stop.set()
        sampler.join()
        held, held_bytes = max(samples, default=(0, 0))
        return dict(report=report, cpu=cpu, peak_rss=peak_rss(server.pid),
                    held_spans=held, bytes_per_held_span=held_bytes / held if held else None,
                    # Every chunk's analysis (streamed as released, and the rest at each tick).
                    analysis_seconds=m.get("stormglass_analysis_chunk_duration_seconds_sum", 0.0),
                    analysis_cpu=analysis_cpu,
                    budget=m.get("stormglass_memory_limit_bytes", 0.0),
                    analysed_spans=m.get("stormglass_analysis_spans_total", 0.0))
    finally:
        stop.set()
        server.terminate()
        server.wait()


def timed(command, stdin=None, runs=3):
    """Median wall seconds of `runs` runs of a command, and its last stdout."""
    times, out = [], ""
    for _ in range(runs):
        started = time.perf_counter()
        out = subprocess.run(command, input=stdin, check=True, capture_output=True,
                             text=True).stdout
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def same_rows(a, b):
    """True when two JSON row lists hold the same values (numbers to 1e-9 relative)."""
    if len(a) != len(b):
        return False
    for ra, rb in zip(a, b):
        if set(ra) != set(rb):
            return False
        for k in ra:
            x, y = ra[k], rb[k]
            try:
                x, y = float(x), float(y)
                if abs(x - y) > 1e-9 * max(1.0, abs(x), abs(y)):
                    return False
            except (TypeError, ValueError):
                if str(x) != str(y):
                    return False
    return True


def bench_sql(sg, python, parquet, args):
    results = {}
    for name, sql in (("edge success rates", EDGES_SQL), ("per-layer quantiles", LAYERS_SQL)):
        ours, ours_out = timed([sg, "query", sql, "--from", parquet, "--format", "json"],
                               runs=args.runs)
        duck, duck_out = timed([python, "-c", DUCKDB_RUNNER, parquet], stdin=sql, runs=args.runs)
        ours_rows, duck_rows = json.loads(ours_out), json.loads(duck_out)
        if not ours_rows:
            raise SystemExit(f"the {name} query returned no rows: the comparison would be empty")
        results[name] = dict(ours=ours, duckdb=duck, rows=len(ours_rows),
                             same=same_rows(ours_rows, duck_rows))
    # The median of as many runs as the queries: single runs over the 10 M span file took
    # 8.5 to 15.6 s on this machine, the slow ones with three times the system time.
    results["analyze"], _ = timed([sg, "analyze", parquet, "--format", "json"], runs=args.runs)
    return results


def machine():
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) / 1024 / 1024
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, {platform.system()} {platform.release()}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stormglass", required=True)
    parser.add_argument("--rotel", required=True)
    parser.add_argument("--python", required=True, help="a Python with duckdb installed")
    parser.add_argument("--parquet", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--duration", default="20s")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--spans-per-request", type=int, default=600)
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3,
                        help="Rotel then stormglass, this many times interleaved: the table "
                             "shows the round with the median ratio, and lists every round")
    args = parser.parse_args()
    sg = args.stormglass

    print("decode floor ...", file=sys.stderr)
    decode = json.loads(subprocess.run(
        [sg, "load", "--decode-only", "--duration", "5s", "--json",
         "--spans-per-request", str(args.spans_per_request)],
        check=True, capture_output=True, text=True).stdout)
    # The servers' rates drift with the neighbours' load on a shared machine: pairs measured
    # back to back, several times, show how far one pair can be trusted.
    rounds = []
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds}: rotel-agent pass-through ...", file=sys.stderr)
        rotel = bench_rotel(sg, args.rotel, args)
        print(f"round {i + 1}/{args.rounds}: stormglass serve, full analytics ...", file=sys.stderr)
        rounds.append((rotel, bench_stormglass(sg, args)))
    if not os.path.exists(args.parquet):
        print(f"writing {args.spans} spans to {args.parquet} ...", file=sys.stderr)
        subprocess.run([sg, "load", "--write-parquet", args.parquet, "--spans", str(args.spans)],
                       check=True)
    print("analyze / query vs DuckDB ...", file=sys.stderr)
    sql = bench_sql(sg, args.python, args.parquet, args)

    def per_cpu(run):
        return run["report"]["accepted_spans"] / run["cpu"] if run["cpu"] > 0 else 0.0

    def ratio(pair):
        rotel, ours = pair
        return per_cpu(ours) / per_cpu(rotel) if per_cpu(rotel) else 0.0

    def live_per_million(run):
        return run["analysis_seconds"] / (run["analysed_spans"] / 1e6) if run["analysed_spans"] else None

    rotel, ours = sorted(rounds, key=ratio)[len(rounds) // 2]
    highest_rss = max(o["peak_rss"] for _, o in rounds)

    rows = []
    floor = decode["decode_spans_per_cpu_second"]
    ours_per_cpu, rotel_per_cpu = per_cpu(ours), per_cpu(rotel)
    rows.append(("spans per server CPU-second (gRPC, 64 in flight)",
                 f"{ours_per_cpu:,.0f}", f"Rotel {rotel_per_cpu:,.0f}",
                 ours_per_cpu / rotel_per_cpu if rotel_per_cpu else None, ">= 0.6"))
    rows.append(("... against the decode floor (prost, one thread)",
                 f"{ours_per_cpu:,.0f}", f"prost {floor:,.0f}",
                 ours_per_cpu / floor if floor else None, ""))
    rows.append(("spans per second accepted (wall)",
                 f"{ours['report']['spans_per_second']:,.0f}",
                 f"Rotel {rotel['report']['spans_per_second']:,.0f}",
                 ours["report"]["spans_per_second"] / rotel["report"]["spans_per_second"], ""))
    rows.append(("peak resident memory",
                 f"{ours['peak_rss'] / 2**20:,.0f} MiB", f"Rotel {rotel['peak_rss'] / 2**20:,.0f} MiB",
                 ours["peak_rss"] / rotel["peak_rss"] if rotel["peak_rss"] else None, ""))
    bound = ours["budget"] * (1 + SLACK)
    rows.append((f"highest peak resident memory of the {len(rounds)} rounds, against "
                 f"limits.memory + {SLACK:.0%}",
                 f"{highest_rss / 2**20:,.0f} MiB",
                 f"{bound / 2**20:,.0f} MiB",
                 highest_rss / bound if bound else None, "<= 1.0"))
    bph = ours["bytes_per_held_span"]
    rows.append(("memory per span held in assembly",
                 f"{bph:,.0f} B" if bph else "n/a", "target 150 B",
                 bph / 150 if bph else None, "<= 1.0"))
    per_million = live_per_million(ours)
    rows.append(("live analysis, seconds per 1 M spans",
                 f"{per_million:.2f} s" if per_million else "n/a", "target 1 s",
                 per_million, "< 1.0"))
    cpu_per_million = (ours["analysis_cpu"] / (ours["analysed_spans"] / 1e6)
                       if ours["analysed_spans"] else None)
    rows.append(("... CPU time of the analysis thread per 1 M spans (every interval too)",
                 f"{cpu_per_million:.2f} s" if cpu_per_million else "n/a", "", None, ""))
    rows.append((f"analyze {args.spans / 1e6:.0f} M spans (Parquet), per 1 M spans",
                 f"{sql['analyze'] / (args.spans / 1e6):.2f} s", "target 1 s",
                 sql["analyze"] / (args.spans / 1e6), "< 1.0"))
    for name in ("edge success rates", "per-layer quantiles"):
        r = sql[name]
        rows.append((f"query: {name}, {args.spans / 1e6:.0f} M spans" + ("" if r["same"] else " (RESULTS DIFFER)"),
                     f"{r['ours']:.2f} s", f"DuckDB {r['duckdb']:.2f} s",
                     r["ours"] / r["duckdb"], "<= 1.5"))

    rep = ours["report"]
    lines = [
        f"Machine: {machine()}. Load: `stormglass load`, OTLP/gRPC, {args.concurrency} exports in "
        f"flight of {args.spans_per_request} spans ({rep['bytes_per_span']:.0f} B/span on the wire, "
        f"{rep['spans_per_trace']:.1f} spans/trace), {args.duration} per server, generator on the same "
        f"machine. stormglass accepted {rep['accepted_spans']:,} spans "
        f"({rep['refused_spans']:,} refused); Rotel {rotel['report']['accepted_spans']:,}.",
        "",
        f"Rounds (Rotel then stormglass, interleaved; the table is the round with the median "
        f"ratio, the memory bound the highest of all): "
        + "; ".join(f"{ratio(pair):.2f}x Rotel, live {live_per_million(pair[1]) or 0:.2f} s/1M, "
                    f"{pair[1]['peak_rss'] / 2**20:,.0f} MiB" for pair in rounds) + ".",
        "",
        "| measure | stormglass | baseline | ratio | target |",
        "|---|---|---|---|---|",
    ]
    for measure, value, baseline, ratio, target in rows:
        ratio_text = f"{ratio:.2f}" if ratio is not None else "n/a"
        lines.append(f"| {measure} | {value} | {baseline} | {ratio_text} | {target} |")
    lines += ["",
              f"Decode floor: prost {floor:,.0f} spans/CPU-s; stormglass's lean decoding + Arrow encoding "
              f"{decode['decode_and_arrow_spans_per_cpu_second']:,.0f} spans/CPU-s (one thread). "
              f"SQL times are whole processes, median of {args.runs}; both engines ran the same SQL "
              f"text and " + ("returned the same rows." if all(sql[n]["same"] for n in ("edge success rates", "per-layer quantiles"))
                               else "DID NOT return the same rows.")]
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
