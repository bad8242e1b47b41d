//! A worker stopped (SIGSTOP) past its lease on a resumed run, then continued: the run was
//! paused for a client tool, answered, and resumed by worker A, which is frozen mid-answer.
//! Worker B takes the run over. When A wakes, whatever it had queued must not reach the
//! stream: no event of A's attempt after the first event of B's, and the answer is written
//! once.

use std::time::Duration;

use serde_json::json;

use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
use spool_tests::sse::{Frame, SseReader};
use spool_tests::{poll_until, token};

use crate::SERIAL;
use crate::stack::{Stack, TIMEOUT, workflow_id};

const READ: Duration = Duration::from_secs(15);

#[tokio::test]
async fn a_worker_stopped_past_its_lease_on_a_resumed_run_publishes_nothing_after_the_takeover() {
    let _turn = SERIAL.lock().await;
    // Step 1 asks the client for a file; step 2 answers slowly (40 deltas, 100 ms apart).
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("c1", "read_file", r#"{"path": "/notes"}"#)]),
        _ => fake_llm::paced_text(&"word ".repeat(40), 40, Duration::from_millis(100)),
    })
    .await;
    let stack = Stack::start().await;
    let llm = [("SPOOL_LLM_BASE_URL", fake.base_url.as_str())];
    let a = stack.worker(&llm).await;
    let agent = stack
        .create_agent(&json!({"name": "reader", "model": "gpt-4o-mini",
            "tools": [{"type": "client", "name": "read_file"}]}))
        .await;
    let alice = token("alice", "acme");
    let thread = uuid::Uuid::new_v4();
    let (_, accepted) = stack
        .post(
            &alice,
            &format!("/v1/threads/{thread}/user_message"),
            &json!({"input_text": "read my notes", "agent_id": agent}),
        )
        .await;
    stack.wait_run(&accepted, "requires_action").await;
    let workflow = workflow_id(&accepted);
    let (status, _) = stack
        .post(
            &alice,
            &format!("/v1/workflows/{workflow}/tool_outputs"),
            &json!({"tool_outputs": [{"tool_call_id": "c1", "output": "the notes"}]}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED);

    // A resumes the run (attempt 2) and is frozen mid-answer.
    let mut reader = SseReader::new(stack.stream(&alice, &accepted["thread_id"], None).await);
    let mut frames: Vec<Frame> = Vec::new();
    while frames.iter().filter(|f| f.event == "text_delta").count() < 5 {
        frames.push(reader.next(READ).await.expect("an event before the stop"));
    }
    a.signal("STOP");
    let _b = stack.worker(&llm).await;
    // B takes over once A's lease has expired (3 s) and announces itself.
    let restarted = poll_until("B's first event", TIMEOUT, || async {
        stack
            .stored(&accepted["thread_id"])
            .await
            .iter()
            .position(|(_, e)| e["attempt"] == 3)
    })
    .await;
    a.signal("CONT");
    frames.extend(reader.collect(Duration::from_secs(30)).await);
    assert_eq!(frames.last().map(|f| f.event.as_str()), Some("done"));

    let stored = stack.stored(&accepted["thread_id"]).await;
    assert_eq!(stored[restarted].1["type"], "attempt_restarted");
    let late: Vec<_> = stored[restarted..]
        .iter()
        .filter(|(_, e)| e["attempt"] != 3)
        .collect();
    assert!(
        late.is_empty(),
        "events of the stopped attempt after the takeover: {late:?}"
    );
    let persisted = stack.messages(&accepted).await;
    assert_eq!(
        persisted[1].2,
        "word ".repeat(40),
        "the answer, written once"
    );
    let (_, a_events) = stored
        .iter()
        .filter(|(_, e)| e["attempt"] == 2)
        .fold((0, 0), |(i, n), _| (i, n + 1));
    println!(
        "sigstop on a resumed run: attempt 2 published {a_events} events before the stop, \
         attempt 3 took over at entry {restarted} of {}; 0 events of attempt 2 after it",
        stored.len()
    );
}
