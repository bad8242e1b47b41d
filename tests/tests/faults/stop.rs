//! A worker stopped (SIGSTOP) past its lease on a resumed run, then continued: the run was
//! paused for a client tool, answered, and resumed by worker A, which is frozen mid-answer.
//! Worker B takes the run over. When A wakes, whatever it had queued must not reach the
//! stream: no event of A's attempt after the first event of B's, and the answer is written
//! once.

use std::time::Duration;

use spool_tests::sse::SseReader;
use spool_tests::{poll_until, token};

use crate::SERIAL;
use crate::stack::{Stack, TIMEOUT, read_deltas, slow_reader};

#[tokio::test]
async fn a_worker_stopped_past_its_lease_on_a_resumed_run_publishes_nothing_after_the_takeover() {
    let _turn = SERIAL.lock().await;
    let fake = slow_reader().await;
    let stack = Stack::start().await;
    let llm = [("SPOOL_LLM_BASE_URL", fake.base_url.as_str())];
    let a = stack.worker(&llm).await;
    let accepted = stack.answered_client_tool().await;
    let alice = token("alice", "acme");

    // A resumes the run (attempt 2) and is frozen mid-answer.
    let mut reader = SseReader::new(stack.stream(&alice, &accepted["thread_id"], None).await);
    let mut frames = read_deltas(&mut reader, 5).await;
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
