//! `SPOOL_PROVIDERS` as an operator sets it: a value that does not parse stops both processes,
//! and a worker whose provider's key variable is unset refuses to start; each names what is
//! wrong.

use std::time::Duration;

use spool_tests::Process;
use spool_tests::process::vars;

#[tokio::test]
async fn bad_provider_settings_stop_the_processes_naming_them() {
    let db = spool_tests::TestDb::new().await.expect("test database");
    let redis = spool_tests::redis_url();
    let unset_key = r#"[{"name": "claude", "kind": "anthropic", "base_url": "http://127.0.0.1:9/v1",
        "api_key_env": "SPOOL_TEST_KEY_THAT_IS_NOT_SET"}]"#;
    let cases = [
        (
            "spool-api",
            &["serve"][..],
            "[{\"name\": \"x\"}]",
            "SPOOL_PROVIDERS",
        ),
        ("spool-worker", &["run"][..], "not json", "SPOOL_PROVIDERS"),
        (
            "spool-worker",
            &["run"][..],
            unset_key,
            "SPOOL_TEST_KEY_THAT_IS_NOT_SET",
        ),
    ];
    for (binary, args, value, named) in cases {
        let env = vars(&[
            ("DATABASE_URL", db.url.as_str()),
            ("REDIS_URL", redis.as_str()),
            ("SPOOL_PROVIDERS", value),
        ]);
        let mut process = Process::spawn(binary, args, &env).expect("spawn");
        let code = process.wait(Duration::from_secs(20)).await;
        let output = process.output();
        assert!(
            matches!(code, Some(c) if c != 0),
            "{binary} {value}: {code:?} {output}"
        );
        assert!(output.contains(named), "{binary} {value}: {output}");
    }
}
