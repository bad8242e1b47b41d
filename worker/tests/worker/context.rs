//! Context (docs/agents.md): earlier turns replay with their tool calls and results (cut), and a
//! prompt over the model's context window, or one the provider refuses as too long, has the
//! thread's oldest turns summarised into a stored summary that later runs reuse; past what
//! summaries can do, `context_overflow`.

use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm, Reply, tool_results_in};
use spool_tests::tools::{Tools, http_tool};

use crate::harness::Harness;

/// Whether the request asks for a summary.
fn summary_request(request: &Value) -> bool {
    request["messages"][0]["content"]
        .as_str()
        .is_some_and(|c| c.starts_with("Summarise the conversation"))
}

/// The requests that were not summaries.
fn answers(fake: &FakeLlm) -> Vec<Value> {
    fake.requests()
        .into_iter()
        .filter(|r| !summary_request(r))
        .collect()
}

async fn summaries(app: &Harness) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT through_seq, content FROM thread_summaries ORDER BY through_seq")
        .fetch_all(&app.db.pool)
        .await
        .expect("summaries")
}

#[tokio::test]
async fn earlier_turns_replay_with_their_tool_calls_and_cut_results() {
    let fake = FakeLlm::start(|request, _| {
        let last = request["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or_default();
        if last["role"] == "user" && last["content"] == "Look it up." {
            fake_llm::tool_calls(&[("call_big", "big", "{}")])
        } else if tool_results_in(request) > 0 && last["role"] == "tool" {
            fake_llm::text("Found it.", 1)
        } else {
            fake_llm::text("Nothing to add.", 1)
        }
    })
    .await;
    let (_tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "memory", "model": "gpt-4o-mini",
            "tools": [http_tool("big", format!("{base}/big"))]}))
        .await;
    let (thread, first) = app.ask(&agent, "Look it up.").await;
    assert_eq!(app.finished(&first).await["status"], "completed");
    let second = app.send(thread, None, "Anything else?").await;
    assert_eq!(app.finished(&second).await["status"], "completed");

    let request = fake
        .requests()
        .last()
        .cloned()
        .expect("the second run's call");
    let messages = request["messages"].as_array().expect("messages");
    let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant", "user"]);
    assert_eq!(messages[1]["tool_calls"][0]["id"], "call_big");
    assert_eq!(messages[1]["tool_calls"][0]["function"]["name"], "big");
    assert_eq!(messages[2]["tool_call_id"], "call_big");
    let result = messages[2]["content"].as_str().unwrap_or_default();
    assert!(
        result.starts_with(&"z".repeat(2_000))
            && result.ends_with("[result cut to 2000 characters]"),
        "{} characters",
        result.len()
    );
    assert_eq!(messages[3]["content"], "Found it.");
    assert_eq!(messages[4]["content"], "Anything else?");
}

#[tokio::test]
async fn a_prompt_over_the_window_is_fitted_by_a_stored_summary_that_later_runs_reuse() {
    let fake = FakeLlm::start(|request, n| {
        if summary_request(request) {
            fake_llm::text(&format!("SUMMARY of request {n}"), 1)
        } else {
            fake_llm::text(&"r".repeat(100), 2)
        }
    })
    .await;
    let app = Harness::start(&fake).await;
    // 256 tokens: about 1,024 characters of prompt.
    let agent = app
        .create_agent(&json!({"name": "window", "model": "gpt-4o-mini",
            "context_window_tokens": 256}))
        .await;
    let first_words = "a".repeat(500);
    let (thread, first) = app.ask(&agent, &first_words).await;
    assert_eq!(app.finished(&first).await["status"], "completed");
    assert!(summaries(&app).await.is_empty(), "the first turn fits");

    // 500 + 100 + 500 characters: over the window; the oldest turn is summarised.
    let second = app.send(thread, None, &"b".repeat(500)).await;
    let run = app.finished(&second).await;
    assert_eq!(run["status"], "completed", "{run}");
    let stored = summaries(&app).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert!(stored[0].1.starts_with("SUMMARY"));
    let asked = fake.requests();
    let summary_asked = asked
        .iter()
        .find(|r| summary_request(r))
        .expect("a summary call");
    assert!(
        summary_asked["messages"][1]["content"]
            .as_str()
            .is_some_and(|t| t.contains(&first_words))
    );
    let fitted = answers(&fake)
        .last()
        .cloned()
        .expect("the second run's call");
    let text = fitted["messages"].to_string();
    assert!(
        !text.contains(&first_words),
        "the summarised turn is not replayed"
    );
    assert!(text.contains(&stored[0].1), "the summary is");

    // The next run starts from the stored summary: no new one.
    let third = app.send(thread, None, "short").await;
    assert_eq!(app.finished(&third).await["status"], "completed");
    assert_eq!(summaries(&app).await.len(), 1);
    assert_eq!(
        fake.requests()
            .iter()
            .filter(|r| summary_request(r))
            .count(),
        1
    );
    let reused = answers(&fake)
        .last()
        .cloned()
        .expect("the third run's call");
    assert_eq!(
        reused["messages"][0]["content"],
        format!("Summary of the earlier conversation:\n{}", stored[0].1)
    );
}

#[tokio::test]
async fn a_provider_s_too_long_answer_summarises_and_retries_and_overflow_fails_clearly() {
    let old = "o".repeat(300);
    let marker = old.clone();
    let fake = FakeLlm::start(move |request, _| {
        if summary_request(request) {
            return fake_llm::text("SUMMARY", 1);
        }
        if request["messages"].to_string().contains(&marker) && request["messages"].as_array().is_some_and(|m| m.len() > 1) {
            let said = "This model's maximum context length is 100 tokens. However, your messages resulted in 180 tokens.";
            return Reply::Status(400, said.into(), None);
        }
        fake_llm::text("fine", 1)
    })
    .await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "refused", "model": "gpt-4o-mini"}))
        .await;
    let (thread, first) = app.ask(&agent, &old).await;
    assert_eq!(app.finished(&first).await["status"], "completed");
    let second = app.send(thread, None, "next").await;
    let run = app.finished(&second).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(summaries(&app).await.len(), 1);

    // A single message over the window: nothing earlier to summarise.
    let small = app
        .create_agent(
            &json!({"name": "small", "model": "gpt-4o-mini", "context_window_tokens": 256}),
        )
        .await;
    let before = fake.requests().len();
    let (_, huge) = app.ask(&small, &"h".repeat(2_000)).await;
    let run = app.finished(&huge).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "context_overflow", "{run}");
    assert_eq!(
        fake.requests().len(),
        before,
        "no model call for a prompt that cannot fit"
    );
}

#[tokio::test]
async fn the_run_s_own_old_tool_results_make_room_within_the_window_before_any_summary() {
    // Two results of 50,000 characters (the cut) do not fit a 20,000-token window together;
    // the older one becomes a placeholder, and the run needs no summary.
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_1", "big", "{\"page\": 1}")]),
        1 => fake_llm::tool_calls(&[("call_2", "big", "{\"page\": 2}")]),
        _ => fake_llm::text("Read both.", 1),
    })
    .await;
    let (_tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "pages", "model": "gpt-4o-mini",
            "context_window_tokens": 20_000, "tools": [http_tool("big", format!("{base}/big"))]}))
        .await;
    let (_, accepted) = app.ask(&agent, "Read the pages.").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    let last = fake.requests().last().cloned().expect("the last call");
    let results: Vec<usize> = last["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().map_or(0, str::len))
        .collect();
    assert_eq!(results.len(), 2);
    assert!(results[0] < 100 && results[1] > 40_000, "{results:?}");
    assert!(summaries(&app).await.is_empty());
}

#[tokio::test]
async fn a_summary_cut_short_or_empty_is_never_stored_and_the_run_fails_only_if_it_cannot_fit() {
    // The summary model stops at its token limit, then says nothing.
    for (case, summary) in [
        (
            "cut",
            fake_llm::text_with_finish("SUMMARY that stops mid-", 1, "length"),
        ),
        ("empty", fake_llm::text(" ", 1)),
    ] {
        let fake = FakeLlm::start(move |request, _| {
            if summary_request(request) {
                summary.clone()
            } else {
                fake_llm::text(&"r".repeat(100), 2)
            }
        })
        .await;
        let app = Harness::start(&fake).await;
        let agent = app
            .create_agent(&json!({"name": "window", "model": "gpt-4o-mini",
                "context_window_tokens": 256}))
            .await;
        let (thread, first) = app.ask(&agent, &"a".repeat(500)).await;
        assert_eq!(app.finished(&first).await["status"], "completed");
        // The history is what overflows: a summary is asked for, and fails.
        let second = app.send(thread, None, &"b".repeat(500)).await;
        let run = app.finished(&second).await;
        assert_eq!(run["status"], "failed", "{case}: {run}");
        assert_eq!(run["error"]["code"], "context_overflow", "{case}: {run}");
        let message = run["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("a summary was not stored"),
            "{case}: {message}"
        );
        assert!(
            fake.requests().iter().any(summary_request),
            "{case}: a summary was asked for"
        );
        assert!(summaries(&app).await.is_empty(), "{case}: nothing stored");
    }
}

#[tokio::test]
async fn the_run_s_own_step_over_the_window_is_cut_not_the_thread_s_history_summarised() {
    // A first turn to summarise, then a run whose one tool result (60,000 characters, cut to
    // 50,000) alone outgrows a 4,000-token window.
    let fake = FakeLlm::start(|request, _| {
        if summary_request(request) {
            return fake_llm::text("SUMMARY", 1);
        }
        let last = request["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or_default();
        if last["role"] == "user" && last["content"] == "Read the page." {
            fake_llm::tool_calls(&[("call_big", "big", "{}")])
        } else if last["role"] == "tool" {
            fake_llm::text("Read it.", 1)
        } else {
            fake_llm::text(&"x".repeat(3_000), 1)
        }
    })
    .await;
    let (_tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "reader", "model": "gpt-4o-mini",
            "context_window_tokens": 4_000, "tools": [http_tool("big", format!("{base}/big"))]}))
        .await;
    let (thread, first) = app.ask(&agent, "Tell me a long story.").await;
    assert_eq!(app.finished(&first).await["status"], "completed");
    let second = app.send(thread, None, "Read the page.").await;
    let run = app.finished(&second).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert!(
        !fake.requests().iter().any(summary_request),
        "no summary: the history was not what overflowed"
    );
    assert!(summaries(&app).await.is_empty());
    let last = answers(&fake).last().cloned().expect("the last call");
    let result = last["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        result.starts_with(&"z".repeat(2_000))
            && result.ends_with("[result cut to 2000 characters]"),
        "{} characters",
        result.len()
    );
    // The stored step keeps the whole (cut at 50,000) result: only the prompt was cut.
    let page = app.messages(thread).await;
    let stored = page["messages"][3]["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["type"] == "tool_result")
        .and_then(|p| p["output"].as_str())
        .map_or(0, str::len);
    assert!(stored > 40_000, "{stored}");
}

#[tokio::test]
async fn a_summary_sees_the_turns_tool_calls_and_results_and_is_written_in_pieces_that_fit() {
    let fake = FakeLlm::start(|request, n| {
        if summary_request(request) {
            return fake_llm::text(&format!("SUMMARY {n}"), 1);
        }
        let last = request["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or_default();
        if last["role"] == "user" && last["content"] == "Create the order." {
            fake_llm::tool_calls(&[("call_o", "create", r#"{"order": 123}"#)])
        } else if last["role"] == "tool" {
            fake_llm::text(&"k".repeat(1_100), 1)
        } else {
            fake_llm::text("Noted.", 1)
        }
    })
    .await;
    let (_tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    // 500 tokens: about 2,000 characters; each summary call takes 1,000 characters of turns.
    let agent = app
        .create_agent(&json!({"name": "orders", "model": "gpt-4o-mini",
            "context_window_tokens": 500, "tools": [http_tool("create", format!("{base}/create"))]}))
        .await;
    let (thread, first) = app.ask(&agent, "Create the order.").await;
    assert_eq!(app.finished(&first).await["status"], "completed");
    let second = app.send(thread, None, "Thanks.").await;
    assert_eq!(app.finished(&second).await["status"], "completed");
    assert!(
        !fake.requests().iter().any(summary_request),
        "two turns fit"
    );
    // The first turn (its call, its result and an answer of 1,100 characters) is summarised
    // to make room, in two calls.
    let third = app.send(thread, None, &"q".repeat(1_200)).await;
    let run = app.finished(&third).await;
    assert_eq!(run["status"], "completed", "{run}");

    let asked: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| summary_request(r))
        .map(|r| {
            r["messages"][1]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(asked.len(), 2, "the turns do not fit one call: {asked:?}");
    assert!(
        asked.iter().all(|t| t.chars().count() <= 1_000 + 100),
        "each piece fits: {:?}",
        asked.iter().map(String::len).collect::<Vec<_>>()
    );
    let all = asked.concat();
    assert!(all.contains("called create with {\"order\": 123}"), "{all}");
    assert!(all.contains("result of create:"), "{all}");
    // Each piece after the first continues the summary so far; the last one is stored.
    assert!(
        asked[1].starts_with("Summary so far:\nSUMMARY"),
        "{}",
        asked[1]
    );
    let stored = summaries(&app).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert!(stored[0].1.starts_with("SUMMARY"));
}

#[tokio::test]
async fn turns_beyond_history_depth_are_summarised_into_the_prompt_not_dropped() {
    let fake = FakeLlm::start(|request, n| {
        if summary_request(request) {
            fake_llm::text(&format!("SUMMARY {n}"), 1)
        } else {
            let asked = request["messages"]
                .as_array()
                .and_then(|m| m.last())
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .unwrap_or_default();
            fake_llm::text(&format!("answer to {asked}"), 1)
        }
    })
    .await;
    let app = Harness::start(&fake).await;
    // Two messages replayed: each run's own, and the answer before it.
    let agent = app
        .create_agent(&json!({"name": "short", "model": "gpt-4o-mini", "history_depth": 2}))
        .await;
    let (thread, first) = app.ask(&agent, "the code word is heron").await;
    assert_eq!(app.finished(&first).await["status"], "completed");
    assert!(
        summaries(&app).await.is_empty(),
        "nothing beyond the window"
    );

    // The first question falls out of the window: it is summarised, not dropped.
    let second = app.send(thread, None, "second question").await;
    assert_eq!(app.finished(&second).await["status"], "completed");
    let stored = summaries(&app).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    let summary_asked = fake
        .requests()
        .into_iter()
        .find(summary_request)
        .expect("a summary call");
    assert!(
        summary_asked["messages"][1]["content"]
            .as_str()
            .is_some_and(|t| t.contains("the code word is heron")),
        "{summary_asked}"
    );
    let prompt = answers(&fake)
        .last()
        .cloned()
        .expect("the second run's call");
    assert_eq!(
        prompt["messages"][0]["content"],
        format!("Summary of the earlier conversation:\n{}", stored[0].1)
    );
    let replayed: Vec<&str> = prompt["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .skip(1)
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(
        replayed,
        ["answer to the code word is heron", "second question"],
        "the window is the last two messages"
    );

    // The third run folds the next two messages into the summary, continuing it.
    let third = app.send(thread, None, "third question").await;
    assert_eq!(app.finished(&third).await["status"], "completed");
    let stored = summaries(&app).await;
    assert_eq!(stored.len(), 2, "{stored:?}");
    let last_summary = fake
        .requests()
        .into_iter()
        .rfind(summary_request)
        .expect("a second summary call");
    let transcript = last_summary["messages"][1]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        transcript.contains(&stored[0].1)
            && transcript.contains("answer to the code word is heron")
            && transcript.contains("second question")
            && !transcript.contains("third question"),
        "{transcript}"
    );
}
