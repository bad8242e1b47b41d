//! Tools as resources (`/v1/tools`, DESIGN section 12): `tools:write` to write, `agents:read` to
//! read, validation by field, write-only header values, agents that reference tools by id
//! (collisions refused on either side, a tool in use never deleted) and runs that offer the
//! enabled ones as they were at enqueue.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm};
use spool_tests::token;

use crate::agents::admin;
use crate::common::{TestApp, app_with, ask, finished, worker_args};

const SECRET: &str = "s3cret-tool-key-4242";

impl TestApp {
    async fn create_tool(&self, tenant: &str, tool: &Value) -> String {
        let (status, created) = self.post(&admin(tenant), "/v1/tools", tool).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        created["id"].as_str().expect("id").to_owned()
    }
}

fn http_tool(name: &str) -> Value {
    json!({"type": "http", "name": name, "description": "Looks things up.",
        "url": "https://tools.example.com/lookup", "headers": {"X-Key": SECRET},
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}})
}

#[tokio::test]
async fn tools_are_created_read_listed_changed_and_deleted_and_never_show_their_secrets() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let root = admin("acme");
    let mut seen = Vec::new();

    let (status, body) = app.post(&alice, "/v1/tools", &http_tool("lookup")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["error"]["permission"], "tools:write");
    assert_eq!(app.db.count("tools").await, 0);

    let (status, created) = app.post(&root, "/v1/tools", &http_tool("lookup")).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["headers"]["X-Key"], "<redacted>");
    assert_eq!(created["enabled"], true, "enabled unless it says otherwise");
    assert_eq!(
        created["method"], "POST",
        "the kind's defaults are filled in"
    );
    seen.push(created.clone());
    let id = created["id"].as_str().expect("id").to_owned();

    let (status, again) = app.post(&root, "/v1/tools", &http_tool("lookup")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(again["error"]["code"], "name_taken");

    // Reading needs `agents:read` only, which a token without a permissions claim holds.
    let (status, read) = app.get(&alice, &format!("/v1/tools/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read["name"], "lookup");
    seen.push(read.clone());
    app.create_tool("acme", &json!({"type": "client", "name": "pick"}))
        .await;
    let (status, page) = app.get(&alice, "/v1/tools?limit=1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["data"][0]["name"], "pick", "newest first");
    let cursor = page["next_cursor"].as_str().expect("a second page");
    let (_, rest) = app.get(&alice, &format!("/v1/tools?cursor={cursor}")).await;
    assert_eq!(rest["data"][0]["name"], "lookup");
    assert!(rest["next_cursor"].is_null());
    seen.push(rest.clone());

    // What was read writes back as it is: the secret is kept.
    let mut written = read.clone();
    for added in ["id", "created_at", "updated_at"] {
        written.as_object_mut().expect("object").remove(added);
    }
    written["description"] = json!("Looks up more.");
    let (status, put) = app
        .send(
            Method::PUT,
            &root,
            &format!("/v1/tools/{id}"),
            Some(&written),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{put}");
    assert_eq!(put["description"], "Looks up more.");
    seen.push(put.clone());
    let (status, patched) = app
        .send(
            Method::PATCH,
            &root,
            &format!("/v1/tools/{id}"),
            Some(&json!({"enabled": false, "read_only": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(
        (&patched["enabled"], &patched["read_only"]),
        (&json!(false), &json!(true))
    );
    assert_eq!(patched["description"], "Looks up more.");
    seen.push(patched.clone());
    let stored: (Value,) = sqlx::query_as("SELECT spec FROM tools WHERE id = $1::uuid")
        .bind(&id)
        .fetch_one(&app.db.pool)
        .await
        .expect("row");
    assert_eq!(stored.0["headers"]["X-Key"], SECRET, "the secret is kept");

    // Pointed elsewhere, the secret must be sent again.
    let (status, moved) = app
        .send(
            Method::PATCH,
            &root,
            &format!("/v1/tools/{id}"),
            Some(&json!({"url": "https://elsewhere.example/steal"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(moved["error"]["code"], "secret_needs_reentry");
    assert_eq!(moved["error"]["errors"][0]["field"], "headers.X-Key");
    seen.push(moved);

    // Another tenant's ids are no tools at all.
    let other = admin("globex");
    let path = format!("/v1/tools/{id}");
    for method in [Method::GET, Method::PUT, Method::PATCH, Method::DELETE] {
        let body = (method == Method::PUT).then(|| json!({"type": "client", "name": "x"}));
        let body = body.or_else(|| (method == Method::PATCH).then(|| json!({"enabled": true})));
        let (status, answer) = app.send(method.clone(), &other, &path, body.as_ref()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {answer}");
        assert_eq!(answer["error"]["code"], "tool_not_found");
    }
    let (_, theirs) = app.get(&other, "/v1/tools").await;
    assert_eq!(theirs["data"], json!([]));

    let (status, _) = app.send(Method::DELETE, &root, &path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = app.get(&alice, &path).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for answer in seen {
        assert!(!answer.to_string().contains(SECRET), "{answer}");
    }
}

#[tokio::test]
async fn a_tool_that_fails_validation_is_a_422_listing_every_problem_by_field() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let (status, body) = app
        .post(
            &admin("acme"),
            "/v1/tools",
            &json!({"type": "http", "name": "bad name", "url": "ftp://x",
                "method": "TRACE", "parameters": {"type": 12}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["code"], "invalid_tool");
    let fields: Vec<&str> = body["error"]["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| e["field"].as_str().expect("field"))
        .collect();
    for field in ["name", "url", "method", "parameters"] {
        assert!(fields.contains(&field), "{field} in {fields:?}");
    }
    let (status, body) = app
        .post(
            &admin("acme"),
            "/v1/tools",
            &json!({"type": "agent", "name": "helper",
                "agent_id": "0190b9c4-0000-7000-8000-000000000000"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["errors"][0]["field"], "agent_id");
    let (status, body) = app
        .post(
            &admin("acme"),
            "/v1/tools",
            &json!({"type": "client", "name": "x", "surprise": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["code"], "invalid_body");
    assert_eq!(app.db.count("tools").await, 0, "nothing is stored");
}

#[tokio::test]
async fn agents_reference_tools_and_collisions_are_refused_on_either_side() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let lookup = app.create_tool("acme", &http_tool("lookup")).await;
    let theirs = app.create_tool("globex", &http_tool("lookup")).await;

    // A name taken twice, a tool of another tenant, one referenced twice, `read_only` on a
    // tool that has none: every problem at once, by reference.
    let pick = app
        .create_tool("acme", &json!({"type": "client", "name": "pick"}))
        .await;
    let (status, body) = app
        .post(
            &root,
            "/v1/agents",
            &json!({"name": "a", "model": "demo",
                "tools": [{"type": "client", "name": "lookup"}],
                "tool_ids": [lookup, theirs, {"tool_id": pick, "read_only": true}, pick]}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "invalid_agent");
    let fields: Vec<&str> = body["error"]["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| e["field"].as_str().expect("field"))
        .collect();
    for field in [
        "tool_ids[0].name",
        "tool_ids[1].tool_id",
        "tool_ids[2].read_only",
        "tool_ids[3].tool_id",
    ] {
        assert!(fields.contains(&field), "{field} in {fields:?}");
    }
    assert_eq!(app.db.count("agents").await, 0);

    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "support", "model": "demo",
                "tools": [{"type": "client", "name": "ask_user"}],
                "tool_ids": [lookup, {"tool_id": pick, "requires_approval": true}]}),
        )
        .await;
    let (_, read) = app.get(&root, &format!("/v1/agents/{agent}")).await;
    assert_eq!(
        read["tool_ids"],
        json!([{"tool_id": lookup}, {"tool_id": pick, "requires_approval": true}]),
        "references read back in one form"
    );

    // A change of the tool that would make the agent offer two tools of one name.
    let (status, body) = app
        .send(
            Method::PATCH,
            &root,
            &format!("/v1/tools/{pick}"),
            Some(&json!({"name": "ask_user"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "tool_conflict");
    let message = body["error"]["errors"][0]["message"]
        .as_str()
        .expect("message");
    assert!(
        message.contains("support") && message.contains(&agent),
        "{message}"
    );
    let (_, unchanged) = app.get(&root, &format!("/v1/tools/{pick}")).await;
    assert_eq!(unchanged["name"], "pick");

    // In use: not deleted, and the answer names who uses it.
    let (status, body) = app
        .send(Method::DELETE, &root, &format!("/v1/tools/{lookup}"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "tool_in_use");
    assert_eq!(body["error"]["agents"][0]["id"], agent.as_str());
    let (status, _) = app
        .send(
            Method::PUT,
            &root,
            &format!("/v1/agents/{agent}"),
            Some(&json!({"name": "support", "model": "demo", "tool_ids": [pick]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app
        .send(Method::DELETE, &root, &format!("/v1/tools/{lookup}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn a_run_offers_the_enabled_tools_it_references_as_they_were_at_enqueue() {
    // The model calls the client tool `pick` when it is offered tools, then answers once its
    // output arrives.
    let fake = FakeLlm::start(|request, _| {
        let tools = request["tools"].as_array().is_some_and(|t| !t.is_empty());
        if tools && fake_llm::tool_results_in(request) == 0 {
            fake_llm::tool_calls(&[("c1", "pick", "{}")])
        } else {
            fake_llm::text("done", 1)
        }
    })
    .await;
    let app = app_with(&fake).await;
    let alice = token("alice", "acme");
    let root = admin("acme");
    let pick = app
        .create_tool(
            "acme",
            &json!({"type": "client", "name": "pick", "requires_approval": true}),
        )
        .await;
    let hidden = app
        .create_tool(
            "acme",
            &json!({"type": "client", "name": "hidden", "enabled": false}),
        )
        .await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "picker", "model": "gpt-4o-mini",
                "tool_ids": [{"tool_id": pick, "requires_approval": false}, hidden]}),
        )
        .await;
    let (_, accepted) = ask(&app, &agent, "pick one").await;
    let workflow = accepted["workflow_id"].as_str().expect("id");
    // The reference's `requires_approval: false` wins: the call waits for its output, not for
    // an approval.
    app.wait_for_status(&alice, workflow, "requires_action")
        .await;

    // Renamed and disabled meanwhile: the run goes on with the tools of its enqueue.
    let (status, body) = app
        .send(
            Method::PATCH,
            &root,
            &format!("/v1/tools/{pick}"),
            Some(&json!({"name": "choose", "enabled": false})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = app
        .post(
            &alice,
            &format!("/v1/workflows/{workflow}/tool_outputs"),
            &json!({"tool_outputs": [{"tool_call_id": "c1", "output": "the blue one"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let completed = finished(&app, &accepted).await;
    assert_eq!(completed["status"], "completed", "{completed}");

    let offered = |request: &Value| -> Vec<String> {
        request["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| t["function"]["name"].as_str().expect("name").to_owned())
            .collect()
    };
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_eq!(offered(request), ["pick"], "never `hidden`, never `choose`");
    }

    // A run enqueued now does without the disabled tool.
    let (_, accepted) = ask(&app, &agent, "again").await;
    let completed = finished(&app, &accepted).await;
    assert_eq!(completed["status"], "completed", "{completed}");
    let last = fake.requests().pop().expect("a request");
    assert!(offered(&last).is_empty(), "{:?}", offered(&last));
}
