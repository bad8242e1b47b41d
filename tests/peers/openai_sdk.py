"""The official OpenAI Python SDK against Spool's OpenAI-compatible routes, unchanged.

Run by tests/tests/e2e/openai.rs with SPOOL_URL (the API's base URL), TOKEN (alice's),
BOB_TOKEN (a user whose concurrent runs are capped at 2) and REPLY (the demo reply to "resume
me"). The API runs a slow demo model (a delta every 50 ms). Each check raises on failure; the
script prints one line per check and exits 0 only when all passed.
"""

import os
import sys
import uuid

import openai

BASE = os.environ["SPOOL_URL"] + "/v1"
client = openai.OpenAI(base_url=BASE, api_key=os.environ["TOKEN"], max_retries=0)
bob = openai.OpenAI(base_url=BASE, api_key=os.environ["BOB_TOKEN"], max_retries=0)


def check(name, condition, detail=""):
    if not condition:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}")


def background_stream_resumes_after_a_dropped_connection():
    stream = client.responses.create(
        model="spool-default", input="resume me", background=True, stream=True
    )
    first, last_seq, response_id, deltas = "", None, None, 0
    for event in stream:
        last_seq = event.sequence_number
        if event.type == "response.created":
            response_id = event.response.id
            check("created is sequence 0", event.sequence_number == 0)
        if event.type == "response.output_text.delta":
            first += event.delta
            deltas += 1
            if deltas == 5:
                break
    stream.close()  # the connection drops mid-answer
    check("dropped mid-answer", 0 < len(first) < len(os.environ["REPLY"]), first)

    # Resume through the SDK's own API: the server sends only what follows.
    resumed, seqs, final = "", [], None
    for event in client.responses.retrieve(
        response_id, stream=True, starting_after=last_seq
    ):
        seqs.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            resumed += event.delta
        final = event
    check("resumed in order, exactly once", seqs == list(range(last_seq + 1, last_seq + 1 + len(seqs))), seqs)
    check("ends completed", final.type == "response.completed", final.type)
    stored = client.responses.retrieve(response_id)
    check("stored response is completed", stored.status == "completed", stored.status)
    check("streamed text is the stored text", first + resumed == stored.output_text,
          (first + resumed, stored.output_text))
    check("stored text is the answer", stored.output_text == os.environ["REPLY"], stored.output_text)
    check("usage is stored", stored.usage is not None and stored.usage.output_tokens > 0)

    # The SDK's accumulating helper, resuming after the same event: the same final response.
    with client.responses.stream(response_id=response_id, starting_after=last_seq) as helper:
        helper_text = "".join(
            e.delta for e in helper if e.type == "response.output_text.delta"
        )
        helper_final = helper.get_final_response()
    check("helper resumes with the rest", helper_text == resumed, helper_text)
    check("helper's final response", helper_final.output_text == stored.output_text)

    # Beyond the last event: nothing is replayed (the stream follows live from the end).
    late = list(client.responses.retrieve(response_id, stream=True, starting_after=10_000))
    check("starting_after beyond the end replays nothing", late == [], [e.type for e in late])
    return response_id


def blocking_and_background_creates():
    response = client.responses.create(model="spool-default", input="block")
    check("blocking create completes", response.status == "completed", response.status)
    check("blocking create has the text", response.output_text.startswith("[demo]"))
    queued = client.responses.create(model="spool-default", input="later", background=True)
    check("background create is queued", queued.status in ("queued", "in_progress"), queued.status)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    once = client.responses.create(model="spool-default", input="once", background=True, extra_headers=key)
    again = client.responses.create(model="spool-default", input="once", background=True, extra_headers=key)
    check("a retried create with its Idempotency-Key is the first response", once.id == again.id)
    # At most 2 active runs per user (SPOOL_QUOTA_USER_CONCURRENT_RUNS): make room.
    client.responses.cancel(once.id)
    client.responses.cancel(queued.id)
    follow = client.responses.create(
        model="spool-default", input="and then?", previous_response_id=response.id
    )
    check("previous_response_id continues the thread",
          follow.conversation.id == response.conversation.id)


def cancel_through_the_sdk():
    response = client.responses.create(
        model="spool-default", input="cancel me", background=True
    )
    cancelled = client.responses.cancel(response.id)
    check("cancel answers the response", cancelled.id == response.id)
    events = list(client.responses.retrieve(response.id, stream=True))
    # OpenAI's document has no `response.cancelled`: the terminal event is `response.failed`,
    # its response `cancelled`.
    check("the stream ends cancelled",
          (events[-1].type, events[-1].response.status) == ("response.failed", "cancelled"),
          events[-1].type)
    check("stored as cancelled", client.responses.retrieve(response.id).status == "cancelled")


def chat_completions():
    completion = client.chat.completions.create(
        model="spool-default",
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "chat with me"},
        ],
        temperature=0.2,
    )
    text = completion.choices[0].message.content
    check("chat completion", text.startswith('[demo] You said "chat with me"'), text)
    check("chat usage", completion.usage.completion_tokens > 0)
    chunks = client.chat.completions.create(
        model="spool-default",
        messages=[{"role": "user", "content": "stream with me"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    streamed, finish, usage = "", None, None
    for chunk in chunks:
        if chunk.choices:
            streamed += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    check("streamed chat completion", streamed.startswith('[demo] You said "stream with me"'), streamed)
    check("finish_reason stop", finish == "stop", finish)
    check("usage chunk", usage is not None and usage.completion_tokens > 0)
    models = [m.id for m in client.models.list()]
    check("models list the default agent", "spool-default" in models, models)


def conversations():
    conversation = client.conversations.create(
        items=[
            {"type": "message", "role": "user", "content": "My name is Ada."},
            {"type": "message", "role": "assistant", "content": "Hello Ada."},
        ],
        metadata={"topic": "intro"},
    )
    check("conversation id", conversation.id.startswith("conv_"), conversation.id)
    check("conversation metadata", conversation.metadata == {"topic": "intro"}, conversation.metadata)
    got = client.conversations.retrieve(conversation.id)
    check("conversation retrieved", got.id == conversation.id and got.created_at == conversation.created_at)
    try:
        bob.conversations.retrieve(got.id)
        check("another's conversation", False, "no error")
    except openai.NotFoundError as err:
        check("another's conversation is 404", err.code == "conversation_not_found", err.body)
    updated = client.conversations.update(conversation.id, metadata={"topic": "names"})
    check("metadata updated", updated.metadata == {"topic": "names"}, updated.metadata)
    items = client.conversations.items.list(conversation.id)
    check("items newest first", [i.role for i in items.data] == ["assistant", "user"],
          [i.role for i in items.data])
    check("item text", items.data[1].content[0].text == "My name is Ada.", items.data[1])
    added = client.conversations.items.create(
        conversation.id, items=[{"type": "message", "role": "user", "content": "Noted?"}]
    )
    check("items added", [i.content[0].text for i in added.data] == ["Noted?"], added)
    response = client.responses.create(
        model="spool-default", input="who am I", conversation=conversation.id
    )
    check("a response in the conversation", response.conversation.id == conversation.id,
          response.conversation)
    check("a plain create is not background", response.background is False, response.background)
    ascending = client.conversations.items.list(conversation.id, order="asc", limit=100)
    texts = [i.content[0].text for i in ascending.data]
    check("the response's turn is in the conversation",
          texts[:4] == ["My name is Ada.", "Hello Ada.", "Noted?", "who am I"]
          and texts[4].startswith("[demo]"), texts)
    page = client.conversations.items.list(conversation.id, order="asc", limit=2)
    check("a page", page.has_more and len(page.data) == 2, page)
    rest = client.conversations.items.list(conversation.id, order="asc", after=page.last_id)
    check("after the page", [i.id for i in rest.data] == [i.id for i in ascending.data[2:]])
    # The bare thread id names the same conversation.
    thread = conversation.id.removeprefix("conv_")
    thread = f"{thread[:8]}-{thread[8:12]}-{thread[12:16]}-{thread[16:20]}-{thread[20:]}"
    check("the thread id names it", client.conversations.retrieve(thread).id == conversation.id)
    deleted = client.conversations.delete(conversation.id)
    check("deleted", deleted.deleted and deleted.id == conversation.id, deleted)
    try:
        client.conversations.retrieve(conversation.id)
        check("deleted is gone", False, "no error")
    except openai.NotFoundError as err:
        check("deleted is gone", err.code == "conversation_not_found", err.body)
    try:
        client.conversations.create(items=[{"type": "message", "role": "system", "content": "x"}])
        check("400 items", False, "no error")
    except openai.BadRequestError as err:
        check("a system item is refused", err.code == "unsupported_input", err.body)


def typed_errors():
    try:
        openai.OpenAI(base_url=BASE, api_key="not-a-token", max_retries=0).models.list()
        check("401", False, "no error")
    except openai.AuthenticationError as err:
        check("401 AuthenticationError", err.code == "invalid_token", err.body)
    try:
        client.responses.retrieve(str(uuid.uuid4()))
        check("404", False, "no error")
    except openai.NotFoundError as err:
        check("404 NotFoundError", err.code == "response_not_found", err.body)
    try:
        client.responses.create(model="no-such-agent", input="x")
        check("404 model", False, "no error")
    except openai.NotFoundError as err:
        check("404 model_not_found", err.code == "model_not_found", err.body)
    conversation = str(uuid.uuid4())
    busy = client.responses.create(
        model="spool-default", input="busy", conversation=conversation, background=True
    )
    try:
        client.responses.create(model="spool-default", input="again", conversation=conversation)
        check("409", False, "no error")
    except openai.ConflictError as err:
        check("409 ConflictError", err.code == "thread_busy", err.body)
    client.responses.cancel(busy.id)
    running = [
        bob.responses.create(model="spool-default", input=f"slow {i}", background=True)
        for i in range(2)
    ]
    try:
        bob.responses.create(model="spool-default", input="one too many", background=True)
        check("429", False, "no error")
    except openai.RateLimitError as err:
        check("429 RateLimitError", err.code == "concurrency_limited", err.body)
    for response in running:
        bob.responses.cancel(response.id)
    try:
        client.responses.create(model="spool-default", input=[{"type": "function_call_output", "call_id": "c", "output": "1"}])
        check("400", False, "no error")
    except openai.BadRequestError as err:
        # An output for a call no response of this user waits for.
        check("400 BadRequestError", err.code == "no_pending_call" and err.param == "input", err.body)


if __name__ == "__main__":
    background_stream_resumes_after_a_dropped_connection()
    blocking_and_background_creates()
    cancel_through_the_sdk()
    chat_completions()
    conversations()
    typed_errors()
    print("all passed")
    sys.exit(0)
