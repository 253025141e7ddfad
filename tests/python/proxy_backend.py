"""The backend the proxy tests share (tests/python/proxies.py, envoy_*.py), put after
otel_stack.py and before the script by tests/retries.rs: a WSGI app under
OpenTelemetryMiddleware whose odd calls fail their first tries (503) or take SLOW_S, served
as two instances on free loopback ports, and the truth it counts (per service: requests,
503s answered, tries it was too slow for and how long those ran); and a proxy started and
waited for."""

import socket
import socketserver
import subprocess
import threading
import time
from wsgiref.simple_server import WSGIServer, make_server

from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware

lock = threading.Lock()
tries = {}
truth = {}


SLOW_S = 0.45


def backend(service, fails, slow=False):
    """A WSGI app of `service` whose odd calls answer 503 to their first `fails` tries, or
    with `slow` take SLOW_S on their first try."""

    def app(environ, start_response):
        key = environ["REQUEST_METHOD"] + environ["PATH_INFO"]
        with lock:
            tries[service, key] = tries.get((service, key), 0) + 1
            odd_first = int(key.rsplit("/", 1)[-1]) % 2 == 1 and tries[service, key] <= fails
            failing = odd_first and not slow
            counts = truth.setdefault(
                service, {"requests": 0, "503": 0, "slow": 0, "slow_seconds": 0.0}
            )
            counts["requests"] += 1
            counts["503"] += failing
            counts["slow"] += odd_first and slow
        if environ.get("CONTENT_LENGTH"):
            environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
        if odd_first and slow:
            began = time.monotonic()
            time.sleep(SLOW_S)
            with lock:
                counts["slow_seconds"] += time.monotonic() - began
        if failing:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"busy"]
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    return app


class Threaded(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    # socketserver's backlog of 5 resets a burst's connections before they are accepted.
    request_queue_size = 64


def instances(service, fails, slow=False):
    """Two instances of `service` on free loopback ports, each its own process's spans."""
    return [serve(service, backend(service, fails, slow)) for _ in range(2)]


def serve(service, app):
    """`app` as an instance of `service` (a request a thread) on a free loopback port."""
    app = OpenTelemetryMiddleware(app, tracer_provider=provider(service))
    server = make_server("127.0.0.1", 0, app, server_class=Threaded, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_port


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command, port, within=20):
    """Start a proxy and wait (bounded) until it listens on `port`."""
    proxy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proxy
        except OSError:
            if proxy.poll() is not None:
                raise SystemExit(f"{command[0]} exited: {proxy.stderr.read().decode()}")
            time.sleep(0.05)
    proxy.kill()
    raise SystemExit(f"{command[0]} did not listen on {port} within {within} s")
