"""Retries a real proxy makes, below the client's CLIENT span, sending the spans to
stormglass over OTLP/HTTP (tests/proxies.rs). `shop` calls through the proxy with requests
under RequestsInstrumentor; the proxy forwards the trace context to two instances of a WSGI
app under OpenTelemetryMiddleware, which answer 503 to the first tries of odd calls.

* haproxy: Debian's HAProxy, `retries 2`, `retry-on 503`, `option redispatch 1` and
  `option http-buffer-request` (so a POST's body can be replayed), to `stock-haproxy`: GET
  /items/N and POST /orders/N without an idempotency key; odd calls fail twice.
* haproxy with a per-try timeout: `timeout server 300ms`, `retries 2`,
  `retry-on response-timeout 503`, to `stock-pertry`: GET /slow/N; the first try of odd
  calls takes 450 ms, so HAProxy gives up on it at 300 ms and re-sends to the other
  instance while the first keeps working (an orphan), the second answers at once.
* haproxy with a timeout it does not retry: `timeout server 300ms`, `retry-on 503`, to
  `stock-noretry`: GET /late/N; odd calls take 450 ms, HAProxy answers 504 at 300 ms while
  the backend works on (an orphan), even calls answer at once.
* nginx with a per-try timeout: `proxy_read_timeout 300ms` and `proxy_next_upstream ...
  timeout`, to `stock-nginx-pertry`: GET /wait/N; the first try of odd calls takes 450 ms,
  nginx gives up on it at 300 ms and tries the other instance, which answers at once.
* nginx: Debian's nginx, `proxy_next_upstream error timeout http_503 non_idempotent` over
  the two instances, to `stock-nginx`: GET /items/N; odd calls fail once (nginx tries each
  instance once).

Prints, per backend service, the requests it received, the 503s it answered, the tries
it was too slow for and how long those ran (the truth next to what the proxies' own logs would say), as one JSON
line. Spans are exported once, at the end (OTEL_BSP_SCHEDULE_DELAY), so a trace's spans
arrive together, an abandoned try's included.

Usage: cat otel_stack.py proxy_backend.py proxies.py | python - OTLP_HTTP_ENDPOINT CALLS
"""

import json
import os
import sys
import tempfile
import time

os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "600000"

import requests
from opentelemetry import trace
from opentelemetry.instrumentation.requests import RequestsInstrumentor

# provider, Quiet, flush: tests/python/otel_stack.py; instances, free_port, start, truth,
# SLOW_S: tests/python/proxy_backend.py; both put before this script.
calls = int(sys.argv[2])
# Removed when the script exits, as the processes it started are.
_work = tempfile.TemporaryDirectory(prefix="stormglass-proxies-", ignore_cleanup_errors=True)
work = _work.name

shop = provider("shop")
tracer = shop.get_tracer("shop")
RequestsInstrumentor().instrument(tracer_provider=shop)

def haproxy(ports, timeout="10s", retry_on="503"):
    port = free_port()
    config = os.path.join(work, f"haproxy-{port}.cfg")
    servers = "".join(f"  server s{i} 127.0.0.1:{p}\n" for i, p in enumerate(ports))
    with open(config, "w") as f:
        f.write(
            "defaults\n  mode http\n  timeout connect 2s\n  timeout client 10s\n"
            f"  timeout server {timeout}\n  retries 2\n  retry-on {retry_on}\n"
            "  option redispatch 1\n  option http-buffer-request\n"
            f"frontend shop\n  bind 127.0.0.1:{port}\n  default_backend stock\n"
            f"backend stock\n  balance roundrobin\n{servers}"
        )
    return start(["haproxy", "-db", "-f", config], port), port


def nginx(ports, read_timeout="60s"):
    port = free_port()
    prefix = os.path.join(work, f"nginx-{port}")
    os.makedirs(os.path.join(prefix, "logs"), exist_ok=True)
    config = os.path.join(prefix, "nginx.conf")
    # max_fails=0: a 503 must not take an instance out of the rotation for 10 s.
    servers = "".join(f"    server 127.0.0.1:{p} max_fails=0;\n" for p in ports)
    temp = "".join(
        f"  {name}_temp_path {prefix}/{name};\n"
        for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    with open(config, "w") as f:
        f.write(
            f"daemon off;\nmaster_process off;\npid {prefix}/nginx.pid;\n"
            f"error_log {prefix}/logs/error.log;\nevents {{}}\n"
            f"http {{\n  access_log off;\n{temp}  upstream stock {{\n{servers}  }}\n"
            f"  server {{\n    listen 127.0.0.1:{port};\n    location / {{\n"
            "      proxy_pass http://stock;\n"
            f"      proxy_read_timeout {read_timeout};\n"
            "      proxy_next_upstream error timeout http_503 non_idempotent;\n"
            "    }\n  }\n}\n"
        )
    return start(["nginx", "-e", "stderr", "-p", prefix, "-c", config], port), port


def run(proxy, requests_of, late=None):
    """Each call under a SERVER span of `shop`, through `proxy`: answered 200, or `late`
    for odd calls when given."""
    session = requests.Session()  # no retries of its own: only the proxy re-sends
    try:
        for method, path in requests_of:
            with tracer.start_as_current_span(f"{method} /buy", kind=trace.SpanKind.SERVER):
                body = b"order" if method == "POST" else None
                r = session.request(method, f"http://127.0.0.1:{proxy[1]}{path}", data=body)
                odd = int(path.rsplit("/", 1)[-1]) % 2 == 1
                assert r.status_code == (late if late and odd else 200), (path, r.status_code)
    finally:
        proxy[0].terminate()
        proxy[0].wait()


gets = [("GET", f"/items/{i}") for i in range(calls)]
posts = [("POST", f"/orders/{i}") for i in range(calls)]
run(haproxy(instances("stock-haproxy", 2)), gets + posts)
run(nginx(instances("stock-nginx", 1)), gets)
slow = [("GET", f"/slow/{i}") for i in range(calls)]
run(haproxy(instances("stock-pertry", 1, slow=True), "300ms", "response-timeout 503"), slow)
waits = [("GET", f"/wait/{i}") for i in range(calls)]
run(nginx(instances("stock-nginx-pertry", 1, slow=True), "300ms"), waits)
late = [("GET", f"/late/{i}") for i in range(calls)]
run(haproxy(instances("stock-noretry", 1, slow=True), "300ms", "503"), late, late=504)
time.sleep(2 * SLOW_S)  # the abandoned tries finish their spans
flush()
print(json.dumps(truth))
