//! API keys (docs/security.md "API keys"): the key is shown once and stored only hashed, the
//! list never shows it, the key acts as `apikey:<id>` of its tenant with exactly its
//! permissions, a creator cannot give a key a permission it lacks, other tenants' key ids are
//! 404, and a revoked key is 401 `api_key_revoked`. (Revocation seen by a second API process:
//! tests/tests/e2e/auth.rs.)

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

use spool_tests::{JWT_SECRET, token_with, token_with_permissions};

use crate::common::{TestApp, worker_args};

fn admin(tenant: &str) -> String {
    token_with("root", tenant, true, 3600, JWT_SECRET)
}

/// The stored rows of the tenant's keys as text, every column.
async fn stored(app: &TestApp) -> String {
    let rows: Vec<(String,)> = sqlx::query_as("SELECT row_to_json(k)::text FROM api_keys k")
        .fetch_all(&app.db.pool)
        .await
        .expect("rows");
    rows.into_iter().map(|(row,)| row).collect()
}

#[tokio::test]
async fn a_key_is_shown_once_stored_hashed_and_acts_with_its_permissions_until_revoked() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let (status, created) = app
        .post(
            &root,
            "/v1/api_keys",
            &json!({"name": "billing sync", "permissions": ["runs:create", "agents:read"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let key = created["key"].as_str().expect("the key").to_owned();
    let id = created["id"].as_str().expect("id").to_owned();
    assert!(key.starts_with("spk_"), "{key}");
    assert_eq!(created["name"], "billing sync");
    assert_eq!(
        created["permissions"],
        json!(["agents:read", "runs:create"])
    );
    assert_eq!(created["user_id"], json!(format!("apikey:{id}")));
    assert_eq!(created["created_by"], "root");

    // Stored as its SHA-256 only.
    let rows = stored(&app).await;
    assert!(!rows.contains(&key), "{rows}");
    let (hashed,): (bool,) =
        sqlx::query_as("SELECT key_hash = sha256(convert_to($1, 'UTF8')) FROM api_keys")
            .bind(&key)
            .fetch_one(&app.db.pool)
            .await
            .expect("hash");
    assert!(hashed);

    // The key works as a bearer token, as the user `apikey:<id>` of acme.
    let thread = Uuid::new_v4();
    let (status, body) = app.send_message(&key, thread, "hi").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (owner,): (String,) = sqlx::query_as("SELECT owner_id FROM threads WHERE id = $1")
        .bind(thread)
        .fetch_one(&app.db.pool)
        .await
        .expect("thread");
    assert_eq!(owner, format!("apikey:{id}"));
    let (status, _) = app.get(&key, "/v1/agents").await;
    assert_eq!(status, StatusCode::OK);
    // Exactly its permissions: not usage, not keys.
    for path in ["/v1/usage", "/v1/api_keys"] {
        let (status, body) = app.get(&key, path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert_eq!(body["error"]["code"], "forbidden");
    }

    // Listed without the key, with when it was last used.
    let (status, list) = app.get(&root, "/v1/api_keys").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert!(!list.to_string().contains(&key), "{list}");
    let listed = &list["data"][0];
    assert_eq!(listed["id"], json!(id));
    assert!(listed.get("key").is_none(), "{listed}");
    assert!(listed["last_used_at"].is_string(), "{listed}");

    // Another tenant neither sees nor revokes it.
    let (status, list) = app.get(&admin("globex"), "/v1/api_keys").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["data"], json!([]));
    let path = format!("/v1/api_keys/{id}");
    let (status, body) = app
        .send(Method::DELETE, &admin("globex"), &path, None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "api_key_not_found");
    let (status, _) = app.get(&key, "/v1/agents").await;
    assert_eq!(status, StatusCode::OK, "still valid");

    // Revoked: refused at once with its own code, gone from the list, 404 a second time.
    let (status, _) = app.send(Method::DELETE, &root, &path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = app.get(&key, "/v1/agents").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["code"], "api_key_revoked");
    let (_, list) = app.get(&root, "/v1/api_keys").await;
    assert_eq!(list["data"], json!([]));
    let (status, _) = app.send(Method::DELETE, &root, &path, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A key no one made.
    let (status, body) = app.get("spk_not-a-key", "/v1/agents").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "invalid_token");
    app.stop().await;
}

#[tokio::test]
async fn a_key_cannot_hold_a_permission_its_creator_lacks_and_bad_requests_store_nothing() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let manager = token_with_permissions("mia", "acme", &["api_keys:admin", "runs:create"]);
    for (asked, lacking) in [
        (json!(["runs:create", "usage:read"]), "usage:read"),
        (json!(["admin"]), "admin"),
    ] {
        let (status, body) = app
            .post(
                &manager,
                "/v1/api_keys",
                &json!({"name": "k", "permissions": asked}),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(body["error"]["code"], "forbidden");
        assert_eq!(body["error"]["permission"], lacking);
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(&format!("`{lacking}`"))),
            "{body}"
        );
    }
    for (request, code) in [
        (
            json!({"name": "k", "permissions": []}),
            "invalid_permissions",
        ),
        (
            json!({"name": "k", "permissions": ["runs:everything"]}),
            "invalid_permissions",
        ),
        (
            json!({"name": " ", "permissions": ["runs:create"]}),
            "invalid_name",
        ),
        (
            json!({"name": "x".repeat(101), "permissions": ["runs:create"]}),
            "invalid_name",
        ),
        (json!({"name": "k"}), "invalid_body"),
        (
            json!({"name": "k", "permissions": ["runs:create"], "key": "spk_mine"}),
            "invalid_body",
        ),
    ] {
        let (status, body) = app.post(&manager, "/v1/api_keys", &request).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{request}: {body}"
        );
        assert_eq!(body["error"]["code"], code, "{request}");
    }
    assert_eq!(app.db.count("api_keys").await, 0, "nothing was stored");

    // What the creator holds, it may give; a key with `api_keys:admin` may make keys too, but
    // never wider than itself.
    let (status, created) = app
        .post(
            &manager,
            "/v1/api_keys",
            &json!({"name": "k", "permissions": ["runs:create", "api_keys:admin"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let key = created["key"].as_str().expect("key");
    let (status, body) = app
        .post(
            key,
            "/v1/api_keys",
            &json!({"name": "wider", "permissions": ["agents:write"]}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["permission"], "agents:write");
    let (status, body) = app
        .post(
            key,
            "/v1/api_keys",
            &json!({"name": "narrower", "permissions": ["runs:create"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["created_by"], json!(created["user_id"]));
    assert_eq!(app.db.count("api_keys").await, 2);
    app.stop().await;
}

#[tokio::test]
async fn a_key_lists_page_by_page() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    for i in 0..3 {
        let (status, _) = app
            .post(
                &root,
                "/v1/api_keys",
                &json!({"name": format!("k{i}"), "permissions": ["agents:read"]}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let (status, first) = app.get(&root, "/v1/api_keys?limit=2").await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<Value> = first["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|k| k["name"].clone())
        .collect();
    assert_eq!(names, [json!("k2"), json!("k1")], "newest first");
    let cursor = first["next_cursor"].as_str().expect("a next page");
    let (_, second) = app
        .get(&root, &format!("/v1/api_keys?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(second["data"][0]["name"], "k0");
    assert_eq!(second["next_cursor"], Value::Null);
    let (status, body) = app.get(&root, "/v1/api_keys?name=k0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "unknown_parameter");
    app.stop().await;
}
