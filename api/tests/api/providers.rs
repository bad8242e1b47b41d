//! Model providers as resources (`/v1/providers`, DESIGN section 12): `providers:write` to read
//! and write them, a key sealed with `SPOOL_SECRETS_KEY` (503 without it) and never shown, kept
//! only for the same destination, `base_url` through the network policy, validation by field,
//! tenant isolation, and agents whose `provider` names a tenant's provider before the
//! operator's, with its `default_model`, its key, its prices, and its changes seen within
//! seconds.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm};
use spool_tests::{poll_until, token, token_with_permissions};

use crate::agents::admin;
use crate::common::{TIMEOUT, TestApp, ask, finished, worker_args, worker_args_with};

/// The operator's `SPOOL_SECRETS_KEY` in these tests (as `--secrets-key`).
const SECRETS_KEY: &str = "8f1e2d3c4b5a69788796a5b4c3d2e1f000112233445566778899aabbccddeeff";
const KEY: &str = "sk-tenant-abc123-very-secret";
const NEW_KEY: &str = "sk-tenant-rotated-456-secret";

fn provider(name: &str, base_url: &str) -> Value {
    json!({"name": name, "kind": "openai", "base_url": base_url, "api_key": KEY,
        "default_model": "tenant-model", "models": ["tenant-model", "tenant-big"],
        "prices": {"tenant-model": {"input_per_mtok": 1000, "output_per_mtok": 2000}}})
}

async fn with_key(workers: usize, extra: &[&str]) -> TestApp {
    let mut args = vec!["--secrets-key", SECRETS_KEY];
    args.extend_from_slice(extra);
    TestApp::start(workers, worker_args_with(1, 0, &args)).await
}

fn assert_no_key(what: &str, seen: &[Value]) {
    for value in seen {
        let text = value.to_string();
        for key in [KEY, NEW_KEY] {
            assert!(!text.contains(key), "{what} shows the key: {text}");
        }
    }
}

#[tokio::test]
async fn without_the_secrets_key_provider_writes_answer_503_and_nothing_is_stored() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let (status, body) = app
        .post(
            &root,
            "/v1/providers",
            &provider("mine", "https://llm.example.com/v1"),
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "secrets_not_configured");
    assert_no_key("the 503", &[body]);
    assert_eq!(app.db.count("providers").await, 0);
    let (status, page) = app.get(&root, "/v1/providers").await;
    assert_eq!(status, StatusCode::OK, "reads need no key: {page}");
    assert_eq!(page["data"], json!([]));
}

#[tokio::test]
async fn providers_are_created_read_listed_changed_and_deleted_and_never_show_their_key() {
    let app = with_key(0, &[]).await;
    let root = admin("acme");
    let mut seen = Vec::new();

    // `providers:write` for reads and writes; agents:read is not enough.
    let reader = token("alice", "acme");
    for (method, path) in [
        (Method::GET, "/v1/providers"),
        (Method::POST, "/v1/providers"),
    ] {
        let body = provider("mine", "https://llm.example.com/v1");
        let (status, refused) = app.send(method, &reader, path, Some(&body)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
        assert_eq!(refused["error"]["permission"], "providers:write");
    }

    let writer = token_with_permissions("ops", "acme", &["providers:write"]);
    let (status, created) = app
        .post(
            &writer,
            "/v1/providers",
            &provider("mine", "https://llm.example.com/v1"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["api_key"], "<redacted>");
    assert_eq!(created["default_model"], "tenant-model");
    assert_eq!(
        created["prices"]["tenant-model"]["output_per_mtok"],
        json!(2000.0)
    );
    seen.push(created.clone());
    let id = created["id"].as_str().expect("id").to_owned();

    // Stored sealed: the key is in no column in clear.
    let clear: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM providers
          WHERE position(convert_to($1, 'UTF8') in api_key_ciphertext) > 0
             OR spec::text LIKE '%' || $1 || '%'",
    )
    .bind(KEY)
    .fetch_one(&app.db.pool)
    .await
    .expect("query");
    assert_eq!(clear, 0);

    let (status, again) = app
        .post(
            &root,
            "/v1/providers",
            &provider("mine", "https://other.example.com/v1"),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{again}");
    assert_eq!(again["error"]["code"], "name_taken");
    seen.push(again);

    let (status, read) = app.get(&writer, &format!("/v1/providers/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read["name"], "mine");
    seen.push(read.clone());
    app.post(
        &root,
        "/v1/providers",
        &provider("second", "https://llm.example.com/v1"),
    )
    .await;
    let (status, page) = app.get(&writer, "/v1/providers?limit=1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["data"][0]["name"], "second", "newest first");
    let cursor = page["next_cursor"].as_str().expect("a second page");
    let (_, rest) = app
        .get(&writer, &format!("/v1/providers?cursor={cursor}"))
        .await;
    assert_eq!(rest["data"][0]["name"], "mine");
    assert!(rest["next_cursor"].is_null());
    seen.extend([page, rest]);
    let (status, unknown) = app.get(&writer, "/v1/providers?kind=openai").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(unknown["error"]["code"], "unknown_parameter");

    // What was read writes back: the key is kept for the same destination (another path).
    let path = format!("/v1/providers/{id}");
    let patch = json!({"base_url": "https://llm.example.com/v2", "api_key": "<redacted>",
        "models": null});
    let (status, patched) = app.send(Method::PATCH, &writer, &path, Some(&patch)).await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["base_url"], "https://llm.example.com/v2");
    assert!(patched.get("models").is_none(), "null removes: {patched}");
    seen.push(patched);

    // Another destination needs the key again, whether omitted or redacted.
    for patch in [
        json!({"base_url": "https://evil.example.com/v1"}),
        json!({"base_url": "https://llm.example.com:8443/v1", "api_key": "<redacted>"}),
        json!({"base_url": "http://llm.example.com/v1"}),
    ] {
        let (status, refused) = app.send(Method::PATCH, &writer, &path, Some(&patch)).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{patch}: {refused}"
        );
        assert_eq!(
            refused["error"]["code"], "secret_needs_reentry",
            "{refused}"
        );
        assert_eq!(refused["error"]["errors"][0]["field"], "api_key");
        seen.push(refused);
    }
    let patch = json!({"base_url": "https://evil.example.com/v1", "api_key": NEW_KEY});
    let (status, moved) = app.send(Method::PATCH, &writer, &path, Some(&patch)).await;
    assert_eq!(status, StatusCode::OK, "{moved}");
    assert_eq!(moved["api_key"], "<redacted>");
    seen.push(moved);

    // Another tenant's id is no provider.
    let other = admin("globex");
    let (status, _) = app.get(&other, &path).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app
        .send(
            Method::PATCH,
            &other,
            &path,
            Some(&json!({"default_model": "x"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app.send(Method::DELETE, &other, &path, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, theirs) = app.get(&other, "/v1/providers").await;
    assert_eq!(theirs["data"], json!([]));

    let (status, _) = app.send(Method::DELETE, &writer, &path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, gone) = app.get(&writer, &path).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(gone["error"]["code"], "provider_not_found");
    assert_no_key("a response", &seen);
}

#[tokio::test]
async fn an_invalid_provider_is_a_422_listing_every_problem_by_field() {
    let app = with_key(0, &[]).await;
    let root = admin("acme");
    let bad = json!({"name": "no spaces", "kind": "openai", "base_url": "not a url",
        "default_model": "absent", "models": [""],
        "prices": {"m": {"input_per_mtok": -1, "output_per_mtok": 1}}});
    let (status, body) = app.post(&root, "/v1/providers", &bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "invalid_provider");
    let mut fields: Vec<&str> = body["error"]["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| e["field"].as_str().expect("field"))
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "api_key",
            "base_url",
            "default_model",
            "models[0]",
            "name",
            "prices.m.input_per_mtok"
        ]
    );

    // The network policy refuses a scheme or a literal address outright.
    for url in [
        "ftp://llm.example.com/v1",
        "http://169.254.169.254/v1",
        "http://10.1.2.3/v1",
    ] {
        let (status, body) = app.post(&root, "/v1/providers", &provider("p", url)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {body}");
        assert_eq!(body["error"]["code"], "url_not_allowed", "{url}: {body}");
        assert_eq!(body["error"]["errors"][0]["field"], "base_url");
        assert_no_key("a refusal", &[body]);
    }
    // An unknown kind or field is the body's problem.
    let mut cohere = provider("p", "https://llm.example.com/v1");
    cohere["kind"] = json!("cohere");
    let (status, body) = app.post(&root, "/v1/providers", &cohere).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_no_key("a refusal", &[body]);
    assert_eq!(app.db.count("providers").await, 0);
}

#[tokio::test]
async fn an_agent_names_the_tenants_provider_before_the_operators_and_its_runs_use_its_key() {
    let tenant_llm = FakeLlm::start(|_, _| fake_llm::text("from the tenant's provider", 2)).await;
    let operator_llm = FakeLlm::start(|_, _| fake_llm::text("from the operator", 2)).await;
    let operator = format!(
        r#"[{{"name": "shared", "kind": "openai", "base_url": "{}"}}]"#,
        operator_llm.base_url
    );
    let app = with_key(
        1,
        &[
            "--providers",
            &operator,
            "--tools-allow-networks",
            "127.0.0.1/32",
        ],
    )
    .await;
    let root = admin("acme");
    let (status, created) = app
        .post(
            &root,
            "/v1/providers",
            &provider("shared", &tenant_llm.base_url),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();

    // A provider neither the tenant nor the operator has is refused; a model the tenant's
    // provider does not list too; no model takes its `default_model`.
    for (spec, field) in [
        (
            json!({"name": "a", "provider": "ghost", "model": "m"}),
            "provider",
        ),
        (
            json!({"name": "a", "provider": "shared", "model": "gpt-4o"}),
            "model",
        ),
        (json!({"name": "a", "model": ""}), "model"),
    ] {
        let (status, body) = app.post(&root, "/v1/agents", &spec).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{spec}: {body}");
        assert_eq!(body["error"]["code"], "invalid_agent");
        assert_eq!(body["error"]["errors"][0]["field"], field, "{body}");
    }
    let agent = app
        .create_agent("acme", &json!({"name": "byok", "provider": "shared"}))
        .await;

    let (_, accepted) = ask(&app, &agent, "hello").await;
    let run = finished(&app, &accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert!(
        operator_llm.requests().is_empty(),
        "the operator's is hidden"
    );
    let requests = tenant_llm.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0]["model"], "tenant-model", "its default_model");
    assert_eq!(
        tenant_llm.credentials(),
        [Some(format!("Bearer {KEY}"))],
        "its key, as the bearer token"
    );
    // Priced at the tenant provider's prices.
    let cost = run["usage"]["cost_usd"].as_f64().expect("a cost");
    assert!(cost > 0.0, "{run}");

    // A new key is used within seconds.
    let path = format!("/v1/providers/{id}");
    let (status, _) = app
        .send(
            Method::PATCH,
            &root,
            &path,
            Some(&json!({"api_key": NEW_KEY})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    poll_until("the new key to be used", TIMEOUT, || async {
        let (_, accepted) = ask(&app, &agent, "again").await;
        finished(&app, &accepted).await;
        let last = tenant_llm.credentials().last().cloned().flatten();
        (last == Some(format!("Bearer {NEW_KEY}"))).then_some(())
    })
    .await;

    // Another tenant's agent naming `shared` gets the operator's.
    let agent = app
        .create_agent(
            "globex",
            &json!({"name": "op", "provider": "shared", "model": "m"}),
        )
        .await;
    let (status, accepted) = app
        .post(
            &token("bob", "globex"),
            &format!("/v1/threads/{}/user_message", uuid::Uuid::new_v4()),
            &json!({"input_text": "hi", "agent_id": agent}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    poll_until("the operator's provider to answer", TIMEOUT, || async {
        (!operator_llm.requests().is_empty()).then_some(())
    })
    .await;
}
