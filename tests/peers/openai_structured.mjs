// Structured outputs through the official OpenAI Node SDK with a Zod schema, as OpenAI's
// structured-outputs guide runs them: `responses.parse()` with `zodTextFormat` (whole and
// streamed) and `chat.completions.parse()` with `zodResponseFormat` return the parsed object;
// an answer that never validates fails as `invalid_output`.
// Run by tests/tests/e2e/openai.rs with SPOOL_URL, TOKEN and MODEL (an agent whose provider is
// the test's fake OpenAI upstream: it answers `{"city": "Paris", "temperature_c": 21}` when
// asked for JSON, and prose to a request that says "never"). Exits 0 when every check passed.
import OpenAI from "openai";
import { zodResponseFormat, zodTextFormat } from "openai/helpers/zod";
import { z } from "zod";

const check = (name, ok, detail = "") => {
  if (!ok) throw new Error(`${name}: ${JSON.stringify(detail)}`);
  console.log(`ok ${name}`);
};
const client = new OpenAI({ baseURL: `${process.env.SPOOL_URL}/v1`, apiKey: process.env.TOKEN, maxRetries: 0 });
const model = process.env.MODEL;
const Weather = z.object({ city: z.string(), temperature_c: z.number().int() });
const paris = (parsed) => parsed?.city === "Paris" && parsed?.temperature_c === 21;

const response = await client.responses.parse({
  model,
  input: "weather in Paris?",
  text: { format: zodTextFormat(Weather, "weather") },
});
check("responses.parse returns the object", paris(response.output_parsed), response.output_text);
check("text.format is the request's", response.text.format.type === "json_schema"
  && response.text.format.name === "weather" && response.text.format.strict === true, response.text);

const stream = client.responses.stream({
  model,
  input: "weather, streamed?",
  text: { format: zodTextFormat(Weather, "weather") },
});
const final = await stream.finalResponse();
check("a streamed parse", paris(final.output_parsed), final.output_text);

const completion = await client.chat.completions.parse({
  model,
  messages: [{ role: "user", content: "weather in Paris?" }],
  response_format: zodResponseFormat(Weather, "weather"),
});
const message = completion.choices[0].message;
check("chat.completions.parse returns the object", paris(message.parsed), message.content);

const failed = await client.responses.create({
  model,
  input: "never answer in JSON",
  text: { format: zodTextFormat(Weather, "weather") },
});
check("an answer that never validates fails", failed.status === "failed"
  && failed.error?.message?.startsWith("invalid_output"), failed.error);
try {
  await client.chat.completions.parse({
    model,
    messages: [{ role: "user", content: "never answer in JSON" }],
    response_format: zodResponseFormat(Weather, "weather"),
  });
  check("chat invalid_output", false, "no error");
} catch (err) {
  check("chat: 422 invalid_output", err instanceof OpenAI.UnprocessableEntityError
    && err.code === "invalid_output", err.message);
}
console.log("all passed");
