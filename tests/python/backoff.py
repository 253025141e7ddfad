"""Backoff from real libraries, sent to stormglass over OTLP/HTTP (tests/retries.rs).
`shop` makes CALLS GETs to each of two WSGI apps under OpenTelemetryMiddleware that fail
the first three tries of every call with 503 (four attempts a call):

* api-tenacity: a tenacity loop around requests.get waiting `wait_random_exponential(
  multiplier=0.05)`: uniform in [0, 50 ms], [0, 100 ms], [0, 200 ms] (full jitter), as
  sibling CLIENT spans;
* api-urllib3: requests with urllib3's `Retry(backoff_factor=0.05)`, re-sending below the
  CLIENT span: urllib3 2 waits 0 before its first retry, then 100 and 200 ms.

Usage: cat otel_stack.py backoff.py | python - OTLP_HTTP_ENDPOINT CALLS
"""

import sys
import threading

import requests
import tenacity
from opentelemetry import trace
from opentelemetry.instrumentation.requests import RequestsInstrumentor
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

# provider, http_server, flush: tests/python/otel_stack.py, put before this script.
calls = int(sys.argv[2])

shop = provider("shop")
tracer = shop.get_tracer("shop")
RequestsInstrumentor().instrument(tracer_provider=shop)

tries = {}
lock = threading.Lock()


def wsgi_app(environ, start_response):
    item = environ["SERVER_PORT"] + environ["PATH_INFO"]
    with lock:
        tries[item] = tries.get(item, 0) + 1
        failing = tries[item] <= 3
    if failing:
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"busy"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"items"]


jittered = http_server("api-tenacity", wsgi_app)
plain = requests.Session()


@tenacity.retry(
    wait=tenacity.wait_random_exponential(multiplier=0.05),
    stop=tenacity.stop_after_attempt(4),
    reraise=True,
)
def get(i):
    r = plain.get(f"http://127.0.0.1:{jittered.server_port}/items/{i}")
    r.raise_for_status()


for i in range(calls):
    with tracer.start_as_current_span("GET /page", kind=trace.SpanKind.SERVER):
        get(i)

exponential = http_server("api-urllib3", wsgi_app)
retrying = requests.Session()
retrying.mount(
    "http://",
    HTTPAdapter(
        max_retries=Retry(total=3, status_forcelist=[503], backoff_factor=0.05)
    ),
)
for i in range(calls):
    with tracer.start_as_current_span("GET /page", kind=trace.SpanKind.SERVER):
        r = retrying.get(f"http://127.0.0.1:{exponential.server_port}/items/{i}")
        assert r.status_code == 200, r.status_code

flush()
print("sent")
