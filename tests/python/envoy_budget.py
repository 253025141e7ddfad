"""A real Envoy's retry budget, for `stormglass replay --budget-as envoy` to predict
(tests/retries.rs). `shop` sends bursts of BURST calls at once through Envoy to a WSGI app
under OpenTelemetryMiddleware whose first try of every call answers 503 after HOLD_S and
whose retries answer after RETRY_S: a burst's retries are decided within a few ms of each
other, while the first one let through still holds its place.

* `shop-envoy-free` -> `stock-free`: `num_retries: 1` and room for every retry
  (`max_retries` 1000): every call retries.
* `shop-envoy-budget` -> `stock-budget`: the same under the cluster's `retry_budget`
  (`budget_percent` 15, `min_retry_concurrency` 1): of the at most 10 requests in flight,
  15% is one retry; the others are refused and their calls answered 503.

Prints per backend service the requests it received, and per client the calls answered
200 and 503, as one JSON line.

Usage: cat otel_stack.py proxy_backend.py envoy_stack.py envoy_budget.py | python - OTLP_HTTP_ENDPOINT BURSTS
"""

import os

os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"  # sent as they end, as Envoy sends its own

import json
import sys
import threading
import time

import requests
from opentelemetry import trace
from opentelemetry.instrumentation.requests import RequestsInstrumentor

# provider, flush: tests/python/otel_stack.py; serve, lock, tries, truth:
# tests/python/proxy_backend.py; envoy: tests/python/envoy_stack.py; all put before this
# script.
bursts = int(sys.argv[2])
BURST = 10
HOLD_S = 0.1
RETRY_S = 0.4
GAP_S = 0.6

shop = provider("shop")
tracer = shop.get_tracer("shop")
RequestsInstrumentor().instrument(tracer_provider=shop)


def flaky(service):
    """Every call's first try answers 503 after HOLD_S, its retries 200 after RETRY_S."""

    def app(environ, start_response):
        key = environ["PATH_INFO"]
        with lock:
            tries[service, key] = tries.get((service, key), 0) + 1
            first = tries[service, key] == 1
            counts = truth.setdefault(service, {"requests": 0})
            counts["requests"] += 1
        time.sleep(HOLD_S if first else RETRY_S)
        if first:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"busy"]
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    return app


def run(client, proxy):
    answered = {"200": 0, "503": 0}

    def call(barrier, path):
        session = requests.Session()
        barrier.wait()
        with tracer.start_as_current_span("GET /buy", kind=trace.SpanKind.SERVER):
            r = session.get(f"http://127.0.0.1:{proxy[1]}{path}")
        with lock:
            answered[str(r.status_code)] += 1

    try:
        for b in range(bursts):
            barrier = threading.Barrier(BURST)
            threads = [
                threading.Thread(target=call, args=(barrier, f"/stock/{b}/{i}"))
                for i in range(BURST)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            time.sleep(GAP_S)
    finally:
        proxy[0].terminate()
        proxy[0].wait()
    truth[client] = answered


policy = {
    "retry_on": "5xx",
    "num_retries": 1,
    "retry_back_off": {"base_interval": "0.001s", "max_interval": "0.002s"},
}
run(
    "shop-free",
    envoy(
        "shop-envoy-free",
        [serve("stock-free", flaky("stock-free"))],
        policy,
        {"thresholds": [{"max_retries": 1000}]},
    ),
)
run(
    "shop-budget",
    envoy(
        "shop-envoy-budget",
        [serve("stock-budget", flaky("stock-budget"))],
        policy,
        {
            "thresholds": [
                {"retry_budget": {"budget_percent": {"value": 15.0}, "min_retry_concurrency": 1}}
            ]
        },
    ),
)
flush()
print(json.dumps(truth))
