//! Signing secrets an operator could apply unchanged from the examples: `spool-api`, started as
//! an operator starts it, refuses them at once with the setting named, rather than serving with
//! a key anyone can read in the repository (review B-L3).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spool_tests::process::binary;

/// The value `deploy/helm/secret.example.yaml` gives `variable`.
fn example_value(variable: &str) -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/helm/secret.example.yaml"
    );
    let example = std::fs::read_to_string(path).expect("the example secret");
    example
        .lines()
        .find_map(|line| line.trim().strip_prefix(&format!("{variable}:")))
        .map(|value| value.trim().to_owned())
        .expect("the variable in the example")
}

/// `spool-api serve` with `SPOOL_JWT_SECRET=secret`: its exit status and standard error, or
/// `None` if it was still running after 20 s (it started serving).
fn serve_with(secret: &str) -> Option<(bool, String)> {
    let mut child = Command::new(binary("spool-api"))
        .arg("serve")
        .env("SPOOL_JWT_SECRET", secret)
        .env("SPOOL_API_ADDR", "127.0.0.1:0")
        // Nothing listens there: a binary that went past the check fails on it, or hangs.
        .env("DATABASE_URL", "postgres://root@127.0.0.1:1/none")
        .env("REDIS_URL", "redis://127.0.0.1:1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn spool-api");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("wait") {
            let output = child.wait_with_output().expect("output");
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            return Some((status.success(), stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().expect("kill");
    child.wait().expect("reap");
    None
}

#[test]
fn the_api_refuses_to_start_with_the_example_placeholder_or_a_repeated_character_secret() {
    let placeholder = example_value("SPOOL_JWT_SECRET");
    assert!(
        placeholder.len() >= 32,
        "the placeholder passes the length check: {placeholder}"
    );
    for (secret, says) in [
        (placeholder, "REPLACE_ME"),
        ("a".repeat(64), "one character repeated"),
    ] {
        let (ok, stderr) = serve_with(&secret).expect("spool-api exited");
        assert!(!ok, "spool-api started with {secret}");
        assert!(
            stderr.contains("SPOOL_JWT_SECRET") && stderr.contains(says),
            "{secret}: {stderr}"
        );
        assert!(
            !stderr.contains(&secret),
            "the secret was printed: {stderr}"
        );
    }
}
