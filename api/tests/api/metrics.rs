//! `GET /metrics`: requests by route and status, runs, claims, queue, events, streams.

use std::time::Duration;

use reqwest::StatusCode;
use uuid::Uuid;

use spool_tests::token;

use crate::common::{TestApp, worker_args};

/// The value of the first sample whose line starts with `prefix` (name and labels).
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

#[tokio::test]
async fn metrics_count_requests_runs_claims_events_and_streams() {
    let app = TestApp::start(0, worker_args(3, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (status, accepted) = app.send_message(&alice, thread, "count me").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let metrics = app
        .http
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status(), StatusCode::OK);
    assert!(
        metrics.headers()["content-type"]
            .to_str()
            .unwrap_or("")
            .starts_with("text/plain")
    );
    let text = metrics.text().await.expect("text");
    assert!(
        sample(&text, "spool_queue_depth").is_some_and(|d| d >= 1.0),
        "the queued run is counted"
    );
    let mut reader = app.stream(&alice, thread, "", None).await;
    let app = app.with_worker(worker_args(3, 0)).await;
    app.wait_for_status(
        &alice,
        accepted["workflow_id"].as_str().expect("id"),
        "completed",
    )
    .await;
    let frames = reader.collect(Duration::from_secs(10)).await;
    assert!(!frames.is_empty());

    let text = app
        .http
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let posted = r#"spool_http_requests_total{method="POST",route="/v1/threads/{thread_id}/user_message",status="202"}"#;
    assert!(sample(&text, posted).is_some_and(|n| n >= 1.0), "{text}");
    for metric in [
        r#"spool_runs_finished_total{status="completed"}"#,
        r#"spool_claims_total{kind="new"}"#,
        "spool_events_published_total",
        r#"spool_attempts_total{outcome="finished"}"#,
    ] {
        assert!(
            sample(&text, metric).is_some_and(|n| n >= 1.0),
            "{metric} missing in\n{text}"
        );
    }
    for family in [
        "spool_claim_latency_seconds",
        "spool_run_duration_seconds",
        "spool_sse_streams_open",
        "spool_http_request_duration_seconds",
        "spool_queue_oldest_age_seconds",
    ] {
        assert!(text.contains(family), "{family} missing");
    }
    // Latencies are histograms with buckets (summaries' quantiles cannot be aggregated across
    // a fleet): every bucket line has an `le`, the last `+Inf`.
    for family in [
        "spool_claim_latency_seconds",
        "spool_run_duration_seconds",
        "spool_http_request_duration_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} histogram")),
            "{family} is not a histogram"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("{family}_bucket")) && l.contains("le=\"+Inf\"")),
            "{family} has no buckets"
        );
    }
    assert!(!text.contains(&thread.to_string()), "no ids in labels");
    app.stop().await;
}
