"""grpcio's retry throttling against a mostly failing server, sending spans to stormglass
over OTLP/HTTP (tests/retries.rs). `shop` calls `stock-throttled` CALLS times on each of two
channels, one call after another; every third call's attempts are all answered UNAVAILABLE,
the others succeed at once. Both channels retry UNAVAILABLE (maxAttempts 3); `Free`'s
channel has no throttling, `Get`'s has retryThrottling (maxTokens 10, tokenRatio 0.5), so
gRPC core stops re-sending while its tokens are at or below half of maxTokens. gRPC core
re-sends below the CLIENT span.

Usage: cat otel_stack.py grpc_throttling.py | python - OTLP_HTTP_ENDPOINT CALLS
Prints JSON: the attempts the server received per method.
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

received = {"Get": 0, "Free": 0}
lock = threading.Lock()


def answer(method):
    def handle(request, context):
        with lock:
            received[method] += 1
        if int(request.decode()) % 3 == 0:
            context.abort(grpc.StatusCode.UNAVAILABLE, "busy")
        return b"ok"

    return grpc.unary_unary_rpc_method_handler(handle)


server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
server.add_generic_rpc_handlers(
    (grpc.method_handlers_generic_handler("demo.Stock", {m: answer(m) for m in received}),)
)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
retry_policy = {
    "name": [{"service": "demo.Stock"}],
    "retryPolicy": {
        "maxAttempts": 3,
        "initialBackoff": "0.01s",
        "maxBackoff": "0.02s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    },
}
free = json.dumps({"methodConfig": [retry_policy]})
throttled = json.dumps(
    {"methodConfig": [retry_policy], "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.5}}
)
trace.set_tracer_provider(shop)
GrpcInstrumentorClient().instrument()
for method, config in [("Free", free), ("Get", throttled)]:
    channel = grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.service_config", config), ("grpc.enable_retries", 1)]
    )
    grpc.channel_ready_future(channel).result(timeout=30)
    stub = channel.unary_unary(f"/demo.Stock/{method}")
    for i in range(calls):
        with tracer.start_as_current_span("GET /reserve", kind=trace.SpanKind.SERVER):
            try:
                stub(str(i).encode(), timeout=5)
            except grpc.RpcError:
                pass
server.stop(0)
flush()
print(json.dumps(received))
