"""grpcio's retry throttling against a mostly failing server, sending spans to stormglass
over OTLP/HTTP (tests/advice.rs). `shop` makes CALLS calls to `stock-throttled`'s Get, one
after another, through a channel whose service config retries UNAVAILABLE (maxAttempts 3)
under retryThrottling (maxTokens 10, tokenRatio 0.5); every third call's attempts are all
answered UNAVAILABLE, the others succeed at once. gRPC core re-sends below the CLIENT span, and
stops re-sending while its tokens are at or below half of maxTokens.

Usage: cat otel_stack.py grpc_throttling.py | python - OTLP_HTTP_ENDPOINT CALLS
Prints JSON: the attempts the server received.
"""

import json
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import GrpcInstrumentorClient, GrpcInstrumentorServer

# provider, flush: tests/python/otel_stack.py, put before this script.
calls = int(sys.argv[2])
shop = provider("shop")
tracer = shop.get_tracer("shop")
GrpcInstrumentorServer().instrument(tracer_provider=provider("stock-throttled"))

received = []
lock = threading.Lock()


def handle(request, context):
    with lock:
        received.append(request)
    if int(request.decode()) % 3 == 0:
        context.abort(grpc.StatusCode.UNAVAILABLE, "busy")
    return b"ok"


server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
server.add_generic_rpc_handlers(
    (grpc.method_handlers_generic_handler("demo.Stock", {"Get": grpc.unary_unary_rpc_method_handler(handle)}),)
)
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
                    "maxBackoff": "0.02s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ],
        "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.5},
    }
)
trace.set_tracer_provider(shop)
GrpcInstrumentorClient().instrument()
channel = grpc.insecure_channel(
    f"127.0.0.1:{port}", options=[("grpc.service_config", config), ("grpc.enable_retries", 1)]
)
grpc.channel_ready_future(channel).result(timeout=30)
stub = channel.unary_unary("/demo.Stock/Get")
for i in range(calls):
    with tracer.start_as_current_span("GET /reserve", kind=trace.SpanKind.SERVER):
        try:
            stub(str(i).encode(), timeout=5)
        except grpc.RpcError:
            pass
server.stop(0)
flush()
print(json.dumps({"received": len(received)}))
