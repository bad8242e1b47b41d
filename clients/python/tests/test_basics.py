"""Routes, typed answers and errors. Needs `SPOOL_EXPECTED_DEMO` (the demo model's answer to
"hello")."""

import uuid

import pytest

from conftest import env
from spool_client import Accepted, Message, SpoolError, TextPart, Thread, Workflow


def test_a_message_is_sent_followed_and_read_back_typed(client):
    thread = str(uuid.uuid4())
    accepted = client.send_message(thread, "hello", metadata={"from": "pytest"})
    assert isinstance(accepted, Accepted)
    assert accepted.status == "queued"
    reply = client.follow(thread)
    assert reply.status == "completed"
    assert reply.message_id == accepted.message_id
    assert reply.text == env("SPOOL_EXPECTED_DEMO")

    messages = client.list_messages(thread)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert all(isinstance(m, Message) for m in messages)
    assert messages[0].metadata == {"from": "pytest"}
    assert messages[1].content == reply.text
    assert "".join(p.text for p in messages[1].parts if isinstance(p, TextPart)) == reply.text
    assert messages[1].status == "completed" and messages[1].workflow_id == accepted.workflow_id

    run = client.get_workflow(accepted.workflow_id)
    assert isinstance(run, Workflow)
    assert run.is_terminal and run.status == "completed"
    assert run.message_id == accepted.message_id
    runs = client.list_workflows(thread_id=thread)
    assert [r.workflow_id for r in runs.data] == [accepted.workflow_id]

    got = client.get_thread(thread)
    assert isinstance(got, Thread)
    assert got.status == "idle" and got.active_workflow_id is None
    assert thread in [t.id for t in client.list_threads(limit=100).data]


def test_nothing_streaming_ends_the_stream_with_message_not_streaming(client):
    thread = client.create_thread().id
    events = list(client.stream(thread))
    assert [e.type for e in events] == ["message_not_streaming"]
    assert events[0].is_gateway_event and events[0].id is None


def test_errors_are_spool_errors_with_their_code(client, admin):
    with pytest.raises(SpoolError) as missing:
        client.get_thread(str(uuid.uuid4()))
    assert missing.value.status == 404
    assert missing.value.code == "thread_not_found"

    with pytest.raises(SpoolError) as blank:
        client.send_message(str(uuid.uuid4()), "   ")
    assert (blank.value.status, blank.value.code) == (422, "invalid_input_text")

    with pytest.raises(SpoolError) as forbidden:
        client.create_agent({"name": "nope", "model": "demo"})
    assert forbidden.value.status == 403
    assert forbidden.value.code == "forbidden"


def test_agents_are_created_read_and_deleted_by_an_admin(admin, client):
    agent = admin.create_agent({"name": "pytest-agent", "model": "demo", "instructions": "Be brief."})
    assert agent.name == "pytest-agent" and agent.model == "demo"
    assert agent.spec["instructions"] == "Be brief."
    assert agent.id in [a.id for a in client.list_agents()]
    assert client.get_agent(agent.id) == agent
    admin.delete_agent(agent.id)
    with pytest.raises(SpoolError) as gone:
        client.get_agent(agent.id)
    assert gone.value.status == 404
