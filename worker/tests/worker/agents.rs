//! Agents as tools: a call of an agent tool starts a durable child run on the parent's
//! thread, the parent waits for it without a worker, and the child's final text comes back as
//! the call's result; `max_call_depth` bounds the nesting.

use serde_json::{Value, json};

use spool_shared::WorkflowId;
use spool_shared::db::agents;
use spool_tests::fake_llm::{self, FakeLlm, last_tool_result, tool_results_in};

use crate::harness::Harness;

/// The system prompt of a request (the agent that asked).
fn instructions(request: &Value) -> &str {
    request["messages"][0]["content"].as_str().unwrap_or("")
}

/// The child runs of `parent`: `(id, status, depth, parent_tool_call_id, attempt)`.
async fn children(app: &Harness, parent: &Value) -> Vec<(WorkflowId, String, i16, String, i32)> {
    let parent: WorkflowId = serde_json::from_value(parent["workflow_id"].clone()).expect("id");
    sqlx::query_as(
        "SELECT id, status, depth, parent_tool_call_id, attempt FROM runs
          WHERE parent_workflow_id = $1 ORDER BY created_at",
    )
    .bind(parent)
    .fetch_all(&app.db.pool)
    .await
    .expect("children")
}

#[tokio::test]
async fn an_agent_tool_call_runs_a_child_and_the_parent_answers_from_its_final_text() {
    let fake = FakeLlm::start(fake_llm::lead_and_researcher(|| {
        fake_llm::text("Paris is the capital of France.", 3)
    }))
    .await;
    let app = Harness::start(&fake).await;
    let researcher = app.create_agent(&fake_llm::researcher_spec()).await;
    let lead = app.create_agent(&fake_llm::lead_spec(&researcher)).await;
    // An endpoint for the runs' ends: its outbox rows say which run is whose child.
    spool_shared::db::webhooks::create(
        &app.db.pool,
        "acme",
        "http://127.0.0.1:9/hook",
        &["run.completed".to_owned()],
        "whsec_c3Bvb2wtdGVzdC1zZWNyZXQ=",
    )
    .await
    .expect("a webhook");
    let (thread, accepted) = app.ask(&lead, "Capital of France?").await;

    // The parent's first attempt starts the child and waits, holding no worker.
    let waiting = app
        .run_until(&accepted, |s| {
            matches!(s, "waiting" | "completed" | "failed")
        })
        .await;
    assert_eq!(waiting["status"], "waiting", "{waiting}");
    let pending = &waiting["pending_action"];
    assert_eq!(pending["type"], "agent_runs", "{pending}");
    let child_id = pending["runs"][0]["workflow_id"].clone();
    assert_eq!(pending["runs"][0]["tool_call_id"], "call_r");

    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    // Claimed to start, then once more when the child ended: never restarted.
    assert_eq!(run["attempt"], 2);
    let kids = children(&app, &accepted).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    let (id, status, depth, call, attempt) = &kids[0];
    assert_eq!(json!(id), child_id);
    assert_eq!(
        (status.as_str(), *depth, call.as_str(), *attempt),
        ("completed", 1, "call_r", 1)
    );

    // The thread shows the user's turn and the lead's answer; the child's messages are its own.
    let messages = app.messages(thread).await;
    let list = messages["messages"].as_array().expect("messages");
    assert_eq!(list.len(), 2, "{messages}");
    assert_eq!(
        list[1]["content"],
        "The researcher says: Paris is the capital of France."
    );
    let parts = &list[1]["parts"];
    assert!(
        parts
            .as_array()
            .expect("parts")
            .iter()
            .any(|p| p["type"] == "tool_result"
                && p["output"] == "Paris is the capital of France."
                && p["is_error"] == false),
        "{parts}"
    );

    // The child saw its input only: its instructions and the call's `input`.
    let requests = fake.requests();
    let child_request = requests
        .iter()
        .find(|r| instructions(r) == fake_llm::RESEARCHER_INSTRUCTIONS)
        .expect("the child's model call");
    assert_eq!(
        child_request["messages"],
        json!([{"role": "system", "content": fake_llm::RESEARCHER_INSTRUCTIONS},
               {"role": "user", "content": "What is the capital of France?"}])
    );
    let lead_calls = requests
        .iter()
        .filter(|r| instructions(r) == fake_llm::LEAD_INSTRUCTIONS)
        .count();
    assert_eq!(lead_calls, 2, "the lead's model is called once per step");

    // The child's events are in the thread's stream with its depth and workflow id, between
    // the parent's start and end; the parent never restarted.
    let events = app.events(thread).await;
    let nested: Vec<Value> = events
        .iter()
        .map(|e| e.json())
        .filter(|e| e["workflow_id"] == child_id)
        .collect();
    assert!(
        nested.iter().all(|e| e["depth"] == 1),
        "every child event has depth 1"
    );
    let nested_text: String = nested
        .iter()
        .filter(|e| e["type"] == "text_delta")
        .filter_map(|e| e["data"]["delta"].as_str())
        .collect();
    assert_eq!(nested_text, "Paris is the capital of France.");
    let parent_events: Vec<Value> = events
        .iter()
        .map(|e| e.json())
        .filter(|e| e["workflow_id"] == accepted["workflow_id"])
        .collect();
    assert!(parent_events.iter().all(|e| e.get("depth").is_none()));
    assert!(
        !events.iter().any(|e| e.event == "attempt_restarted"),
        "a resumed parent does not restart"
    );
    assert_eq!(
        events.last().map(|e| e.json()["workflow_id"].clone()),
        Some(accepted["workflow_id"].clone())
    );
    assert_eq!(
        events.last().map(|e| e.event.clone()).as_deref(),
        Some("done")
    );

    let payloads: Vec<(Value,)> =
        sqlx::query_as("SELECT payload FROM webhook_deliveries ORDER BY created_at")
            .fetch_all(&app.db.pool)
            .await
            .expect("deliveries");
    let parents: Vec<(Value, Value)> = payloads
        .iter()
        .map(|(p,)| {
            (
                p["data"]["workflow_id"].clone(),
                p["data"]["parent_workflow_id"].clone(),
            )
        })
        .collect();
    assert_eq!(
        parents,
        [
            (child_id.clone(), accepted["workflow_id"].clone()),
            (accepted["workflow_id"].clone(), Value::Null)
        ]
    );
}

#[tokio::test]
async fn calls_deeper_than_max_call_depth_are_refused_with_a_tool_error() {
    // An agent that delegates to itself, and answers with what its call returned.
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_d", "delegate", r#"{"input": "go deeper"}"#)]),
        _ => {
            let result = last_tool_result(request).unwrap_or("?").to_owned();
            fake_llm::text(&format!("[{result}]"), 1)
        }
    })
    .await;
    let app = Harness::start(&fake).await;
    let id = app
        .create_agent(&json!({"name": "recursive", "model": "gpt-4o-mini"}))
        .await;
    let spec = serde_json::from_value(json!({"name": "recursive", "model": "gpt-4o-mini",
        "limits": {"max_call_depth": 2},
        "tools": [{"type": "agent", "name": "delegate", "agent_id": id}]}))
    .expect("spec");
    agents::update(&app.db.pool, id.parse().expect("id"), "acme", &spec)
        .await
        .expect("update")
        .expect("the agent");
    let (_, accepted) = app.ask(&id, "start").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    // Depth 0 and 1 call; the call at depth 2 is refused; each level wraps what it got.
    let runs: Vec<(i16, String)> = sqlx::query_as("SELECT depth, status FROM runs ORDER BY depth")
        .fetch_all(&app.db.pool)
        .await
        .expect("runs");
    assert_eq!(
        runs,
        [
            (0, "completed".to_owned()),
            (1, "completed".to_owned()),
            (2, "completed".to_owned())
        ]
    );
    let messages = app.messages(uuid_of(&accepted)).await;
    let answer = messages["messages"][1]["content"].as_str().unwrap_or("");
    assert!(
        answer.starts_with("[[[agents may call agents 2 levels deep at most"),
        "{answer}"
    );
}

#[tokio::test]
async fn an_agent_call_without_input_or_naming_a_deleted_agent_is_a_tool_error() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[
            ("call_a", "helper", r#"{"question": "no input"}"#),
            ("call_b", "gone", r#"{"input": "hello"}"#),
        ]),
        _ => fake_llm::text("handled", 1),
    })
    .await;
    let app = Harness::start(&fake).await;
    let helper = app
        .create_agent(&json!({"name": "helper", "model": "gpt-4o-mini"}))
        .await;
    let gone = app
        .create_agent(&json!({"name": "gone", "model": "gpt-4o-mini"}))
        .await;
    let lead = app
        .create_agent(&json!({"name": "lead", "model": "gpt-4o-mini", "tools": [
            {"type": "agent", "name": "helper", "agent_id": helper},
            {"type": "agent", "name": "gone", "agent_id": gone}]}))
        .await;
    agents::delete(&app.db.pool, gone.parse().expect("id"), "acme")
        .await
        .expect("delete");
    let (thread, accepted) = app.ask(&lead, "try").await;
    let run = app.finished(&accepted).await;
    assert_eq!(
        (run["status"].as_str(), run["attempt"].as_i64()),
        (Some("completed"), Some(1))
    );
    assert!(children(&app, &accepted).await.is_empty(), "no child run");
    let messages = app.messages(thread).await;
    let results: Vec<(String, bool)> = messages["messages"][1]["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .filter(|p| p["type"] == "tool_result")
        .map(|p| {
            (
                p["output"].as_str().unwrap_or("").to_owned(),
                p["is_error"] == true,
            )
        })
        .collect();
    assert_eq!(
        results,
        [
            ("the call needs an `input` string".to_owned(), true),
            (format!("the agent {gone} does not exist"), true)
        ]
    );
}

fn uuid_of(accepted: &Value) -> uuid::Uuid {
    serde_json::from_value(accepted["thread_id"].clone()).expect("thread id")
}
