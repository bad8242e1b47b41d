//! `GET /v1/usage` (admin): tokens and runs by user, agent, provider and model, from Postgres.

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use spool_tests::token;

use crate::agents::admin;
use crate::common::{TestApp, worker_args};

/// (input, output) tokens of a finished run.
fn tokens(run: &Value) -> (i64, i64) {
    (
        run["usage"]["input_tokens"].as_i64().expect("input"),
        run["usage"]["output_tokens"].as_i64().expect("output"),
    )
}

fn row<'a>(page: &'a Value, group: &str) -> &'a Value {
    page["data"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["group"] == group))
        .unwrap_or_else(|| panic!("no row for {group}: {page}"))
}

#[tokio::test]
async fn usage_sums_each_tenants_tokens_and_runs_by_user_agent_and_model() {
    let app = TestApp::start(1, worker_args(4, 0)).await;
    let agent = app
        .create_agent("acme", &json!({"name": "helper", "model": "demo"}))
        .await;
    let (alice, bob) = (token("alice", "acme"), token("bob", "acme"));
    let mut runs = Vec::new();
    for (who, text, agent) in [
        (&alice, "one", None),
        (&alice, "two two", Some(&agent)),
        (&bob, "three", None),
    ] {
        let mut body = json!({"input_text": text});
        if let Some(agent) = agent {
            body["agent_id"] = json!(agent);
        }
        let (status, accepted) = app
            .post(
                who,
                &format!("/v1/threads/{}/user_message", Uuid::new_v4()),
                &body,
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
        let run = app
            .wait_for_status(
                who,
                accepted["workflow_id"].as_str().expect("id"),
                "completed",
            )
            .await;
        runs.push(tokens(&run));
    }
    // Another tenant's run counts only for it.
    let (_, other) = app
        .send_message(&token("carol", "other"), Uuid::new_v4(), "elsewhere")
        .await;
    app.wait_for_status(
        &token("carol", "other"),
        other["workflow_id"].as_str().expect("id"),
        "completed",
    )
    .await;

    let acme = admin("acme");
    // An explicit window: the default starts at midnight UTC, which a run could straddle.
    let hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1)).format("%Y-%m-%dT%H:%M:%SZ");
    let usage = |group_by: &str| format!("/v1/usage?group_by={group_by}&from={hour_ago}");
    let (status, by_user) = app.get(&acme, &usage("user")).await;
    assert_eq!(status, StatusCode::OK, "{by_user}");
    let alice_row = row(&by_user, "alice");
    assert_eq!(alice_row["runs"], 2);
    assert_eq!(alice_row["input_tokens"], runs[0].0 + runs[1].0);
    assert_eq!(alice_row["output_tokens"], runs[0].1 + runs[1].1);
    assert_eq!(row(&by_user, "bob")["runs"], 1);
    assert_eq!(
        by_user["data"].as_array().map(Vec::len),
        Some(2),
        "not carol"
    );

    let (_, by_agent) = app.get(&acme, &usage("agent")).await;
    assert_eq!(row(&by_agent, &agent)["runs"], 1);
    assert_eq!(row(&by_agent, &agent)["output_tokens"], runs[1].1);
    assert_eq!(row(&by_agent, "default")["runs"], 2);
    let (_, by_model) = app.get(&acme, &usage("model")).await;
    let demo = row(&by_model, "demo");
    assert_eq!(demo["runs"], 3);
    assert_eq!(
        demo["output_tokens"],
        runs.iter().map(|r| r.1).sum::<i64>(),
        "summed from each step's model call"
    );
    let (_, theirs) = app.get(&admin("other"), &usage("user")).await;
    assert_eq!(row(&theirs, "carol")["runs"], 1);
    let (_, before) = app
        .get(
            &acme,
            "/v1/usage?from=2000-01-01T00:00:00Z&to=2000-01-02T00:00:00Z",
        )
        .await;
    assert_eq!(before["data"], json!([]), "nothing ended then");

    let (status, body) = app.get(&alice, "/v1/usage").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    for (query, status, code) in [
        ("group_by=team", StatusCode::BAD_REQUEST, "invalid_group_by"),
        (
            "group_by=providers",
            StatusCode::BAD_REQUEST,
            "invalid_group_by",
        ),
        (
            "from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z",
            StatusCode::BAD_REQUEST,
            "invalid_window",
        ),
        (
            "from=2020-01-01T00:00:00Z&to=2026-01-01T00:00:00Z",
            StatusCode::BAD_REQUEST,
            "invalid_window",
        ),
        (
            "from=yesterday",
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_query",
        ),
        (
            "colour=red",
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_query",
        ),
    ] {
        let (got, body) = app.get(&acme, &format!("/v1/usage?{query}")).await;
        assert_eq!(got, status, "{query}: {body}");
        assert_eq!(body["error"]["code"], code, "{query}");
    }
    app.stop().await;
}

/// Issue 37 (DESIGN section 15): housekeeping rolls usage up by day, then deletes the steps of
/// runs past `SPOOL_RETENTION_STEPS_DAYS` and the per-run figures past
/// `SPOOL_RETENTION_USAGE_DETAIL_DAYS`. The run still answers, its timeline says its steps
/// expired, and the usage report's totals do not move.
#[tokio::test]
async fn a_run_past_the_retention_windows_keeps_its_run_and_usage_and_says_its_steps_expired() {
    use chrono::{Duration, Utc};
    use spool_shared::config::RetentionArgs;
    use tokio_util::sync::CancellationToken;

    // The worker's own housekeeping passes at its start and next in 10 minutes: the passes
    // below are the ones that find the run.
    let app = TestApp::start(1, worker_args(4, 0)).await;
    let alice = token("alice", "acme");
    let acme = admin("acme");
    let (_, accepted) = app.send_message(&alice, Uuid::new_v4(), "hello").await;
    let id = accepted["workflow_id"].as_str().expect("id").to_owned();
    let run = app.wait_for_status(&alice, &id, "completed").await;
    let (status, timeline) = app.get(&alice, &format!("/v1/workflows/{id}/steps")).await;
    assert_eq!(status, StatusCode::OK, "{timeline}");
    assert_eq!(timeline["steps"].as_array().map(Vec::len), Some(1));
    assert_eq!(timeline["steps_expired_at"], Value::Null);

    // The run ended 40 days ago (as far as retention can tell), and is not rolled up yet: in
    // case the worker's first pass came after it ended, its count (under today) is undone.
    sqlx::raw_sql(
        "UPDATE runs SET finished_at = now() - interval '40 days', usage_rolled_up_at = NULL;
         DELETE FROM usage_detail; DELETE FROM usage_daily;",
    )
    .execute(&app.db.pool)
    .await
    .expect("backdate");
    let midnight = Utc::now()
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc();
    let whole_days = format!(
        "from={}&to={}",
        (midnight - Duration::days(45)).format("%Y-%m-%dT%H:%M:%SZ"),
        midnight.format("%Y-%m-%dT%H:%M:%SZ")
    );
    let report = |group_by: &str| format!("/v1/usage?group_by={group_by}&{whole_days}");
    let mut before = Vec::new();
    for group_by in ["user", "agent", "model"] {
        let (status, body) = app.get(&acme, &report(group_by)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        before.push(body["data"].clone());
    }
    assert_eq!(row(&json!({"data": before[0]}), "alice")["runs"], 1);
    assert_eq!(
        row(&json!({"data": before[0]}), "alice")["output_tokens"],
        tokens(&run).1
    );

    let done = spool_worker::housekeeping::purge(
        &app.db.pool,
        &RetentionArgs::default(),
        &CancellationToken::new(),
    )
    .await
    .expect("housekeeping");
    assert_eq!(
        (done.runs_rolled_up, done.runs_steps_deleted),
        (1, 1),
        "{done:?}"
    );

    let (status, timeline) = app.get(&alice, &format!("/v1/workflows/{id}/steps")).await;
    assert_eq!(status, StatusCode::OK, "{timeline}");
    assert_eq!(timeline["steps"], json!([]));
    assert!(timeline["steps_expired_at"].is_string(), "{timeline}");
    assert_eq!(timeline["status"], "completed");
    let document = app.openapi_document().await;
    crate::openapi::check(&document, "StepsResponse", &timeline);
    let (status, again) = app.get(&alice, &format!("/v1/workflows/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        again["usage"], run["usage"],
        "the run keeps its own figures"
    );

    for (group_by, before) in ["user", "agent", "model"].into_iter().zip(&before) {
        let (_, after) = app.get(&acme, &report(group_by)).await;
        assert_eq!(
            &after["data"], before,
            "{group_by}: the same totals from the roll-up"
        );
    }

    // The run's own figures go after SPOOL_RETENTION_USAGE_DETAIL_DAYS: whole days still add
    // up; a window that needs them is refused, not answered short.
    let short = RetentionArgs {
        retention_usage_detail_days: 30,
        ..RetentionArgs::default()
    };
    let done = spool_worker::housekeeping::purge(&app.db.pool, &short, &CancellationToken::new())
        .await
        .expect("housekeeping");
    assert!(done.usage_detail > 0, "{done:?}");
    let (_, after) = app.get(&acme, &report("user")).await;
    assert_eq!(after["data"], before[0]);
    let old_edge = (Utc::now() - Duration::days(100)).format("%Y-%m-%dT%H:%M:%SZ");
    let (status, body) = app.get(&acme, &format!("/v1/usage?from={old_edge}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "usage_detail_expired");
    app.stop().await;
}

/// A housekeeping stage that fails does not stop the others: a roll-up that keeps failing
/// (here a trigger refuses its writes) still lets expired idempotency keys go, and the pass
/// reports the failure.
#[tokio::test]
async fn a_failing_roll_up_does_not_keep_expired_idempotency_keys() {
    use spool_shared::config::RetentionArgs;
    use tokio_util::sync::CancellationToken;

    let app = TestApp::start(1, worker_args(4, 0)).await;
    let alice = token("alice", "acme");
    let (_, accepted) = app.send_message(&alice, Uuid::new_v4(), "hello").await;
    let id = accepted["workflow_id"].as_str().expect("id").to_owned();
    app.wait_for_status(&alice, &id, "completed").await;
    sqlx::raw_sql(
        "UPDATE runs SET usage_rolled_up_at = NULL;
         CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RAISE EXCEPTION 'refused'; END $$;
         CREATE TRIGGER refuse BEFORE INSERT ON usage_daily FOR EACH ROW EXECUTE FUNCTION refuse();
         INSERT INTO idempotency_keys (tenant_id, key, request_hash, status_code, response,
                                       created_at)
         VALUES ('acme', 'old', 'h', 202, '{}', now() - interval '25 hours')",
    )
    .execute(&app.db.pool)
    .await
    .expect("setup");
    let pass = spool_worker::housekeeping::purge(
        &app.db.pool,
        &RetentionArgs::default(),
        &CancellationToken::new(),
    )
    .await;
    assert!(pass.is_err(), "the failure is reported: {pass:?}");
    assert_eq!(
        app.db.count("idempotency_keys").await,
        0,
        "the keys went anyway"
    );
    let (rolled,): (Option<chrono::DateTime<chrono::Utc>>,) =
        sqlx::query_as("SELECT usage_rolled_up_at FROM runs WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&app.db.pool)
            .await
            .expect("run");
    assert_eq!(rolled, None, "the failed roll-up marked nothing");
    app.stop().await;
}

/// Usage by provider (issue 41): each run under the provider its agent named when it was
/// enqueued, one of the tenant's (`tenant:<name>`, still after the provider is deleted) or the
/// operator's (`operator:<name>`), `unknown` for the default agent; tokens, runs and dollars the
/// same from the runs themselves, and from the roll-up by whole day and by edge.
#[tokio::test]
async fn usage_by_provider_counts_each_run_under_its_agents_provider_before_and_after_the_roll_up()
{
    use chrono::{Duration, Utc};
    use reqwest::Method;
    use spool_shared::config::RetentionArgs;
    use spool_tests::fake_llm::{self, FakeLlm};
    use tokio_util::sync::CancellationToken;

    // Each call of a fake provider: 10 prompt tokens, 5 generated.
    let reply = |_: &Value, _: usize| fake_llm::text("fine", 2);
    let (alpha, beta, shared) = (
        FakeLlm::start(reply).await,
        FakeLlm::start(reply).await,
        FakeLlm::start(reply).await,
    );
    let operator = format!(
        r#"[{{"name": "shared", "kind": "openai", "base_url": "{}", "models": ["m-o"],
              "prices": {{"m-o": {{"input_per_mtok": 100, "output_per_mtok": 200}}}}}}]"#,
        shared.base_url
    );
    let app = TestApp::start(
        1,
        crate::common::worker_args_with(
            1,
            0,
            &[
                "--secrets-key",
                "8f1e2d3c4b5a69788796a5b4c3d2e1f000112233445566778899aabbccddeeff",
                "--providers",
                &operator,
                "--tools-allow-networks",
                "127.0.0.1/32",
            ],
        ),
    )
    .await;
    let acme = admin("acme");
    let mut ids = Vec::new();
    for (name, fake, model, prices) in [
        (
            "alpha",
            &alpha,
            "m-a",
            json!({"m-a": {"input_per_mtok": 1000, "output_per_mtok": 2000}}),
        ),
        // No price: its runs' dollars are not known.
        ("beta", &beta, "m-b", json!({})),
    ] {
        let (status, created) = app
            .post(
                &acme,
                "/v1/providers",
                &json!({"name": name, "kind": "openai", "base_url": fake.base_url,
                        "api_key": "sk-test", "models": [model], "prices": prices}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        ids.push(created["id"].as_str().expect("id").to_owned());
    }
    let mut runs = Vec::new();
    for (provider, model, times) in [
        ("alpha", "m-a", 2),
        ("beta", "m-b", 1),
        ("shared", "m-o", 1),
    ] {
        let agent = app
            .create_agent(
                "acme",
                &json!({"name": provider, "provider": provider, "model": model}),
            )
            .await;
        for _ in 0..times {
            let (_, accepted) = crate::common::ask(&app, &agent, "hello").await;
            runs.push(accepted);
        }
    }
    let alice = token("alice", "acme");
    let (_, accepted) = app.send_message(&alice, Uuid::new_v4(), "hello").await;
    runs.push(accepted);
    let mut ended = Vec::new();
    for accepted in &runs {
        let run = crate::common::finished(&app, accepted).await;
        assert_eq!(run["status"], "completed", "{run}");
        ended.push(run);
    }
    assert_eq!(
        (
            alpha.requests().len(),
            beta.requests().len(),
            shared.requests().len()
        ),
        (2, 1, 1),
        "each through its own provider"
    );
    let default_run = tokens(&ended[4]);

    // The runs ended two days ago and are not rolled up yet (in case the worker's first
    // housekeeping pass came after they ended, its count is undone).
    sqlx::raw_sql(
        "UPDATE runs SET finished_at = now() - interval '2 days', usage_rolled_up_at = NULL;
         DELETE FROM usage_detail; DELETE FROM usage_daily; DELETE FROM usage_daily_providers;",
    )
    .execute(&app.db.pool)
    .await
    .expect("backdate");
    // A provider deleted since keeps its runs' key.
    let (status, _) = app
        .send(
            Method::DELETE,
            &acme,
            &format!("/v1/providers/{}", ids[0]),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let stamp = |t: chrono::DateTime<Utc>| t.format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let midnight = Utc::now()
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc();
    let ended_at = Utc::now() - Duration::days(2);
    // Whole days (the daily roll-up), and two hours around the runs' end (per-run figures).
    let windows = [
        (midnight - Duration::days(5), midnight),
        (ended_at - Duration::hours(1), ended_at + Duration::hours(1)),
    ];
    let report = |(from, to): (chrono::DateTime<Utc>, chrono::DateTime<Utc>)| {
        format!(
            "/v1/usage?group_by=provider&from={}&to={}",
            stamp(from),
            stamp(to)
        )
    };
    let document = app.openapi_document().await;
    let mut before = Vec::new();
    for window in windows {
        let (status, body) = app.get(&acme, &report(window)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        crate::openapi::check(&document, "UsageResponse", &body);
        assert_eq!(body["group_by"], "provider");
        let alpha = row(&body, "tenant:alpha");
        assert_eq!(
            (
                &alpha["runs"],
                &alpha["input_tokens"],
                &alpha["output_tokens"]
            ),
            (&json!(2), &json!(20), &json!(10)),
            "{body}"
        );
        // 10 tokens at $1000 and 5 at $2000 a million, twice.
        let cost = alpha["cost_usd"].as_f64().expect("priced");
        assert!((cost - 0.04).abs() < 1e-9, "{body}");
        let beta = row(&body, "tenant:beta");
        assert_eq!(
            (&beta["runs"], &beta["input_tokens"]),
            (&json!(1), &json!(10))
        );
        assert_eq!(beta["cost_usd"], Value::Null, "unpriced, not free");
        assert_eq!(beta["unpriced_models"], json!(["m-b"]));
        let operator = row(&body, "operator:shared");
        assert_eq!(
            (&operator["runs"], &operator["output_tokens"]),
            (&json!(1), &json!(5))
        );
        let cost = operator["cost_usd"].as_f64().expect("priced");
        assert!((cost - 0.002).abs() < 1e-9, "{body}");
        let unknown = row(&body, "unknown");
        assert_eq!(
            (
                &unknown["runs"],
                &unknown["input_tokens"],
                &unknown["output_tokens"]
            ),
            (&json!(1), &json!(default_run.0), &json!(default_run.1)),
            "the default agent names no provider"
        );
        assert_eq!(body["data"].as_array().map(Vec::len), Some(4), "{body}");
        assert_eq!(body["unpriced_models"], json!(["m-b"]));
        before.push(body["data"].clone());
    }

    let done = spool_worker::housekeeping::purge(
        &app.db.pool,
        &RetentionArgs::default(),
        &CancellationToken::new(),
    )
    .await
    .expect("housekeeping");
    assert_eq!(done.runs_rolled_up, 5, "{done:?}");
    for (window, before) in windows.into_iter().zip(&before) {
        let (_, after) = app.get(&acme, &report(window)).await;
        assert_eq!(&after["data"], before, "the same totals from the roll-up");
    }
    app.stop().await;
}
