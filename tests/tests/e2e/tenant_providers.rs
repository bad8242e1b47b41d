//! A tenant's own provider ("bring your own key", DESIGN section 12) through real processes:
//! an agent whose `provider` names it is served by it with its key as the bearer token, while
//! the operator's provider of the same name is not called; the key appears in no response, no
//! log line of the API or the worker, and no error message; and once a provider is stored, a
//! process without `SPOOL_SECRETS_KEY` refuses to start. Also `spool providers`.

use std::time::Duration;

use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm};
use spool_tests::process::{Process, vars};
use spool_tests::{JWT_SECRET, token_with};

use crate::stack::Stack;

const SECRETS_KEY: &str = "00112233445566778899aabbccddeeff0f1e2d3c4b5a69788796a5b4c3d2e1f0";
const KEY: &str = "sk-byok-e2e-7f3a9c-do-not-log";

#[tokio::test]
async fn a_tenant_provider_serves_its_agents_with_its_key_which_no_response_or_log_shows() {
    let tenant_llm = FakeLlm::start(|_, _| fake_llm::text("tenant answer", 2)).await;
    let operator_llm = FakeLlm::start(|_, _| fake_llm::text("operator answer", 2)).await;
    let operator = format!(
        r#"[{{"name": "house", "kind": "openai", "base_url": "{}"}}]"#,
        operator_llm.base_url
    );
    let settings = [
        ("SPOOL_SECRETS_KEY", SECRETS_KEY),
        ("SPOOL_PROVIDERS", operator.as_str()),
        ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.1/32"),
        ("RUST_LOG", "debug"),
    ];
    let stack = Stack::start_with(&spool_tests::redis_url(), &settings).await;
    let worker = stack.worker(&settings).await;
    let admin = token_with("root", "acme", true, 3600, JWT_SECRET);
    let mut seen: Vec<Value> = Vec::new();

    let body = json!({"name": "house", "kind": "openai", "base_url": tenant_llm.base_url,
        "api_key": KEY, "default_model": "their-model"});
    let (status, created) = stack.post(&admin, "/v1/providers", &body).await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{created}");
    seen.push(created.clone());
    // Refusals that concern the key: a changed destination, a bad body.
    let id = created["id"].as_str().expect("id");
    let refused = stack
        .http
        .patch(format!("{}/v1/providers/{id}", stack.base))
        .bearer_auth(&admin)
        .json(&json!({"base_url": "https://elsewhere.example.com/v1"}))
        .send()
        .await
        .expect("patch");
    assert_eq!(refused.status(), reqwest::StatusCode::UNPROCESSABLE_ENTITY);
    seen.push(refused.json().await.expect("json"));
    let mut bad = body.clone();
    bad["name"] = json!("not a name");
    bad["api_key"] = json!(format!("{KEY}\n"));
    let (status, invalid) = stack.post(&admin, "/v1/providers", &bad).await;
    assert_eq!(
        status,
        reqwest::StatusCode::UNPROCESSABLE_ENTITY,
        "{invalid}"
    );
    seen.push(invalid);
    let (_, listed) = stack.get_with(&admin, "/v1/providers").await;
    seen.push(listed);

    let agent = stack
        .create_agent(&json!({"name": "byok", "provider": "house"}))
        .await;
    let accepted = stack.ask(&agent, "hello").await;
    stack.wait_run(&accepted, "completed").await;
    let workflow = accepted["workflow_id"].as_str().expect("workflow");
    let (_, run) = stack
        .get_with(
            &spool_tests::token("alice", "acme"),
            &format!("/v1/workflows/{workflow}"),
        )
        .await;
    seen.push(run);

    assert_eq!(tenant_llm.credentials(), [Some(format!("Bearer {KEY}"))]);
    assert_eq!(tenant_llm.requests()[0]["model"], "their-model");
    assert!(
        operator_llm.requests().is_empty(),
        "the operator's provider of the same name was called"
    );
    for value in &seen {
        assert!(
            !value.to_string().contains(KEY),
            "a response shows the key: {value}"
        );
    }
    for (who, log) in [("api", stack.api_log()), ("worker", worker.output())] {
        assert!(!log.is_empty(), "{who} logged nothing");
        assert!(!log.contains(KEY), "the {who}'s log shows the key");
    }

    // With a provider stored, a process without the key refuses to start, naming it.
    for (binary, args) in [
        ("spool-api", &["serve"][..]),
        ("spool-worker", &["run"][..]),
    ] {
        let env = vars(&[
            ("DATABASE_URL", stack.db.url.as_str()),
            ("REDIS_URL", stack.redis_url.as_str()),
            ("SPOOL_JWT_SECRET", JWT_SECRET),
            ("SPOOL_API_ADDR", "127.0.0.1:0"),
        ]);
        let mut process = Process::spawn(binary, args, &env).expect("spawn");
        let code = process.wait(Duration::from_secs(20)).await;
        let output = process.output();
        assert!(
            matches!(code, Some(c) if c != 0),
            "{binary}: {code:?} {output}"
        );
        assert!(output.contains("SPOOL_SECRETS_KEY"), "{binary}: {output}");
    }
}

/// What `spool ARGS` printed as JSON against `stack` with `token`, after checking it exited 0.
async fn spool_json(stack: &Stack, token: &str, args: &[&str]) -> (Option<i32>, Value, String) {
    let output = tokio::process::Command::new(spool_tests::process::binary("spool"))
        .args(args)
        .env_clear()
        .env("SPOOL_URL", &stack.base)
        .env("SPOOL_TOKEN", token)
        .output()
        .await
        .expect("spool");
    let stdout = String::from_utf8_lossy(&output.stdout);
    (
        output.status.code(),
        serde_json::from_str(&stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn spool_providers_applies_lists_gets_and_deletes_without_showing_the_key() {
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_SECRETS_KEY", SECRETS_KEY)],
    )
    .await;
    let admin = token_with("root", "acme", true, 3600, JWT_SECRET);
    let dir = std::env::temp_dir().join(format!("spool-providers-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("provider.json");
    let file = path.to_str().expect("path");
    let body = json!({"name": "mine", "kind": "anthropic",
        "base_url": "https://llm.example.com/v1", "api_key": KEY});
    std::fs::write(&path, body.to_string()).expect("write");
    let (code, created, stderr) =
        spool_json(&stack, &admin, &["providers", "apply", "-f", file]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(created["api_key"], "<redacted>", "{created}");
    let id = created["id"].as_str().expect("id").to_owned();

    // What `get` prints applies as it is, changed: the key is kept.
    let (_, mut got, _) = spool_json(&stack, &admin, &["providers", "get", &id]).await;
    got["default_model"] = json!("claude-sonnet-4-5");
    std::fs::write(&path, got.to_string()).expect("write");
    let (code, changed, stderr) =
        spool_json(&stack, &admin, &["providers", "apply", "-f", file]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(changed["default_model"], "claude-sonnet-4-5", "{changed}");
    let (_, listed, _) = spool_json(&stack, &admin, &["providers", "list"]).await;
    assert_eq!(listed["data"][0]["id"], id.as_str(), "{listed}");
    for shown in [&created, &got, &changed, &listed] {
        assert!(!shown.to_string().contains(KEY), "{shown}");
    }
    let (code, _, stderr) = spool_json(&stack, &admin, &["providers", "delete", &id]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let (code, _, stderr) = spool_json(&stack, &admin, &["providers", "get", &id]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("404"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}
