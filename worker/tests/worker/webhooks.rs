//! A webhook try against a real receiver and the real outbox: a delivery claimed before its
//! thread is erased is not sent (its body waits for a hold on the delivery's row, which the
//! erasure either precedes or waits for).

use std::sync::Arc;
use std::time::Duration;

use spool_shared::ThreadId;
use spool_shared::db::{threads, webhooks};
use spool_shared::egress::NetworkPolicy;
use spool_tests::TestDb;
use spool_tests::webhooks::Receiver;
use uuid::Uuid;

/// From the Standard Webhooks reference libraries' tests.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A pending delivery to `hook` about a run of `thread`.
async fn delivery(db: &TestDb, hook: spool_shared::ids::WebhookId, thread: ThreadId) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO webhook_deliveries
                (id, webhook_id, tenant_id, thread_id, workflow_id, event, payload)
         VALUES ($1, $2, 'acme', $3, $3, 'run.completed', jsonb_build_object('thread', $3::text))",
    )
    .bind(id)
    .bind(hook)
    .bind(thread)
    .execute(&db.pool)
    .await
    .expect("delivery");
    id
}

#[tokio::test]
async fn a_delivery_claimed_before_its_thread_is_erased_is_never_sent() {
    let db = TestDb::new().await.expect("db");
    let (receiver, url) = Receiver::start(&[]).await;
    let events = ["run.completed".to_owned()];
    let hook = webhooks::create(&db.pool, "acme", &url, &events, SECRET, 20)
        .await
        .expect("endpoint")
        .expect("under the cap");
    let (erased, kept) = (ThreadId::new(), ThreadId::new());
    let gone = delivery(&db, hook.id, erased).await;
    let sent = delivery(&db, hook.id, kept).await;
    // Both claimed, payloads in memory; then the user erases one thread.
    let claimed = webhooks::claim_due(&db.pool, 10, Duration::from_secs(30), 10)
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    let mut tx = db.pool.begin().await.expect("tx");
    threads::erase(&mut tx, erased).await.expect("erase");
    tx.commit().await.expect("commit");

    let policy = Arc::new(NetworkPolicy::parse("127.0.0.1/32").expect("allow list parses"));
    let timeout = Duration::from_secs(5);
    let due = |id: Uuid| claimed.iter().find(|d| d.id == id).expect("claimed");
    let outcome =
        spool_worker::webhooks::try_once(&db.pool, Arc::clone(&policy), timeout, due(gone))
            .await
            .expect("clients");
    assert!(
        outcome.is_none(),
        "not sent, nothing to record: {outcome:?}"
    );
    let outcome = spool_worker::webhooks::try_once(&db.pool, policy, timeout, due(sent))
        .await
        .expect("clients")
        .expect("sent");
    assert!(outcome.delivered, "{outcome:?}");
    let received = receiver.received();
    assert_eq!(
        received.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        [sent.to_string()],
        "only the delivery of the thread that stays reached the receiver"
    );
    assert!(received[0].verify(SECRET), "sent whole and signed");
    assert_eq!(received[0].json()["thread"], kept.to_string());
}
