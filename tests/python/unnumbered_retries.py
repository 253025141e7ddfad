"""Three real stacks whose retries carry no attempt number, sending their spans to
stormglass over OTLP/HTTP (tests/retries.rs). Each makes CALLS calls from `shop`; even calls
succeed at once, odd ones fail twice (503 / UNAVAILABLE) and succeed on the third try.

* http: requests with urllib3's Retry(total=2, status_forcelist=[503]) under
  RequestsInstrumentor, to `stock-http`, a WSGI app under OpenTelemetryMiddleware: urllib3
  re-sends below the CLIENT span.
* grpc: grpcio with a retryPolicy (maxAttempts 3, UNAVAILABLE) under the client and server
  interceptors, to `stock-grpc`: gRPC core re-sends below the CLIENT span.
* loop: a tenacity loop (3 tries) around an instrumented requests call without retries, to
  `stock-loop`: sibling CLIENT spans.
* bare: the same gRPC retries from a client that forwards the trace context but records
  no span (as a mesh sidecar without tracing), to `stock-grpc`'s `Peek`: the SERVER spans
  hang under shop's SERVER span.

Usage: cat otel_stack.py unnumbered_retries.py | python - OTLP_HTTP_ENDPOINT CALLS
"""

import json
import sys
import threading
from concurrent import futures

import grpc
import requests
import tenacity
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import (
    GrpcInstrumentorClient,
    GrpcInstrumentorServer,
    client_interceptor,
)
from opentelemetry.instrumentation.grpc.grpcext import intercept_channel
from opentelemetry.instrumentation.requests import RequestsInstrumentor
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

# provider, http_server, flush: tests/python/otel_stack.py, put before this script.
calls = int(sys.argv[2])

shop = provider("shop")
tracer = shop.get_tracer("shop")
# The instrumentations take their provider at instrument time: shop's for the clients.
RequestsInstrumentor().instrument(tracer_provider=shop)

# Each request key fails its first two tries when odd.
tries = {}
lock = threading.Lock()


def failing(key):
    with lock:
        tries[key] = tries.get(key, 0) + 1
        return int(key.rsplit("/", 1)[-1]) % 2 == 1 and tries[key] <= 2


def wsgi_app(environ, start_response):
    key = environ["PATH_INFO"] + environ.get("QUERY_STRING", "")
    if failing(environ["SERVER_PORT"] + key):
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"busy"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


# http: urllib3 re-sends below the CLIENT span.
stock_http = http_server("stock-http", wsgi_app)
retrying = requests.Session()
retrying.mount(
    "http://",
    HTTPAdapter(max_retries=Retry(total=2, status_forcelist=[503], backoff_factor=0)),
)
for i in range(calls):
    with tracer.start_as_current_span("GET /buy", kind=trace.SpanKind.SERVER):
        r = retrying.get(f"http://127.0.0.1:{stock_http.server_port}/items/{i}")
        assert r.status_code == 200, r.status_code

# loop: tenacity around a call that does not retry.
stock_loop = http_server("stock-loop", wsgi_app)
plain = requests.Session()


@tenacity.retry(stop=tenacity.stop_after_attempt(3), reraise=True)
def fetch(i):
    r = plain.get(f"http://127.0.0.1:{stock_loop.server_port}/items/{i}")
    r.raise_for_status()


for i in range(calls):
    with tracer.start_as_current_span("GET /list", kind=trace.SpanKind.SERVER):
        fetch(i)

# grpc: gRPC core re-sends below the CLIENT span. The server interceptor takes its provider
# from instrument(); the client interceptor reads `tracer_provider` from each channel's own
# arguments and otherwise uses the global provider (instrument()'s is ignored).
GrpcInstrumentorServer().instrument(tracer_provider=provider("stock-grpc"))


def answer(prefix):
    def handle(request, context):
        if failing(prefix + request.decode()):
            context.abort(grpc.StatusCode.UNAVAILABLE, "busy")
        return b"ok"

    return grpc.unary_unary_rpc_method_handler(handle)


handler = grpc.method_handlers_generic_handler(
    "demo.Stock", {"Get": answer("get/"), "Peek": answer("peek/")}
)
server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
server.add_generic_rpc_handlers((handler,))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
config = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "demo.Stock"}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.01s",
                    "maxBackoff": "0.05s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)
options = [("grpc.service_config", config), ("grpc.enable_retries", 1)]
# bare: a client that forwards the trace context but records no span (a mesh sidecar or
# proxy without tracing): the interceptor over a no-op provider, on a channel made before
# the client instrumentation wraps channel creation.
trace.set_tracer_provider(shop)
bare = intercept_channel(
    grpc.insecure_channel(f"127.0.0.1:{port}", options=options),
    client_interceptor(tracer_provider=trace.NoOpTracerProvider()),
)
GrpcInstrumentorClient().instrument()
channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
stub = channel.unary_unary("/demo.Stock/Get")
for i in range(calls):
    with tracer.start_as_current_span("GET /reserve", kind=trace.SpanKind.SERVER):
        assert stub(str(i).encode(), timeout=5) == b"ok"
peek = bare.unary_unary("/demo.Stock/Peek")
for i in range(calls):
    with tracer.start_as_current_span("GET /peek", kind=trace.SpanKind.SERVER):
        assert peek(str(i).encode(), timeout=5) == b"ok"
server.stop(0)

flush()
print("sent")
