"""Structured outputs through the official OpenAI Python SDK: `responses.parse()` and
`chat.completions.parse()` with a Pydantic model, `text.format` json_schema strict or not, and an
answer that never validates.

Run by tests/tests/e2e/openai.rs with SPOOL_URL, TOKEN and MODEL (an agent whose provider is the
test's fake OpenAI upstream: it answers `{"city": "Paris", "temperature_c": 21}` when asked for
JSON, reporting 32 cached prompt tokens and 8 reasoning tokens, and prose to a request that says
"never"). Each check raises on failure; prints `all passed` at the end.
"""

import os
import sys

import openai
from pydantic import BaseModel

client = openai.OpenAI(base_url=os.environ["SPOOL_URL"] + "/v1", api_key=os.environ["TOKEN"],
                       max_retries=0)
MODEL = os.environ["MODEL"]


class Weather(BaseModel):
    city: str
    temperature_c: int


PARIS = Weather(city="Paris", temperature_c=21)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "temperature_c": {"type": "integer"}},
          "required": ["city", "temperature_c"], "additionalProperties": False}


def check(name, condition, detail=""):
    if not condition:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}")


def responses_parse():
    response = client.responses.parse(model=MODEL, input="weather in Paris?", text_format=Weather)
    check("responses.parse returns the object", response.output_parsed == PARIS,
          response.output_text)
    check("text.format is the request's", response.text.format.type == "json_schema"
          and response.text.format.name == "Weather", response.text)
    usage = response.usage
    check("cached tokens passed through", usage.input_tokens_details.cached_tokens == 32, usage)
    check("reasoning tokens passed through", usage.output_tokens_details.reasoning_tokens == 8,
          usage)
    loose = client.responses.create(
        model=MODEL, input="weather in Paris, loosely?",
        text={"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA,
                         "strict": False}})
    check("strict false validates too",
          Weather.model_validate_json(loose.output_text) == PARIS, loose.output_text)
    with client.responses.stream(model=MODEL, input="weather, streamed?",
                                 text_format=Weather) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    check("a streamed parse", final.output_parsed == PARIS, final.output_text)


def never_validates():
    response = client.responses.create(
        model=MODEL, input="never answer in JSON",
        text={"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA,
                         "strict": True}})
    check("a failed response", response.status == "failed", response.status)
    check("its error names invalid_output", response.error.message.startswith("invalid_output"),
          response.error)
    try:
        client.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": "never answer in JSON"}],
            response_format=Weather)
        check("chat invalid_output", False, "no error")
    except openai.UnprocessableEntityError as err:
        check("chat: 422 invalid_output", err.code == "invalid_output", err.body)
    try:
        client.responses.create(model=MODEL, input="x",
                                text={"format": {"type": "json_schema", "name": "bad name",
                                                 "schema": SCHEMA}})
        check("bad format", False, "no error")
    except openai.BadRequestError as err:
        check("a bad format is a 400", err.code == "invalid_response_format"
              and err.param == "text.format", err.body)


def chat_parse():
    completion = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "weather in Paris?"}],
        response_format=Weather)
    message = completion.choices[0].message
    check("chat.completions.parse returns the object", message.parsed == PARIS, message.content)
    check("chat cached tokens", completion.usage.prompt_tokens_details.cached_tokens == 32,
          completion.usage)
    check("chat reasoning tokens",
          completion.usage.completion_tokens_details.reasoning_tokens == 8, completion.usage)


if __name__ == "__main__":
    responses_parse()
    chat_parse()
    never_validates()
    print("all passed")
    sys.exit(0)
