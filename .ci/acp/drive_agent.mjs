// The official SDK's client driving an ACP agent on stdio (`node drive_agent.mjs CWD -- CMD...`):
// initialize, session/new, a prompt whose tool asks permission (answered), a prompt cancelled
// mid-turn, session/load. Prints one JSON line: what it saw.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { client, ndJsonStream, PROTOCOL_VERSION } from "@agentclientprotocol/sdk";

const [cwd, , ...argv] = process.argv.slice(2);
const child = spawn(argv[0], argv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
const seen = { updates: 0, permissions: 0, stopReasons: [], loadUpdates: 0 };
let onUpdate = () => {};

const app = client()
  .onRequest("session/request_permission", async (ctx) => {
    seen.permissions += 1;
    return { outcome: { outcome: "selected", optionId: ctx.params.options[0].optionId } };
  })
  .onNotification("session/update", async (ctx) => {
    seen.updates += 1;
    onUpdate(ctx.params.update);
  });

await app.connectWith(ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout)), async (agent) => {
  const init = await agent.request("initialize", {
    protocolVersion: PROTOCOL_VERSION, clientCapabilities: { fs: { readTextFile: false, writeTextFile: false } } });
  seen.loadSession = init.agentCapabilities?.loadSession === true;
  seen.promptCapabilities = init.agentCapabilities?.promptCapabilities ?? null;
  const { sessionId } = await agent.request("session/new", {
    cwd, mcpServers: [], _meta: { "hopline.scripted": { iterations: 1, toolsPerIteration: 1 } } });
  const blocks = [{ type: "text", text: "run the tests" },
                  { type: "resource_link", uri: "calc.py", name: "calc.py" },
                  { type: "resource", resource: { uri: "mem://note", text: "a note" } }];
  const first = await agent.request("session/prompt", { sessionId, prompt: blocks });
  seen.stopReasons.push(first.stopReason);
  // a turn cancelled once it has started talking
  const started = new Promise((resolve) => { onUpdate = resolve; });
  const turn = agent.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "again" }] });
  await started;
  onUpdate = () => {};
  await agent.notify("session/cancel", { sessionId });
  seen.stopReasons.push((await turn).stopReason);
  const before = seen.updates;
  await agent.request("session/load", { sessionId, cwd, mcpServers: [] });
  seen.loadUpdates = seen.updates - before;
});
child.stdin.end();
console.log(JSON.stringify(seen));
