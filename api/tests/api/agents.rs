//! The Agents API: admin-only writes, validation by field path, tenant isolation.

use reqwest::StatusCode;
use serde_json::{Value, json};

use spool_tests::{JWT_SECRET, token, token_with};

use crate::common::{TestApp, worker_args};

pub(crate) fn admin(tenant: &str) -> String {
    token_with("root", tenant, true, 3600, JWT_SECRET)
}

impl TestApp {
    pub(crate) async fn send(
        &self,
        method: reqwest::Method,
        token: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, self.url(path)).bearer_auth(token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.expect("request");
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn create_agent(&self, tenant: &str, spec: &Value) -> String {
        let (status, agent) = self.post(&admin(tenant), "/v1/agents", spec).await;
        assert_eq!(status, StatusCode::CREATED, "{agent}");
        agent["id"].as_str().expect("id").to_owned()
    }
}

#[tokio::test]
async fn agents_are_created_read_listed_replaced_and_deleted_by_admins() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let spec = json!({"name": "support", "instructions": "Be brief.", "model": "demo",
        "tools": [{"type": "http", "name": "lookup", "url": "https://tools.example.com/lookup",
                   "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]});
    let user = token("alice", "acme");
    let (status, body) = app.post(&user, "/v1/agents", &spec).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["error"]["code"], "forbidden");
    assert_eq!(body["error"]["permission"], "agents:write");
    assert_eq!(app.db.count("agents").await, 0);

    let id = app.create_agent("acme", &spec).await;
    let (status, read) = app.get(&user, &format!("/v1/agents/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read["name"], "support");
    assert_eq!(read["max_steps"], 25, "defaults are filled in");
    assert_eq!(read["tools"][0]["method"], "POST");
    assert!(read["created_at"].is_string());
    let (_, list) = app.get(&user, "/v1/agents").await;
    assert_eq!(list["agents"].as_array().map(Vec::len), Some(1));

    let mut changed = spec.clone();
    changed["instructions"] = json!("Be thorough.");
    let (status, _) = app
        .send(
            reqwest::Method::PUT,
            &user,
            &format!("/v1/agents/{id}"),
            Some(&changed),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, put) = app
        .send(
            reqwest::Method::PUT,
            &admin("acme"),
            &format!("/v1/agents/{id}"),
            Some(&changed),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(put["instructions"], "Be thorough.");

    // Another tenant, even an admin, cannot see or touch it.
    let (status, _) = app.get(&admin("other"), &format!("/v1/agents/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app
        .send(
            reqwest::Method::DELETE,
            &admin("other"),
            &format!("/v1/agents/{id}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, _) = app
        .send(
            reqwest::Method::DELETE,
            &admin("acme"),
            &format!("/v1/agents/{id}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = app.get(&user, &format!("/v1/agents/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.stop().await;
}

#[tokio::test]
async fn an_invalid_agent_is_refused_with_every_problem_named_by_field() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let spec = json!({"name": "bad", "model": "demo", "max_steps": 500, "tool_choice": "ghost",
        "tools": [
            {"type": "http", "name": "dup", "url": "http://", "parameters": {"type": 12}},
            {"type": "client", "name": "dup"},
            {"type": "mcp", "name": "gh", "url": "https://mcp.example.com/mcp"},
            {"type": "http", "name": "gh_search", "url": "https://x.example.com"}],
        "response_format": {"type": "json_schema", "schema": {"type": "banana"}},
        "provider": "ghost", "fallback_models": [""], "context_window_tokens": 10});
    let (status, body) = app.post(&admin("acme"), "/v1/agents", &spec).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["code"], "invalid_agent");
    let fields: Vec<&str> = body["error"]["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|e| e["field"].as_str())
        .collect();
    for field in [
        "max_steps",
        "tool_choice",
        "tools[0].url",
        "tools[0].parameters",
        "tools[1].name",
        "tools[3].name",
        "response_format.schema",
        "provider",
        "fallback_models[0]",
        "context_window_tokens",
    ] {
        assert!(fields.contains(&field), "{field} not in {fields:?}");
    }
    let (status, body) = app
        .post(&admin("acme"), "/v1/agents", &json!({"name": "x"}))
        .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a missing model is named: {body}"
    );
    // Named by field: `model` may be left out only for a provider's `default_model`.
    assert_eq!(body["error"]["code"], "invalid_agent", "{body}");
    assert_eq!(body["error"]["errors"][0]["field"], "model", "{body}");
    assert_eq!(app.db.count("agents").await, 0);
    app.stop().await;
}

#[tokio::test]
async fn a_thread_created_with_an_agent_is_answered_by_it() {
    let app = TestApp::start(1, worker_args(2, 0)).await;
    let agent = app
        .create_agent("acme", &json!({"name": "demo", "model": "demo"}))
        .await;
    let alice = token("alice", "acme");
    let (status, thread) = app
        .post(&alice, "/v1/threads", &json!({"agent_id": agent}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(thread["agent_id"], agent.as_str());
    let thread_id = thread["id"].as_str().expect("id");
    let (status, accepted) = app
        .post(
            &alice,
            &format!("/v1/threads/{thread_id}/user_message"),
            &json!({"input_text": "hi"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let run = crate::common::finished(&app, &accepted).await;
    assert_eq!(run["status"], "completed");
    assert_eq!(
        run["agent_id"],
        agent.as_str(),
        "the thread's agent answered"
    );
    app.stop().await;
}

#[tokio::test]
async fn header_values_are_write_only_and_writing_back_what_was_read_keeps_them() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let spec = json!({"name": "keys", "model": "demo",
        "tools": [
            {"type": "http", "name": "lookup", "url": "https://tools.example.com/lookup",
             "headers": {"X-Api-Key": "sesame"}},
            {"type": "mcp", "name": "gh", "url": "https://mcp.example.com/mcp",
             "headers": {"Authorization": "Bearer ghp_secret"}}],
        "hooks": [{"event": "on_run_start", "type": "http", "url": "https://hooks.example.com",
                   "headers": {"X-Hook-Token": "hook-secret"}}]});
    let id = app.create_agent("acme", &spec).await;
    let stored_spec = || async {
        let (spec,): (Value,) = sqlx::query_as("SELECT spec FROM agents")
            .fetch_one(&app.db.pool)
            .await
            .expect("stored");
        spec
    };
    let secrets = ["sesame", "ghp_secret", "hook-secret"];
    let reads = [
        app.get(&token("alice", "acme"), &format!("/v1/agents/{id}"))
            .await,
        app.get(&token("alice", "acme"), "/v1/agents").await,
        app.get(&admin("acme"), &format!("/v1/agents/{id}")).await,
    ];
    for (status, body) in &reads {
        assert_eq!(*status, StatusCode::OK);
        let text = body.to_string();
        for secret in secrets {
            assert!(!text.contains(secret), "{secret} was shown: {text}");
        }
    }
    let read = reads[2].1.clone();
    assert_eq!(read["tools"][0]["headers"]["X-Api-Key"], "<redacted>");
    assert_eq!(read["hooks"][0]["headers"]["X-Hook-Token"], "<redacted>");

    // The client changes the instructions and writes back what it read.
    let mut written = read.clone();
    for field in ["id", "created_at", "updated_at"] {
        written.as_object_mut().expect("object").remove(field);
    }
    written["instructions"] = json!("Be brief.");
    written["tools"][0]["headers"]["X-Extra"] = json!("new-value");
    let (status, body) = app
        .send(
            reqwest::Method::PUT,
            &admin("acme"),
            &format!("/v1/agents/{id}"),
            Some(&written),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let stored = stored_spec().await;
    assert_eq!(stored["instructions"], "Be brief.");
    assert_eq!(stored["tools"][0]["headers"]["X-Api-Key"], "sesame");
    assert_eq!(stored["tools"][0]["headers"]["X-Extra"], "new-value");
    assert_eq!(
        stored["tools"][1]["headers"]["Authorization"],
        "Bearer ghp_secret"
    );
    assert_eq!(stored["hooks"][0]["headers"]["X-Hook-Token"], "hook-secret");

    // `<redacted>` where nothing is stored is refused, and nothing is created.
    let mut copy = written.clone();
    copy["name"] = json!("copy");
    let (status, body) = app.post(&admin("acme"), "/v1/agents", &copy).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["code"], "secret_needs_reentry");
    assert!(
        body["error"]["errors"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["field"] == "tools[0].headers.X-Api-Key")),
        "{body}"
    );
    assert_eq!(app.db.count("agents").await, 1);

    // Pointing a tool or a hook elsewhere with the secret as read: refused, nothing changed.
    let before = stored_spec().await;
    let moved = |edit: &dyn Fn(&mut Value)| {
        let mut moved = written.clone();
        edit(&mut moved);
        moved
    };
    let attempts = [
        moved(&|w| w["tools"][0]["url"] = json!("https://attacker.example/lookup")),
        moved(&|w| w["tools"][1]["url"] = json!("https://mcp.example.com:8443/mcp")),
        moved(&|w| w["hooks"][0]["url"] = json!("http://hooks.example.com")),
    ];
    let fields = [
        "tools[0].headers.X-Api-Key",
        "tools[1].headers.Authorization",
        "hooks[0].headers.X-Hook-Token",
    ];
    for (attempt, field) in attempts.iter().zip(fields) {
        let (status, body) = app
            .send(
                reqwest::Method::PUT,
                &admin("acme"),
                &format!("/v1/agents/{id}"),
                Some(attempt),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["error"]["code"], "secret_needs_reentry", "{body}");
        assert!(
            body["error"]["errors"]
                .as_array()
                .is_some_and(|e| e.iter().any(|e| e["field"] == field)),
            "{body}"
        );
        assert_eq!(stored_spec().await, before);
    }
    // Resent with the new URL, the new value is stored.
    let mut resent = attempts[0].clone();
    resent["tools"][0]["headers"]["X-Api-Key"] = json!("new-key");
    let (status, body) = app
        .send(
            reqwest::Method::PUT,
            &admin("acme"),
            &format!("/v1/agents/{id}"),
            Some(&resent),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        stored_spec().await["tools"][0]["headers"]["X-Api-Key"],
        "new-key"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_run_executes_its_agent_as_it_was_when_the_run_was_enqueued() {
    let fake =
        spool_tests::fake_llm::FakeLlm::start(|_, _| spool_tests::fake_llm::text("done", 1)).await;
    // No worker until both runs are enqueued and the agent has changed, then was deleted.
    let args = crate::common::worker_args_with(1, 0, &["--llm-base-url", &fake.base_url]);
    let mut app = TestApp::start(0, args.clone()).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "v", "model": "gpt-4o-mini", "instructions": "Version A."}),
        )
        .await;
    let (_, first) = crate::common::ask(&app, &agent, "first").await;
    let (status, _) = app
        .send(
            reqwest::Method::PUT,
            &admin("acme"),
            &format!("/v1/agents/{agent}"),
            Some(&json!({"name": "v", "model": "gpt-4o-mini", "instructions": "Version B."})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, second) = crate::common::ask(&app, &agent, "second").await;
    let (status, _) = app
        .send(
            reqwest::Method::DELETE,
            &admin("acme"),
            &format!("/v1/agents/{agent}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    app.restart_workers(1, args).await;
    for accepted in [&first, &second] {
        let run = crate::common::finished(&app, accepted).await;
        assert_eq!(run["status"], "completed", "{run}");
    }
    let instructions: Vec<(String, String)> = fake
        .requests()
        .iter()
        .map(|r| {
            let messages = r["messages"].as_array().cloned().unwrap_or_default();
            let system = messages[0]["content"].as_str().unwrap_or("").to_owned();
            let user = messages
                .last()
                .and_then(|m| m["content"].as_str())
                .unwrap_or("")
                .to_owned();
            (user, system)
        })
        .collect();
    assert!(
        instructions.contains(&("first".into(), "Version A.".into())),
        "{instructions:?}"
    );
    assert!(
        instructions.contains(&("second".into(), "Version B.".into())),
        "{instructions:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_disabled_agent_refuses_new_runs_and_its_queued_ones_finish() {
    let args = crate::common::worker_args(1, 0);
    let mut app = TestApp::start(0, args.clone()).await;
    let spec = json!({"name": "pausable", "model": "demo"});
    let agent = app.create_agent("acme", &spec).await;
    let (thread, queued) = crate::common::ask(&app, &agent, "before").await;
    let path = format!("/v1/agents/{agent}");
    let mut disabled = spec.clone();
    disabled["status"] = json!("disabled");
    let (status, body) = app
        .send(reqwest::Method::PUT, &admin("acme"), &path, Some(&disabled))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "disabled");
    let (status, bad) = app
        .send(
            reqwest::Method::PUT,
            &admin("acme"),
            &path,
            Some(&json!({"name": "x", "model": "demo", "status": "asleep"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");

    // A new message naming it, and one to a new thread that it answers: both refused, and
    // nothing is stored for them.
    let alice = token("alice", "acme");
    let runs_before = app.get(&alice, "/v1/workflows").await.1["data"].clone();
    let (status, refused) = app
        .post(
            &alice,
            &format!("/v1/threads/{}/user_message", uuid::Uuid::new_v4()),
            &json!({"input_text": "after", "agent_id": agent}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(refused["error"]["code"], "agent_disabled");
    let (_, runs_after) = app.get(&alice, "/v1/workflows").await;
    assert_eq!(runs_after["data"], runs_before, "nothing created");

    app.restart_workers(1, args).await;
    let run = crate::common::finished(&app, &queued).await;
    assert_eq!(
        run["status"], "completed",
        "the run enqueued before finishes"
    );
    let (status, refused) = app.send_message(&alice, thread, "its thread's agent").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(refused["error"]["code"], "agent_disabled");

    // Enabled again, it answers.
    let (status, _) = app
        .send(reqwest::Method::PUT, &admin("acme"), &path, Some(&spec))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app.send_message(&alice, thread, "again").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    app.stop().await;
}

#[tokio::test]
async fn limits_outside_their_ranges_are_refused_each_by_name() {
    let app = TestApp::start(0, crate::common::worker_args(1, 0)).await;
    let spec = json!({"name": "x", "model": "demo", "limits": {"max_steps": 201,
        "max_tool_calls": 501, "max_parallel_tools": 0, "timeout_secs": 4,
        "max_output_tokens": 0, "human_timeout_secs": 0}});
    let (status, body) = app.post(&admin("acme"), "/v1/agents", &spec).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "invalid_agent");
    let fields: Vec<&str> = body["error"]["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|e| e["field"].as_str())
        .collect();
    for field in [
        "limits.max_steps",
        "limits.max_tool_calls",
        "limits.max_parallel_tools",
        "limits.timeout_secs",
        "limits.max_output_tokens",
        "limits.human_timeout_secs",
    ] {
        assert!(fields.contains(&field), "{field} in {fields:?}");
    }
    let (status, body) = app
        .post(
            &admin("acme"),
            "/v1/agents",
            &json!({"name": "x", "model": "demo", "limits": {"max_steps": 200,
                "max_tool_calls": 0, "max_parallel_tools": 16, "timeout_secs": 5}}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the bounds themselves are fine: {body}"
    );
    app.stop().await;
}

/// The fields of a validation report's or an `invalid_agent` error's `errors`.
pub(crate) fn error_fields(errors: &Value) -> Vec<String> {
    errors
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|e| e["field"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn validate_reports_every_problem_by_field_path_and_stores_nothing() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let good = json!({"name": "ok", "model": "demo", "tools": [{"type": "http", "name": "lookup",
        "url": "https://tools.example.com/lookup", "headers": {"X-Key": "sesame"}}]});
    let (status, report) = app.post(&root, "/v1/agents/validate", &good).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["valid"], true);
    assert_eq!(report["errors"], json!([]));
    assert_eq!(
        report["agent"]["max_steps"], 25,
        "the agent as it would be stored"
    );
    assert_eq!(
        report["agent"]["tools"][0]["headers"]["X-Key"],
        "<redacted>"
    );

    let bad = json!({"name": "", "model": "demo", "max_steps": 0,
        "tools": [{"type": "http", "name": "a b", "url": "ftp://x"}]});
    let (status, report) = app.post(&root, "/v1/agents/validate", &bad).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["valid"], false);
    let fields = error_fields(&report["errors"]);
    for field in ["name", "max_steps", "tools[0].name", "tools[0].url"] {
        assert!(
            fields.contains(&field.to_owned()),
            "{field} not in {fields:?}"
        );
    }
    // A problem of the body's shape is named by its path too.
    let shape = json!({"name": "x", "model": "demo", "tools": [{"type": "http", "name": "t",
        "url": "https://t.example", "read_only": "yes"}]});
    let (status, report) = app.post(&root, "/v1/agents/validate", &shape).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["valid"], false);
    assert!(
        report["errors"][0]["field"]
            .as_str()
            .is_some_and(|f| f.starts_with("tools[0]")),
        "{report}"
    );
    let (status, report) = app
        .post(
            &root,
            "/v1/agents/validate",
            &json!({"name": "x", "model": "demo", "colour": 1}),
        )
        .await;
    assert_eq!(
        (status, report["valid"].clone()),
        (StatusCode::OK, json!(false)),
        "{report}"
    );

    let (status, body) = app
        .post(&token("alice", "acme"), "/v1/agents/validate", &good)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(app.db.count("agents").await, 0, "nothing is stored");
    app.stop().await;
}

#[tokio::test]
async fn a_dry_run_validates_a_write_and_stores_nothing() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let spec = json!({"name": "dry", "model": "demo"});
    let (status, report) = app.post(&root, "/v1/agents?dry_run=true", &spec).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["valid"], true);
    assert_eq!(app.db.count("agents").await, 0);
    let (status, body) = app
        .post(
            &root,
            "/v1/agents?dry_run=true",
            &json!({"name": "dry", "model": "", "max_steps": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["code"], "invalid_agent");
    assert_eq!(
        error_fields(&body["error"]["errors"]),
        ["model", "max_steps"]
    );
    assert_eq!(app.db.count("agents").await, 0);

    let id = app.create_agent("acme", &spec).await;
    let path = format!("/v1/agents/{id}");
    let (_, before) = app.get(&root, &path).await;
    let changed = json!({"name": "wet", "model": "demo", "instructions": "Changed."});
    for (method, body) in [
        (reqwest::Method::PUT, changed.clone()),
        (reqwest::Method::PATCH, json!({"instructions": "Changed."})),
    ] {
        let (status, report) = app
            .send(
                method.clone(),
                &root,
                &format!("{path}?dry_run=true"),
                Some(&body),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{method}: {report}");
        assert_eq!(report["valid"], true, "{method}: {report}");
        let (_, after) = app.get(&root, &path).await;
        assert_eq!(after, before, "{method} ?dry_run=true changed nothing");
        let (status, body) = app
            .send(
                method.clone(),
                &root,
                &format!("{path}?dry_run=true"),
                Some(&json!({"name": "wet", "model": "demo", "max_steps": 999})),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{method}: {body}");
        assert_eq!(error_fields(&body["error"]["errors"]), ["max_steps"]);
    }
    app.stop().await;
}

#[tokio::test]
async fn patch_replaces_only_the_fields_sent_and_null_restores_a_default() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let spec = json!({"name": "p", "model": "demo", "instructions": "A.", "max_steps": 7,
        "limits": {"max_tool_calls": 3, "timeout_secs": 60},
        "tools": [{"type": "http", "name": "lookup", "url": "https://tools.example.com/lookup",
                   "headers": {"X-Key": "sesame"}}]});
    let id = app.create_agent("acme", &spec).await;
    let path = format!("/v1/agents/{id}");
    let patch = |body: Value| {
        let path = path.clone();
        let root = root.clone();
        let app = &app;
        async move {
            app.send(reqwest::Method::PATCH, &root, &path, Some(&body))
                .await
        }
    };
    let (status, agent) =
        patch(json!({"instructions": "B.", "limits": {"max_tool_calls": 9}})).await;
    assert_eq!(status, StatusCode::OK, "{agent}");
    assert_eq!(agent["instructions"], "B.");
    assert_eq!(agent["max_steps"], 7, "not sent, kept");
    assert_eq!(
        agent["limits"],
        json!({"max_tool_calls": 9}),
        "sent whole, replaced whole"
    );
    let stored: (Value,) = sqlx::query_as("SELECT spec FROM agents")
        .fetch_one(&app.db.pool)
        .await
        .expect("stored");
    assert_eq!(
        stored.0["tools"][0]["headers"]["X-Key"], "sesame",
        "a secret not sent is kept"
    );

    let (status, agent) = patch(json!({"max_steps": null, "limits": null})).await;
    assert_eq!(status, StatusCode::OK, "{agent}");
    assert_eq!(agent["max_steps"], 25, "null restores the default");
    assert!(agent.get("limits").is_none(), "{agent}");

    // Tools sent back as read keep their secrets; pointed elsewhere, they must be resent.
    let (_, read) = app.get(&root, &path).await;
    let tools = read["tools"].clone();
    let (status, agent) = patch(json!({"tools": tools})).await;
    assert_eq!(status, StatusCode::OK, "{agent}");
    let mut moved = read["tools"].clone();
    moved[0]["url"] = json!("https://attacker.example/lookup");
    let (status, body) = patch(json!({"tools": moved})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["code"], "secret_needs_reentry", "{body}");
    let stored: (Value,) = sqlx::query_as("SELECT spec FROM agents")
        .fetch_one(&app.db.pool)
        .await
        .expect("stored");
    assert_eq!(stored.0["tools"][0]["headers"]["X-Key"], "sesame");

    let (status, body) = patch(json!({"kind": "graph"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "invalid_agent");
    assert_eq!(error_fields(&body["error"]["errors"]), ["kind"]);
    let (status, body) = patch(json!({"max_steps": "many"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "invalid_body");
    let (status, _) = app
        .send(
            reqwest::Method::PATCH,
            &admin("other"),
            &path,
            Some(&json!({"instructions": "C."})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app
        .send(
            reqwest::Method::PATCH,
            &token("alice", "acme"),
            &path,
            Some(&json!({"instructions": "C."})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    app.stop().await;
}

#[tokio::test]
async fn a_run_keeps_its_snapshot_when_its_agent_is_patched() {
    let fake =
        spool_tests::fake_llm::FakeLlm::start(|_, _| spool_tests::fake_llm::text("done", 1)).await;
    let args = crate::common::worker_args_with(1, 0, &["--llm-base-url", &fake.base_url]);
    let mut app = TestApp::start(0, args.clone()).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "v", "model": "gpt-4o-mini", "instructions": "Version A."}),
        )
        .await;
    let (_, queued) = crate::common::ask(&app, &agent, "first").await;
    let (status, _) = app
        .send(
            reqwest::Method::PATCH,
            &admin("acme"),
            &format!("/v1/agents/{agent}"),
            Some(&json!({"instructions": "Version B."})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    app.restart_workers(1, args).await;
    let run = crate::common::finished(&app, &queued).await;
    assert_eq!(run["status"], "completed", "{run}");
    let systems: Vec<String> = fake
        .requests()
        .iter()
        .filter_map(|r| r["messages"][0]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(systems, ["Version A."]);
    app.stop().await;
}
