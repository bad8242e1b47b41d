//! Agents as tools: a call of an agent tool starts a durable child run on the parent's
//! thread, the parent waits for it without a worker, and the child's final text comes back as
//! the call's result; `max_call_depth`, `max_agent_calls_per_step`, `max_tree_runs` and the
//! root's concurrency quota bound the fan-out (calls past them are tool errors), and a waiting
//! parent ends by its own time limit, its tree with it.

use serde_json::{Value, json};

use spool_shared::WorkflowId;
use spool_shared::db::agents;
use spool_shared::quota::{QuotaLimits, Quotas};
use spool_tests::fake_llm::{self, FakeLlm, Reply, last_tool_result, tool_results_in};

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
        20,
    )
    .await
    .expect("a webhook")
    .expect("under the cap");
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
        answer.starts_with("[[[max_call_depth_exceeded:"),
        "{answer}"
    );
}

/// A lead whose first step calls `research` `calls` times (ids `call_1`…), whose next steps
/// call it `more` times each while it has fewer than `until` results, and which then answers
/// with every result it got, one per line; the researcher answers "fact".
fn fan_out(
    calls: usize,
    more: usize,
    until: usize,
) -> impl Fn(&Value, usize) -> Reply + Send + Sync {
    move |request, _| {
        if instructions(request) == fake_llm::RESEARCHER_INSTRUCTIONS {
            return fake_llm::text("fact", 1);
        }
        let done = tool_results_in(request);
        if done < until {
            let n = if done == 0 { calls } else { more };
            // Each with its own input: the same call three times is a doom loop.
            let calls: Vec<(String, String)> = (done + 1..=done + n)
                .map(|i| (format!("call_{i}"), format!(r#"{{"input": "find {i}"}}"#)))
                .collect();
            let calls: Vec<(&str, &str, &str)> = calls
                .iter()
                .map(|(id, arguments)| (id.as_str(), "research", arguments.as_str()))
                .collect();
            return fake_llm::tool_calls(&calls);
        }
        let results: Vec<&str> = request["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "tool")
            .filter_map(|m| m["content"].as_str())
            .collect();
        fake_llm::text(&results.join("\n"), 1)
    }
}

/// The tool results of the thread's answer, in order: `(output, is_error)`.
async fn results(app: &Harness, thread: uuid::Uuid) -> Vec<(String, bool)> {
    app.messages(thread).await["messages"][1]["parts"]
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
        .collect()
}

/// A lead agent (with `limits`) whose `research` tool is the researcher.
async fn lead_with(app: &Harness, limits: Value) -> String {
    let researcher = app.create_agent(&fake_llm::researcher_spec()).await;
    let mut spec = fake_llm::lead_spec(&researcher);
    spec["limits"] = limits;
    app.create_agent(&spec).await
}

#[tokio::test]
async fn calls_past_max_agent_calls_per_step_are_tool_errors_and_the_run_goes_on() {
    let fake = FakeLlm::start(fan_out(3, 0, 3)).await;
    let app = Harness::start(&fake).await;
    let lead = lead_with(&app, json!({"max_agent_calls_per_step": 2})).await;
    let (thread, accepted) = app.ask(&lead, "research three things").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        children(&app, &accepted).await.len(),
        2,
        "two of the three calls ran"
    );
    let results = results(&app, thread).await;
    assert_eq!(
        results[..2],
        [("fact".to_owned(), false), ("fact".to_owned(), false)]
    );
    assert!(
        results[2].1
            && results[2]
                .0
                .starts_with("max_agent_calls_per_step_exceeded:"),
        "{results:?}"
    );
}

#[tokio::test]
async fn calls_past_max_tree_runs_are_tool_errors_however_the_steps_spread_them() {
    // Three calls in step 1, one more in step 2: the tree holds two runs at most.
    let fake = FakeLlm::start(fan_out(3, 1, 4)).await;
    let app = Harness::start(&fake).await;
    let lead = lead_with(&app, json!({"max_tree_runs": 2})).await;
    let (thread, accepted) = app.ask(&lead, "research").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(children(&app, &accepted).await.len(), 2);
    let results = results(&app, thread).await;
    assert_eq!(results.len(), 4, "{results:?}");
    for refused in &results[2..] {
        assert!(
            refused.1 && refused.0.starts_with("max_tree_runs_exceeded:"),
            "{results:?}"
        );
    }
}

#[tokio::test]
async fn a_child_takes_room_in_its_root_s_concurrency_quota_and_gives_it_back() {
    let fake = FakeLlm::start(fan_out(3, 0, 3)).await;
    let app = Harness::start(&fake).await;
    let lead = lead_with(&app, json!({})).await;
    let quotas = Quotas {
        user: QuotaLimits {
            max_concurrent_runs: Some(2),
            ..QuotaLimits::default()
        },
        ..Quotas::default()
    };
    // Twice: the second run finds the room the first run's child took given back.
    for turn in 0..2 {
        let thread = uuid::Uuid::new_v4();
        let accepted = app
            .send_under(thread, Some(&lead), "research", &quotas)
            .await;
        let run = app.finished(&accepted).await;
        assert_eq!(run["status"], "completed", "{run}");
        let kids = children(&app, &accepted).await;
        assert_eq!(
            kids.len(),
            1,
            "turn {turn}: the root and one child fill the quota"
        );
        let results = results(&app, thread).await;
        assert_eq!(results[0], ("fact".to_owned(), false));
        for refused in &results[1..] {
            assert!(
                refused.1 && refused.0.starts_with("concurrency_limited:"),
                "{results:?}"
            );
        }
        // The child carries its root's counter with its concurrency limit.
        let (quota,): (Value,) = sqlx::query_as("SELECT quota FROM runs WHERE id = $1")
            .bind(kids[0].0)
            .fetch_one(&app.db.pool)
            .await
            .expect("quota");
        assert_eq!(
            quota["counters"][0]["limits"]["max_concurrent_runs"], 2,
            "{quota}"
        );
    }
}

#[tokio::test]
async fn a_child_nests_no_deeper_than_its_root_allows_and_ends_by_its_callers_time_limit() {
    // The lead may nest one level; its researcher, alone, could nest ten.
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_d", "delegate", r#"{"input": "go deeper"}"#)]),
        _ => {
            let result = last_tool_result(request).unwrap_or("?").to_owned();
            fake_llm::text(&format!("[{result}]"), 1)
        }
    })
    .await;
    let app = Harness::start(&fake).await;
    let deep = app
        .create_agent(&json!({"name": "deep", "model": "gpt-4o-mini"}))
        .await;
    let spec = serde_json::from_value(json!({"name": "deep", "model": "gpt-4o-mini",
        "limits": {"max_call_depth": 10, "max_tree_runs": 500},
        "tools": [{"type": "agent", "name": "delegate", "agent_id": deep}]}))
    .expect("spec");
    agents::update(&app.db.pool, deep.parse().expect("id"), "acme", &spec)
        .await
        .expect("update")
        .expect("the agent");
    let lead = app
        .create_agent(&json!({"name": "lead", "model": "gpt-4o-mini",
            "limits": {"max_call_depth": 1, "max_tree_runs": 5, "timeout_secs": 600},
            "tools": [{"type": "agent", "name": "delegate", "agent_id": deep}]}))
        .await;
    let (thread, accepted) = app.ask(&lead, "start").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    let depths: Vec<(i16,)> = sqlx::query_as("SELECT depth FROM runs ORDER BY depth")
        .fetch_all(&app.db.pool)
        .await
        .expect("runs");
    assert_eq!(
        depths,
        [(0,), (1,)],
        "the child's own max_call_depth does not win"
    );
    let answer = app.messages(thread).await["messages"][1]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(answer.starts_with("[[max_call_depth_exceeded:"), "{answer}");
    // The child's limits as it ran them: its own, narrowed to what the lead allowed.
    let (limits,): (Value,) =
        sqlx::query_as("SELECT agent_spec->'limits' FROM runs WHERE depth = 1")
            .fetch_one(&app.db.pool)
            .await
            .expect("limits");
    assert_eq!(limits["max_call_depth"], 0, "{limits}");
    assert_eq!(limits["max_tree_runs"], 5, "{limits}");
    let timeout = limits["timeout_secs"].as_u64().expect("a time limit");
    assert!((1..=601).contains(&timeout), "{limits}");
}

#[tokio::test]
async fn a_parent_waiting_past_its_time_limit_fails_with_timeout_and_its_children_are_cancelled() {
    // The child waits for a client tool nobody answers.
    let fake = FakeLlm::start(|request, _| {
        if instructions(request) == "You ask the user." {
            return fake_llm::tool_calls(&[("call_u", "ask_user", "{}")]);
        }
        match tool_results_in(request) {
            0 => fake_llm::tool_calls(&[("call_c", "consult", r#"{"input": "ask them"}"#)]),
            _ => fake_llm::text("done", 1),
        }
    })
    .await;
    let app = Harness::start(&fake).await;
    let asker = app
        .create_agent(&json!({"name": "asker", "model": "gpt-4o-mini",
            "instructions": "You ask the user.",
            "tools": [{"type": "client", "name": "ask_user"}]}))
        .await;
    let lead = app
        .create_agent(&json!({"name": "lead", "model": "gpt-4o-mini",
            "limits": {"timeout_secs": 5},
            "tools": [{"type": "agent", "name": "consult", "agent_id": asker}]}))
        .await;
    let (_, accepted) = app.ask(&lead, "start").await;
    let waiting = app.run_until(&accepted, |s| s == "waiting").await;
    assert_eq!(waiting["status"], "waiting");
    let parent: WorkflowId = serde_json::from_value(accepted["workflow_id"].clone()).expect("id");
    let (deadline,): (Option<f64>,) = sqlx::query_as(
        "SELECT extract(epoch FROM pause_expires_at - created_at)::float8 FROM runs WHERE id = $1",
    )
    .bind(parent)
    .fetch_one(&app.db.pool)
    .await
    .expect("deadline");
    assert_eq!(deadline, Some(5.0), "the wait's deadline is the run's own");
    // The child pauses for its client tool. Its own deadline is bounded by the parent's time
    // left; pushed an hour away here, the parent's deadline alone must end the tree.
    let child = app
        .run_until(
            &json!({"workflow_id": children(&app, &accepted).await[0].0}),
            |s| s == "requires_action",
        )
        .await;
    assert_eq!(child["status"], "requires_action");
    let (child_deadline,): (f64,) = sqlx::query_as(
        "SELECT extract(epoch FROM c.pause_expires_at - p.created_at)::float8
           FROM runs c JOIN runs p ON p.id = c.parent_workflow_id WHERE p.id = $1",
    )
    .bind(parent)
    .fetch_one(&app.db.pool)
    .await
    .expect("the child's deadline");
    assert!(
        child_deadline <= 7.0,
        "{child_deadline} s after the parent's enqueue"
    );
    sqlx::query("UPDATE runs SET pause_expires_at = now() + interval '1 hour' WHERE parent_workflow_id = $1")
        .bind(parent)
        .execute(&app.db.pool)
        .await
        .expect("push the child's deadline");

    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "timeout", "{run}");
    let kids = children(&app, &accepted).await;
    assert_eq!(
        kids[0].1, "cancelled",
        "the tree ends with its root: {kids:?}"
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
