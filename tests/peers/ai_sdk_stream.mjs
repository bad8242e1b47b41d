// A client of `GET /v1/threads/{id}/stream?format=ai-sdk` built on the AI SDK's own parsers:
// `parseJsonEventStream` with `uiMessageChunkSchema` validates every chunk, `readUIMessageStream`
// assembles the message, and `eventsource-parser` (the SSE parser the SDK uses) gives the ids.
//
// Usage: node ai_sdk_stream.mjs BASE TOKEN THREAD [CUT]
// Reads the thread's stream. With CUT: prints READY once loaded and waits for a line on stdin
// (the run streams by then), drops the connection after CUT text deltas, prints "CUT <last
// id>", waits for another line, and resumes with Last-Event-ID. Prints the
// assembled message as one JSON line: {status, text, parts, superseded, chunks}.
import { createInterface } from "node:readline";
import { parseJsonEventStream, readUIMessageStream, uiMessageChunkSchema } from "ai";
import { EventSourceParserStream } from "eventsource-parser/stream";

const [base, token, thread, cutArg] = process.argv.slice(2);
const cut = cutArg ? Number(cutArg) : Infinity;

async function open(lastId, signal) {
  const headers = { Authorization: `Bearer ${token}` };
  if (lastId) headers["Last-Event-ID"] = lastId;
  return fetch(`${base}/v1/threads/${thread}/stream?format=ai-sdk`, { headers, signal });
}

// Reads one session: the validated chunks, the last SSE id, whether it was cut.
async function session(lastId, stopAfterDeltas) {
  const abort = new AbortController();
  const response = await open(lastId, abort.signal);
  if (response.status === 204) return { status: 204, chunks: [], lastId, cut: false };
  if (response.headers.get("x-vercel-ai-ui-message-stream") !== "v1") {
    throw new Error("missing x-vercel-ai-ui-message-stream: v1");
  }
  const [forChunks, forIds] = response.body.tee();
  const chunks = parseJsonEventStream({ stream: forChunks, schema: uiMessageChunkSchema }).getReader();
  const events = forIds.pipeThrough(new TextDecoderStream()).pipeThrough(new EventSourceParserStream()).getReader();
  const got = [];
  let deltas = 0;
  for (;;) {
    const { value: event, done } = await events.read();
    if (done) break;
    if (event.id) lastId = event.id;
    if (event.data === "[DONE]") continue;
    const { value: parsed } = await chunks.read();
    if (!parsed.success) throw new Error(`invalid chunk ${event.data}: ${parsed.error}`);
    got.push(parsed.value);
    if (parsed.value.type === "text-delta" && ++deltas >= stopAfterDeltas) {
      abort.abort();
      return { status: 200, chunks: got, lastId, cut: true };
    }
  }
  return { status: 200, chunks: got, lastId, cut: false };
}

const lines = createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => lines.once("line", resolve));
if (cutArg) {
  // Loaded: the test starts the run now, and says when it streams.
  console.log("READY");
  await nextLine();
}
const first = await session(undefined, cut);
let all = first.chunks;
if (first.status === 204) {
  console.log(JSON.stringify({ status: 204 }));
  process.exit(0);
}
if (first.cut) {
  console.log(`CUT ${first.lastId}`);
  await nextLine();
  const second = await session(first.lastId, Infinity);
  all = all.concat(second.chunks);
}
lines.close();
let message;
const stream = new ReadableStream({
  start(controller) {
    for (const chunk of all) controller.enqueue(chunk);
    controller.close();
  },
});
for await (const snapshot of readUIMessageStream({ stream, terminateOnError: true })) {
  message = snapshot;
}
const text = message.parts.filter((p) => p.type === "text" && !p.providerMetadata?.spool?.superseded);
console.log(
  JSON.stringify({
    status: 200,
    id: message.id,
    text: text.map((p) => p.text).join(""),
    parts: message.parts.map((p) => p.type),
    superseded: message.parts.filter((p) => p.providerMetadata?.spool?.superseded).length,
    chunks: all.map((c) => c.type),
  }),
);
