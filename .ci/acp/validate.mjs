// Validates a recorded ACP session (NDJSON lines {"dir": "c2a"|"a2c", "msg": {...}}) with the official
// SDK's own zod schemas, method by method. Prints {"checked", "invalid": [...], "methods": {...}}.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

// The schemas are not in the package's exports map: imported by their file.
const sdkRoot = join(dirname(fileURLToPath(import.meta.url)), "node_modules/@agentclientprotocol/sdk");
const z = await import(pathToFileURL(join(sdkRoot, "dist/v1/schema/zod.gen.js")).href);

// method -> [params schema, result schema]
const REQUESTS = {
  initialize: [z.zInitializeRequest, z.zInitializeResponse],
  "session/new": [z.zNewSessionRequest, z.zNewSessionResponse],
  "session/load": [z.zLoadSessionRequest, z.zLoadSessionResponse],
  "session/prompt": [z.zPromptRequest, z.zPromptResponse],
  "session/request_permission": [z.zRequestPermissionRequest, z.zRequestPermissionResponse],
};
const NOTIFICATIONS = { "session/update": z.zSessionNotification, "session/cancel": z.zCancelNotification };

const [tape] = process.argv.slice(2);
const pending = new Map(); // `${dir}:${id}` -> method
const out = { checked: 0, invalid: [], methods: {}, extensions: 0, errors: 0 };
const check = (schema, value, where) => {
  const result = schema.safeParse(value);
  out.checked += 1;
  if (!result.success) out.invalid.push({ where, issues: result.error.issues.slice(0, 3) });
};
for (const line of readFileSync(tape, "utf8").split("\n")) {
  if (!line.trim()) continue;
  const { dir, msg } = JSON.parse(line);
  if (msg.method !== undefined) {
    out.methods[msg.method] = (out.methods[msg.method] ?? 0) + 1;
    if (msg.method.startsWith("_")) {  // an extension: its shape is its own, its id is tracked
      out.extensions += 1;
      if (msg.id !== undefined) pending.set(`${dir}:${msg.id}`, msg.method);
      continue;
    }
    if (msg.id !== undefined) {
      const known = REQUESTS[msg.method];
      if (!known) { out.invalid.push({ where: `unknown request ${msg.method}` }); continue; }
      pending.set(`${dir}:${msg.id}`, msg.method);
      check(known[0], msg.params, `${msg.method} params`);
    } else {
      const schema = NOTIFICATIONS[msg.method];
      if (!schema) { out.invalid.push({ where: `unknown notification ${msg.method}` }); continue; }
      check(schema, msg.params, `${msg.method} params`);
    }
  } else {
    const asker = dir === "a2c" ? "c2a" : "a2c";
    const method = pending.get(`${asker}:${msg.id}`);
    if (method === undefined) { out.invalid.push({ where: `response to no request ${msg.id}` }); continue; }
    pending.delete(`${asker}:${msg.id}`);
    if (msg.error !== undefined) { out.errors += 1; check(z.zError, msg.error, `${method} error`); continue; }
    if (method.startsWith("_")) continue;
    check(REQUESTS[method][1], msg.result, `${method} result`);
    out.methods[`${method} result`] = (out.methods[`${method} result`] ?? 0) + 1;
  }
}
console.log(JSON.stringify(out));
