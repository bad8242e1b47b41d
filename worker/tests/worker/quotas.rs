//! Daily token budgets in the loop (docs/operations.md): every model call's tokens are charged to
//! the run's budgeted counters, and a run whose budget is spent (by itself or by another run) fails
//! with `budget_exceeded` before its next model call, keeping its partial message.

use serde_json::json;

use spool_shared::db::quota;
use spool_shared::quota::{QuotaLimits, Quotas};
use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
use spool_tests::tools::{Tools, http_tool};

use crate::harness::Harness;

#[tokio::test]
async fn a_run_that_crosses_its_agents_budget_stops_before_its_next_model_call() {
    // Every step asks for a new call (27 tokens each: 20 in, 7 out), with some text first.
    let fake = FakeLlm::start(|request, _| {
        let n = tool_results_in(request);
        let (id, arguments) = (format!("c{n}"), format!(r#"{{"n": {n}}}"#));
        let reply = fake_llm::tool_calls(&[(&id, "create", &arguments)]);
        fake_llm::with_text(reply, &format!("Step {n}. "))
    })
    .await;
    let (tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "spender", "model": "gpt-4o-mini",
            "governance": {"user": {"daily_token_budget": 30}},
            "tools": [http_tool("create", format!("{base}/create"))]}))
        .await;
    let (thread, accepted) = app.ask(&agent, "go").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "budget_exceeded", "{run}");
    let message = run["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("30") && message.contains("54"),
        "{message}"
    );
    // Step 1 (27 tokens) left 3; step 2 crossed the budget and its call still ran; step 3
    // was never asked for.
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(tools.calls().len(), 2);
    let answer = &app.messages(thread).await["messages"][1];
    assert_eq!(answer["status"], "failed");
    assert!(
        answer["content"]
            .as_str()
            .is_some_and(|c| c.contains("Step 1.")),
        "the partial message is kept: {answer}"
    );
    let kinds: Vec<String> = app
        .events(thread)
        .await
        .into_iter()
        .map(|f| f.event)
        .filter(|k| k != "heartbeat")
        .collect();
    assert_eq!(kinds[kinds.len() - 2..], ["message_end", "done"]);
    let counters = quota::counters(&app.db.pool, "acme")
        .await
        .expect("counters");
    assert_eq!(counters.len(), 1, "{counters:?}");
    assert_eq!(
        (counters[0].owner_id.as_str(), counters[0].agent_id.as_str()),
        ("alice", agent.as_str())
    );
    assert_eq!(counters[0].day_tokens, 54);
}

#[tokio::test]
async fn a_queued_run_whose_budget_another_run_spent_fails_without_calling_the_model() {
    let fake = FakeLlm::start(|_, _| fake_llm::text("Hello there.", 2)).await;
    let app = Harness::start(&fake).await;
    let quotas = Quotas {
        tenant: QuotaLimits {
            daily_token_budget: Some(10),
            ..QuotaLimits::default()
        },
        user: QuotaLimits::default(),
        ip: QuotaLimits::default(),
    };
    // Both admitted: nothing is spent yet.
    let first = app
        .send_under(uuid::Uuid::new_v4(), None, "one", &quotas)
        .await;
    let second = app
        .send_under(uuid::Uuid::new_v4(), None, "two", &quotas)
        .await;
    // The first run crosses the budget (15 tokens) on its only step, which answers: it
    // completes.
    assert_eq!(app.finished(&first).await["status"], "completed");
    let run = app.finished(&second).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "budget_exceeded", "{run}");
    assert_eq!(
        fake.requests().len(),
        1,
        "the second run never called the model"
    );
    // A run enqueued under no budget is not stopped by it.
    let free = app.send(uuid::Uuid::new_v4(), None, "three").await;
    assert_eq!(app.finished(&free).await["status"], "completed");
    let counters = quota::counters(&app.db.pool, "acme")
        .await
        .expect("counters");
    assert_eq!(counters.len(), 1, "{counters:?}");
    assert_eq!(
        counters[0].day_tokens, 15,
        "only the budgeted run's call is charged"
    );
}
