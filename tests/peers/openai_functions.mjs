// Function calling through the official OpenAI Node SDK, as OpenAI's function-calling guide
// runs it (see openai_functions.py for the scripted model behind MODEL): a response ends with
// two function calls, the outputs go back with `previous_response_id`, the same run answers;
// the same with Chat Completions' `tool` messages, streamed.
// Usage: SPOOL_URL=... TOKEN=... MODEL=... node openai_functions.mjs; exits 0 when every check passed.
import OpenAI from "openai";

const check = (name, ok, detail = "") => {
  if (!ok) throw new Error(`${name}: ${JSON.stringify(detail)}`);
  console.log(`ok ${name}`);
};
const client = new OpenAI({ baseURL: `${process.env.SPOOL_URL}/v1`, apiKey: process.env.TOKEN, maxRetries: 0 });
const model = process.env.MODEL;
const parameters = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };
const tools = [
  { type: "function", name: "get_weather", description: "The weather in a city.", parameters },
  { type: "function", name: "get_time", description: "The local time in a city.", parameters },
];
const functions = {
  get_weather: ({ city }) => `sunny in ${city}`,
  get_time: ({ city }) => `noon in ${city}`,
};
const run = (name, args) => functions[name](JSON.parse(args));

const response = await client.responses.create({ model, tools, input: "Weather and time in Paris?" });
const calls = response.output.filter((item) => item.type === "function_call");
check("the response ends with two calls", response.status === "completed" && calls.length === 2, response.output);
const final = await client.responses.create({
  model,
  tools,
  previous_response_id: response.id,
  input: calls.map((c) => ({ type: "function_call_output", call_id: c.call_id, output: run(c.name, c.arguments) })),
});
check("the outputs answer it", final.output_text.includes("sunny in Paris") && final.output_text.includes("noon in Paris"), final.output_text);
check("a new response of the same conversation", final.id !== response.id && final.conversation?.id === response.conversation?.id, final.id);

const chatTools = tools.map(({ type, ...fn }) => ({ type, function: fn }));
const messages = [{ role: "user", content: "Weather and time in Rome?" }];
const stream = await client.chat.completions.create({ model, messages, tools: chatTools, stream: true });
const pending = {};
let finish = null;
for await (const chunk of stream) {
  const choice = chunk.choices[0];
  if (!choice) continue;
  for (const delta of choice.delta.tool_calls ?? []) {
    const entry = (pending[delta.index] ??= { id: "", name: "", arguments: "" });
    entry.id = delta.id ?? entry.id;
    entry.name += delta.function?.name ?? "";
    entry.arguments += delta.function?.arguments ?? "";
  }
  finish = choice.finish_reason ?? finish;
}
const toolCalls = Object.values(pending);
check("a streamed completion ends with two tool calls", finish === "tool_calls" && toolCalls.length === 2, { finish, toolCalls });
messages.push({
  role: "assistant",
  content: null,
  tool_calls: toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } })),
});
for (const c of toolCalls) messages.push({ role: "tool", tool_call_id: c.id, content: run(c.name, c.arguments) });
const answer = await client.chat.completions.create({ model, messages, tools: chatTools });
const content = answer.choices[0].message.content;
check("the tool messages answer it", answer.choices[0].finish_reason === "stop" && content.includes("sunny in Rome"), content);

console.log("all passed");
