//! Honest refusals on the OpenAI-compatible routes (DESIGN section 11, issue 39 item 5):
//! parameters Spool does not apply are a 400 naming them, instructions from a caller who may not
//! give them are a 400 saying why, and nothing is created either way; a Chat Completions client
//! that resends its conversation stays on one thread.

use serde_json::{Value, json};
use spool_tests::token;

use crate::stack::{Stack, demo_reply};

/// The number of threads `token`'s user has.
async fn threads(stack: &Stack, token: &str) -> usize {
    let (status, list) = stack.get_with(token, "/v1/threads?limit=100").await;
    assert_eq!(status, 200, "{list}");
    list["data"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn parameters_spool_does_not_apply_and_instructions_it_may_not_take_are_named() {
    let mut stack = Stack::start().await;
    let conform = crate::openai::conforming(&mut stack).await;
    let _worker = stack.worker(&[("SPOOL_DEMO_DELAY_MS", "0")]).await;
    let alice = token("alice", "acme");
    let refusals = [
        (
            "/v1/responses",
            json!({"model": "spool-default", "input": "hi",
                "include": ["file_search_call.results"]}),
            "unsupported_parameter",
            "include",
        ),
        (
            "/v1/responses",
            json!({"model": "spool-default", "input": "hi", "tools": [{"type": "web_search"}]}),
            "unsupported_parameter",
            "tools[0].type",
        ),
        (
            "/v1/responses",
            json!({"model": "spool-default", "input": "hi", "prompt": {"id": "pmpt_1"}}),
            "unsupported_parameter",
            "prompt",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "spool-default", "messages": [{"role": "user", "content": "hi"}],
                "seed": 7}),
            "unsupported_parameter",
            "seed",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "spool-default", "messages": [{"role": "user", "content": "hi"}],
                "web_search_options": {}}),
            "unsupported_parameter",
            "web_search_options",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "spool-default", "messages": [
                {"role": "system", "content": "You are a pirate."},
                {"role": "user", "content": "hi"}]}),
            "instructions_not_allowed",
            "messages[0]",
        ),
        (
            "/v1/responses",
            json!({"model": "spool-default", "input": "hi", "instructions": "Be a pirate."}),
            "instructions_not_allowed",
            "instructions",
        ),
        (
            "/v1/responses",
            json!({"model": "spool-default", "input": [
                {"role": "user", "content": "hi"},
                {"role": "developer", "content": "Be a pirate."},
                {"role": "user", "content": "again"}]}),
            "instructions_not_allowed",
            "input[1]",
        ),
    ];
    for (path, body, code, param) in refusals {
        let (status, error) = stack.post(&alice, path, &body).await;
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["error"]["code"], code, "{error}");
        assert_eq!(error["error"]["param"], param, "{error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(param.split('[').next().unwrap_or(param)),
            "{message}"
        );
    }
    assert_eq!(threads(&stack, &alice).await, 0, "nothing was created");
    // OpenAI's defaults ask for nothing: accepted.
    let (status, completion) = stack
        .post(
            &alice,
            "/v1/chat/completions",
            &json!({"model": "spool-default", "messages": [{"role": "user", "content": "hi"}],
                "frequency_penalty": 0, "presence_penalty": 0, "logprobs": false, "n": 1,
                "stop": null}),
        )
        .await;
    assert_eq!(status, 200, "{completion}");
    conform.check();
}

/// The thread a completion ran on.
async fn thread_of(stack: &Stack, token: &str, completion: &Value) -> String {
    let id = completion["id"].as_str().expect("id");
    let hex = id.trim_start_matches("chatcmpl-");
    let workflow = uuid::Uuid::parse_str(hex).expect("a workflow id");
    let (status, run) = stack
        .get_with(token, &format!("/v1/workflows/{workflow}"))
        .await;
    assert_eq!(status, 200, "{run}");
    run["thread_id"].as_str().expect("thread").to_owned()
}

#[tokio::test]
async fn a_chat_conversation_resent_with_its_answer_stays_on_one_thread() {
    let mut stack = Stack::start().await;
    let conform = crate::openai::conforming(&mut stack).await;
    let _worker = stack.worker(&[("SPOOL_DEMO_DELAY_MS", "0")]).await;
    let alice = token("alice", "acme");
    let chat = |messages: Value| json!({"model": "spool-default", "messages": messages});
    let mut messages = vec![json!({"role": "user", "content": "first question"})];
    let (status, first) = stack
        .post(&alice, "/v1/chat/completions", &chat(json!(messages)))
        .await;
    assert_eq!(status, 200, "{first}");
    let answer = first["choices"][0]["message"]["content"].clone();
    assert_eq!(answer, json!(demo_reply("first question", 32)));
    let thread = thread_of(&stack, &alice, &first).await;

    messages.push(json!({"role": "assistant", "content": answer}));
    messages.push(json!({"role": "user", "content": "second question"}));
    let (status, second) = stack
        .post(&alice, "/v1/chat/completions", &chat(json!(messages)))
        .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(
        thread_of(&stack, &alice, &second).await,
        thread,
        "the same thread"
    );
    let (_, stored) = stack
        .get_with(&alice, &format!("/v1/threads/{thread}/messages"))
        .await;
    let roles: Vec<&str> = stored["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["role"].as_str())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "user", "assistant"],
        "the conversation once, not seeded again"
    );

    // Another user resending the same words has a thread of their own.
    let bob = token("bob", "acme");
    let (_, theirs) = stack
        .post(&bob, "/v1/chat/completions", &chat(json!(messages)))
        .await;
    assert_ne!(thread_of(&stack, &bob, &theirs).await, thread);
    // An answer the thread never gave does not continue it.
    let edited = json!([
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer someone wrote"},
        {"role": "user", "content": "second question"},
    ]);
    let (_, other) = stack
        .post(&alice, "/v1/chat/completions", &chat(edited))
        .await;
    assert_ne!(thread_of(&stack, &alice, &other).await, thread);

    // Erasing the thread erases the hashes of its conversation too.
    let hashes = |thread: String| {
        let pool = stack.db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM chat_histories WHERE thread_id = $1::uuid",
            )
            .bind(thread)
            .fetch_one(&pool)
            .await
            .expect("count")
        }
    };
    assert_eq!(hashes(thread.clone()).await, 2);
    let erased = stack
        .http
        .delete(format!("{}/v1/threads/{thread}", stack.base))
        .bearer_auth(&alice)
        .send()
        .await
        .expect("erase");
    assert_eq!(erased.status(), 204);
    assert_eq!(hashes(thread).await, 0);
    conform.check();
}
