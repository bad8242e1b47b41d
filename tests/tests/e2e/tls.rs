//! `rediss://`: the API and a worker, configured as an operator would (`REDIS_URL=rediss://…`,
//! and the certificate authority in `SSL_CERT_FILE`, which rustls reads), run a message end to
//! end through a Redis that only speaks TLS.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use spool_tests::servers::free_port;
use spool_tests::sse::SseReader;
use spool_tests::{poll_until, token};

use crate::stack::{Stack, demo_reply};

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A certificate authority and a certificate it signed for 127.0.0.1, in `dir`.
fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=Spool test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(dir.join("san.cnf"), "subjectAltName=IP:127.0.0.1\n").expect("san");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            "server.pem",
            "-extfile",
            "san.cnf",
        ],
    );
}

#[tokio::test]
async fn a_message_runs_end_to_end_through_a_redis_that_only_speaks_tls() {
    let dir = std::env::temp_dir().join(format!("spool-tls-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    certificates(&dir);
    let port = free_port();
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let mut redis = tokio::process::Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--tls-port",
            &port.to_string(),
        ])
        .args([
            "--tls-cert-file",
            &path("server.pem"),
            "--tls-key-file",
            &path("server.key"),
        ])
        .args([
            "--tls-ca-cert-file",
            &path("ca.pem"),
            "--tls-auth-clients",
            "no",
        ])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server with TLS");
    poll_until(
        "the TLS Redis to listen",
        Duration::from_secs(10),
        || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
        },
    )
    .await;

    let url = format!("rediss://127.0.0.1:{port}");
    let ca = path("ca.pem");
    let trust = [("SSL_CERT_FILE", ca.as_str())];
    let stack = Stack::start_with(&url, &trust).await;
    let _worker = stack
        .worker(&[
            trust[0],
            ("SPOOL_DEMO_TOKENS", "10"),
            ("SPOOL_DEMO_DELAY_MS", "100"),
        ])
        .await;
    let alice = token("alice", "acme");
    let accepted = stack.enqueue(&alice, "over TLS").await;
    let mut reader = SseReader::new(stack.stream(&alice, &accepted["thread_id"], None).await);
    let frames = reader.collect(Duration::from_secs(30)).await;
    assert_eq!(
        frames.last().map(|f| f.event.as_str()),
        Some("done"),
        "{frames:?}"
    );
    let streamed: String = frames
        .iter()
        .filter(|f| f.event == "text_delta")
        .filter_map(|f| f.json()["data"]["delta"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(streamed, demo_reply("over TLS", 10));
    let _ = redis.start_kill();
    let _ = std::fs::remove_dir_all(&dir);
}
