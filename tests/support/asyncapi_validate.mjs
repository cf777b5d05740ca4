// Validates an AsyncAPI document with the real @asyncapi/parser (installed by scripts/test
// into .npm-tools/). Prints {"diagnostics": [...]} as JSON; exits 1 when any diagnostic is
// an error (severity 0), 2 when the document cannot be read.
// usage: node tests/support/asyncapi_validate.mjs docs/asyncapi.yaml
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve } from "node:path";

const root = process.env.EDGE_VISION_NPM_TOOLS || resolve(process.cwd(), ".npm-tools");
const require = createRequire(resolve(root, "package.json"));
const { Parser } = require("@asyncapi/parser");

const path = process.argv[2];
let text;
try {
  text = readFileSync(path, "utf8");
} catch (e) {
  console.log(JSON.stringify({ error: String(e) }));
  process.exit(2);
}
const parser = new Parser();
const diagnostics = await parser.validate(text, { source: resolve(path) });
const out = diagnostics.map((d) => ({
  code: d.code,
  message: d.message,
  path: d.path,
  severity: d.severity,
}));
const { document } = await parser.parse(text, { source: resolve(path) });
console.log(
  JSON.stringify({
    diagnostics: out,
    parsed: document ? { version: document.version(), messages: document.allMessages().length } : null,
  }),
);
process.exit(out.some((d) => d.severity === 0) ? 1 : 0);
