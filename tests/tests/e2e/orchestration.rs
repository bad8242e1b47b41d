//! Agents as tools through the real processes: the child's events nest in the parent thread's
//! stream (and a client resuming mid-child still ends at the parent's `done`), the child is a
//! run of its own in the API, a cancel of the parent reaches the child, and a crash of the
//! child's worker leaves one answer.

use std::time::Duration;

use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm, Reply, tool_results_in};
use spool_tests::sse::{Frame, SseReader};
use spool_tests::{JWT_SECRET, poll_until, run_row, token, token_with};

use crate::stack::{Stack, TIMEOUT, workflow_id};

const RESEARCH_ANSWER: &str = "Paris is the capital of France, on the Seine.";

/// The lead and the researcher of `fake_llm::lead_and_researcher`, the researcher answering
/// in `pieces` deltas `gap` apart.
fn lead_and_researcher(pieces: usize, gap: Duration) -> impl Fn(&Value, usize) -> Reply {
    fake_llm::lead_and_researcher(move || fake_llm::paced_text(RESEARCH_ANSWER, pieces, gap))
}

/// The stack with one worker on `fake`, and the lead agent calling the researcher; returns
/// the lead's id and the worker.
async fn lead(stack: &Stack, fake: &FakeLlm) -> (String, spool_tests::process::Process) {
    lead_with(stack, fake, &[]).await
}

/// The same, the worker with `settings` on top.
async fn lead_with(
    stack: &Stack,
    fake: &FakeLlm,
    settings: &[(&str, &str)],
) -> (String, spool_tests::process::Process) {
    let llm = [("SPOOL_LLM_BASE_URL", fake.base_url.as_str())];
    let worker = stack.worker(&[&llm[..], settings].concat()).await;
    let researcher = stack.create_agent(&fake_llm::researcher_spec()).await;
    let lead = stack.create_agent(&fake_llm::lead_spec(&researcher)).await;
    (lead, worker)
}

/// Alice asks the lead on a new thread; returns the 202 body.
async fn ask(stack: &Stack, lead: &str) -> Value {
    stack.ask(lead, "Capital of France?").await
}

/// The child run of `parent`, once it exists.
async fn child_of(stack: &Stack, parent: &Value) -> uuid::Uuid {
    let parent = workflow_id(parent);
    poll_until("the child run to start", TIMEOUT, || async {
        sqlx::query_as::<_, (uuid::Uuid,)>("SELECT id FROM runs WHERE parent_workflow_id = $1")
            .bind(parent)
            .fetch_optional(&stack.db.pool)
            .await
            .ok()
            .flatten()
            .map(|(id,)| id)
    })
    .await
}

/// Waits until the run's assistant message is streaming.
async fn wait_streaming(stack: &Stack, run: uuid::Uuid) {
    poll_until("the child to stream", TIMEOUT, || async {
        sqlx::query_as::<_, (String,)>(
            "SELECT m.status FROM runs r JOIN messages m ON m.id = r.assistant_message_id
              WHERE r.id = $1",
        )
        .bind(run)
        .fetch_optional(&stack.db.pool)
        .await
        .ok()
        .flatten()
        .filter(|(status,)| status == "streaming")
    })
    .await;
}

/// A run's status as stored.
async fn status(stack: &Stack, run: uuid::Uuid) -> Option<String> {
    run_row(&stack.db.pool, run).await.map(|r| r.status)
}

fn text_of(frames: &[Frame], workflow: &str) -> String {
    frames
        .iter()
        .map(Frame::json)
        .filter(|e| e["type"] == "text_delta" && e["workflow_id"] == workflow)
        .filter_map(|e| e["data"]["delta"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_child_run_streams_nested_in_the_parent_s_stream_which_ends_at_the_parent_s_done() {
    let fake = FakeLlm::start(lead_and_researcher(6, Duration::from_millis(50))).await;
    let stack = Stack::start().await;
    let (lead, _worker) = lead(&stack, &fake).await;

    // Agent tools name an agent of the tenant, checked when the agent is saved.
    let admin = token_with("root", "acme", true, 3600, JWT_SECRET);
    let other_admin = token_with("root", "globex", true, 3600, JWT_SECRET);
    let (_, theirs) = stack
        .post(
            &other_admin,
            "/v1/agents",
            &json!({"name": "theirs", "model": "m"}),
        )
        .await;
    for missing in [
        uuid::Uuid::new_v4().to_string(),
        theirs["id"].as_str().expect("id").to_owned(),
    ] {
        let (status, error) = stack
            .post(
                &admin,
                "/v1/agents",
                &json!({"name": "bad", "model": "m",
                "tools": [{"type": "agent", "name": "sub", "agent_id": missing}]}),
            )
            .await;
        assert_eq!(status, reqwest::StatusCode::UNPROCESSABLE_ENTITY, "{error}");
        assert_eq!(error["error"]["code"], "invalid_agent", "{error}");
        assert_eq!(
            error["error"]["errors"][0]["field"], "tools[0].agent_id",
            "{error}"
        );
    }

    let accepted = ask(&stack, &lead).await;
    let alice = token("alice", "acme");
    let response = stack.stream(&alice, &accepted["thread_id"], None).await;
    let frames = SseReader::new(response).collect(TIMEOUT).await;
    let parent = accepted["workflow_id"].as_str().expect("id");
    let child = child_of(&stack, &accepted).await.to_string();

    // One stream: the parent's start, its tool call, the child's whole message at depth 1,
    // the tool's result, the parent's answer and its `done` last.
    let last = frames.last().map(Frame::json).unwrap_or_default();
    assert_eq!(
        (last["type"].as_str(), last["workflow_id"].as_str()),
        (Some("done"), Some(parent)),
        "{frames:?}"
    );
    let nested: Vec<Value> = frames
        .iter()
        .map(Frame::json)
        .filter(|e| e["workflow_id"] == child)
        .collect();
    assert!(nested.iter().all(|e| e["depth"] == 1), "{nested:?}");
    let kinds: Vec<&str> = nested.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"message_start"));
    assert_eq!(kinds.last(), Some(&"done"));
    assert_eq!(text_of(&frames, &child), RESEARCH_ANSWER);
    assert_eq!(
        text_of(&frames, parent),
        format!("The researcher says: {RESEARCH_ANSWER}")
    );

    // A client that lost the connection in the middle of the child's text resumes there and
    // still follows through the child's `done` to the parent's.
    let middle = frames
        .iter()
        .find(|f| f.event == "text_delta" && f.json()["workflow_id"] == child)
        .and_then(|f| f.id.clone())
        .expect("a child delta");
    let response = stack
        .stream(&alice, &accepted["thread_id"], Some(&middle))
        .await;
    let rest = SseReader::new(response).collect(TIMEOUT).await;
    let position = frames
        .iter()
        .position(|f| f.id.as_deref() == Some(&middle))
        .expect("cursor");
    assert_eq!(
        rest.iter().map(|f| f.id.clone()).collect::<Vec<_>>(),
        frames[position + 1..]
            .iter()
            .map(|f| f.id.clone())
            .collect::<Vec<_>>(),
        "the resumed stream is exactly what followed the cursor"
    );

    // The child is a run of its own, visible to the owner, tied to the call that started it.
    let (status, run) = stack
        .get_with(&alice, &format!("/v1/workflows/{child}"))
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{run}");
    assert_eq!(
        (
            run["status"].as_str(),
            run["parent_workflow_id"].as_str(),
            run["parent_tool_call_id"].as_str(),
            run["depth"].as_i64()
        ),
        (Some("completed"), Some(parent), Some("call_r"), Some(1))
    );
    let (status, _) = stack
        .get_with(
            &token("mallory", "globex"),
            &format!("/v1/workflows/{child}"),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND);
    let (_, timeline) = stack
        .get_with(&alice, &format!("/v1/workflows/{parent}/steps"))
        .await;
    let call = &timeline["steps"][0]["tool_calls"][0];
    assert_eq!(
        (
            call["name"].as_str(),
            call["state"].as_str(),
            call["workflow_id"].as_str()
        ),
        (Some("research"), Some("done"), Some(child.as_str())),
        "{timeline}"
    );
    assert_eq!(call["result"], RESEARCH_ANSWER);
    let (_, run) = stack
        .get_with(&alice, &format!("/v1/workflows/{parent}"))
        .await;
    assert_eq!(
        (run["status"].as_str(), run["depth"].as_i64()),
        (Some("completed"), Some(0))
    );
    assert!(run["parent_workflow_id"].is_null());

    // The thread's messages are the user's turn and the lead's answer.
    let thread = accepted["thread_id"].as_str().expect("thread");
    let (_, messages) = stack
        .get_with(&alice, &format!("/v1/threads/{thread}/messages"))
        .await;
    let contents: Vec<&str> = messages["data"]
        .as_array()
        .or_else(|| messages["messages"].as_array())
        .expect("messages")
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(
        contents,
        [
            "Capital of France?",
            &format!("The researcher says: {RESEARCH_ANSWER}")
        ]
    );
}

#[tokio::test]
async fn cancelling_the_parent_cancels_the_child_it_waits_for() {
    let fake = FakeLlm::start(lead_and_researcher(200, Duration::from_millis(100))).await;
    let stack = Stack::start().await;
    let (lead, _worker) = lead(&stack, &fake).await;
    let accepted = ask(&stack, &lead).await;
    let child = child_of(&stack, &accepted).await;
    poll_until("the child's first words", TIMEOUT, || async {
        let stored = stack.stored(&accepted["thread_id"]).await;
        stored
            .iter()
            .any(|(_, e)| e["type"] == "text_delta" && e["workflow_id"] == child.to_string())
            .then_some(())
    })
    .await;
    let parent = workflow_id(&accepted);
    assert_eq!(status(&stack, parent).await.as_deref(), Some("waiting"));
    // A waiting parent is the thread's active run (invariant 2): no second run starts.
    let thread = accepted["thread_id"].as_str().expect("thread");
    let (code, refused) = stack
        .post(
            &token("alice", "acme"),
            &format!("/v1/threads/{thread}/user_message"),
            &json!({"input_text": "and now?"}),
        )
        .await;
    assert_eq!(code, reqwest::StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "thread_busy", "{refused}");

    let (status, body) = stack
        .post(
            &token("alice", "acme"),
            &format!("/v1/workflows/{parent}/cancel"),
            &json!({"reason": "changed my mind"}),
        )
        .await;
    assert!(status.is_success(), "{status} {body}");
    let parent_row = stack.wait_run(&accepted, "cancelled").await;
    let child_row = poll_until("the child to be cancelled", TIMEOUT, || async {
        run_row(&stack.db.pool, child)
            .await
            .filter(|r| r.status == "cancelled")
    })
    .await;
    // The child's worker stopped it; its end re-queued the parent, whose next claim found
    // the cancel request: the parent ended after its child.
    assert_eq!((parent_row.attempt, child_row.attempt), (2, 1));
    let stored = stack.stored(&accepted["thread_id"]).await;
    let dones: Vec<(Value, Value)> = stored
        .iter()
        .filter(|(_, e)| e["type"] == "done")
        .map(|(_, e)| (e["workflow_id"].clone(), e["data"]["status"].clone()))
        .collect();
    assert_eq!(
        dones,
        [
            (json!(child.to_string()), json!("cancelled")),
            (accepted["workflow_id"].clone(), json!("cancelled"))
        ]
    );
    assert_eq!(
        stored.last().map(|(_, e)| e["type"].clone()),
        Some(json!("done"))
    );
    // The child's partial text is kept on its message.
    let (content,): (String,) = sqlx::query_as(
        "SELECT m.content FROM runs r JOIN messages m ON m.id = r.assistant_message_id
          WHERE r.id = $1",
    )
    .bind(child)
    .fetch_one(&stack.db.pool)
    .await
    .expect("the child's message");
    assert!(
        !content.is_empty() && RESEARCH_ANSWER.starts_with(&content),
        "{content:?}"
    );
}

#[tokio::test]
async fn a_crash_of_the_child_s_worker_resumes_the_child_and_the_parent_completes_once() {
    let fake = FakeLlm::start(lead_and_researcher(20, Duration::from_millis(100))).await;
    let stack = Stack::start().await;
    let (lead, mut a) = lead(&stack, &fake).await;
    let accepted = ask(&stack, &lead).await;
    let child = child_of(&stack, &accepted).await;
    wait_streaming(&stack, child).await;
    a.kill9().await;
    let _b = stack
        .worker(&[("SPOOL_LLM_BASE_URL", fake.base_url.as_str())])
        .await;

    let parent = stack.wait_run(&accepted, "completed").await;
    let child_row = run_row(&stack.db.pool, child).await.expect("child");
    assert_eq!(
        (
            child_row.status.as_str(),
            child_row.attempt,
            child_row.reclaims
        ),
        ("completed", 2, 1),
        "the child was reclaimed once"
    );
    assert_eq!(
        (parent.attempt, parent.reclaims),
        (2, 0),
        "the parent was claimed to start and once more to go on: never reclaimed"
    );
    let lead_calls = fake
        .requests()
        .iter()
        .filter(|r| r["messages"][0]["content"] == fake_llm::LEAD_INSTRUCTIONS)
        .count();
    assert_eq!(lead_calls, 2, "the lead's model was called once per step");
    let answers: Vec<(String, String, String)> = stack
        .messages(&accepted)
        .await
        .into_iter()
        .filter(|(role, _, content)| role == "assistant" && content.starts_with("The researcher"))
        .collect();
    assert_eq!(
        answers,
        [(
            "assistant".to_owned(),
            "completed".to_owned(),
            format!("The researcher says: {RESEARCH_ANSWER}")
        )]
    );
    // The child's new attempt said so in the stream, nested.
    let stored = stack.stored(&accepted["thread_id"]).await;
    let restarted: Vec<&Value> = stored
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e["type"] == "attempt_restarted")
        .collect();
    assert_eq!(restarted.len(), 1, "{restarted:?}");
    assert_eq!(restarted[0]["workflow_id"], json!(child.to_string()));
    assert_eq!(restarted[0]["depth"], 1);
}

#[tokio::test]
async fn starting_a_child_and_re_queueing_its_parent_wake_idle_workers() {
    // A worker that polls once a minute: the run can only finish within the test's deadline
    // if the child's start and the parent's return each wake it with a NOTIFY.
    let fake = FakeLlm::start(lead_and_researcher(2, Duration::from_millis(1))).await;
    let stack = Stack::start().await;
    let (lead, _worker) = lead_with(&stack, &fake, &[("SPOOL_POLL_INTERVAL_MS", "60000")]).await;
    let accepted = ask(&stack, &lead).await;
    let run = stack.wait_run(&accepted, "completed").await;
    assert_eq!(run.attempt, 2);
}

#[tokio::test]
async fn a_child_that_needs_an_approval_is_answered_on_its_own_workflow_and_its_parent_goes_on() {
    // The researcher must look the weather up, a call a person approves; the lead answers
    // from what the researcher then says.
    let fake = FakeLlm::start(|request: &Value, _| {
        if request["messages"][0]["content"] == fake_llm::RESEARCHER_INSTRUCTIONS {
            return match tool_results_in(request) {
                0 => fake_llm::tool_calls(&[("call_w", "get_weather", r#"{"city": "Paris"}"#)]),
                _ => fake_llm::text("It is sunny in Paris.", 2),
            };
        }
        fake_llm::lead_and_researcher(|| fake_llm::text("unused", 1))(request, 0)
    })
    .await;
    let (_tools, base) = spool_tests::tools::Tools::start().await;
    let stack = Stack::start().await;
    let _worker = stack
        .worker(&[
            ("SPOOL_LLM_BASE_URL", fake.base_url.as_str()),
            ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.1/32"),
        ])
        .await;
    let mut weather = spool_tests::tools::http_tool("get_weather", format!("{base}/weather"));
    weather["requires_approval"] = json!(true);
    let mut researcher = fake_llm::researcher_spec();
    researcher["tools"] = json!([weather]);
    let researcher = stack.create_agent(&researcher).await;
    let lead = stack.create_agent(&fake_llm::lead_spec(&researcher)).await;
    let accepted = ask(&stack, &lead).await;
    let child = child_of(&stack, &accepted).await;
    poll_until("the child to wait for an approval", TIMEOUT, || async {
        run_row(&stack.db.pool, child)
            .await
            .filter(|r| r.status == "awaiting_approval")
    })
    .await;
    let parent = workflow_id(&accepted);
    assert_eq!(status(&stack, parent).await.as_deref(), Some("waiting"));
    // The thread's stream told the client, nested, which run waits for whom.
    let stored = stack.stored(&accepted["thread_id"]).await;
    let asked = stored
        .iter()
        .map(|(_, e)| e)
        .find(|e| e["type"] == "approval_requested")
        .expect("an approval request");
    assert_eq!(
        (asked["workflow_id"].clone(), asked["depth"].clone()),
        (json!(child.to_string()), json!(1))
    );

    let alice = token("alice", "acme");
    // The parent waits for nobody but its child: it takes no approval itself.
    let (status, _) = stack
        .post(
            &alice,
            &format!("/v1/workflows/{parent}/approvals/call_w"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::CONFLICT);
    let (status, body) = stack
        .post(
            &alice,
            &format!("/v1/workflows/{child}/approvals/call_w"),
            &json!({"approved": true}),
        )
        .await;
    assert!(status.is_success(), "{status} {body}");
    stack.wait_run(&accepted, "completed").await;
    let messages = stack.messages(&accepted).await;
    assert!(
        messages.iter().any(|(role, _, content)| role == "assistant"
            && content == "The researcher says: It is sunny in Paris."),
        "{messages:?}"
    );
}

#[tokio::test]
async fn a_child_s_long_answer_reaches_its_parent_whole() {
    // 60,000 characters: past the 50,000 at which a tool's result is cut.
    let long: String = (0..6_000).map(|i| format!("{:09}|", i)).collect();
    let answer = long.clone();
    let fake = FakeLlm::start(fake_llm::lead_and_researcher(move || {
        fake_llm::text(&answer, 20)
    }))
    .await;
    let stack = Stack::start().await;
    let (lead, _worker) = lead(&stack, &fake).await;
    let accepted = ask(&stack, &lead).await;
    stack.wait_run(&accepted, "completed").await;
    let parent_calls: Vec<Value> = fake
        .requests()
        .into_iter()
        .filter(|r| r["messages"][0]["content"] == fake_llm::LEAD_INSTRUCTIONS)
        .filter(|r| tool_results_in(r) == 1)
        .collect();
    assert_eq!(parent_calls.len(), 1);
    let result = fake_llm::last_tool_result(&parent_calls[0]).unwrap_or_default();
    assert_eq!(result.len(), 60_000);
    assert_eq!(result, long, "the child's answer, whole and unmarked");
}
