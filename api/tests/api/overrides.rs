//! Per-message overrides on `user_message` (`tool_choice` in both forms, `active_tools`,
//! `step_rules`, `stop_conditions`, `max_steps` up to the agent's ceiling, `max_call_depth`,
//! earlier turns in `messages`, and `instructions` from an admin token or to an agent that
//! allows them), `?wait=` on the enqueue, and an agent's own `active_tools`: what reaches the
//! model, and a clear 4xx with nothing created for each misuse.

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use spool_tests::fake_llm::{self, FakeLlm};
use spool_tests::token;

use crate::agents::admin;
use crate::common::{app_with, finished};

fn client(name: &str) -> Value {
    json!({"type": "client", "name": name, "parameters": {"type": "object"}})
}

/// The names of the tools a model request offered.
fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_message_steers_its_run_and_the_agent_s_active_tools_hold_otherwise() {
    let fake = FakeLlm::start(|_, _| fake_llm::text("ok", 1)).await;
    let app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "steer", "model": "gpt-4o-mini", "instructions": "Agent prompt.",
                "tools": [client("a"), client("b"), client("c")], "active_tools": ["a", "b"]}),
        )
        .await;
    let alice = token("alice", "acme");
    let post = |token: String, body: Value| {
        let app = &app;
        async move {
            let thread = Uuid::new_v4();
            let path = format!("/v1/threads/{thread}/user_message");
            let (status, accepted) = app.post(&token, &path, &body).await;
            (status, accepted, thread)
        }
    };

    // The agent's own active tools.
    let (status, accepted, _) = post(
        alice.clone(),
        json!({"input_text": "hi", "agent_id": agent}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
    let first = fake.requests().last().cloned().expect("a request");
    assert_eq!(offered(&first), ["a", "b"]);
    assert_eq!(first["messages"][0]["content"], "Agent prompt.");

    // The message's tools and choice, for every step of its run.
    let (status, accepted, _) = post(
        alice.clone(),
        json!({"input_text": "hi", "agent_id": agent, "active_tools": ["c"], "tool_choice": "c"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
    let steered = fake.requests().last().cloned().expect("a request");
    assert_eq!(offered(&steered), ["c"]);
    assert_eq!(steered["tool_choice"]["function"]["name"], "c");

    // max_steps 1: the first step is the last, so no tools are offered.
    let (status, accepted, _) = post(
        alice.clone(),
        json!({"input_text": "hi", "agent_id": agent, "max_steps": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
    let last = fake.requests().last().cloned().expect("a request");
    assert!(last["tools"].is_null(), "{last}");

    // Instructions, with an admin token: added to the agent's.
    let (status, accepted, _) = post(
        admin("acme"),
        json!({"input_text": "hi", "agent_id": agent, "instructions": "Admin prompt."}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let workflow = accepted["workflow_id"].as_str().expect("id");
    app.wait_for_status(&admin("acme"), workflow, "completed")
        .await;
    let last = fake.requests().last().cloned().expect("a request");
    assert_eq!(
        last["messages"][0]["content"],
        "Agent prompt.\n\nAdmin prompt."
    );
}

#[tokio::test]
async fn overrides_that_do_not_fit_are_refused_by_field_and_create_nothing() {
    let fake = FakeLlm::start(|_, _| fake_llm::text("ok", 1)).await;
    let app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "steer", "model": "gpt-4o-mini", "tools": [client("a"), client("b")]}),
        )
        .await;
    let alice = token("alice", "acme");
    let cases = [
        (
            json!({"input_text": "hi", "agent_id": agent, "active_tools": ["ghost"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_overrides",
            Some("active_tools[0]"),
        ),
        (
            json!({"input_text": "hi", "agent_id": agent, "active_tools": ["a"], "tool_choice": "b"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_overrides",
            Some("tool_choice"),
        ),
        (
            json!({"input_text": "hi", "agent_id": agent, "max_steps": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_overrides",
            Some("max_steps"),
        ),
        (
            // The server's default agent has no tools.
            json!({"input_text": "hi", "active_tools": ["a"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_overrides",
            Some("active_tools[0]"),
        ),
        (
            // The agent does not set allow_instruction_override, and alice is no admin.
            json!({"input_text": "hi", "agent_id": agent, "instructions": "Obey me."}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_overrides",
            Some("instructions"),
        ),
    ];
    for (body, status, code, field) in cases {
        let thread = Uuid::new_v4();
        let path = format!("/v1/threads/{thread}/user_message");
        let (got, error) = app.post(&alice, &path, &body).await;
        assert_eq!(
            (got, error["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}: {error}"
        );
        if let Some(field) = field {
            let fields: Vec<&str> = error["error"]["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["field"].as_str())
                .collect();
            assert!(fields.contains(&field), "{field} not in {fields:?}");
        }
        let (status, _) = app.get(&alice, &format!("/v1/threads/{thread}")).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "nothing was created for {body}"
        );
    }
    assert!(fake.requests().is_empty(), "no run started");
}

/// The runs and messages stored in the app's database.
async fn stored_rows(app: &crate::common::TestApp) -> (i64, i64) {
    sqlx::query_as("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM messages)")
        .fetch_one(&app.db.pool)
        .await
        .expect("counts")
}

/// The text of every message of a model request, in order.
fn contents(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_message_s_controls_reach_the_model_and_last_through_a_pause_and_a_worker_restart() {
    let fake = FakeLlm::start(|request, _| match fake_llm::tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_l", "lookup", r#"{"q": "answer"}"#)]),
        _ => fake_llm::tool_calls(&[("call_d", "done", r#"{"answer": "42"}"#)]),
    })
    .await;
    let mut app = app_with(&fake).await;
    let done = json!({"type": "client", "name": "done", "parameters": {"type": "object",
        "properties": {"answer": {"type": "string"}}, "required": ["answer"]}});
    // Two steps by default, at most six; instructions from any caller.
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "controlled", "model": "gpt-4o-mini", "instructions": "Agent prompt.",
                "max_steps": 2, "limits": {"max_steps": 6}, "allow_instruction_override": true,
                "tools": [client("lookup"), done]}),
        )
        .await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (status, accepted) = app
        .post(
            &alice,
            &format!("/v1/threads/{thread}/user_message"),
            &json!({"input_text": "go", "agent_id": agent,
                "messages": [{"role": "user", "content": "Earlier question"},
                             {"role": "assistant", "content": "Earlier answer"}],
                "instructions": "Message prompt.",
                "tool_choice": {"type": "tool", "tool_name": "lookup"},
                "step_rules": [{"step": 2, "tool_choice": {"type": "tool", "tool_name": "done"}}],
                "stop_conditions": [{"type": "has_tool_call", "tool_name": "done"}],
                "max_steps": 4, "max_call_depth": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let paused = app.wait_run(&accepted, |s| s == "requires_action").await;
    assert_eq!(
        paused["pending_action"]["tool_calls"][0]["tool_name"],
        "lookup"
    );
    let first = fake.requests().last().cloned().expect("a request");
    assert_eq!(
        contents(&first),
        [
            "Agent prompt.\n\nMessage prompt.",
            "Earlier question",
            "Earlier answer",
            "go"
        ],
        "the instructions added to the agent's, the earlier turns before the message"
    );
    assert_eq!(first["tool_choice"]["function"]["name"], "lookup");

    // Every attempt reads them from the run: a restart changes nothing.
    app.restart_workers(
        1,
        crate::common::worker_args_with(1, 0, &["--llm-base-url", &fake.base_url]),
    )
    .await;
    let workflow = accepted["workflow_id"].as_str().expect("id");
    let (status, body) = app
        .post(
            &alice,
            &format!("/v1/workflows/{workflow}/tool_outputs"),
            &json!({"tool_outputs": [{"tool_call_id": "call_l", "output": "42"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let run = finished(&app, &accepted).await;
    assert_eq!(
        run["status"], "completed",
        "the message's stop condition makes `done` end the run: {run}"
    );
    let second = fake.requests().last().cloned().expect("a request");
    assert_eq!(
        contents(&second)[0],
        "Agent prompt.\n\nMessage prompt.",
        "the same instructions after the restart"
    );
    assert_eq!(
        offered(&second),
        ["lookup", "done"],
        "step 2 is not the last of the four the message asked for: tools are offered"
    );
    assert_eq!(second["tool_choice"]["function"]["name"], "done");
    let (_, messages) = app
        .get(&alice, &format!("/v1/threads/{thread}/messages"))
        .await;
    let stored: Vec<(&str, &str)> = messages["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or("?"),
                m["content"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        stored[..3],
        [
            ("user", "Earlier question"),
            ("assistant", "Earlier answer"),
            ("user", "go")
        ],
        "{messages}"
    );
    let answer = messages["messages"].as_array().and_then(|m| m.last());
    assert_eq!(
        answer.map(|m| &m["output"]),
        Some(&json!({"answer": "42"})),
        "{messages}"
    );
}

#[tokio::test]
async fn controls_that_do_not_fit_are_refused_by_field_all_at_once_and_enqueue_nothing() {
    let fake = FakeLlm::start(|_, _| fake_llm::text("ok", 1)).await;
    let app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "strict", "model": "gpt-4o-mini", "max_steps": 3,
                "limits": {"max_steps": 5, "max_call_depth": 1}, "tools": [client("a")]}),
        )
        .await;
    let alice = token("alice", "acme");
    // A run on another thread, so that "unchanged" is not "empty".
    let (_, accepted) = crate::common::ask(&app, &agent, "first").await;
    finished(&app, &accepted).await;
    let before = stored_rows(&app).await;
    let too_many: Vec<Value> = (0..101)
        .map(|_| json!({"role": "user", "content": "x"}))
        .collect();
    let cases = [
        (
            json!({"input_text": "hi", "agent_id": agent, "max_steps": 6, "max_call_depth": 2,
                "stop_conditions": [{"type": "has_tool_call", "tool_name": "ghost"}],
                "step_rules": [{"step": 6, "tool_choice": "a"}, {"step": 1, "tool_choice": "b"}],
                "tool_choice": {"type": "tool", "tool_name": "phantom"},
                "messages": [{"role": "user", "content": "fine"},
                             {"role": "assistant", "content": "  "}],
                "instructions": "Obey me."}),
            vec![
                "max_steps",
                "max_call_depth",
                "stop_conditions[0].tool_name",
                "step_rules[0].step",
                "step_rules[1].tool_choice",
                "tool_choice",
                "messages[1].content",
                "instructions",
            ],
        ),
        (
            // Wrong types, each named.
            json!({"input_text": "hi", "agent_id": agent, "max_call_depth": "deep",
                "messages": [{"role": "system", "content": "x"}],
                "tool_choice": {"type": "tool"}, "stop_conditions": [{"type": "never"}],
                "step_rules": {"step": 1}}),
            vec![
                "max_call_depth",
                "messages[0].role",
                "tool_choice",
                "stop_conditions[0]",
                "step_rules",
            ],
        ),
        (
            json!({"input_text": "hi", "agent_id": agent, "messages": too_many}),
            vec!["messages"],
        ),
    ];
    for (body, expected) in cases {
        let thread = Uuid::new_v4();
        let path = format!("/v1/threads/{thread}/user_message?wait=5");
        let (status, error) = app.post(&alice, &path, &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {error}");
        assert_eq!(error["error"]["code"], "invalid_overrides", "{error}");
        let fields: Vec<&str> = error["error"]["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["field"].as_str())
            .collect();
        for field in &expected {
            assert!(
                fields.iter().any(|f| f.starts_with(field)),
                "{field} not in {fields:?}: {error}"
            );
        }
        assert_eq!(fields.len(), expected.len(), "{error}");
        let (status, _) = app.get(&alice, &format!("/v1/threads/{thread}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "no thread for {body}");
        assert_eq!(stored_rows(&app).await, before, "nothing stored for {body}");
    }
    // The ceiling itself is fine.
    let (status, accepted) = app
        .post(
            &alice,
            &format!("/v1/threads/{}/user_message", Uuid::new_v4()),
            &json!({"input_text": "hi", "agent_id": agent, "max_steps": 5, "max_call_depth": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
}

#[tokio::test]
async fn a_message_with_wait_answers_with_its_run_once_it_ends_or_pauses_else_202() {
    let fake = FakeLlm::start(|request, _| {
        let input = contents(request).last().cloned().unwrap_or_default();
        match input.as_str() {
            "slow" => fake_llm::paced_text("s l o w", 4, std::time::Duration::from_secs(1)),
            "use the tool" => fake_llm::tool_calls(&[("call_a", "a", "{}")]),
            _ => fake_llm::text("quick", 1),
        }
    })
    .await;
    let app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "waits", "model": "gpt-4o-mini", "tools": [client("a")]}),
        )
        .await;
    let alice = token("alice", "acme");
    let post = |text: &'static str, wait: &'static str| {
        let (app, alice, agent) = (&app, &alice, &agent);
        async move {
            let path = format!("/v1/threads/{}/user_message{wait}", Uuid::new_v4());
            app.post(
                alice,
                &path,
                &json!({"input_text": text, "agent_id": agent}),
            )
            .await
        }
    };

    let (status, run) = post("hi", "?wait=20").await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["status"], "completed", "{run}");
    assert!(run["workflow_id"].is_string(), "the run: {run}");

    let (status, run) = post("use the tool", "?wait=20").await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["status"], "requires_action", "{run}");
    assert_eq!(
        run["pending_action"]["tool_calls"][0]["tool_call_id"],
        "call_a"
    );

    // A run that outlasts the wait: the usual 202.
    let (status, accepted) = post("slow", "?wait=1").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(accepted["status"], "queued");
    assert_eq!(finished(&app, &accepted).await["status"], "completed");

    let before = stored_rows(&app).await;
    let (status, error) = post("hi", "?wait=61").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["code"], "invalid_wait");
    assert_eq!(stored_rows(&app).await, before, "nothing enqueued");
}
