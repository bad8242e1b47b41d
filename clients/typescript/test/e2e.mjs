// The package through the AI SDK's own `Chat` (what `useChat` wraps) against a real Spool, driven
// by `tests/tests/e2e/ai_sdk_client.rs`, which starts the API, the workers and the fake model.
//
// Usage: node test/e2e.mjs SCENARIO BASE TOKEN THREAD
//   crash     the demo model answers slowly; after 5 text deltas the script prints STREAMING and
//             waits for a line on stdin (the test kills the worker and starts another), then drops
//             its connection; the transport resumes with Last-Event-ID and a fresh stream token.
//   approve   a client tool (`read_file`, answered in `onToolCall`), then a call that waits for
//             approval (`get_weather`), approved; `deny`: the same, denied.
// Asserts with node:assert, then prints one JSON line with what the test checks against Spool.
import assert from "node:assert/strict";
import { createInterface } from "node:readline";
import {
  AbstractChat,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
} from "ai";
import { SpoolChatTransport, loadThreadMessages, visibleParts } from "../dist/index.js";

const [scenario, base, token, thread] = process.argv.slice(2);

/** The state `useChat` keeps in React, kept in plain fields. */
class State {
  status = "ready";
  error = undefined;
  messages = [];
  pushMessage = (message) => {
    this.messages = this.messages.concat(message);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (index, message) => {
    this.messages = [...this.messages.slice(0, index), this.snapshot(message), ...this.messages.slice(index + 1)];
  };
  snapshot = (thing) => structuredClone(thing);
}

class Chat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new State() });
  }
}

/** Polls `check` every 50 ms until it returns something, for at most 60 s. */
async function until(what, check) {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

const lines = createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => lines.once("line", resolve));

/** A `fetch` that records every stream request and can drop the first stream's connection. */
function recordingFetch({ cutAfterDeltas } = {}) {
  const streams = [];
  let cut = false;
  const wrapped = async (url, init) => {
    const response = await fetch(url, init);
    if (!String(url).includes("/stream?")) return response;
    streams.push({
      authorization: init.headers.Authorization,
      lastEventId: init.headers["Last-Event-ID"] ?? null,
      status: response.status,
    });
    if (cut || cutAfterDeltas === undefined || response.status !== 200) return response;
    cut = true;
    // Passes the body through and, after `cutAfterDeltas` text deltas, waits for the test,
    // then errors it as a dropped connection would.
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let deltas = 0;
    const body = new ReadableStream({
      async pull(controller) {
        const { value, done } = await reader.read();
        if (done) return controller.close();
        controller.enqueue(value);
        deltas += (decoder.decode(value, { stream: true }).match(/"text-delta"/g) ?? []).length;
        if (deltas >= cutAfterDeltas) {
          console.log("STREAMING");
          await nextLine();
          await reader.cancel();
          controller.error(new TypeError("network error: the connection dropped"));
        }
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
  return { fetch: wrapped, streams };
}

const textOf = (message) =>
  visibleParts(message)
    .filter((part) => part.type === "text")
    .map((part) => part.text)
    .join("");

if (scenario === "crash") {
  const recorded = recordingFetch({ cutAfterDeltas: 5 });
  const transport = new SpoolChatTransport({ baseUrl: base, token, fetch: recorded.fetch, reconnectDelayMs: 200 });
  const chat = new Chat({ id: thread, transport });
  await chat.sendMessage({ text: "nested resume" });
  assert.equal(chat.status, "ready", String(chat.error));
  const answer = chat.messages.at(-1);
  assert.equal(answer.role, "assistant");
  // The history as Spool stored it is what the chat shows.
  const history = await loadThreadMessages({ baseUrl: base, token }, thread);
  // (A user message's id is the SDK's own; Spool's answer keeps Spool's message id.)
  const shown = (m) => [m.role === "assistant" ? m.id : "user", m.role, textOf(m)];
  assert.deepEqual(history.map(shown), chat.messages.map(shown));
  // Nothing streams any more: a chat opened on the history resumes nothing (`204`).
  const reopened = new Chat({ id: thread, transport: new SpoolChatTransport({ baseUrl: base, token, fetch: recorded.fetch }) });
  reopened.state.messages = history;
  await reopened.resumeStream();
  assert.equal(reopened.status, "ready");
  assert.equal(reopened.messages.length, history.length);
  // A second message on the same thread: its stream starts after the first one's end.
  await chat.sendMessage({ text: "again" });
  assert.equal(chat.status, "ready", String(chat.error));
  assert.equal(chat.messages.at(-1).role, "assistant", "the second message is answered");
  lines.close();
  console.log(
    JSON.stringify({
      id: answer.id,
      text: textOf(answer),
      parts: answer.parts.map((p) => p.type),
      second: { id: chat.messages.at(-1).id, text: textOf(chat.messages.at(-1)) },
      streams: recorded.streams.map((s) => ({ lastEventId: s.lastEventId, status: s.status })),
      longTokenStreams: recorded.streams.filter((s) => s.authorization === `Bearer ${token}`).length,
      historyRoles: history.map((m) => m.role),
    }),
  );
} else if (scenario === "approve" || scenario === "deny") {
  const approve = scenario === "approve";
  const recorded = recordingFetch();
  const transport = new SpoolChatTransport({ baseUrl: base, token, fetch: recorded.fetch });
  const toolCalls = [];
  const chat = new Chat({
    id: thread,
    transport,
    sendAutomaticallyWhen: (options) =>
      lastAssistantMessageIsCompleteWithToolCalls(options) || lastAssistantMessageIsCompleteWithApprovalResponses(options),
    onToolCall: ({ toolCall }) => {
      toolCalls.push(toolCall.toolName);
      if (toolCall.toolName === "read_file") {
        // Not awaited, as the SDK's documentation says: `addToolOutput` waits for this callback.
        void chat.addToolOutput({ tool: "read_file", toolCallId: toolCall.toolCallId, output: "the notes" });
      }
    },
  });
  await chat.sendMessage({ text: "read my notes, then the weather" });
  const pending = await until("the approval request", () =>
    chat.messages
      .at(-1)
      ?.parts.find((part) => part.type === "tool-get_weather" && part.state === "approval-requested"),
  );
  await chat.addToolApprovalResponse({ id: pending.approval.id, approved: approve, reason: approve ? undefined : "not now" });
  const done = await until("the answer", () => {
    const last = chat.messages.at(-1);
    return chat.status === "ready" && textOf(last).includes("All done.") ? last : null;
  });
  assert.equal(chat.error, undefined);
  const tools = Object.fromEntries(
    done.parts.filter((p) => p.type.startsWith("tool-")).map((p) => [p.type, { state: p.state, output: p.output }]),
  );
  const history = await loadThreadMessages({ baseUrl: base, token }, thread);
  lines.close();
  console.log(
    JSON.stringify({
      id: done.id,
      text: textOf(done),
      toolCalls,
      tools,
      messages: chat.messages.length,
      historyTools: history.at(-1).parts.filter((p) => p.type.startsWith("tool-")).map((p) => [p.type, p.state]),
      longTokenStreams: recorded.streams.filter((s) => s.authorization === `Bearer ${token}`).length,
    }),
  );
} else {
  throw new Error(`unknown scenario ${scenario}`);
}
