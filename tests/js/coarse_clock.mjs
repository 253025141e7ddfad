// Emits `count` traces through the OpenTelemetry JS SDK and one of its OTLP exporters, as a
// Node service with millisecond timestamps would: in each, web's SERVER span makes one
// logical call to inv in two attempts that start in the same millisecond (503, then
// http.request.resend_count=1 and 200). Usage: node coarse_clock.mjs PROTOCOL URL COUNT,
// PROTOCOL one of http/json, http/protobuf, grpc.
import { context, SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import { OTLPTraceExporter as GrpcExporter } from '@opentelemetry/exporter-trace-otlp-grpc';
import { OTLPTraceExporter as JsonExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPTraceExporter as ProtoExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';

const [protocol, url, countText] = process.argv.slice(2);
const count = Number(countText);
const exporters = {
  'http/json': () => new JsonExporter({ url: `${url}/v1/traces` }),
  'http/protobuf': () => new ProtoExporter({ url: `${url}/v1/traces` }),
  grpc: () => new GrpcExporter({ url }),
};
if (!exporters[protocol] || !(count > 0)) {
  console.error('usage: node coarse_clock.mjs http/json|http/protobuf|grpc URL COUNT');
  process.exit(2);
}
const provider = new BasicTracerProvider({
  resource: resourceFromAttributes({ 'service.name': 'web' }),
  spanProcessors: [new BatchSpanProcessor(exporters[protocol]())],
});
const tracer = provider.getTracer('coarse-clock');
const peer = { 'peer.service': 'inv', 'http.request.method': 'GET' };
for (let i = 0; i < count; i++) {
  const t0 = Date.now(); // whole milliseconds, as the JS SDK's clock reads them
  const root = tracer.startSpan('GET /', { kind: SpanKind.SERVER, startTime: t0 });
  const inRoot = trace.setSpan(context.active(), root);
  const first = tracer.startSpan(
    'GET',
    { kind: SpanKind.CLIENT, startTime: t0, attributes: { ...peer, 'http.response.status_code': 503 } },
    inRoot,
  );
  first.setStatus({ code: SpanStatusCode.ERROR });
  first.end(t0);
  const retry = tracer.startSpan(
    'GET',
    {
      kind: SpanKind.CLIENT,
      startTime: t0,
      attributes: { ...peer, 'http.request.resend_count': 1, 'http.response.status_code': 200 },
    },
    inRoot,
  );
  retry.end(t0 + 1);
  root.end(t0 + 1);
}
await provider.forceFlush();
await provider.shutdown();
