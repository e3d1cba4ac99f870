// An ACP agent written on the official SDK (@agentclientprotocol/sdk), run under `hopline serve`.
// Prompt text commands: "permission" (asks session/request_permission, says the outcome), "wait"
// (waits for session/cancel, then ends cancelled), anything else echoed; session/load replays.
import { Readable, Writable } from "node:stream";
import { agent, ndJsonStream, PROTOCOL_VERSION } from "@agentclientprotocol/sdk";

const waiting = new Map();
const say = (ctx, sessionId, text) => ctx.client.notify("session/update", {
  sessionId, update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } } });

const app = agent()
  .onRequest("initialize", async () => ({
    protocolVersion: PROTOCOL_VERSION,
    agentCapabilities: { loadSession: true, promptCapabilities: { image: true, embeddedContext: true } },
    agentInfo: { name: "sdk-agent", version: "1.0.0" },
  }))
  .onRequest("session/new", async () => ({ sessionId: `sdk-${Date.now()}-${Math.random().toString(16).slice(2)}` }))
  .onRequest("session/load", async (ctx) => {
    await say(ctx, ctx.params.sessionId, "replayed 0");
    return {};
  })
  .onRequest("session/prompt", async (ctx) => {
    const { sessionId, prompt } = ctx.params;
    const text = prompt.filter((b) => b.type === "text").map((b) => b.text).join(" ").trim();
    if (text === "permission") {
      const answer = await ctx.client.request("session/request_permission", {
        sessionId,
        toolCall: { toolCallId: "call-1", title: "run something", kind: "execute", status: "pending" },
        options: [{ optionId: "allow", name: "Allow", kind: "allow_once" },
                  { optionId: "deny", name: "Deny", kind: "reject_once" }],
      });
      await say(ctx, sessionId, `permission: ${answer.outcome.optionId ?? answer.outcome.outcome}`);
      return { stopReason: "end_turn" };
    }
    if (text === "wait") {
      await say(ctx, sessionId, "waiting");
      await new Promise((resolve) => waiting.set(sessionId, resolve));
      return { stopReason: "cancelled" };
    }
    await say(ctx, sessionId, `echo: ${text} (${prompt.map((b) => b.type).join(",")})`);
    return { stopReason: "end_turn", _meta: { "sdk.turn": { blocks: prompt.length } } };
  })
  .onNotification("session/cancel", async (ctx) => {
    waiting.get(ctx.params.sessionId)?.();
  });

app.connect(ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin)));
