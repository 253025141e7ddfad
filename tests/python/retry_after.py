"""Retry-After from real libraries, sent to stormglass over OTLP/HTTP (tests/retries.rs).
`shop` makes CALLS GETs to each of two WSGI apps under OpenTelemetryMiddleware whose first
try of every call answers 429 with `Retry-After: 1`; the header is captured on the SERVER
span (OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_RESPONSE, set here before
instrumenting, as a deployment sets it), which OpenTelemetry Python names
`http.response.header.retry_after`. Both clients are requests with urllib3's Retry on 429,
re-sending below the CLIENT span:

* api-honoured: `respect_retry_after_header=True` (urllib3's default) sleeps the second;
* api-ignored: `respect_retry_after_header=False` with no backoff re-sends at once.

Prints the gaps (ms) each app saw between a call's 429 and its retry, per app (JSON).

Usage: cat otel_stack.py retry_after.py | python - OTLP_HTTP_ENDPOINT CALLS
"""

import json
import os
import sys
import threading
import time

import requests
from opentelemetry import trace
from opentelemetry.instrumentation.requests import RequestsInstrumentor
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

os.environ["OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_RESPONSE"] = "Retry-After"
# provider, http_server, flush: tests/python/otel_stack.py, put before this script.
calls = int(sys.argv[2])

shop = provider("shop")
tracer = shop.get_tracer("shop")
RequestsInstrumentor().instrument(tracer_provider=shop)

answered = {}
gaps = {}
lock = threading.Lock()


def wsgi_app(environ, start_response):
    item = environ["SERVER_PORT"] + environ["PATH_INFO"]
    now = time.monotonic()
    with lock:
        first = item not in answered
        if first:
            answered[item] = now
        else:
            gaps.setdefault(environ["SERVER_PORT"], []).append(
                round((now - answered[item]) * 1000.0, 1)
            )
    if first:
        start_response(
            "429 Too Many Requests",
            [("Content-Type", "text/plain"), ("Retry-After", "1")],
        )
        return [b"slow down"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"items"]


def session(respect):
    s = requests.Session()
    retry = Retry(
        total=2,
        status_forcelist=[429],
        backoff_factor=0,
        respect_retry_after_header=respect,
    )
    s.mount("http://", HTTPAdapter(max_retries=retry))
    return s


seen = {}
for name, respect in [("api-honoured", True), ("api-ignored", False)]:
    server = http_server(name, wsgi_app)
    client = session(respect)
    for i in range(calls):
        with tracer.start_as_current_span("GET /page", kind=trace.SpanKind.SERVER):
            r = client.get(f"http://127.0.0.1:{server.server_port}/items/{i}")
            assert r.status_code == 200, r.status_code
    seen[name] = gaps.get(str(server.server_port), [])

flush()
print(json.dumps(seen))
