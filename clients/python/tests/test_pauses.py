"""A client tool and an approval through the stream helper. Needs `SPOOL_AGENT_ID`: an agent
whose model calls the client tool `read_file` (call `c1`), then `get_weather` (`c2`, which
needs approval), then answers "All done."."""

from conftest import env


def test_a_client_tool_and_an_approval_are_answered_between_streams(client):
    thread = client.create_thread(agent_id=env("SPOOL_AGENT_ID")).id
    accepted = client.send_message(thread, "read my notes, then the weather")

    first = client.follow(thread, stop_at_pause=True)
    assert first.pause is not None and first.pause.type == "requires_action"
    assert [c["tool_name"] for c in first.pause.data["tool_calls"]] == ["read_file"]
    run = client.get_workflow(accepted.workflow_id)
    assert run.status == "requires_action"
    assert run.pending_action.type == "submit_tool_outputs"
    assert [c.tool_call_id for c in run.pending_action.tool_calls] == ["c1"]
    client.submit_tool_outputs(accepted.workflow_id, {"c1": "the notes"})

    second = client.follow(thread, last_event_id=first.pause.id, stop_at_pause=True)
    assert second.pause is not None and second.pause.type == "approval_requested"
    assert second.pause.data["tool_name"] == "get_weather"
    run = client.get_workflow(accepted.workflow_id)
    assert run.status == "awaiting_approval"
    assert run.pending_action.type == "approval"
    client.approve(accepted.workflow_id, "c2", True)

    last = client.follow(thread, last_event_id=second.pause.id)
    assert last.status == "completed"
    assert last.text == "All done."
    assert [r["tool_name"] for r in second.tool_results] == ["read_file"]
    assert [r["tool_name"] for r in last.tool_results] == ["get_weather"]
    assert "sunny" in last.tool_results[-1]["output"]
    messages = client.list_messages(thread)
    results = [p for p in messages[-1].parts if p.type == "tool_result"]
    assert [r.output for r in results][0] == "the notes"


def test_a_graph_s_human_input_is_a_pause_answered_with_submit_input(client):
    """Needs `SPOOL_GRAPH_AGENT_ID`: a graph agent whose entry is a `human_input` node `ask`
    (output key `answer`) followed by an end node answering "You said: {{answer}}"."""
    thread = client.create_thread(agent_id=env("SPOOL_GRAPH_AGENT_ID")).id
    accepted = client.send_message(thread, "start")

    first = client.follow(thread, stop_at_pause=True)
    assert first.pause is not None and first.pause.type == "input_requested"
    assert first.pause.data["node"] == "ask"
    assert first.status is None, "the stream stopped at the pause, before the run's end"
    assert client.get_workflow(accepted.workflow_id).status == "requires_action"
    answered = client.submit_input(accepted.workflow_id, "blue")
    assert answered.status == "queued"

    last = client.follow(thread, last_event_id=first.pause.id)
    assert last.status == "completed"
    assert last.pause is None
    # The end node's rendered output is the message's text (it streams as `message_end`'s
    # `output`, not as text: only `llm` nodes stream text, DESIGN section 14).
    assert client.list_messages(thread)[-1].content == "You said: blue"
