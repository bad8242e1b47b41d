//! Cost (DESIGN sections 8 and 9): every model call's `cost_usd` from its provider's prices,
//! summed on the run, the message, `/steps`, `GET /v1/usage` and the webhooks' payloads; a model
//! with no price is unpriced (null, named in usage reports, never free); `daily_budget_usd`
//! refuses new runs and stops running ones between steps.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use spool_tests::fake_llm::{self, FakeLlm, Reply, tool_results_in};
use spool_tests::tools::{Tools, http_tool};
use spool_tests::webhooks::Receiver;
use spool_tests::{poll_until, token};

use crate::agents::admin;
use crate::common::{TestApp, finished, worker_args_with};

/// The unnamed provider's prices: `priced` has a cached-input price; `mystery` has none.
const PRICES: &str = r#"{"priced": {"input_per_mtok": 2, "output_per_mtok": 8,
                                    "cached_input_per_mtok": 0.5}}"#;

/// What the tool-calling step costs: 20 prompt tokens (4 of them cached) and 7 generated.
fn tool_step_cost() -> f64 {
    (16.0 * 2.0 + 4.0 * 0.5 + 7.0 * 8.0) / 1_000_000.0
}

/// What the answering step costs: 10 prompt tokens and 5 generated.
fn text_step_cost() -> f64 {
    (10.0 * 2.0 + 5.0 * 8.0) / 1_000_000.0
}

/// A tool call whose usage reports 4 of its 20 prompt tokens read from the cache.
fn cached_tool_call(n: usize) -> Reply {
    let (id, arguments) = (format!("c{n}"), format!(r#"{{"n": {n}}}"#));
    match fake_llm::tool_calls(&[(&id, "look", &arguments)]) {
        Reply::Stream(mut payloads) => {
            if let Some(last) = payloads.last_mut() {
                last["usage"]["prompt_tokens_details"] = json!({"cached_tokens": 4});
            }
            Reply::Stream(payloads)
        }
        other => other,
    }
}

/// The run of `accepted` once it completed or failed, read as `who` (a user sees only their
/// own runs).
async fn finished_as(app: &TestApp, who: &str, accepted: &Value) -> Value {
    let path = format!(
        "/v1/workflows/{}",
        accepted["workflow_id"].as_str().expect("a workflow id")
    );
    poll_until(
        &format!("{who}'s run to finish"),
        Duration::from_secs(30),
        async || {
            let (status, run) = app.get(&token(who, "acme"), &path).await;
            (status == StatusCode::OK
                && matches!(run["status"].as_str(), Some("completed" | "failed")))
            .then_some(run)
        },
    )
    .await
}

/// An API whose one worker calls `fake` as its unnamed provider, priced by [`PRICES`].
async fn priced_app(fake: &FakeLlm) -> TestApp {
    TestApp::start(
        1,
        worker_args_with(
            1,
            0,
            &[
                "--llm-base-url",
                &fake.base_url,
                "--llm-prices",
                PRICES,
                "--tools-allow-networks",
                "127.0.0.0/8",
            ],
        ),
    )
    .await
}

/// Posts `who`'s message to `agent` on a new thread; the thread and the 202 body.
async fn ask_as(app: &TestApp, who: &str, agent: &str, text: &str) -> (Uuid, Value) {
    let thread = Uuid::new_v4();
    let (status, accepted) = app
        .post(
            &token(who, "acme"),
            &format!("/v1/threads/{thread}/user_message"),
            &json!({"input_text": text, "agent_id": agent}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    (thread, accepted)
}

fn row<'a>(page: &'a Value, group: &str) -> &'a Value {
    page["data"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["group"] == group))
        .unwrap_or_else(|| panic!("no row for {group}: {page}"))
}

#[tokio::test]
async fn a_run_costs_its_calls_at_their_prices_everywhere_and_an_unpriced_model_is_named_not_free()
{
    // Step 1 asks for a tool, step 2 answers.
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => cached_tool_call(0),
        _ => fake_llm::text("Found it.", 2),
    })
    .await;
    let (_tools, base) = Tools::start().await;
    let app = priced_app(&fake).await;
    let (receiver, hook) = Receiver::start(&[]).await;
    let acme = admin("acme");
    let (status, body) = app
        .post(
            &acme,
            "/v1/webhooks",
            &json!({"url": hook, "events": ["run.completed"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let tools = json!([http_tool("look", format!("{base}/list"))]);
    let priced = app
        .create_agent(
            "acme",
            &json!({"name": "priced", "model": "priced", "tools": tools}),
        )
        .await;
    let mystery = app
        .create_agent(
            "acme",
            &json!({"name": "mystery", "model": "mystery", "tools": tools}),
        )
        .await;

    let (thread, accepted) = ask_as(&app, "alice", &priced, "look it up").await;
    let run = finished(&app, &accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    let cost = tool_step_cost() + text_step_cost();
    assert_eq!(run["usage"]["cost_usd"].as_f64(), Some(cost), "{run}");

    let alice = token("alice", "acme");
    let (_, messages) = app
        .get(&alice, &format!("/v1/threads/{thread}/messages"))
        .await;
    let answer = &messages["messages"][1];
    assert_eq!(answer["usage"]["cost_usd"].as_f64(), Some(cost), "{answer}");

    let id = accepted["workflow_id"].as_str().expect("id");
    let (status, timeline) = app.get(&alice, &format!("/v1/workflows/{id}/steps")).await;
    assert_eq!(status, StatusCode::OK, "{timeline}");
    let step_costs: Vec<Option<f64>> = timeline["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["usage"]["cost_usd"].as_f64())
        .collect();
    assert_eq!(
        step_costs,
        [Some(tool_step_cost()), Some(text_step_cost())],
        "{timeline}"
    );

    let delivered = poll_until(
        "the run.completed webhook",
        Duration::from_secs(20),
        async || receiver.received().into_iter().next(),
    )
    .await;
    assert_eq!(
        delivered.json()["data"]["usage"]["cost_usd"].as_f64(),
        Some(cost),
        "{}",
        delivered.json()
    );

    // Bob's run is on a model with no price: its cost is unknown, not 0.
    let (bobs_thread, accepted) = ask_as(&app, "bob", &mystery, "look it up").await;
    let unpriced = finished_as(&app, "bob", &accepted).await;
    assert_eq!(unpriced["status"], "completed", "{unpriced}");
    assert_eq!(unpriced["usage"]["cost_usd"], Value::Null, "{unpriced}");
    assert!(unpriced["usage"]["input_tokens"].as_u64() > Some(0));
    let (_, messages) = app
        .get(
            &token("bob", "acme"),
            &format!("/v1/threads/{bobs_thread}/messages"),
        )
        .await;
    assert_eq!(messages["messages"][1]["usage"]["cost_usd"], Value::Null);

    let hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let usage = |group_by: &str| format!("/v1/usage?group_by={group_by}&from={hour_ago}");
    let (status, by_model) = app.get(&acme, &usage("model")).await;
    assert_eq!(status, StatusCode::OK, "{by_model}");
    assert_eq!(row(&by_model, "priced")["cost_usd"].as_f64(), Some(cost));
    assert_eq!(row(&by_model, "priced")["unpriced_models"], json!([]));
    assert_eq!(row(&by_model, "mystery")["cost_usd"], Value::Null);
    assert_eq!(
        row(&by_model, "mystery")["unpriced_models"],
        json!(["mystery"])
    );
    assert_eq!(by_model["unpriced_models"], json!(["mystery"]));
    let (_, by_user) = app.get(&acme, &usage("user")).await;
    assert_eq!(row(&by_user, "alice")["cost_usd"].as_f64(), Some(cost));
    assert_eq!(row(&by_user, "alice")["unpriced_models"], json!([]));
    assert_eq!(row(&by_user, "bob")["cost_usd"], Value::Null, "{by_user}");
    assert_eq!(row(&by_user, "bob")["unpriced_models"], json!(["mystery"]));
    let (_, by_agent) = app.get(&acme, &usage("agent")).await;
    assert_eq!(row(&by_agent, &priced)["cost_usd"].as_f64(), Some(cost));
    assert_eq!(
        row(&by_agent, &mystery)["unpriced_models"],
        json!(["mystery"])
    );

    // Rolled up by housekeeping, the report says the same.
    spool_worker::housekeeping::purge(
        &app.db.pool,
        &spool_shared::config::RetentionArgs::default(),
        &tokio_util::sync::CancellationToken::new(),
    )
    .await
    .expect("housekeeping");
    let (pending,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM runs WHERE usage_rolled_up_at IS NULL")
            .fetch_one(&app.db.pool)
            .await
            .expect("count");
    assert_eq!(pending, 0, "both runs rolled up");
    let (_, rolled_model) = app.get(&acme, &usage("model")).await;
    assert_eq!(rolled_model["data"], by_model["data"]);
    let (_, rolled_user) = app.get(&acme, &usage("user")).await;
    assert_eq!(rolled_user["data"], by_user["data"]);
    app.stop().await;
}

#[tokio::test]
async fn a_daily_budget_in_dollars_stops_the_run_between_steps_and_refuses_the_next() {
    // Every step asks for another tool call: each costs `tool_step_cost()`.
    let fake = FakeLlm::start(|request, _| cached_tool_call(tool_results_in(request))).await;
    let (tools, base) = Tools::start().await;
    let app = priced_app(&fake).await;
    let budget = 0.0001;
    assert!(tool_step_cost() < budget && 2.0 * tool_step_cost() >= budget);

    // Out of range, or per address: refused by field, nothing saved.
    for (governance, field) in [
        (
            json!({"user": {"daily_budget_usd": 0}}),
            "governance.user.daily_budget_usd",
        ),
        (
            json!({"tenant": {"daily_budget_usd": 2e9}}),
            "governance.tenant.daily_budget_usd",
        ),
        (
            json!({"ip": {"daily_budget_usd": 1}}),
            "governance.ip.daily_budget_usd",
        ),
    ] {
        let (status, body) = app
            .post(
                &admin("acme"),
                "/v1/agents",
                &json!({"name": "bad", "model": "priced", "governance": governance}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["error"]["code"], "invalid_agent");
        assert_eq!(body["error"]["errors"][0]["field"], field, "{body}");
    }

    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "spender", "model": "priced",
                "governance": {"user": {"daily_budget_usd": budget}},
                "tools": [http_tool("look", format!("{base}/list"))]}),
        )
        .await;
    let (_, accepted) = ask_as(&app, "alice", &agent, "go").await;
    let run = finished(&app, &accepted).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "budget_exceeded", "{run}");
    let message = run["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("$0.0001"), "{message}");
    // Step 1 left some of the budget; step 2 crossed it and its call still ran; step 3 was
    // never asked for.
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(tools.calls().len(), 2);
    assert_eq!(
        run["usage"]["cost_usd"].as_f64(),
        Some(tool_step_cost() + tool_step_cost())
    );

    // Spent for today: the next run of alice with this agent is refused at enqueue.
    let thread = Uuid::new_v4();
    let (status, body) = app
        .post(
            &token("alice", "acme"),
            &format!("/v1/threads/{thread}/user_message"),
            &json!({"input_text": "again", "agent_id": agent}),
        )
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "budget_exceeded");
    assert_eq!(body["error"]["scope"], "user");
    assert_eq!(body["error"]["limit_usd"].as_f64(), Some(budget), "{body}");
    assert_eq!(body["error"]["agent_id"], json!(agent));
    assert!(body["error"].get("limit").is_none(), "{body}");
    let (status, _) = app
        .get(
            &token("alice", "acme"),
            &format!("/v1/threads/{thread}/messages"),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was enqueued");
    // Bob has a budget of his own.
    let (_, accepted) = ask_as(&app, "bob", &agent, "go").await;
    assert_eq!(
        finished_as(&app, "bob", &accepted).await["error"]["code"],
        "budget_exceeded"
    );
    app.stop().await;
}

#[test]
fn prices_that_do_not_parse_stop_the_start_naming_the_variable() {
    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        worker: spool_worker::WorkerArgs,
    }
    for (flag, value, says) in [
        (
            "--llm-prices",
            r#"{"m": {"input_per_mtok": 1}}"#,
            "SPOOL_LLM_PRICES: not a JSON object",
        ),
        (
            "--llm-prices",
            r#"{"m": {"input_per_mtok": -1, "output_per_mtok": 1}}"#,
            "SPOOL_LLM_PRICES: m.input_per_mtok must be a number from 0",
        ),
        (
            "--providers",
            r#"[{"name": "p", "kind": "openai", "base_url": "https://x.io",
                 "prices": {"m": {"input_per_mtok": 1, "output_per_mtok": "free"}}}]"#,
            "SPOOL_PROVIDERS: not a JSON list",
        ),
    ] {
        let err = <Command as clap::Parser>::try_parse_from(["worker", flag, value])
            .err()
            .unwrap_or_else(|| panic!("{value} parsed"));
        assert!(err.to_string().contains(says), "{value}: {err}");
    }
}
