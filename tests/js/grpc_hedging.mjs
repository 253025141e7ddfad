// grpc-js hedging (`hedgingPolicy`: 2 attempts, 100 ms apart) under the OpenTelemetry gRPC
// instrumentation, driven by tests/retries.rs: `shop` calls `hedge-search`'s
// search.Search/Find COUNT times, each call under a SERVER span of its own; the server (a
// child process, its own spans) answers call n by n % 3:
//   0: in 10 ms, long before the hedge is due: one attempt;
//   1: the first attempt in 400 ms, a hedge in 10 ms: the hedge answers, grpc-js cancels
//      the first, whose handler works on (~290 ms);
//   2: the first attempt in 200 ms, a hedge in 400 ms: the first answers while the hedge
//      runs, and the hedge is cancelled (and works on ~300 ms).
// The margins (90 ms and more) keep the shapes on a busy machine.
// Prints the truth as the server and the client saw it (attempts received, calls answered
// ok, seconds the handlers ran) as one JSON line. Usage: node grpc_hedging.mjs OTLP_HTTP_URL COUNT
// (`server` after COUNT: the server's role, in the child process).
import { fork } from 'node:child_process';
import { createRequire } from 'node:module';
import { SpanKind, trace } from '@opentelemetry/api';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { registerInstrumentations } from '@opentelemetry/instrumentation';
import { GrpcInstrumentation } from '@opentelemetry/instrumentation-grpc';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';

const [url, countText, role] = process.argv.slice(2);
const count = Number(countText);
if (!url || !(count > 0)) {
  console.error('usage: node grpc_hedging.mjs OTLP_HTTP_URL COUNT');
  process.exit(2);
}

function instrument(service) {
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({ 'service.name': service }),
    // Exported once, at the end: a trace's spans from both processes arrive together.
    spanProcessors: [
      new BatchSpanProcessor(new OTLPTraceExporter({ url: `${url}/v1/traces` }), {
        scheduledDelayMillis: 600000,
        maxQueueSize: 100000,
        maxExportBatchSize: 100000,
      }),
    ],
  });
  provider.register();
  registerInstrumentations({ instrumentations: [new GrpcInstrumentation()] });
  // Loaded after the instrumentation is registered, so it is patched.
  return { provider, grpc: createRequire(import.meta.url)('@grpc/grpc-js') };
}

const json = {
  serialize: (value) => Buffer.from(JSON.stringify(value)),
  deserialize: (bytes) => JSON.parse(bytes.toString()),
};
const definition = {
  find: {
    path: '/search.Search/Find',
    requestStream: false,
    responseStream: false,
    requestSerialize: json.serialize,
    requestDeserialize: json.deserialize,
    responseSerialize: json.serialize,
    responseDeserialize: json.deserialize,
  },
};
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

if (role === 'server') {
  const { provider, grpc } = instrument('hedge-search');
  const arrivals = new Map();
  let received = 0;
  let worked = 0; // ms the handlers ran, all of them
  const server = new grpc.Server();
  server.addService(definition, {
    find: (call, callback) => {
      const n = call.request.n;
      const nth = (arrivals.get(n) ?? 0) + 1;
      arrivals.set(n, nth);
      received += 1;
      const ms = [[10, 10], [400, 10], [200, 400]][n % 3][nth === 1 ? 0 : 1];
      const began = performance.now();
      setTimeout(() => {
        worked += performance.now() - began;
        callback(null, { n, nth });
      }, ms);
    },
  });
  server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (error, port) => {
    if (error) throw error;
    process.send({ port });
  });
  process.on('message', async () => {
    await sleep(800); // the last cancelled handlers finish, and their spans end
    await provider.forceFlush();
    process.send({ received, worked_seconds: worked / 1000 });
    server.forceShutdown();
    await provider.shutdown();
    process.exit(0);
  });
} else {
  const child = fork(new URL(import.meta.url).pathname, [url, countText, 'server']);
  const fromChild = () => new Promise((resolve) => child.once('message', resolve));
  const { port } = await fromChild();
  const { provider, grpc } = instrument('shop');
  const tracer = trace.getTracer('grpc-hedging');
  const Search = grpc.makeGenericClientConstructor(definition, 'Search');
  const serviceConfig = {
    methodConfig: [
      {
        name: [{ service: 'search.Search' }],
        hedgingPolicy: { maxAttempts: 2, hedgingDelay: '0.1s', nonFatalStatusCodes: [] },
      },
    ],
  };
  const client = new Search(`127.0.0.1:${port}`, grpc.credentials.createInsecure(), {
    'grpc.service_config': JSON.stringify(serviceConfig),
  });
  let answered = 0;
  for (let n = 0; n < count; n++) {
    await tracer.startActiveSpan('GET /find', { kind: SpanKind.SERVER }, async (span) => {
      await new Promise((resolve, reject) =>
        client.find({ n }, (error) => (error ? reject(error) : resolve())),
      );
      answered += 1;
      span.end();
    });
  }
  client.close();
  child.send('done');
  const { received, worked_seconds } = await fromChild();
  await provider.forceFlush();
  await provider.shutdown();
  console.log(JSON.stringify({ calls: count, answered, received, worked_seconds }));
}
