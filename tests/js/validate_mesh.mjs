// Validates Kubernetes objects (a JSON array on stdin) against the upstream CRD schemas as
// @kubernetes-models packages them (Istio networking v1, Gateway API v1 and its
// experimental x-k8s.io v1alpha1): prints "<kind>/<name>: valid" per object, or the
// schema's error and exits 1. An object of another kind is an error.
import { VirtualService, DestinationRule } from "@kubernetes-models/istio/networking.istio.io/v1";
import { HTTPRoute } from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1";
import { XBackendTrafficPolicy } from "@kubernetes-models/gateway-api/gateway.networking.x-k8s.io/v1alpha1";

const models = { VirtualService, DestinationRule, HTTPRoute, XBackendTrafficPolicy };
const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const objects = JSON.parse(Buffer.concat(chunks).toString());
let failed = false;
for (const o of objects) {
  const Model = models[o.kind];
  const name = `${o.kind}/${o.metadata?.name}`;
  if (!Model) {
    console.log(`${name}: no schema for this kind`);
    failed = true;
    continue;
  }
  try {
    new Model(o).validate();
    console.log(`${name}: valid`);
  } catch (e) {
    console.log(`${name}: ${e.message}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
