// The official OpenAI Node SDK against Spool's OpenAI-compatible routes, unchanged: the
// docs/clients.md's three lines, a background stream dropped mid-answer and resumed with
// `starting_after`, a streamed chat completion, a typed 404.
// Usage: SPOOL_URL=... TOKEN=... REPLY=... node openai_sdk.mjs; exits 0 when every check passed.
import OpenAI from "openai";

const check = (name, ok, detail = "") => {
  if (!ok) throw new Error(`${name}: ${JSON.stringify(detail)}`);
  console.log(`ok ${name}`);
};
const client = new OpenAI({ baseURL: `${process.env.SPOOL_URL}/v1`, apiKey: process.env.TOKEN, maxRetries: 0 });

// docs/clients.md's example.
const hello = await client.responses.create({ model: "spool-default", input: "Hello!" });
check("a blocking create", hello.status === "completed" && hello.output_text.startsWith("[demo]"), hello.status);

const stream = await client.responses.create({ model: "spool-default", input: "resume me", background: true, stream: true });
let id;
let last = 0;
let text = "";
let deltas = 0;
for await (const event of stream) {
  if (event.type === "response.created") id = event.response.id;
  last = event.sequence_number;
  if (event.type === "response.output_text.delta") {
    text += event.delta;
    if (++deltas === 4) break; // the connection drops mid-answer
  }
}
const resumed = await client.responses.retrieve(id, { stream: true, starting_after: last });
const numbers = [];
for await (const event of resumed) {
  numbers.push(event.sequence_number);
  if (event.type === "response.output_text.delta") text += event.delta;
}
check("resumed exactly after the cursor", numbers[0] === last + 1 && numbers.every((n, i) => n === last + 1 + i), numbers);
const stored = await client.responses.retrieve(id);
check("the streamed text is the stored text", text === stored.output_text, [text, stored.output_text]);
check("the stored text is the answer", stored.output_text === process.env.REPLY, stored.output_text);

const chunks = await client.chat.completions.create({
  model: "spool-default",
  messages: [{ role: "user", content: "chat with me" }],
  stream: true,
});
let chat = "";
for await (const chunk of chunks) chat += chunk.choices[0]?.delta?.content ?? "";
check("a streamed chat completion", chat.startsWith('[demo] You said "chat with me"'), chat);

try {
  await client.responses.retrieve("00000000-0000-0000-0000-000000000000");
  check("404", false);
} catch (err) {
  check("404 NotFoundError", err instanceof OpenAI.NotFoundError && err.code === "response_not_found", err.message);
}
console.log("all passed");
