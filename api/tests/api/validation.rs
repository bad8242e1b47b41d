//! Bad input gets a clear 4xx JSON error with a code, and nothing is written (invariant 10).

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use spool_tests::{JWT_SECRET, token, token_with};

use crate::common::{TestApp, worker_args};

async fn assert_nothing_written(app: &TestApp) {
    for table in ["threads", "messages", "runs", "idempotency_keys"] {
        assert_eq!(app.db.count(table).await, 0, "{table} must be empty");
    }
}

#[tokio::test]
async fn malformed_messages_are_refused_with_codes_and_change_nothing() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let path = format!("/v1/threads/{}/user_message", Uuid::new_v4());
    let raw = |body: &'static str, content_type: Option<&'static str>| {
        let mut request = app.http.post(app.url(&path)).bearer_auth(&alice).body(body);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        request.send()
    };
    let cases: Vec<(reqwest::Response, StatusCode, &str)> = vec![
        (
            raw("{not json", Some("application/json"))
                .await
                .expect("send"),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            raw(r#"{"input_text":"hi"}"#, Some("text/plain"))
                .await
                .expect("send"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            raw(r#"{"input_text":"hi"}"#, None).await.expect("send"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            raw(r#"{"input_text":42}"#, Some("application/json"))
                .await
                .expect("send"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            raw(
                r#"{"input_text":"hi","metadata":"x"}"#,
                Some("application/json"),
            )
            .await
            .expect("send"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            raw(
                r#"{"input_text":"hi","surprise":1}"#,
                Some("application/json"),
            )
            .await
            .expect("send"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            raw(r#"{}"#, Some("application/json")).await.expect("send"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            raw(r#"["hi", null, null]"#, Some("application/json"))
                .await
                .expect("send"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            raw(r#"{"input_text":"   "}"#, Some("application/json"))
                .await
                .expect("send"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input_text",
        ),
        (
            raw(
                r#"{"input_text":"hi","agent_id":"nope"}"#,
                Some("application/json"),
            )
            .await
            .expect("send"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
    ];
    for (response, status, code) in cases {
        assert_eq!(response.status(), status, "expected {code}");
        let body: Value = response.json().await.expect("a JSON error body");
        assert_eq!(body["error"]["code"], code);
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }

    let oversized = "x".repeat(32 * 1024 + 1);
    let (status, body) = app
        .post(&alice, &path, &json!({"input_text": oversized}))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"]["code"], "input_too_large");

    let huge = "x".repeat(2 << 20);
    let (status, body) = app.post(&alice, &path, &json!({"input_text": huge})).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"]["code"], "body_too_large");

    let unknown_agent = json!({"input_text": "hi", "agent_id": Uuid::new_v4()});
    let (status, body) = app.post(&alice, &path, &unknown_agent).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "agent_not_found");

    let response = app
        .http
        .post(app.url(&path))
        .bearer_auth(&alice)
        .header("Idempotency-Key", "")
        .json(&json!({"input_text": "hi"}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);

    assert_nothing_written(&app).await;
    app.stop().await;
}

#[tokio::test]
async fn missing_expired_and_forged_tokens_get_401_and_change_nothing() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let path = format!("/v1/threads/{}/user_message", Uuid::new_v4());
    let body = json!({"input_text": "hi"});
    let response = app
        .http
        .post(app.url(&path))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let error: Value = response.json().await.expect("json");
    assert_eq!(error["error"]["code"], "missing_token");

    let cases = [
        (
            token_with("alice", "acme", false, -3600, JWT_SECRET),
            "token_expired",
        ),
        (
            token_with("alice", "acme", false, 3600, "not-the-secret"),
            "invalid_token",
        ),
        ("garbage".to_owned(), "invalid_token"),
    ];
    for (bad, code) in cases {
        let (status, error) = app.post(&bad, &path, &body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{code}");
        assert_eq!(error["error"]["code"], code);
    }
    let (status, _) = app
        .get(
            "garbage",
            "/v1/threads/00000000-0000-0000-0000-000000000000",
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_nothing_written(&app).await;
    app.stop().await;
}

#[tokio::test]
async fn bad_query_and_path_parameters_get_coded_errors() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let (status, _) = app.get(&alice, "/v1/threads/not-a-uuid").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let thread = Uuid::new_v4();
    let (status, _) = app.send_message(&alice, thread, "hi").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, body) = app
        .get(&alice, &format!("/v1/threads/{thread}/messages?limit=0"))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["code"], "invalid_limit");
    let (status, body) = app
        .get(&alice, &format!("/v1/threads/{thread}/messages?limit=x"))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["code"], "invalid_query");
    let (status, body) = app.get(&alice, "/v1/nowhere").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "route_not_found");
    app.stop().await;
}

#[tokio::test]
async fn health_and_readiness_answer() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let ok = app
        .http
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("send");
    assert_eq!(ok.status(), StatusCode::OK);
    let ready = app.http.get(app.url("/readyz")).send().await.expect("send");
    assert_eq!(ready.status(), StatusCode::OK);
    app.stop().await;
}

/// Postgres stores no NUL character: text with `\u0000` is the client's error (422), not a 500
/// (found by schemathesis against the OpenAPI document).
#[tokio::test]
async fn text_with_a_nul_character_is_refused_and_changes_nothing() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let admin = token_with("ops", "acme", true, 3600, JWT_SECRET);
    let thread = Uuid::new_v4();
    let cases = [
        (
            &alice,
            "/v1/threads".to_owned(),
            json!({"metadata": {"k": "a\u{0}b"}}),
        ),
        (
            &alice,
            format!("/v1/threads/{thread}/user_message"),
            json!({"input_text": "a\u{0}b"}),
        ),
        (
            &alice,
            format!("/v1/threads/{thread}/user_message"),
            json!({"input_text": "hi", "metadata": {"a\u{0}": 1}}),
        ),
        (
            &admin,
            "/v1/agents".to_owned(),
            json!({"name": "a\u{0}b", "model": "demo"}),
        ),
    ];
    for (token, path, body) in &cases {
        let (status, answer) = app.post(token, path, body).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{path} {body}: {answer}"
        );
        assert_eq!(answer["error"]["code"], "invalid_body", "{path}");
    }
    assert_nothing_written(&app).await;
    assert_eq!(app.db.count("agents").await, 0);
    app.stop().await;
}
