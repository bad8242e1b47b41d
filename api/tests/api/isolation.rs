//! Tenant and user isolation: another tenant's or user's ids are 404 on every endpoint,
//! indistinguishable from ids that do not exist (invariant 9).

use reqwest::StatusCode;
use uuid::Uuid;

use spool_tests::token;

use crate::common::{TestApp, worker_args};

#[tokio::test]
async fn another_tenant_or_user_gets_404_on_every_endpoint_and_changes_nothing() {
    let app = TestApp::start(1, worker_args(3, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (status, accepted) = app.send_message(&alice, thread, "secret").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let workflow = accepted["workflow_id"].as_str().expect("id").to_owned();
    app.wait_for_status(&alice, &workflow, "completed").await;

    let intruders = [token("alice", "other-tenant"), token("bob", "acme")];
    for intruder in &intruders {
        for path in [
            format!("/v1/threads/{thread}"),
            format!("/v1/threads/{thread}/messages"),
            format!("/v1/workflows/{workflow}"),
        ] {
            let (status, body) = app.get(intruder, &path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
            // The same answer as for an id that does not exist.
            let missing = path
                .replace(&thread.to_string(), &Uuid::new_v4().to_string())
                .replace(&workflow, &Uuid::new_v4().to_string());
            let (_, missing_body) = app.get(intruder, &missing).await;
            assert_eq!(body, missing_body, "{path}");
        }
        let (status, body) = app.send_message(intruder, thread, "let me in").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["code"], "thread_not_found");
    }
    assert_eq!(app.db.count("runs").await, 1);
    assert_eq!(app.db.count("messages").await, 2);
    assert_eq!(app.db.count("threads").await, 1);

    // Alice still sees her own thread.
    let (status, _) = app.get(&alice, &format!("/v1/threads/{thread}")).await;
    assert_eq!(status, StatusCode::OK);
    app.stop().await;
}
