"""A real grpcio channel takes a stormglass gRPC service config and obeys it.

Usage: grpc_service_config.py CONFIG_JSON SERVICE METHOD

Starts a grpcio server on loopback whose SERVICE/METHOD always answers UNAVAILABLE, calls
it once through a channel built with the config (`grpc.service_config`, retries enabled)
and prints JSON: the attempts the server received, the status the client saw and the
config grpcio applied. A config grpcio rejects fails the channel (a non-zero exit).
"""

import json
import sys
import threading
from concurrent import futures

import grpc


def main():
    config, service, method = sys.argv[1], sys.argv[2], sys.argv[3]
    received = []
    lock = threading.Lock()

    def handler(request, context):
        with lock:
            received.append(1)
        context.abort(grpc.StatusCode.UNAVAILABLE, "down")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                service, {method: grpc.unary_unary_rpc_method_handler(handler)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    options = [("grpc.service_config", config), ("grpc.enable_retries", 1)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        # Connected first: the config's deadline is the call's, not the connection's.
        grpc.channel_ready_future(channel).result(timeout=30)
        call = channel.unary_unary(f"/{service}/{method}")
        try:
            call(b"")
            status = "OK"
        except grpc.RpcError as e:
            status = e.code().name
    server.stop(None)
    print(json.dumps({"attempts": len(received), "status": status}))


if __name__ == "__main__":
    main()
