"""Idempotency keys from real libraries, sent to stormglass over OTLP/HTTP
(tests/retries.rs). `shop` makes CALLS payments (POST) to two WSGI apps under
OpenTelemetryMiddleware that keep the Idempotency-Key of every request they did and answer
a repeat from it, saying so on their SERVER span (`idempotency.hit`). The first try of each
payment does the work and answers 503 (the answer is lost); the header is captured on both
sides (OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_{CLIENT,SERVER}_REQUEST, set here before
instrumenting, as a deployment sets them).

* pay-stable: requests with urllib3's Retry (POST allowed) re-sends the same request, key
  included, below the CLIENT span: the retry is a hit.
* pay-fresh: a tenacity loop around requests.post that makes a new key for every try (the
  bug the figure is for): sibling CLIENT spans with different keys; never a hit.

Prints the keys it sent (JSON), which stormglass must keep nowhere.

Usage: cat otel_stack.py idempotency_keys.py | python - OTLP_HTTP_ENDPOINT CALLS
"""

import json
import os
import sys
import threading
import uuid

import requests
import tenacity
from opentelemetry import trace
from opentelemetry.instrumentation.requests import RequestsInstrumentor
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

os.environ["OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_REQUEST"] = "Idempotency-Key"
os.environ["OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST"] = "Idempotency-Key"
# provider, http_server, flush: tests/python/otel_stack.py, put before this script.
calls = int(sys.argv[2])
sent = []

shop = provider("shop")
tracer = shop.get_tracer("shop")
RequestsInstrumentor().instrument(tracer_provider=shop)

done = set()
tries = {}
lock = threading.Lock()


def wsgi_app(environ, start_response):
    key = environ.get("HTTP_IDEMPOTENCY_KEY")
    payment = environ["SERVER_PORT"] + environ["PATH_INFO"]
    with lock:
        tries[payment] = tries.get(payment, 0) + 1
        replay = key in done
        done.add(key)
        first = tries[payment] == 1
    if replay:
        trace.get_current_span().set_attribute("idempotency.hit", True)
    elif first:
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"done, answer lost"]
    start_response("201 Created", [("Content-Type", "text/plain")])
    return [b"paid"]


def new_key():
    key = str(uuid.uuid4())
    sent.append(key)
    return key


# pay-stable: urllib3 re-sends the same request (and key) below the CLIENT span.
stable = http_server("pay-stable", wsgi_app)
retrying = requests.Session()
retrying.mount(
    "http://",
    HTTPAdapter(
        max_retries=Retry(
            total=2, status_forcelist=[503], allowed_methods=["POST"], backoff_factor=0
        )
    ),
)
for i in range(calls):
    with tracer.start_as_current_span("POST /checkout", kind=trace.SpanKind.SERVER):
        r = retrying.post(
            f"http://127.0.0.1:{stable.server_port}/payments/{i}",
            headers={"Idempotency-Key": new_key()},
        )
        assert r.status_code == 201, r.status_code

# pay-fresh: a loop that makes a new key for every try.
fresh = http_server("pay-fresh", wsgi_app)
plain = requests.Session()


@tenacity.retry(stop=tenacity.stop_after_attempt(3), reraise=True)
def pay(i):
    r = plain.post(
        f"http://127.0.0.1:{fresh.server_port}/payments/{i}",
        headers={"Idempotency-Key": new_key()},
    )
    r.raise_for_status()


for i in range(calls):
    with tracer.start_as_current_span("POST /checkout", kind=trace.SpanKind.SERVER):
        pay(i)

flush()
print(json.dumps(sent))
