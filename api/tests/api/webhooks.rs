//! Webhooks: created by an admin with a URL the network policy permits, written to the outbox
//! with the run's status change, delivered by the workers signed per Standard Webhooks, retried
//! until a 2xx, and listed with every try.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use spool_tests::webhooks::{Receiver, Reply, blackhole};
use spool_tests::{poll_until, token};

use crate::agents::admin;
use crate::common::{TestApp, worker_args_with};

/// Workers that may reach loopback, as `SPOOL_TOOLS_ALLOW_NETWORKS=127.0.0.0/8` allows.
fn loopback_workers() -> spool_worker::WorkerArgs {
    worker_args_with(1, 0, &["--tools-allow-networks", "127.0.0.0/8"])
}

/// The same, with `--webhooks-concurrency` (and more flags).
fn loopback_workers_with(concurrency: usize, extra: &[&str]) -> spool_worker::WorkerArgs {
    let concurrency = concurrency.to_string();
    let flags = [
        &[
            "--tools-allow-networks",
            "127.0.0.0/8",
            "--webhooks-concurrency",
        ][..],
        &[concurrency.as_str()][..],
        extra,
    ]
    .concat();
    worker_args_with(1, 0, &flags)
}

/// Creates `n` endpoints of `tenant` at `url` for `run.completed`.
async fn endpoints(app: &TestApp, tenant: &str, url: &str, n: usize) {
    for _ in 0..n {
        let (status, body) = app
            .post(
                &admin(tenant),
                "/v1/webhooks",
                &json!({"url": url, "events": ["run.completed"]}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
}

/// Runs `n` messages of `user` of `tenant`, each on a thread of its own, to completion.
async fn complete_runs(app: &TestApp, user: &str, tenant: &str, n: usize) {
    let token = token(user, tenant);
    let mut workflows = Vec::new();
    for _ in 0..n {
        let (status, accepted) = app.send_message(&token, uuid::Uuid::new_v4(), "hi").await;
        assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
        workflows.push(accepted["workflow_id"].as_str().expect("id").to_owned());
    }
    for workflow in &workflows {
        app.wait_for_status(&token, workflow, "completed").await;
    }
}

async fn count(app: &TestApp, table: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {table}");
    let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_one(&app.db.pool)
        .await
        .expect("count");
    n
}

#[tokio::test]
async fn creating_a_webhook_checks_its_url_events_and_secret_and_needs_an_admin() {
    let app = TestApp::start(0, loopback_workers()).await;
    let acme = admin("acme");
    let ok = json!({"url": "http://127.0.0.1:9/hook", "events": ["run.completed"]});
    let (status, body) = app.post(&token("alice", "acme"), "/v1/webhooks", &ok).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    assert_eq!(body["error"]["permission"], "webhooks:admin");

    for (request, code) in [
        (
            json!({"url": "ftp://127.0.0.1/hook", "events": ["run.completed"]}),
            "url_refused",
        ),
        // The cloud metadata endpoint and private ranges: refused before any connection.
        (
            json!({"url": "http://169.254.169.254/latest", "events": ["run.completed"]}),
            "url_refused",
        ),
        (
            json!({"url": "http://10.1.2.3/hook", "events": ["run.completed"]}),
            "url_refused",
        ),
        (
            json!({"url": "http://[::1]:9/hook", "events": ["run.completed"]}),
            "url_refused",
        ),
        (
            json!({"url": "not a url", "events": ["run.completed"]}),
            "invalid_url",
        ),
        (
            json!({"url": format!("http://127.0.0.1/{}", "a".repeat(2048)), "events": ["run.completed"]}),
            "invalid_url",
        ),
        (
            json!({"url": "http://127.0.0.1:9/hook", "events": []}),
            "invalid_events",
        ),
        (
            json!({"url": "http://127.0.0.1:9/hook", "events": ["run.exploded"]}),
            "invalid_events",
        ),
        (
            json!({"url": "http://127.0.0.1:9/hook", "events": ["run.failed"], "secret": "hunter2"}),
            "invalid_secret",
        ),
        (
            json!({"url": "http://127.0.0.1:9/hook", "events": ["run.failed"], "secret": "whsec_c2hvcnQ="}),
            "invalid_secret",
        ),
        (json!({"url": 7, "events": ["run.failed"]}), "invalid_body"),
        (
            json!({"url": "http://127.0.0.1:9/hook", "events": ["run.failed"], "colour": 1}),
            "invalid_body",
        ),
    ] {
        let (status, body) = app.post(&acme, "/v1/webhooks", &request).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{request}: {body}"
        );
        assert_eq!(body["error"]["code"], code, "{request}");
    }
    assert_eq!(
        count(&app, "webhooks").await,
        0,
        "nothing stored for a refused request"
    );

    let (status, created) = app.post(&acme, "/v1/webhooks", &ok).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let secret = created["secret"].as_str().expect("the secret, shown once");
    assert!(
        secret.starts_with("whsec_") && secret.len() > 40,
        "{secret}"
    );
    let id = created["id"].as_str().expect("id");
    let (status, listed) = app.get(&acme, "/v1/webhooks").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["data"][0]["id"], id);
    assert!(
        listed["data"][0].get("secret").is_none(),
        "never shown again"
    );
    let (_, other) = app.get(&admin("other"), "/v1/webhooks").await;
    assert_eq!(other["data"], json!([]), "another tenant's admin sees none");
    let deliveries = format!("/v1/webhooks/{id}/deliveries");
    let (status, _) = app.get(&admin("other"), &deliveries).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let path = format!("/v1/webhooks/{id}");
    let (status, _) = app
        .send(reqwest::Method::DELETE, &admin("other"), &path, None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "not theirs to delete");
    let (status, _) = app.send(reqwest::Method::DELETE, &acme, &path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = app.send(reqwest::Method::DELETE, &acme, &path, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = app.get(&acme, "/v1/webhooks?limit=0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "invalid_limit");
    app.stop().await;
}

#[tokio::test]
async fn a_run_end_is_delivered_signed_and_retried_until_the_receiver_accepts_it() {
    let (receiver, url) = Receiver::start(&[Reply::Status(500), Reply::Status(200)]).await;
    let app = TestApp::start(1, loopback_workers()).await;
    let acme = admin("acme");
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (status, hook) = app
        .post(
            &acme,
            "/v1/webhooks",
            &json!({"url": url, "events": ["run.completed", "run.failed"], "secret": secret}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{hook}");
    let (_, other) = app
        .post(
            &admin("other"),
            "/v1/webhooks",
            &json!({"url": url, "events": ["run.completed"]}),
        )
        .await;
    assert!(other["id"].is_string(), "{other}");

    let alice = token("alice", "acme");
    let (_, accepted) = app
        .send_message(&alice, uuid::Uuid::new_v4(), "notify me")
        .await;
    let workflow = accepted["workflow_id"].as_str().expect("id");
    let run = app.wait_for_status(&alice, workflow, "completed").await;

    // A 500, then (after the first backoff, 5 s) the same delivery again, accepted.
    let received = poll_until("two tries", Duration::from_secs(30), || async {
        let received = receiver.received();
        (received.len() >= 2).then_some(received)
    })
    .await;
    assert_eq!(
        received.len(),
        2,
        "one event, two tries, nothing for the other tenant"
    );
    assert_eq!(
        received[0].id, received[1].id,
        "receivers de-duplicate on webhook-id"
    );
    for delivery in &received {
        assert!(delivery.verify(secret), "{delivery:?}");
        assert!(!delivery.verify("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"));
        let age = chrono::Utc::now().timestamp() - delivery.timestamp.parse::<i64>().expect("secs");
        assert!((0..60).contains(&age), "{age}");
        let body = delivery.json();
        assert_eq!(body["type"], "run.completed");
        assert_eq!(body["data"]["workflow_id"], workflow);
        assert_eq!(body["data"]["thread_id"], run["thread_id"]);
        assert_eq!(body["data"]["status"], "completed");
        assert_eq!(body["data"]["user_id"], "alice");
        assert!(body["timestamp"].is_string());
    }

    let id = hook["id"].as_str().expect("id");
    // The outcome is recorded after the receiver answered: wait for it.
    let page = poll_until("the 2xx recorded", Duration::from_secs(20), || async {
        let (status, page) = app
            .get(&acme, &format!("/v1/webhooks/{id}/deliveries"))
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        (page["data"][0]["status"] == "delivered").then_some(page)
    })
    .await;
    let delivery = &page["data"][0];
    assert_eq!(page["data"].as_array().map(Vec::len), Some(1), "{page}");
    assert_eq!(delivery["id"], received[0].id.as_str());
    assert_eq!(delivery["event"], "run.completed");
    assert_eq!(delivery["status"], "delivered");
    let tries = delivery["attempts"].as_array().expect("attempts");
    assert_eq!(tries.len(), 2, "{delivery}");
    assert_eq!(
        (tries[0]["attempt"].clone(), tries[0]["status_code"].clone()),
        (json!(1), json!(500))
    );
    assert!(tries[0]["error"].is_string());
    assert_eq!(
        (tries[1]["attempt"].clone(), tries[1]["status_code"].clone()),
        (json!(2), json!(200))
    );
    assert_eq!(tries[1]["error"], Value::Null);
    app.stop().await;
}

#[tokio::test]
async fn a_worker_whose_network_policy_refuses_the_url_never_connects_and_records_why() {
    let (receiver, url) = Receiver::start(&[]).await;
    // The API allows loopback (so the webhook is created); the worker does not.
    let app = TestApp::start(1, worker_args_with(1, 0, &[])).await;
    let acme = admin("acme");
    let (_, hook) = app
        .post(
            &acme,
            "/v1/webhooks",
            &json!({"url": url, "events": ["run.completed"]}),
        )
        .await;
    let id = hook["id"].as_str().expect("id").to_owned();
    let alice = token("alice", "acme");
    let (_, accepted) = app.send_message(&alice, uuid::Uuid::new_v4(), "hi").await;
    let workflow = accepted["workflow_id"].as_str().expect("id");
    app.wait_for_status(&alice, workflow, "completed").await;
    let tries = poll_until("a refused try", Duration::from_secs(20), || async {
        let (_, page) = app
            .get(&acme, &format!("/v1/webhooks/{id}/deliveries"))
            .await;
        let tries = page["data"][0]["attempts"].as_array()?.clone();
        (!tries.is_empty()).then_some(tries)
    })
    .await;
    let error = tries[0]["error"].as_str().expect("an error");
    assert!(error.contains("refused by the network policy"), "{error}");
    assert_eq!(tries[0]["status_code"], Value::Null);
    assert!(
        receiver.received().is_empty(),
        "no connection reached the receiver"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_redirect_is_a_failed_try_never_followed_into_a_delivery() {
    // A 303 followed would turn the signed POST into a GET whose 200 would count as delivered.
    let (receiver, url) = Receiver::start(&[Reply::SeeOther]).await;
    let app = TestApp::start(1, loopback_workers()).await;
    let acme = admin("acme");
    let (_, hook) = app
        .post(
            &acme,
            "/v1/webhooks",
            &json!({"url": url, "events": ["run.completed"]}),
        )
        .await;
    let id = hook["id"].as_str().expect("id").to_owned();
    let alice = token("alice", "acme");
    let (_, accepted) = app.send_message(&alice, uuid::Uuid::new_v4(), "hi").await;
    let workflow = accepted["workflow_id"].as_str().expect("id");
    app.wait_for_status(&alice, workflow, "completed").await;
    let delivery = poll_until("a try", Duration::from_secs(20), || async {
        let (_, page) = app
            .get(&acme, &format!("/v1/webhooks/{id}/deliveries"))
            .await;
        let delivery = page["data"][0].clone();
        (delivery["attempts"]
            .as_array()
            .is_some_and(|a| !a.is_empty()))
        .then_some(delivery)
    })
    .await;
    assert_eq!(delivery["status"], "pending", "{delivery}");
    assert_eq!(delivery["attempts"][0]["status_code"], 303);
    assert_eq!(receiver.landed(), 0, "the redirect was not followed");
    app.stop().await;
}

#[tokio::test]
async fn deliveries_go_at_the_pace_the_receiver_answers_with_a_bounded_number_in_flight() {
    // 100 ms per answer and 8 tries in flight (the one tenant may hold all 8): 120 deliveries
    // take about 1.5 s. A fixed pace (16 claimed a second) takes 7.5 s, with 16 in flight.
    let (receiver, url) = Receiver::slow(Duration::from_millis(100)).await;
    let app = TestApp::start(
        1,
        loopback_workers_with(8, &["--webhooks-max-in-flight-per-tenant", "8"]),
    )
    .await;
    endpoints(&app, "acme", &url, 20).await;
    complete_runs(&app, "alice", "acme", 6).await;
    let ended = Instant::now();
    poll_until("120 deliveries", Duration::from_secs(30), || async {
        (receiver.count() >= 120).then_some(())
    })
    .await;
    let took = ended.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the last deliveries took {took:?} after the runs ended"
    );
    let most = receiver.most_in_flight();
    assert!(
        (2..=8).contains(&most),
        "{most} tries in flight at once; the worker allows 8"
    );
    assert_eq!(receiver.count(), 120, "each once");
    app.stop().await;
}

#[tokio::test]
async fn a_tenant_whose_endpoints_never_answer_delays_another_tenants_delivery_by_one_timeout() {
    // A 5 s lease: a try times out after 2.5 s. Four slots, all taken by "dark" (its cap is
    // raised to all four), whose ten endpoints accept connections and never answer, with 40
    // deliveries due. In one FIFO, acme's delivery would wait for ten rounds of timeouts
    // (25 s); taking turns, for the next slot.
    const TIMEOUT: Duration = Duration::from_millis(2500);
    let hole = blackhole().await;
    let (receiver, url) = Receiver::start(&[]).await;
    let app = TestApp::start(
        1,
        loopback_workers_with(4, &["--webhooks-max-in-flight-per-tenant", "4"]),
    )
    .await;
    endpoints(&app, "dark", &hole, 10).await;
    endpoints(&app, "acme", &url, 1).await;
    complete_runs(&app, "eve", "dark", 4).await;
    poll_until(
        "every slot held by the blackhole",
        Duration::from_secs(10),
        || async {
            let (held,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM webhook_deliveries WHERE lease_expires_at > now()",
            )
            .fetch_one(&app.db.pool)
            .await
            .ok()?;
            (held >= 4).then_some(())
        },
    )
    .await;
    complete_runs(&app, "alice", "acme", 1).await;
    let ended = Instant::now();
    poll_until("acme's delivery", Duration::from_secs(20), || async {
        (receiver.count() >= 1).then_some(())
    })
    .await;
    let waited = ended.elapsed();
    assert!(
        waited < TIMEOUT + Duration::from_millis(1500),
        "acme's delivery waited {waited:?} behind dark's endpoints (one try times out in {TIMEOUT:?})"
    );
    app.stop().await;
}

/// How many of `tenant`'s deliveries are in flight (leased).
async fn in_flight(app: &TestApp, tenant: &str) -> i64 {
    let (held,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM webhook_deliveries WHERE tenant_id = $1 AND lease_expires_at > now()",
    )
    .bind(tenant)
    .fetch_one(&app.db.pool)
    .await
    .expect("count");
    held
}

#[tokio::test]
async fn a_tenant_whose_endpoints_never_answer_holds_only_its_cap_and_another_tenants_delivery_goes_at_once()
 {
    // As above, but with the default cap: half the four slots. "dark" holds two tries that
    // will time out after 2.5 s, with 38 more due; acme's delivery takes a free slot at the
    // next claim (100 ms polls), not the one that frees when a try times out.
    const TIMEOUT: Duration = Duration::from_millis(2500);
    let hole = blackhole().await;
    let (receiver, url) = Receiver::start(&[]).await;
    let app = TestApp::start(1, loopback_workers_with(4, &[])).await;
    endpoints(&app, "dark", &hole, 10).await;
    endpoints(&app, "acme", &url, 1).await;
    complete_runs(&app, "eve", "dark", 4).await;
    poll_until("dark's cap held", Duration::from_secs(10), || async {
        (in_flight(&app, "dark").await >= 2).then_some(())
    })
    .await;
    complete_runs(&app, "alice", "acme", 1).await;
    let ended = Instant::now();
    poll_until("acme's delivery", Duration::from_secs(20), || async {
        (receiver.count() >= 1).then_some(())
    })
    .await;
    let waited = ended.elapsed();
    assert!(
        waited < TIMEOUT / 2,
        "acme's delivery waited {waited:?} behind dark's endpoints (a try times out in {TIMEOUT:?})"
    );
    let held = in_flight(&app, "dark").await;
    assert!(held <= 2, "dark holds {held} tries; its cap is 2");
    app.stop().await;
}

#[tokio::test]
async fn one_endpoint_past_the_tenant_cap_is_429_too_many_webhooks_and_nothing_is_created() {
    let app = TestApp::start(
        0,
        loopback_workers_with(4, &["--webhooks-max-per-tenant", "3"]),
    )
    .await;
    let body = json!({"url": "http://127.0.0.1:9/hook", "events": ["run.completed"]});
    // Ten at once: the cap holds under concurrency (the count and the insert are serialized
    // per tenant).
    let acme = admin("acme");
    let answers =
        futures::future::join_all((0..10).map(|_| app.post(&acme, "/v1/webhooks", &body))).await;
    let created = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count();
    assert_eq!(created, 3, "{answers:?}");
    for (status, body) in answers.iter().filter(|(s, _)| *s != StatusCode::CREATED) {
        assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert_eq!(body["error"]["code"], "too_many_webhooks", "{body}");
        assert_eq!(body["error"]["limit"], 3, "{body}");
    }
    assert_eq!(
        count(&app, "webhooks").await,
        3,
        "nothing created past the cap"
    );
    let (status, _) = app.post(&admin("other"), "/v1/webhooks", &body).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "another tenant has its own cap"
    );
    app.stop().await;
}

#[tokio::test]
async fn http_urls_are_refused_outside_the_networks_the_operator_allowed() {
    // The API's policy allows 127.0.0.0/8 (as SPOOL_TOOLS_ALLOW_NETWORKS would).
    let app = TestApp::start(0, loopback_workers()).await;
    let acme = admin("acme");
    let public = json!({"url": "http://93.184.216.34/hook", "events": ["run.completed"]});
    let (status, body) = app.post(&acme, "/v1/webhooks", &public).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "insecure_url", "{body}");
    assert_eq!(count(&app, "webhooks").await, 0, "nothing stored");
    for url in ["https://93.184.216.34/hook", "http://127.0.0.1:9/hook"] {
        let (status, body) = app
            .post(
                &acme,
                "/v1/webhooks",
                &json!({"url": url, "events": ["run.completed"]}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{url}: {body}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_rotated_secret_is_shown_once_and_both_secrets_sign_deliveries_during_the_grace() {
    let (receiver, url) = Receiver::start(&[]).await;
    let app = TestApp::start(1, loopback_workers()).await;
    let acme = admin("acme");
    let old = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (_, hook) = app
        .post(
            &acme,
            "/v1/webhooks",
            &json!({"url": url, "events": ["run.completed"], "secret": old}),
        )
        .await;
    let id = hook["id"].as_str().expect("id").to_owned();
    let rotate = format!("/v1/webhooks/{id}/rotate-secret");
    let (status, _) = app.post(&admin("other"), &rotate, &json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "not theirs");
    let (status, rotated) = app.post(&acme, &rotate, &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    let new = rotated["secret"]
        .as_str()
        .expect("the new secret, shown once");
    assert_ne!(new, old);
    assert!(
        rotated["previous_secret_expires_at"].is_string(),
        "{rotated}"
    );
    let (status, shown) = app.get(&acme, &format!("/v1/webhooks/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert!(shown.get("secret").is_none(), "never shown again: {shown}");
    assert_eq!(shown["circuit"]["state"], "closed", "{shown}");

    complete_runs(&app, "alice", "acme", 1).await;
    let received = poll_until("a delivery", Duration::from_secs(20), || async {
        receiver.received().pop()
    })
    .await;
    assert_eq!(received.signature.split(' ').count(), 2, "{received:?}");
    assert!(received.verify(new), "the new secret signs");
    assert!(received.verify(old), "the old one too, during the grace");
    app.stop().await;
}

#[tokio::test]
async fn an_endpoint_shows_its_failures_and_deleting_it_says_how_many_pending_deliveries_went() {
    // Nothing listens on port 9: every try fails, and the delivery stays pending.
    let app = TestApp::start(1, loopback_workers()).await;
    let acme = admin("acme");
    let (_, hook) = app
        .post(
            &acme,
            "/v1/webhooks",
            &json!({"url": "http://127.0.0.1:9/hook", "events": ["run.completed"]}),
        )
        .await;
    let id = hook["id"].as_str().expect("id").to_owned();
    complete_runs(&app, "alice", "acme", 1).await;
    let shown = poll_until("a failed try", Duration::from_secs(20), || async {
        let (_, shown) = app.get(&acme, &format!("/v1/webhooks/{id}")).await;
        (shown["circuit"]["consecutive_failures"] == 1).then_some(shown)
    })
    .await;
    assert_eq!(shown["circuit"]["state"], "closed", "{shown}");
    let response = app
        .http
        .delete(format!("{}/v1/webhooks/{id}", app.base))
        .bearer_auth(&acme)
        .send()
        .await
        .expect("delete");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        response
            .headers()
            .get("x-discarded-deliveries")
            .and_then(|v| v.to_str().ok()),
        Some("1"),
        "the pending delivery is discarded, and the answer says so"
    );
    assert_eq!(count(&app, "webhook_deliveries").await, 0);
    app.stop().await;
}

#[tokio::test]
async fn workers_export_the_oldest_due_deliverys_age_as_a_gauge() {
    let app = TestApp::start(1, loopback_workers()).await;
    let line = poll_until("the gauge in /metrics", Duration::from_secs(15), || async {
        let text = app
            .http
            .get(app.url("/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find(|l| l.starts_with("spool_webhook_oldest_due_seconds"))
            .map(str::to_owned)
    })
    .await;
    let value: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a number");
    assert!(value >= 0.0, "{line}");
    app.stop().await;
}
