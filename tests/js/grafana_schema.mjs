// Validates dashboards against Grafana's published dashboard schema: the `Dashboard` type of
// the @grafana/schema package (pinned in package.json), turned into a JSON Schema by
// ts-json-schema-generator and checked with ajv. Every violation is printed; the exit status
// is 1 if any dashboard has one. Driven by tests/prometheus.rs.
// Usage: node grafana_schema.mjs DASHBOARD.json...
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import Ajv from "ajv";
import { createGenerator } from "ts-json-schema-generator";

const require = createRequire(import.meta.url);
const types = join(
  dirname(require.resolve("@grafana/schema/package.json")),
  "dist/types/raw/dashboard/x/types.gen.d.ts",
);
const schema = createGenerator({ path: types, type: "Dashboard", skipTypeCheck: true }).createSchema("Dashboard");
const validate = new Ajv({ allErrors: true, strict: false }).compile(schema);
let invalid = 0;
for (const file of process.argv.slice(2)) {
  if (validate(JSON.parse(readFileSync(file, "utf8")))) {
    console.log(`${file}: valid`);
  } else {
    invalid++;
    for (const e of validate.errors) {
      console.log(`${file}: ${e.instancePath || "/"} ${e.message} ${JSON.stringify(e.params)}`);
    }
  }
}
process.exit(invalid ? 1 : 0);
