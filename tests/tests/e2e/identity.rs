//! `X-Spool-Identity` as a tool sees it, through real processes: the tool-side example of
//! docs/security.md, run as written with Node's `jose`, verifies the token a real run's tool
//! call carried with the API's `/.well-known/jwks.json`; and no process starts when the
//! identity key is the JWT secret.

use std::time::Duration;

use spool_tests::fake_llm::{self, FakeLlm};
use spool_tests::process::{Process, vars};
use spool_tests::tools::{Tools, http_tool};
use spool_tests::{JWT_SECRET, TestDb, poll_until};

use crate::stack::{Stack, TIMEOUT};

/// The `js` block of docs/security.md's "Identity sent to tools".
fn documented_example() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/security.md");
    let text = std::fs::read_to_string(path).expect("docs/security.md");
    let section = &text[text.find("## Identity sent to tools").expect("the section")..];
    let start = section.find("```js\n").expect("a js block") + "```js\n".len();
    let end = start + section[start..].find("```").expect("the block's end");
    section[start..end].to_owned()
}

/// Runs the example with its URLs pointed at `api` and `origin` on `token`; its answer (the
/// user and tenant as JSON), or what it printed when verification failed.
fn verify_as_documented(api: &str, origin: &str, token: &str) -> Result<String, String> {
    let example = documented_example()
        .replace("https://spool.example.com", api)
        .replace("https://tools.example.com", origin);
    let script = format!(
        "{example}\nconst who = await spoolUser({{ headers: {{ \"x-spool-identity\": \
         process.env.IDENTITY }} }});\nconsole.log(JSON.stringify(who));\n"
    );
    let output = std::process::Command::new("node")
        .args(["--input-type=module", "--eval", &script])
        // Bare imports (`jose`) resolve from the working directory for `--eval`.
        .current_dir(spool_tests::peers::node_peers().expect("node peers"))
        .env("IDENTITY", token)
        .output()
        .expect("node runs");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[tokio::test]
async fn the_documented_tool_side_example_verifies_a_real_tool_call_with_the_jwks() {
    let fake = FakeLlm::start(fake_llm::weather_then_echo()).await;
    let (tools, tools_base) = Tools::start().await;
    let stack = Stack::start().await;
    let _worker = stack
        .worker(&[
            ("SPOOL_LLM_BASE_URL", fake.base_url.as_str()),
            ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.1/32"),
        ])
        .await;
    let spec = serde_json::json!({"name": "weather", "model": "gpt-4o-mini",
        "tools": [http_tool("get_weather", format!("{tools_base}/weather"))]});
    let agent = stack.create_agent(&spec).await;
    stack.ask(&agent, "weather?").await;
    let token = poll_until("the tool call", TIMEOUT, || async {
        tools.identities().into_iter().find_map(|seen| seen.token)
    })
    .await;

    let who = verify_as_documented(&stack.base, &tools_base, &token).expect("verified");
    assert_eq!(who, r#"{"user":"alice","tenant":"acme"}"#);
    let elsewhere = verify_as_documented(&stack.base, "http://127.0.0.1:9", &token);
    assert!(
        elsewhere
            .as_ref()
            .is_err_and(|why| why.contains(r#""aud""#)),
        "another origin refuses it for its audience: {elsewhere:?}"
    );
    // What a tool that held the JWT secret would try: it does not verify the token.
    let mut hs256 = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    hs256.set_audience(&[&tools_base]);
    let secret = jsonwebtoken::DecodingKey::from_secret(JWT_SECRET.as_bytes());
    assert!(jsonwebtoken::decode::<serde_json::Value>(&token, &secret, &hs256).is_err());
}

#[tokio::test]
async fn neither_the_api_nor_a_worker_starts_when_the_identity_key_is_the_jwt_secret() {
    let db = TestDb::new().await.expect("test database");
    let settings = vars(&[
        ("DATABASE_URL", &db.url),
        ("SPOOL_API_ADDR", "127.0.0.1:0"),
        ("SPOOL_JWT_SECRET", JWT_SECRET),
        ("SPOOL_IDENTITY_KEY", JWT_SECRET),
    ]);
    for (binary, command) in [("spool-api", "serve"), ("spool-worker", "run")] {
        let mut process = Process::spawn(binary, &[command], &settings).expect("spawn");
        let code = process.wait(Duration::from_secs(20)).await;
        assert!(
            matches!(code, Some(c) if c != 0),
            "{binary} exited: {code:?}"
        );
        let output = process.output();
        assert!(
            output.contains("SPOOL_IDENTITY_KEY equals SPOOL_JWT_SECRET"),
            "{binary}: {output}"
        );
        assert!(!output.contains(JWT_SECRET), "{binary} printed the secret");
    }
}
