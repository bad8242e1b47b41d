"""Function calling through the official OpenAI Python SDK, as OpenAI's function-calling guide
runs it: the client offers functions, the response ends with function calls, the client runs
them and sends their outputs, the same Spool run goes on and answers.

Run by tests/tests/e2e/openai.rs with SPOOL_URL, TOKEN and MODEL (an agent whose model is the
tests' scripted upstream: it calls every offered function it is allowed to, one if
`parallel_tool_calls` is false, the named one under a forced `tool_choice`, and answers
`Answer: <outputs>` once the conversation ends with their results). Each check raises on
failure; the script exits 0 only when all passed.
"""

import json
import os

import openai

BASE = os.environ["SPOOL_URL"] + "/v1"
MODEL = os.environ["MODEL"]
client = openai.OpenAI(base_url=BASE, api_key=os.environ["TOKEN"], max_retries=0)

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
    {
        "type": "function",
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
]
CHAT_TOOLS = [
    {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
    for tool in TOOLS
]


def get_weather(city):
    return f"sunny in {city}"


def get_time(city):
    return f"noon in {city}"


FUNCTIONS = {"get_weather": get_weather, "get_time": get_time}


def check(name, condition, detail=""):
    if not condition:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}")


def call(name, arguments):
    return FUNCTIONS[name](**json.loads(arguments))


def the_guides_loop_resending_the_input_list():
    # https://platform.openai.com/docs/guides/function-calling, step by step.
    input_list = [{"role": "user", "content": "Weather and time in Paris?"}]
    response = client.responses.create(model=MODEL, tools=TOOLS, input=input_list)
    calls = [item for item in response.output if item.type == "function_call"]
    check("the response ends with two calls", response.status == "completed" and len(calls) == 2,
          response.output)
    check("the calls are the functions", sorted(c.name for c in calls) == ["get_time", "get_weather"])
    input_list += response.output
    for item in response.output:
        if item.type == "function_call":
            input_list.append({
                "type": "function_call_output",
                "call_id": item.call_id,
                "output": call(item.name, item.arguments),
            })
    final = client.responses.create(model=MODEL, tools=TOOLS, input=input_list)
    check("the follow-up answers with both outputs",
          "sunny in Paris" in final.output_text and "noon in Paris" in final.output_text,
          final.output_text)
    check("the follow-up is a new response", final.id != response.id, final.id)
    check("it names the one before", final.previous_response_id == response.id,
          final.previous_response_id)
    first = client.responses.retrieve(response.id)
    check("the first response stays as it was",
          first.status == "completed" and [i.type for i in first.output].count("function_call") == 2
          and first.output_text == "", first.output)
    check("the follow-up is stored", client.responses.retrieve(final.id).output_text == final.output_text)
    return response.conversation.id if response.conversation else None


def previous_response_id_and_streams():
    stream = client.responses.create(
        model=MODEL, tools=TOOLS, input="Weather and time in Rome?", stream=True
    )
    calls, types, response_id = [], [], None
    for event in stream:
        types.append(event.type)
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_item.done" and event.item.type == "function_call":
            calls.append(event.item)
    check("the stream ends completed at the calls", types[-1] == "response.completed", types)
    check("the stream shows both calls", len(calls) == 2, calls)
    outputs = [
        {"type": "function_call_output", "call_id": c.call_id, "output": call(c.name, c.arguments)}
        for c in calls
    ]
    text, final, indexes = "", None, set()
    for event in client.responses.create(
        model=MODEL, tools=TOOLS, previous_response_id=response_id, input=outputs, stream=True
    ):
        if event.type == "response.output_text.delta":
            text += event.delta
        if getattr(event, "output_index", None) is not None:
            indexes.add(event.output_index)
        final = event
    check("the follow-up's items are numbered from 0", indexes == {0}, indexes)
    check("the streamed follow-up ends completed", final.type == "response.completed", final.type)
    check("the streamed follow-up answers", "sunny in Rome" in text and "noon in Rome" in text, text)
    check("its response holds only the answer",
          [i.type for i in final.response.output] == ["message"], final.response.output)


def background_mode():
    response = client.responses.create(
        model=MODEL, tools=TOOLS, input="Weather and time in Oslo?", background=True
    )
    while response.status in ("queued", "in_progress"):
        response = client.responses.retrieve(response.id)
    calls = [item for item in response.output if item.type == "function_call"]
    check("a background response ends at the calls", response.status == "completed" and len(calls) == 2,
          response)
    follow = client.responses.create(
        model=MODEL, previous_response_id=response.id, background=True,
        input=[{"type": "function_call_output", "call_id": c.call_id,
                "output": call(c.name, c.arguments)} for c in calls],
    )
    check("the background follow-up answers at once", follow.status in ("queued", "in_progress"),
          follow.status)
    while follow.status in ("queued", "in_progress"):
        follow = client.responses.retrieve(follow.id)
    check("the background follow-up answers", "sunny in Oslo" in follow.output_text, follow.output_text)


def tool_choice_and_parallel_tool_calls():
    forced = client.responses.create(
        model=MODEL, tools=TOOLS, input="Time in Lima?",
        tool_choice={"type": "function", "name": "get_time"},
    )
    names = [i.name for i in forced.output if i.type == "function_call"]
    check("a forced tool_choice calls that function", names == ["get_time"], names)
    one = client.responses.create(
        model=MODEL, tools=TOOLS, input="Weather and time in Kyiv?", parallel_tool_calls=False,
    )
    calls = [i for i in one.output if i.type == "function_call"]
    check("parallel_tool_calls false: one call", len(calls) == 1 and one.parallel_tool_calls is False,
          calls)
    final = client.responses.create(
        model=MODEL, previous_response_id=one.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "42"}],
    )
    check("and it goes on", final.status in ("completed",), final.status)
    none = client.responses.create(model=MODEL, tools=TOOLS, input="Say hi", tool_choice="none")
    check("tool_choice none: no call", [i.type for i in none.output] == ["message"], none.output)
    # Close the threads these left waiting for nothing: their answers are the checks above.
    for item in [forced]:
        c = [i for i in item.output if i.type == "function_call"]
        client.responses.create(
            model=MODEL, previous_response_id=item.id,
            input=[{"type": "function_call_output", "call_id": x.call_id, "output": "n/a"} for x in c],
        )


def chat_completions():
    messages = [{"role": "user", "content": "Weather and time in Paris?"}]
    completion = client.chat.completions.create(model=MODEL, messages=messages, tools=CHAT_TOOLS)
    choice = completion.choices[0]
    check("a chat completion ends with tool_calls", choice.finish_reason == "tool_calls"
          and len(choice.message.tool_calls) == 2, choice)
    messages.append(choice.message)
    for tool_call in choice.message.tool_calls:
        messages.append({
            "role": "tool",
            "tool_call_id": tool_call.id,
            "content": call(tool_call.function.name, tool_call.function.arguments),
        })
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=CHAT_TOOLS)
    content = final.choices[0].message.content
    check("the tool messages answer it", final.choices[0].finish_reason == "stop"
          and "sunny in Paris" in content and "noon in Paris" in content, content)

    # Streamed, assembling the calls from the deltas as the guide does.
    messages = [{"role": "user", "content": "Weather and time in Bern?"}]
    calls, finish = {}, None
    for chunk in client.chat.completions.create(
        model=MODEL, messages=messages, tools=CHAT_TOOLS, stream=True
    ):
        if not chunk.choices:
            continue
        for delta in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = delta.id or entry["id"]
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    check("a streamed completion ends with tool_calls", finish == "tool_calls" and len(calls) == 2,
          (finish, calls))
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in calls.values()]})
    for c in calls.values():
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": call(c["name"], c["arguments"])})
    text = ""
    for chunk in client.chat.completions.create(
        model=MODEL, messages=messages, tools=CHAT_TOOLS, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    check("the streamed follow-up answers", "sunny in Bern" in text and "noon in Bern" in text, text)


def bad_input_is_refused():
    response = client.responses.create(model=MODEL, tools=TOOLS, input="Weather and time in Nice?")
    calls = [i for i in response.output if i.type == "function_call"]
    try:
        client.responses.create(
            model=MODEL, previous_response_id=response.id,
            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "x"}],
        )
        raise AssertionError("a missing output was accepted")
    except openai.BadRequestError as err:
        check("a missing output is a 400 naming the call", calls[1].call_id in str(err.body)
              and err.body.get("param") == "input", err.body)
    try:
        client.responses.create(
            model=MODEL, previous_response_id=response.id,
            input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}],
        )
        raise AssertionError("an unknown call was accepted")
    except openai.BadRequestError as err:
        check("an output for a call not pending is a 400", err.code == "unknown_call_id", err.body)
    try:
        client.responses.create(model=MODEL, input="hi", tools=[{"type": "web_search"}])
        raise AssertionError("a hosted tool was accepted")
    except openai.BadRequestError as err:
        check("a hosted tool is a 400 naming it", err.body.get("param") == "tools[0].type", err.body)
    try:
        client.responses.create(
            model=MODEL, previous_response_id="00000000-0000-4000-8000-000000000000",
            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "x"}],
        )
        raise AssertionError("an unknown previous_response_id was accepted")
    except openai.NotFoundError:
        check("an unknown previous_response_id is a 404", True)
    # Nothing changed: the right outputs still answer.
    final = client.responses.create(
        model=MODEL, previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": c.call_id, "output": call(c.name, c.arguments)}
               for c in calls],
    )
    check("after the refusals the outputs still answer", "sunny in Nice" in final.output_text,
          final.output_text)


the_guides_loop_resending_the_input_list()
previous_response_id_and_streams()
background_mode()
tool_choice_and_parallel_tool_calls()
chat_completions()
bad_input_is_refused()
print("all passed")
