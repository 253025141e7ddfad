"""What the scripts of tests/python share, put before each by tests/retries.rs (they run
through `python -c`, so there is no import path): a TracerProvider per service exporting
over OTLP/HTTP to the endpoint the script is given (argv[1]), a WSGI app served under
OpenTelemetryMiddleware on a free loopback port, and the flush at the end."""

import sys
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

endpoint = sys.argv[1]
providers = []


def provider(service):
    tp = TracerProvider(resource=Resource.create({"service.name": service}))
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    providers.append(tp)
    return tp


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def http_server(service, wsgi_app):
    app = OpenTelemetryMiddleware(wsgi_app, tracer_provider=provider(service))
    server = make_server("127.0.0.1", 0, app, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def flush():
    for tp in providers:
        tp.force_flush()
        tp.shutdown()
