//! A Redis Cluster master killed under load: three masters with a replica each, on loopback;
//! clients post messages and follow their streams throughout, two workers run them, and one
//! master is killed (SIGKILL) so that its replica takes over. Replication is asynchronous, so
//! the old master may have acknowledged stream entries its replica never got.
//!
//! What must hold: every message that got a 202 is in Postgres and its run ends (completed,
//! with the demo model's exact reply); every client that followed a stream either got the
//! whole reply exactly (resuming with `Last-Event-ID` as often as it had to) or was told with
//! `stream_reset` (or `message_not_streaming`) that it must reload the message over REST:
//! never a reply with a silent hole in it.

use std::time::{Duration, Instant};

use serde_json::Value;

use spool_tests::servers::OwnRedisCluster;
use spool_tests::sse::{Frame, SseReader};
use spool_tests::token;

use crate::SERIAL;
use crate::restarts::{Load, TOKENS, WORKER, drive, settled};
use crate::stack::{Stack, TIMEOUT, demo_reply, shown_text};

/// Clients that post a message and follow its stream to the end, again and again.
const FOLLOWERS: usize = 4;
/// When the master is killed, and when the clients stop, from the start.
const KILL_AT: Duration = Duration::from_secs(3);
const LOAD_FOR: Duration = Duration::from_secs(10);
/// How long the replica may take to be promoted: a few seconds when the machine is idle, more
/// while the other fault tests load both cores beside this one (a deadline, not a wait).
const FAILOVER_WITHIN: Duration = Duration::from_secs(90);
/// How long a follower waits for the next event before it takes the connection as dead.
const READ: Duration = Duration::from_secs(15);

/// How a followed stream ended.
#[derive(Debug, PartialEq)]
enum Followed {
    /// The reply, whole and exact, up to its `done`.
    Exact,
    /// The gateway said what followed may be lost (`stream_reset` / `message_not_streaming`).
    Reset,
}

/// Follows `thread`'s stream as a client would, resuming after every dropped connection or
/// 503 with its last event id, until the reply's `done` or the gateway's own end; an error
/// names a reply that ended with a hole in it.
async fn follow(
    stack: &Stack,
    user: &str,
    thread: &Value,
    input: &str,
) -> Result<Followed, String> {
    let mut frames: Vec<Frame> = Vec::new();
    for _ in 0..100 {
        let cursor = frames.iter().rev().find_map(|f| f.id.clone());
        let response = stack.stream(user, thread, cursor.as_deref()).await;
        if response.status() != reqwest::StatusCode::OK {
            // 503 stream_unavailable while the cluster fails over: retry shortly (pacing).
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let mut reader = SseReader::new(response);
        while let Some(frame) = reader.next(READ).await {
            match frame.event.as_str() {
                "stream_reset" | "message_not_streaming" => return Ok(Followed::Reset),
                "done" => {
                    frames.push(frame);
                    let shown = shown_text(&frames);
                    let expected = demo_reply(input, TOKENS);
                    return if shown == expected {
                        Ok(Followed::Exact)
                    } else {
                        Err(format!(
                            "{thread}: shown {shown:?}, the reply is {expected:?}"
                        ))
                    };
                }
                _ => frames.push(frame),
            }
        }
    }
    Err(format!("{thread}: never reached its end"))
}

/// One follower: posts to a new thread and follows the reply, until `until`.
async fn follower(
    stack: &Stack,
    n: usize,
    until: Instant,
) -> (Load, Vec<Result<Followed, String>>) {
    let user = token(&format!("follower{n}"), "acme");
    let mut load = Load::default();
    let mut outcomes = Vec::new();
    let mut i = 0;
    while Instant::now() < until {
        i += 1;
        let input = format!("follow {n}-{i}");
        let thread = uuid::Uuid::new_v4();
        let sent = stack
            .http
            .post(format!("{}/v1/threads/{thread}/user_message", stack.base))
            .bearer_auth(&user)
            .json(&serde_json::json!({"input_text": input}))
            .send()
            .await;
        let Ok(response) = sent else {
            load.refused += 1;
            continue;
        };
        if response.status() != reqwest::StatusCode::ACCEPTED {
            load.refused += 1;
            continue;
        }
        let body: Value = response.json().await.expect("202 body");
        outcomes.push(follow(stack, &user, &body["thread_id"], &input).await);
        load.acknowledged.push((body, input));
    }
    (load, outcomes)
}

#[tokio::test]
async fn a_cluster_master_killed_under_load_loses_no_acknowledged_run_and_no_stream_is_silently_cut()
 {
    let _turn = SERIAL.lock().await;
    let mut cluster = OwnRedisCluster::start(TIMEOUT)
        .await
        .expect("a Redis Cluster");
    let stack = Stack::start_with_redis(&cluster.url()).await;
    let _workers = (stack.worker(&WORKER).await, stack.worker(&WORKER).await);

    let start = Instant::now();
    let until = start + LOAD_FOR;
    let posters = tokio::spawn(drive(stack.base.clone(), until));
    let followers = futures::future::join_all((0..FOLLOWERS).map(|n| follower(&stack, n, until)));
    let kill = async {
        tokio::time::sleep_until((start + KILL_AT).into()).await;
        cluster.fail_over(FAILOVER_WITHIN).await
    };
    let (followed, failover) = tokio::join!(followers, kill);
    let mut load = posters.await.expect("load");

    let mut exact = 0;
    let mut reset = 0;
    let mut cut = Vec::new();
    for (followed_load, outcomes) in followed {
        load.acknowledged.extend(followed_load.acknowledged);
        load.refused += followed_load.refused;
        for outcome in outcomes {
            match outcome {
                Ok(Followed::Exact) => exact += 1,
                Ok(Followed::Reset) => reset += 1,
                Err(hole) => cut.push(hole),
            }
        }
    }
    assert!(
        cut.is_empty(),
        "streams cut without a stream_reset: {cut:#?}"
    );
    assert!(exact > 0, "some followed replies were whole");

    let (runs, reclaims, attempts, settle) = settled(&stack.db.pool, &load).await;
    assert!(runs > 100, "the load was real: {runs} runs");
    println!(
        "redis cluster failover: {runs} acknowledged runs ({} refused), all completed once; \
         the replica took over {:.1} s after the master was killed at {KILL_AT:?}; followed \
         streams: {exact} exact, {reset} told to reload (stream_reset), 0 cut; {reclaims} \
         reclaims, at most {attempts} attempts; settled {settle:.1} s after the load",
        load.refused,
        failover.as_secs_f64(),
    );
}
