//! The timeline (`GET /v1/workflows/{id}/steps`) a page at a time, and with its long results
//! cut (review B-L11): through the API process, on a run whose steps are in Postgres.

use serde_json::{Value, json};
use spool_tests::token;

use crate::stack::{Stack, workflow_id};

/// A completed run with `count` saved steps before its answer, each with one tool call whose
/// result is 5,000 characters long (written as the worker writes them: `SavedStep` JSON).
async fn run_with_steps(stack: &Stack, count: i32) -> uuid::Uuid {
    let accepted = stack.enqueue(&token("alice", "acme"), "steps").await;
    stack.wait_run(&accepted, "completed").await;
    let id = workflow_id(&accepted);
    for step in 1..=count {
        let data = json!({
            "assistant": {"text": format!("step {step}"),
                          "tool_calls": [{"id": format!("c{step}"), "name": "lookup",
                                          "arguments": "{}"}]},
            "results": [{"tool_call_id": format!("c{step}"), "name": "lookup",
                         "output": "x".repeat(5_000), "state": "done"}],
        });
        sqlx::query(
            "INSERT INTO run_steps (workflow_id, step, attempt, data, text)
             VALUES ($1, $2, 1, $3, $4)",
        )
        .bind(id)
        .bind(step)
        .bind(&data)
        .bind(format!("step {step}"))
        .execute(&stack.db.pool)
        .await
        .expect("a step");
    }
    id
}

fn numbers(page: &Value) -> Vec<i64> {
    page["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["step"].as_i64().expect("step"))
        .collect()
}

#[tokio::test]
async fn the_timeline_comes_a_page_at_a_time_with_results_cut_on_request() {
    let stack = Stack::start().await;
    let _worker = stack
        .worker(&[("SPOOL_DEMO_TOKENS", "2"), ("SPOOL_DEMO_DELAY_MS", "0")])
        .await;
    let id = run_with_steps(&stack, 5).await;
    let alice = token("alice", "acme");
    let path = format!("/v1/workflows/{id}/steps");
    let (status, whole) = stack.get_with(&alice, &format!("{path}?limit=200")).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{whole}");
    let all = numbers(&whole);
    assert!(all.len() >= 5, "{all:?}");
    assert_eq!(whole["next_cursor"], Value::Null);

    // Pages of two, each after the previous one's cursor, make up the whole timeline.
    let (mut seen, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let query = match &cursor {
            Some(cursor) => format!("{path}?limit=2&cursor={cursor}"),
            None => format!("{path}?limit=2"),
        };
        let (status, page) = stack.get_with(&alice, &query).await;
        assert_eq!(status, reqwest::StatusCode::OK, "{page}");
        let steps = numbers(&page);
        assert!(!steps.is_empty() && steps.len() <= 2, "{query}: {steps:?}");
        seen.extend(steps);
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, all, "the pages are the timeline, once each");
    assert_eq!(pages, all.len().div_ceil(2));

    // Whole results, or cut to 2,000 characters with a marker.
    let result = |page: &Value| page["steps"][0]["tool_calls"][0]["result"].clone();
    assert_eq!(result(&whole).as_str().map(str::len), Some(5_000));
    let (status, cut) = stack.get_with(&alice, &format!("{path}?results=cut")).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{cut}");
    let expected = format!("{}… [cut: 3000 more characters]", "x".repeat(2_000));
    assert_eq!(result(&cut), json!(expected));

    for (query, code) in [
        ("limit=0", "invalid_limit"),
        ("limit=201", "invalid_limit"),
        ("limit=two", "invalid_query"),
        ("cursor=abc", "invalid_cursor"),
        ("cursor=0", "invalid_cursor"),
        ("cursor=-3", "invalid_cursor"),
        ("results=short", "invalid_query"),
        ("page=2", "invalid_query"),
    ] {
        let (status, body) = stack.get_with(&alice, &format!("{path}?{query}")).await;
        assert_eq!(
            status,
            reqwest::StatusCode::UNPROCESSABLE_ENTITY,
            "{query}: {body}"
        );
        assert_eq!(body["error"]["code"], code, "{query}: {body}");
    }
}
