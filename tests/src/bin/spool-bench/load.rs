//! Closed-loop HTTP load: `concurrency` clients each posting a message to a new thread, then
//! the next, until a deadline or a total count.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use hdrhistogram::Histogram;
use serde_json::json;
use tokio::task::JoinSet;

use crate::report::histogram;
use crate::stack::Stack;

pub(crate) struct Load {
    /// Accepted requests.
    pub(crate) count: u64,
    /// Accepted requests per second.
    pub(crate) rate: f64,
    /// Latency of each, µs.
    pub(crate) latency: Histogram<u64>,
}

/// When to stop.
#[derive(Clone, Copy)]
pub(crate) enum Until {
    Elapsed(Duration),
    Posted(u64),
}

/// Posts `input_text: "hello"` to new threads with `concurrency` clients until `until`.
pub(crate) async fn enqueue(
    stack: &Stack,
    concurrency: usize,
    until: Until,
) -> anyhow::Result<Load> {
    let started = Instant::now();
    let claimed = Arc::new(AtomicU64::new(0));
    let mut clients = JoinSet::new();
    for _ in 0..concurrency {
        let http = stack.http.clone();
        let base = stack.base.clone();
        let token = stack.token.clone();
        let claimed = claimed.clone();
        clients.spawn(async move {
            let mut latency = histogram();
            let body = json!({"input_text": "hello"});
            loop {
                let more = match until {
                    Until::Elapsed(d) => started.elapsed() < d,
                    Until::Posted(n) => claimed.fetch_add(1, Ordering::Relaxed) < n,
                };
                if !more {
                    return anyhow::Ok(latency);
                }
                let thread = uuid::Uuid::new_v4();
                let sent = Instant::now();
                let response = http
                    .post(format!("{base}/v1/threads/{thread}/user_message"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await?;
                let status = response.status();
                let _ = response.bytes().await?;
                if status != reqwest::StatusCode::ACCEPTED {
                    bail!("POST user_message answered {status}");
                }
                latency.saturating_record(sent.elapsed().as_micros().max(1) as u64);
            }
        });
    }
    let mut latency = histogram();
    while let Some(client) = clients.join_next().await {
        latency.add(client??)?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let count = latency.len();
    Ok(Load {
        count,
        rate: count as f64 / elapsed,
        latency,
    })
}
