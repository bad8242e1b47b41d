//! Agents for end users (DESIGN section 13): `visibility`, public sessions, their origins, and
//! `safety_acknowledged`. A public session's token is walked over every operation of the
//! OpenAPI document, so a route added later is covered without touching this test.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

use spool_tests::{poll_until, token};

use crate::common::{TIMEOUT, TestApp, worker_args};

/// What a public session may do: its threads, messages, streams and cancel (and open sessions).
const SESSION_ROUTES: &[&str] = &[
    "POST /v1/threads",
    "GET /v1/threads",
    "GET /v1/threads/{thread_id}",
    "GET /v1/threads/{thread_id}/messages",
    "POST /v1/threads/{thread_id}/user_message",
    "GET /v1/threads/{thread_id}/stream",
    "POST /v1/workflows/{workflow_id}/cancel",
    "POST /v1/public/agents/{agent_id}/sessions",
];

async fn open_session(app: &TestApp, agent: &str, origin: Option<&str>) -> reqwest::Response {
    let mut request = app
        .http
        .post(app.url(&format!("/v1/public/agents/{agent}/sessions")));
    if let Some(origin) = origin {
        request = request.header("Origin", origin);
    }
    request.send().await.expect("request")
}

async fn session(app: &TestApp, agent: &str) -> Value {
    let response = open_session(app, agent, None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json().await.expect("json")
}

fn concrete(template: &str, thread: &str) -> String {
    let mut path = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        let end = rest[start..].find('}').expect("brace") + start;
        path.push_str(&rest[..start]);
        if &rest[start..=end] == "{thread_id}" {
            path.push_str(thread);
        } else {
            path.push_str(&Uuid::new_v4().to_string());
        }
        rest = &rest[end + 1..];
    }
    path.push_str(rest);
    path
}

#[tokio::test]
async fn a_public_session_reaches_its_own_threads_and_nothing_else() {
    let app = TestApp::start(1, worker_args(3, 0)).await;
    let public = app
        .create_agent(
            "acme",
            &json!({"name": "greeter", "model": "demo", "visibility": "public",
                "cors_origins": ["https://shop.example"]}),
        )
        .await;
    let internal = app
        .create_agent("acme", &json!({"name": "internal", "model": "demo"}))
        .await;

    // Only a public agent opens sessions.
    for agent in [internal.clone(), Uuid::new_v4().to_string()] {
        let response = open_session(&app, &agent, None).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"]["code"], "agent_not_found");
    }
    let first = session(&app, &public).await;
    let user = first["user_id"].as_str().expect("user_id");
    assert!(user.starts_with("anon:"), "{first}");
    let expires = chrono::DateTime::parse_from_rfc3339(first["expires_at"].as_str().expect("exp"))
        .expect("timestamp");
    let left = expires.timestamp() - chrono::Utc::now().timestamp();
    assert!((3590..=3600).contains(&left), "an hour: {left}");
    let one = first["token"].as_str().expect("token").to_owned();

    // Its thread runs the public agent, whatever the body asks.
    let (status, thread) = app.post(&one, "/v1/threads", &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{thread}");
    assert_eq!(thread["agent_id"], public.as_str());
    let thread_id = thread["id"].as_str().expect("id").to_owned();
    let (status, body) = app
        .post(&one, "/v1/threads", &json!({"agent_id": internal}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = app
        .post(
            &one,
            &format!("/v1/threads/{thread_id}/user_message"),
            &json!({"input_text": "hi", "agent_id": internal}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "agent_not_found");
    let (status, accepted) = app
        .post(
            &one,
            &format!("/v1/threads/{thread_id}/user_message"),
            &json!({"input_text": "hello"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let messages = poll_until("the reply", TIMEOUT, || async {
        let (status, page) = app
            .get(&one, &format!("/v1/threads/{thread_id}/messages"))
            .await;
        let messages = page["messages"].as_array().cloned().unwrap_or_default();
        (status == StatusCode::OK && messages.len() == 2 && messages[1]["status"] == "completed")
            .then_some(messages)
    })
    .await;
    assert_eq!(messages[0]["content"], "hello");
    let (status, list) = app.get(&one, "/v1/threads").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["data"].as_array().map(Vec::len), Some(1), "{list}");

    // Another session, or a user of the tenant, never reads it.
    let two = session(&app, &public).await["token"]
        .as_str()
        .expect("token")
        .to_owned();
    for other in [two.clone(), token("alice", "acme")] {
        for path in [
            format!("/v1/threads/{thread_id}"),
            format!("/v1/threads/{thread_id}/messages"),
            format!("/v1/threads/{thread_id}/stream?last_entry_id=0-1"),
        ] {
            let (status, body) = app.get(&other, &path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        }
        let (status, _) = app
            .post(
                &other,
                &format!("/v1/threads/{thread_id}/user_message"),
                &json!({"input_text": "mine now"}),
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    let workflow = accepted["workflow_id"].as_str().expect("workflow");
    let (status, _) = app
        .post(
            &two,
            &format!("/v1/workflows/{workflow}/cancel"),
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Every operation of the document: a session's token is refused everywhere but its own
    // routes (a fresh UUID for any other id; its own thread for `{thread_id}`).
    let document = app.openapi_document().await;
    let mut walked = 0;
    for (template, item) in document["paths"].as_object().expect("paths") {
        for (method, _) in item.as_object().expect("item") {
            let method = method.to_uppercase();
            if Method::from_bytes(method.as_bytes()).is_err() || !template.starts_with("/v1/") {
                continue;
            }
            let operation = format!("{method} {template}");
            let path = concrete(template, &thread_id);
            let response = app
                .http
                .request(
                    Method::from_bytes(method.as_bytes()).expect("method"),
                    app.url(&path),
                )
                .bearer_auth(&one)
                .json(
                    &json!({"input_text": "x", "input": "x", "model": "greeter", "name": "x",
                    "url": "https://hooks.example/x", "approved": true, "tool_outputs": []}),
                )
                .send()
                .await
                .expect("request");
            let status = response.status();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            walked += 1;
            if SESSION_ROUTES.contains(&operation.as_str()) {
                assert!(
                    status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
                    "{operation}: {status} {body}"
                );
            } else {
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{operation}: {body}");
                assert_eq!(
                    body["error"]["code"], "session_token_refused",
                    "{operation}: {body}"
                );
            }
        }
    }
    assert!(walked > 30, "walked {walked} operations");
    app.stop().await;
}

#[tokio::test]
async fn a_public_agent_serves_only_its_origins_and_stops_when_it_is_no_longer_public() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let spec = json!({"name": "greeter", "model": "demo", "visibility": "public",
        "cors_origins": ["https://shop.example"]});
    let public = app.create_agent("acme", &spec).await;

    let response = open_session(&app, &public, Some("https://evil.example")).await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "origin_not_allowed");

    // The listed origin's preflight and answers pass CORS.
    let preflight = app
        .http
        .request(
            Method::OPTIONS,
            app.url(&format!("/v1/public/agents/{public}/sessions")),
        )
        .header("Origin", "https://shop.example")
        .header("Access-Control-Request-Method", "POST")
        .send()
        .await
        .expect("preflight");
    assert_eq!(
        preflight.headers()["access-control-allow-origin"],
        "https://shop.example"
    );
    let response = open_session(&app, &public, Some("https://shop.example")).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        response.headers()["access-control-allow-origin"],
        "https://shop.example"
    );
    let session: Value = response.json().await.expect("json");
    let token = session["token"].as_str().expect("token").to_owned();
    let response = app
        .http
        .post(app.url("/v1/threads"))
        .bearer_auth(&token)
        .header("Origin", "https://shop.example")
        .json(&json!({}))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        response.headers()["access-control-allow-origin"],
        "https://shop.example"
    );
    // The same session from another origin: refused before anything is created.
    let response = app
        .http
        .post(app.url("/v1/threads"))
        .bearer_auth(&token)
        .header("Origin", "https://evil.example")
        .json(&json!({}))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let (_, list) = app.get(&token, "/v1/threads").await;
    assert_eq!(list["data"].as_array().map(Vec::len), Some(1), "{list}");
    // An origin no public agent lists gets no preflight answer from the sessions' CORS.
    let preflight = app
        .http
        .request(Method::OPTIONS, app.url("/v1/threads"))
        .header("Origin", "https://evil.example")
        .header("Access-Control-Request-Method", "POST")
        .send()
        .await
        .expect("preflight");
    assert!(
        !preflight
            .headers()
            .contains_key("access-control-allow-origin")
    );

    // Made `tenant` again: its sessions stop at once.
    let mut tenant = spec.clone();
    tenant["visibility"] = json!("tenant");
    let response = app
        .http
        .put(app.url(&format!("/v1/agents/{public}")))
        .bearer_auth(crate::agents::admin("acme"))
        .json(&tenant)
        .send()
        .await
        .expect("put");
    let status = response.status();
    assert_eq!(status, StatusCode::OK);
    let (status, body) = app.get(&token, "/v1/threads").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let response = open_session(&app, &public, None).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    app.stop().await;
}

#[tokio::test]
async fn a_public_agent_with_a_tool_that_writes_needs_the_safety_acknowledgement() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let admin = spool_tests::token_with("ops", "acme", true, 3600, spool_tests::JWT_SECRET);
    let tool = |read_only: bool| {
        json!({"type": "http", "name": "refund", "url": "https://tools.example.com/refund",
            "read_only": read_only})
    };
    let spec = |visibility: &str, read_only: bool, acknowledged: bool| {
        json!({"name": "shop", "model": "demo", "visibility": visibility,
            "tools": [tool(read_only)], "safety_acknowledged": acknowledged})
    };
    let (status, body) = app
        .post(&admin, "/v1/agents", &spec("public", false, false))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "safety_acknowledgement_required");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("refund"))
    );
    let (_, agents) = app.get(&admin, "/v1/agents").await;
    assert_eq!(agents["agents"], json!([]), "nothing stored");
    for (visibility, read_only, acknowledged) in [
        ("public", false, true),
        ("public", true, false),
        ("tenant", false, false),
        ("private", false, false),
    ] {
        let (status, body) = app
            .post(
                &admin,
                "/v1/agents",
                &spec(visibility, read_only, acknowledged),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "{visibility} {read_only}: {body}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn a_private_agent_is_seen_and_used_only_by_who_writes_agents() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let private = app
        .create_agent(
            "acme",
            &json!({"name": "ops-only", "model": "demo", "visibility": "private"}),
        )
        .await;
    let alice = token("alice", "acme");
    let (_, list) = app.get(&alice, "/v1/agents").await;
    assert_eq!(list["agents"], json!([]), "{list}");
    let (status, _) = app.get(&alice, &format!("/v1/agents/{private}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app.get(&alice, &format!("/v1/models/{private}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = app
        .post(&alice, "/v1/threads", &json!({"agent_id": private}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = app
        .post(
            &alice,
            &format!("/v1/threads/{}/user_message", Uuid::new_v4()),
            &json!({"input_text": "hi", "agent_id": private}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "agent_not_found");
    // The OpenAI-compatible routes resolve `model` as the rest do: by id or by name, a private
    // agent is no model of hers, and `GET /v1/models` does not list it.
    let (_, models) = app.get(&alice, "/v1/models").await;
    assert!(
        !models.to_string().contains(&private.to_string()),
        "{models}"
    );
    for model in [private.to_string(), "ops-only".to_owned()] {
        let (status, body) = app
            .post(
                &alice,
                "/v1/responses",
                &json!({"model": model, "input": "hi"}),
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{model}: {body}");
        assert_eq!(body["error"]["code"], "model_not_found", "{body}");
        let (status, body) = app
            .post(
                &alice,
                "/v1/chat/completions",
                &json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{model}: {body}");
        assert_eq!(body["error"]["code"], "model_not_found", "{body}");
    }
    // Writing agents (not only `admin`) is what lets one see it.
    let writer =
        spool_tests::token_with_permissions("wendy", "acme", &["agents:read", "agents:write"]);
    let (status, _) = app.get(&writer, &format!("/v1/models/{private}")).await;
    assert_eq!(status, StatusCode::OK);
    let admin = spool_tests::token_with("ops", "acme", true, 3600, spool_tests::JWT_SECRET);
    let (_, list) = app.get(&admin, "/v1/agents").await;
    assert_eq!(list["agents"].as_array().map(Vec::len), Some(1));
    let (status, _) = app.get(&admin, &format!("/v1/agents/{private}")).await;
    assert_eq!(status, StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn each_client_address_is_held_to_the_agents_ip_governance() {
    let app = TestApp::start(1, worker_args(1, 0)).await;
    let public = app
        .create_agent(
            "acme",
            &json!({"name": "greeter", "model": "demo", "visibility": "public",
                "governance": {"ip": {"runs_per_hour": 1}}}),
        )
        .await;
    // The tests' API trusts loopback as a proxy (SPOOL_TRUSTED_PROXIES=127.0.0.0/8), so
    // `X-Forwarded-For` names the client.
    let open = |client: &'static str| {
        app.http
            .post(app.url(&format!("/v1/public/agents/{public}/sessions")))
            .header("X-Forwarded-For", client)
            .send()
    };
    let response = open("203.0.113.1").await.expect("session");
    assert_eq!(response.status(), StatusCode::CREATED);
    let first: Value = response.json().await.expect("json");
    // A second session from the same address within the hour: refused.
    let response = open("203.0.113.1").await.expect("session");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(response.headers().contains_key("retry-after"));
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert_eq!(body["error"]["scope"], "ip", "{body}");
    let response = open("203.0.113.2").await.expect("session");
    assert_eq!(response.status(), StatusCode::CREATED, "another address");
    let second: Value = response.json().await.expect("json");

    let send = |token: Value, client: &'static str| {
        app.http
            .post(app.url(&format!("/v1/threads/{}/user_message", Uuid::new_v4())))
            .bearer_auth(token.as_str().expect("token"))
            .header("X-Forwarded-For", client)
            .json(&json!({"input_text": "hello"}))
            .send()
    };
    let response = send(first["token"].clone(), "203.0.113.1")
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    // The address's hourly run is spent, whichever session sends from it.
    let response = send(second["token"].clone(), "203.0.113.1")
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert_eq!(body["error"]["scope"], "ip", "{body}");
    let response = send(second["token"].clone(), "203.0.113.2")
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::ACCEPTED, "its own address");
    // Ordinary users are not counted per address.
    for _ in 0..2 {
        let (status, body) = app
            .post(
                &token("alice", "acme"),
                &format!("/v1/threads/{}/user_message", Uuid::new_v4()),
                &json!({"input_text": "hi", "agent_id": public}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    app.stop().await;
}
