//! Durable pauses: client tools and approvals hold no worker, survive a worker restart, and
//! resume from the saved step.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm, tool_results_in, weather_then_echo};
use spool_tests::tools::{Tools, http_tool};
use spool_tests::{poll_until, token};

use crate::common::{TestApp, app_with, ask, finished, worker_args_with};

fn client_tool() -> Value {
    json!({"type": "client", "name": "read_local_file", "description": "Reads a file on the user's machine",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}})
}

#[tokio::test]
async fn a_client_tool_pauses_the_run_survives_a_worker_restart_and_resumes_with_the_outputs() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_f", "read_local_file", r#"{"path": "notes.txt"}"#)]),
        _ => {
            let output = fake_llm::last_tool_result(request)
                .unwrap_or("?")
                .to_owned();
            fake_llm::text(&format!("The file says: {output}"), 2)
        }
    })
    .await;
    let mut app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "files", "model": "gpt-4o-mini", "tools": [client_tool()]}),
        )
        .await;
    let (thread, accepted) = ask(&app, &agent, "what is in notes.txt?").await;
    let alice = token("alice", "acme");
    let workflow = accepted["workflow_id"].as_str().expect("id").to_owned();
    let paused = app.wait_run(&accepted, |s| s == "requires_action").await;
    assert_eq!(paused["pending_action"]["type"], "submit_tool_outputs");
    assert_eq!(
        paused["pending_action"]["tool_calls"][0]["tool_call_id"],
        "call_f"
    );
    assert_eq!(
        paused["pending_action"]["tool_calls"][0]["arguments"]["path"],
        "notes.txt"
    );
    let (_, thread_state) = app.get(&alice, &format!("/v1/threads/{thread}")).await;
    assert_eq!(
        thread_state["status"], "busy",
        "a paused run keeps the thread busy"
    );
    let (status, busy) = app.send_message(&alice, thread, "hello?").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(busy["error"]["code"], "thread_busy");
    let stored = app.stored(thread).await;
    assert_eq!(
        stored.last().map(|(_, k)| k.as_str()),
        Some("requires_action")
    );

    // The run holds no worker: restart them all while it waits.
    app.restart_workers(
        1,
        worker_args_with(1, 0, &["--llm-base-url", &fake.base_url]),
    )
    .await;

    let path = format!("/v1/workflows/{workflow}/tool_outputs");
    let (status, body) = app.post(&alice, &path, &json!({"tool_outputs": []})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["code"], "missing_tool_outputs");
    assert_eq!(body["error"]["missing"], json!(["call_f"]));
    let (status, body) = app
        .post(
            &alice,
            &path,
            &json!({"tool_outputs": [{"tool_call_id": "nope", "output": "x"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["code"], "unknown_tool_call");
    let (status, _) = app
        .post(
            &token("mallory", "acme"),
            &path,
            &json!({"tool_outputs": [{"tool_call_id": "call_f", "output": "x"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another user's run");
    // Steering the run towards tools the agent does not have, or a step already taken.
    let (status, body) = app
        .post(
            &alice,
            &path,
            &json!({
                "tool_outputs": [{"tool_call_id": "call_f", "output": "x"}],
                "tool_choice": "write_file",
                "active_tools": ["read_local_file", "nope"],
                "step_rules": [{"step": 1, "tool_choice": "ghost"}, {"step": 2, "tool_choice": "none"}],
                "defaults": {"tool_choice": "phantom"},
            }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "invalid_overrides");
    let mut fields: Vec<&str> = body["error"]["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|e| e["field"].as_str())
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "active_tools[1]",
            "defaults.tool_choice",
            "step_rules[0].step",
            "step_rules[0].tool_choice",
            "tool_choice",
            "tool_choice"
        ]
    );
    let (_, still) = app.get(&alice, &format!("/v1/workflows/{workflow}")).await;
    assert_eq!(
        still["status"], "requires_action",
        "a refused answer changes nothing"
    );
    assert_eq!(still["pending_action"], paused["pending_action"]);
    assert_eq!(fake.requests().len(), 1, "refused outputs resumed nothing");

    let (status, resumed) = app
        .post(
            &alice,
            &path,
            &json!({
        "tool_outputs": [{"tool_call_id": "call_f", "output": "buy milk"}],
        "tool_choice": "none"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{resumed}");
    let run = finished(&app, &accepted).await;
    assert_eq!(run["status"], "completed");
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1]["tool_choice"], "none",
        "the override reached the next step"
    );
    let tool_message = requests[1]["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (
            tool_message["role"].as_str(),
            tool_message["content"].as_str()
        ),
        (Some("tool"), Some("buy milk"))
    );
    let (_, page) = app
        .get(&alice, &format!("/v1/threads/{thread}/messages"))
        .await;
    assert_eq!(page["messages"][1]["content"], "The file says: buy milk");
    let (status, again) = app
        .post(
            &alice,
            &path,
            &json!({"tool_outputs": [{"tool_call_id": "call_f", "output": "x"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(again["error"]["code"], "run_not_waiting");
    let kinds: Vec<String> = app
        .stored(thread)
        .await
        .into_iter()
        .map(|(_, k)| k)
        .collect();
    assert!(
        !kinds.contains(&"attempt_restarted".to_owned()),
        "a resumed pause is not a restart: {kinds:?}"
    );
    assert_eq!(kinds.last().map(String::as_str), Some("done"));
    app.stop().await;
}

#[tokio::test]
async fn partial_outputs_are_refused_and_overrides_last_across_later_pauses() {
    // Step 1 asks two client tools at once, steps 2 and 3 one more each, step 4 answers.
    let fake = FakeLlm::start(|_, n| match n {
        0 => fake_llm::tool_calls(&[
            ("call_a", "read_local_file", r#"{"path": "a"}"#),
            ("call_b", "list_dir", r#"{"path": "."}"#),
        ]),
        1 => fake_llm::tool_calls(&[("call_c", "list_dir", r#"{"path": "b"}"#)]),
        2 => fake_llm::tool_calls(&[("call_d", "read_local_file", r#"{"path": "c"}"#)]),
        _ => fake_llm::text("done", 1),
    })
    .await;
    let app = app_with(&fake).await;
    let list_dir = json!({"type": "client", "name": "list_dir", "parameters": {"type": "object"}});
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "files", "model": "gpt-4o-mini", "tools": [client_tool(), list_dir]}),
        )
        .await;
    let (_, accepted) = ask(&app, &agent, "tidy up").await;
    let alice = token("alice", "acme");
    let workflow = accepted["workflow_id"].as_str().expect("id").to_owned();
    let path = format!("/v1/workflows/{workflow}/tool_outputs");
    app.wait_run(&accepted, |s| s == "requires_action").await;

    let (status, body) = app
        .post(
            &alice,
            &path,
            &json!({"tool_outputs": [{"tool_call_id": "call_a", "output": "A"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "missing_tool_outputs");
    assert_eq!(body["error"]["missing"], json!(["call_b"]));

    // Step 2: only list_dir, and it must be called; step 3: read_local_file must be called;
    // every step without a rule of its own: some tool must be called.
    let (status, body) = app
        .post(
            &alice,
            &path,
            &json!({
                "tool_outputs": [{"tool_call_id": "call_a", "output": "A"},
                                 {"tool_call_id": "call_b", "output": "B"}],
                "tool_choice": "list_dir",
                "active_tools": ["list_dir"],
                "step_rules": [{"step": 3, "tool_choice": "read_local_file"}],
                "defaults": {"tool_choice": "required"}}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let pending = async |call: &str| {
        poll_until("the next pause", Duration::from_secs(20), || async {
            let (_, run) = app.get(&alice, &format!("/v1/workflows/{workflow}")).await;
            (run["pending_action"]["tool_calls"][0]["tool_call_id"] == call).then_some(())
        })
        .await;
    };
    pending("call_c").await;
    // Narrowing step 3 to tools without the one the first pause chose for it: refused.
    let (status, body) = app
        .post(
            &alice,
            &path,
            &json!({"tool_outputs": [{"tool_call_id": "call_c", "output": "C"}],
                    "active_tools": ["list_dir"]}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "invalid_overrides");
    // The second answer only narrows step 3's tools: the first pause's choice for that step,
    // and its default, still hold.
    let (status, body) = app
        .post(
            &alice,
            &path,
            &json!({"tool_outputs": [{"tool_call_id": "call_c", "output": "C"}],
                    "active_tools": ["read_local_file"]}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    pending("call_d").await;
    let (status, body) = app
        .post(
            &alice,
            &path,
            &json!({"tool_outputs": [{"tool_call_id": "call_d", "output": "D"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let run = finished(&app, &accepted).await;
    assert_eq!(run["status"], "completed", "{run}");

    let requests = fake.requests();
    assert_eq!(requests.len(), 4);
    let offered = |request: &Value| -> Vec<String> {
        request["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(offered(&requests[1]), ["list_dir"]);
    assert_eq!(
        requests[1]["tool_choice"],
        json!({"type": "function", "function": {"name": "list_dir"}})
    );
    assert_eq!(
        offered(&requests[2]),
        ["read_local_file"],
        "narrowed at the second pause"
    );
    assert_eq!(
        requests[2]["tool_choice"],
        json!({"type": "function", "function": {"name": "read_local_file"}}),
        "step 3's choice, posted at the first pause"
    );
    assert_eq!(offered(&requests[3]).len(), 2, "no rule for step 4");
    assert_eq!(
        requests[3]["tool_choice"], "required",
        "the default posted at the first pause, two pauses later"
    );
    app.stop().await;
}

async fn approval_app(fake: &FakeLlm, base: &str, timeout_secs: u32) -> (TestApp, String) {
    let app = app_with(fake).await;
    let mut tool = http_tool("get_weather", format!("{base}/weather"));
    tool["requires_approval"] = json!(true);
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "careful", "model": "gpt-4o-mini",
        "approval_timeout_secs": timeout_secs, "tools": [tool]}),
        )
        .await;
    (app, agent)
}

#[tokio::test]
async fn an_approved_call_runs_and_a_denied_one_reaches_the_model_as_an_error() {
    let fake = FakeLlm::start(weather_then_echo()).await;
    let (tools, base) = Tools::start().await;
    let (app, agent) = approval_app(&fake, &base, 300).await;
    let alice = token("alice", "acme");

    let (thread, accepted) = ask(&app, &agent, "approve me").await;
    let workflow = accepted["workflow_id"].as_str().expect("id").to_owned();
    let paused = app.wait_run(&accepted, |s| s == "awaiting_approval").await;
    assert_eq!(paused["pending_action"]["tool_call_id"], "call_w");
    assert_eq!(paused["pending_action"]["arguments"]["city"], "Paris");
    assert!(paused["pending_action"]["expires_at"].is_string());
    let requested = app.stored(thread).await;
    assert_eq!(
        requested.last().map(|(_, k)| k.as_str()),
        Some("approval_requested")
    );
    assert!(tools.calls().is_empty(), "nothing runs before the approval");
    let path = format!("/v1/workflows/{workflow}/approvals/call_w");
    let (status, _) = app
        .post(&token("alice", "other"), &path, &json!({"approved": true}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another tenant's approval");
    let (status, _) = app
        .post(
            &alice,
            &format!("/v1/workflows/{workflow}/approvals/ghost"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, approved) = app.post(&alice, &path, &json!({"approved": true})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // The run as the approval's transaction left it, whether or not a worker took it since.
    assert_eq!(approved["status"], "queued", "{approved}");
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
    assert_eq!(tools.calls().len(), 1);

    let (_, denied) = ask(&app, &agent, "deny me").await;
    app.wait_run(&denied, |s| s == "awaiting_approval").await;
    let path = format!(
        "/v1/workflows/{}/approvals/call_w",
        denied["workflow_id"].as_str().expect("id")
    );
    let (status, _) = app
        .post(
            &alice,
            &path,
            &json!({"approved": false, "reason": "not on weekends"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(finished(&app, &denied).await["status"], "completed");
    assert_eq!(tools.calls().len(), 1, "the denied call was not made");
    let last = fake.requests().last().cloned().expect("request");
    let tool_message = last["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool"))
        .cloned()
        .expect("tool");
    assert!(
        tool_message["content"]
            .as_str()
            .is_some_and(|c| c.contains("denied") && c.contains("not on weekends"))
    );
    app.stop().await;
}

#[tokio::test]
async fn an_approval_nobody_answers_counts_as_denied_when_it_expires() {
    let fake = FakeLlm::start(weather_then_echo()).await;
    let (tools, base) = Tools::start().await;
    let (app, agent) = approval_app(&fake, &base, 1).await;
    let (_, accepted) = ask(&app, &agent, "anyone?").await;
    app.wait_run(&accepted, |s| s == "awaiting_approval").await;
    // Nobody calls: the system itself picks the run up once the approval expires.
    let run = finished(&app, &accepted).await;
    assert_eq!(run["status"], "completed");
    assert!(tools.calls().is_empty());
    let last = fake.requests().last().cloned().expect("request");
    let tool_message = last["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool"))
        .cloned()
        .expect("tool");
    assert!(
        tool_message["content"]
            .as_str()
            .is_some_and(|c| c.contains("No one approved")),
        "{tool_message}"
    );
    app.stop().await;
}

#[tokio::test]
async fn an_approval_hook_holds_a_matching_call_until_it_is_approved() {
    let fake = FakeLlm::start(weather_then_echo()).await;
    let (tools, base) = Tools::start().await;
    let app = app_with(&fake).await;
    let agent = app.create_agent("acme", &json!({"name": "held", "model": "gpt-4o-mini",
        "tools": [http_tool("get_weather", format!("{base}/weather"))],
        "hooks": [{"event": "pre_tool_use", "type": "approval", "matcher": "get_weather", "timeout_secs": 600}]})).await;
    let (_, accepted) = ask(&app, &agent, "weather?").await;
    let alice = token("alice", "acme");
    let workflow = accepted["workflow_id"].as_str().expect("id").to_owned();
    let paused = poll_until("the approval", Duration::from_secs(10), || async {
        let (_, run) = app.get(&alice, &format!("/v1/workflows/{workflow}")).await;
        (run["status"] == "awaiting_approval").then_some(run)
    })
    .await;
    let expires: chrono::DateTime<chrono::Utc> = paused["pending_action"]["expires_at"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("expires_at");
    assert!(
        expires > chrono::Utc::now() + chrono::Duration::seconds(500),
        "the hook's timeout applies"
    );
    assert!(tools.calls().is_empty());
    let (status, _) = app
        .post(
            &alice,
            &format!("/v1/workflows/{workflow}/approvals/call_w"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED);
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
    assert_eq!(tools.calls().len(), 1);
    app.stop().await;
}

/// The run's pause deadline and the time it paused, both by the database clock.
async fn deadline(app: &TestApp, accepted: &Value) -> (chrono::DateTime<chrono::Utc>, i64) {
    let id: uuid::Uuid = accepted["workflow_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("id");
    sqlx::query_as(
        "SELECT pause_expires_at, (extract(epoch FROM pause_expires_at - updated_at) * 1e6)::bigint
           FROM runs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&app.db.pool)
    .await
    .expect("deadline")
}

#[tokio::test]
async fn each_approval_of_a_step_gets_its_own_deadline_from_the_database_clock() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[
            ("w1", "get_weather", r#"{"city": "Paris"}"#),
            ("w2", "get_weather", r#"{"city": "Lyon"}"#),
        ]),
        _ => fake_llm::text("Both answered.", 1),
    })
    .await;
    let (tools, base) = Tools::start().await;
    let (app, agent) = approval_app(&fake, &base, 300).await;
    let alice = token("alice", "acme");
    let (_, accepted) = ask(&app, &agent, "two cities").await;
    let workflow = accepted["workflow_id"].as_str().expect("id").to_owned();
    let first = app.wait_run(&accepted, |s| s == "awaiting_approval").await;
    assert_eq!(first["pending_action"]["tool_call_id"], "w1");
    let (first_deadline, timeout_us) = deadline(&app, &accepted).await;
    assert_eq!(
        timeout_us, 300_000_000,
        "now() + 300 s, in the pause's own statement"
    );
    let shown: chrono::DateTime<chrono::Utc> = first["pending_action"]["expires_at"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("expires_at");
    assert_eq!(shown, first_deadline);
    let approve = |call: &'static str| {
        let (app, alice, workflow) = (&app, alice.clone(), workflow.clone());
        async move {
            app.post(
                &alice,
                &format!("/v1/workflows/{workflow}/approvals/{call}"),
                &json!({"approved": true}),
            )
            .await
        }
    };
    assert_eq!(approve("w1").await.0, StatusCode::ACCEPTED);
    // The second approval is presented now, with 300 s from now: not what was left of the
    // first one's.
    let second = poll_until("the second approval", Duration::from_secs(20), || async {
        let (_, run) = app.get(&alice, &format!("/v1/workflows/{workflow}")).await;
        (run["pending_action"]["tool_call_id"] == "w2").then_some(run)
    })
    .await;
    let (second_deadline, timeout_us) = deadline(&app, &accepted).await;
    assert_eq!(timeout_us, 300_000_000);
    assert!(
        second_deadline > first_deadline,
        "{second_deadline} vs {first_deadline}"
    );
    assert_eq!(second["status"], "awaiting_approval");
    assert_eq!(approve("w2").await.0, StatusCode::ACCEPTED);
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
    assert_eq!(tools.calls().len(), 2, "both approved calls ran");
    app.stop().await;
}

#[tokio::test]
async fn an_approval_past_its_deadline_by_the_database_clock_cannot_be_approved() {
    let fake = FakeLlm::start(weather_then_echo()).await;
    let (tools, base) = Tools::start().await;
    // Long enough that no worker expires it by itself during the test.
    let (mut app, agent) = approval_app(&fake, &base, 3600).await;
    let alice = token("alice", "acme");
    let (_, accepted) = ask(&app, &agent, "late").await;
    let workflow = accepted["workflow_id"].as_str().expect("id").to_owned();
    app.wait_run(&accepted, |s| s == "awaiting_approval").await;
    // No worker may pick the expired run up before the API is asked.
    let args = crate::common::worker_args_with(1, 0, &["--llm-base-url", &fake.base_url]);
    app.restart_workers(0, args.clone()).await;
    sqlx::query("UPDATE runs SET pause_expires_at = now() - interval '1 second'")
        .execute(&app.db.pool)
        .await
        .expect("expire");
    let (status, body) = app
        .post(
            &alice,
            &format!("/v1/workflows/{workflow}/approvals/call_w"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "approval_expired");
    app.restart_workers(1, args).await;
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
    assert!(tools.calls().is_empty(), "an expired approval is a denial");
    app.stop().await;
}

#[tokio::test]
async fn a_client_tool_that_needs_approval_waits_for_the_approval_then_for_the_client() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("f1", "read_local_file", r#"{"path": "/notes"}"#)]),
        _ => {
            let output = fake_llm::last_tool_result(request)
                .unwrap_or("?")
                .to_owned();
            fake_llm::text(&format!("File says: {output}"), 1)
        }
    })
    .await;
    let app = app_with(&fake).await;
    let mut tool = client_tool();
    tool["requires_approval"] = json!(true);
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "guarded reader", "model": "gpt-4o-mini", "tools": [tool]}),
        )
        .await;
    let alice = token("alice", "acme");
    let (_, accepted) = ask(&app, &agent, "read my notes").await;
    let workflow = accepted["workflow_id"].as_str().expect("id").to_owned();
    app.wait_run(&accepted, |s| s == "awaiting_approval").await;
    let (status, _) = app
        .post(
            &alice,
            &format!("/v1/workflows/{workflow}/approvals/f1"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // Approved, it is still the client's to execute.
    let waiting = app.wait_run(&accepted, |s| s == "requires_action").await;
    assert_eq!(
        waiting["pending_action"]["tool_calls"][0]["tool_call_id"],
        "f1"
    );
    assert!(waiting["pending_action"]["expires_at"].is_string());
    let (status, _) = app
        .post(
            &alice,
            &format!("/v1/workflows/{workflow}/tool_outputs"),
            &json!({"tool_outputs": [{"tool_call_id": "f1", "output": "buy milk"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
    assert_eq!(
        fake_llm::last_tool_result(&fake.requests()[1]),
        Some("buy milk")
    );
    app.stop().await;
}

#[tokio::test]
async fn client_tool_outputs_that_never_come_fail_the_run_and_free_the_thread() {
    let fake =
        FakeLlm::start(|_, _| fake_llm::tool_calls(&[("f1", "read_local_file", "{}")])).await;
    let app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "impatient", "model": "gpt-4o-mini",
            "tools": [client_tool()], "limits": {"human_timeout_secs": 1}}),
        )
        .await;
    let alice = token("alice", "acme");
    let (thread, accepted) = ask(&app, &agent, "read it").await;
    let paused = app.wait_run(&accepted, |s| s == "requires_action").await;
    assert!(paused["pending_action"]["expires_at"].is_string());
    // Nobody answers: the system itself fails the run once the deadline passes.
    let run = finished(&app, &accepted).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "human_timeout");
    let kinds: Vec<String> = app
        .stored(thread)
        .await
        .into_iter()
        .map(|(_, k)| k)
        .collect();
    assert!(
        kinds.ends_with(&["error".into(), "message_end".into(), "done".into()]),
        "{kinds:?}"
    );
    let (status, _) = app
        .post(
            &alice,
            &format!("/v1/threads/{thread}/user_message"),
            &json!({"input_text": "again", "agent_id": agent}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "the thread is free again");
    app.stop().await;
}

/// A model that asks the client to read a file (`call_f`), then answers "done".
async fn file_reader() -> FakeLlm {
    FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_f", "read_local_file", r#"{"path": "a.txt"}"#)]),
        _ => fake_llm::text("done", 1),
    })
    .await
}

/// An app whose `files` agent has the client tool, and alice's run of it paused for `call_f`:
/// the app, the thread, the 202 body and the paused run.
async fn paused_on_the_client(fake: &FakeLlm) -> (TestApp, uuid::Uuid, Value, Value) {
    let app = app_with(fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "files", "model": "gpt-4o-mini", "tools": [client_tool()]}),
        )
        .await;
    let (thread, accepted) = ask(&app, &agent, "read a.txt").await;
    let paused = app.wait_run(&accepted, |s| s == "requires_action").await;
    (app, thread, accepted, paused)
}

#[tokio::test]
async fn a_client_output_over_the_result_limit_is_cut_like_any_tool_result() {
    let fake = file_reader().await;
    let (app, _, accepted, _) = paused_on_the_client(&fake).await;
    let workflow = accepted["workflow_id"].as_str().expect("id");
    let (status, body) = app
        .post(
            &token("alice", "acme"),
            &format!("/v1/workflows/{workflow}/tool_outputs"),
            &json!({"tool_outputs": [{"tool_call_id": "call_f", "output": "y".repeat(60_000)}]}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
    let requests = fake.requests();
    let seen = fake_llm::last_tool_result(&requests[1]).unwrap_or_default();
    assert!(
        seen.ends_with("\n[truncated: 10040 more characters]"),
        "{}",
        &seen[seen.len().saturating_sub(60)..]
    );
    assert_eq!(seen.chars().filter(|c| *c == 'y').count(), 49_960);
    app.stop().await;
}

/// Deletes the thread's `requires_action` event from its stream, as a Redis outage past the
/// publisher's last flush would lose it, then follows the thread from the start until the
/// gateway tells the pause; returns the reader, the events seen before, and that event.
async fn lose_the_pause_event_then_follow(
    app: &TestApp,
    thread: uuid::Uuid,
    token: &str,
) -> (
    spool_tests::sse::SseReader,
    Vec<String>,
    spool_tests::sse::Frame,
) {
    let pause = poll_until(
        "the pause event to be stored",
        Duration::from_secs(10),
        || async {
            let stored = app.stored(thread).await;
            stored
                .into_iter()
                .find(|(_, kind)| kind == "requires_action")
        },
    )
    .await;
    let key = app.keys.events(spool_shared::ThreadId(thread));
    let _: i64 = redis::cmd("XDEL")
        .arg(&key)
        .arg(&pause.0)
        .query_async(&mut app.streams.conn())
        .await
        .expect("xdel");
    let mut reader = app.stream(token, thread, "", None).await;
    let mut seen = Vec::new();
    let told = loop {
        // The gateway looks at Postgres once the stream has been quiet for 15 s.
        let frame = reader
            .next(Duration::from_secs(25))
            .await
            .unwrap_or_else(|| panic!("the stream went quiet after {seen:?}"));
        if frame.event == "requires_action" {
            break frame;
        }
        seen.push(frame.event);
    };
    (reader, seen, told)
}

#[tokio::test]
async fn a_follower_of_a_run_whose_pause_event_was_lost_is_told_from_postgres() {
    let fake = file_reader().await;
    let (app, thread, accepted, paused) = paused_on_the_client(&fake).await;
    let alice = token("alice", "acme");
    let (mut reader, seen, told) = lose_the_pause_event_then_follow(&app, thread, &alice).await;
    assert!(seen.contains(&"step".to_owned()), "{seen:?}");
    assert_eq!(told.id, None, "a rebuilt event moves no cursor");
    let event = told.json();
    assert_eq!(event["type"], "requires_action");
    assert_eq!(event["workflow_id"], accepted["workflow_id"]);
    assert_eq!(event["message_id"], accepted["message_id"]);
    assert_eq!(event["data"]["tool_calls"][0]["tool_call_id"], "call_f");
    assert_eq!(
        event["data"]["expires_at"], paused["pending_action"]["expires_at"],
        "the deadline Postgres holds"
    );
    assert!(
        reader.next(Duration::from_millis(500)).await.is_none() && !reader.closed,
        "the stream stays open for the rest of the run"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_follower_of_a_waiting_run_whose_childs_pause_event_was_lost_is_told_from_postgres() {
    // The boss hands the question to its `ask_files` agent, whose client tool pauses it.
    let names = |request: &Value| -> Vec<String> {
        request["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
            .collect()
    };
    let fake = FakeLlm::start(move |request, _| {
        let child = names(request).iter().any(|n| n == "read_local_file");
        match (child, tool_results_in(request)) {
            (true, 0) => {
                fake_llm::tool_calls(&[("call_f", "read_local_file", r#"{"path": "a.txt"}"#)])
            }
            (false, 0) => {
                fake_llm::tool_calls(&[("call_a", "ask_files", r#"{"input": "read a.txt"}"#)])
            }
            _ => fake_llm::text("done", 1),
        }
    })
    .await;
    let app = app_with(&fake).await;
    let files = app
        .create_agent(
            "acme",
            &json!({"name": "files", "model": "gpt-4o-mini", "tools": [client_tool()]}),
        )
        .await;
    let boss = app
        .create_agent(
            "acme",
            &json!({"name": "boss", "model": "gpt-4o-mini", "tools": [
                {"type": "agent", "name": "ask_files", "agent_id": files}]}),
        )
        .await;
    let (thread, accepted) = ask(&app, &boss, "what is in a.txt?").await;
    app.wait_run(&accepted, |s| s == "waiting").await;
    let alice = token("alice", "acme");
    let (mut reader, _, told) = lose_the_pause_event_then_follow(&app, thread, &alice).await;
    let event = told.json();
    assert_ne!(
        event["workflow_id"], accepted["workflow_id"],
        "the child's, not the boss's"
    );
    assert_eq!(event["depth"], 1);
    assert_eq!(event["data"]["tool_calls"][0]["tool_call_id"], "call_f");
    let (_, child) = app
        .get(
            &alice,
            &format!(
                "/v1/workflows/{}",
                event["workflow_id"].as_str().unwrap_or("")
            ),
        )
        .await;
    assert_eq!(child["status"], "requires_action", "{child}");
    assert!(
        reader.next(Duration::from_millis(500)).await.is_none() && !reader.closed,
        "told once; the stream stays open for the rest of the run"
    );
    app.stop().await;
}
