use spool_tests::{TestDb, poll_until};

use super::*;

const LEASE: Duration = Duration::from_secs(30);
/// A per-tenant cap no test reaches.
const UNCAPPED: i64 = 1_000;

/// An endpoint of `acme` and one delivery to it of an event `age` old.
async fn delivery(db: &TestDb, age: Duration) -> (WebhookId, Uuid) {
    let events = ["run.completed".to_owned()];
    let hook = create(
        &db.pool,
        "acme",
        "http://127.0.0.1:9/",
        &events,
        "whsec_x",
        20,
    )
    .await
    .expect("webhook")
    .expect("under the cap");
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO webhook_deliveries
                    (id, webhook_id, tenant_id, thread_id, workflow_id, event, payload, created_at)
             VALUES ($1, $2, 'acme', $3, $3, 'run.completed', '{}', now() - $4)",
    )
    .bind(id)
    .bind(hook.id)
    .bind(Uuid::new_v4())
    .bind(interval(age))
    .execute(&db.pool)
    .await
    .expect("delivery");
    (hook.id, id)
}

/// A delivery to `hook` of `tenant`, created `age` ago, due `due_ago` ago, in `state`
/// (`pending`, `delivered` or `abandoned`).
async fn delivery_to(
    db: &TestDb,
    hook: WebhookId,
    tenant: &str,
    age: Duration,
    due_ago: Duration,
    state: &str,
) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO webhook_deliveries
                    (id, webhook_id, tenant_id, thread_id, workflow_id, event, payload,
                     created_at, next_attempt_at, delivered_at, abandoned_at)
             VALUES ($1, $2, $3, $4, $4, 'run.completed', '{}', now() - $5, now() - $6,
                     CASE WHEN $7 = 'delivered' THEN now() - $5 END,
                     CASE WHEN $7 = 'abandoned' THEN now() - $5 END)",
    )
    .bind(id)
    .bind(hook)
    .bind(tenant)
    .bind(Uuid::new_v4())
    .bind(interval(age))
    .bind(interval(due_ago))
    .bind(state)
    .execute(&db.pool)
    .await
    .expect("delivery");
    id
}

/// An endpoint of `tenant`.
async fn endpoint(db: &TestDb, tenant: &str) -> WebhookId {
    let events = ["run.completed".to_owned()];
    create(
        &db.pool,
        tenant,
        "http://127.0.0.1:9/",
        &events,
        "whsec_x",
        20,
    )
    .await
    .expect("webhook")
    .expect("under the cap")
    .id
}

fn ok() -> Outcome {
    Outcome {
        status_code: Some(204),
        error: None,
        delivered: true,
        retry_in: Duration::ZERO,
    }
}

const DAY: Duration = Duration::from_secs(86_400);

#[tokio::test]
async fn purge_deletes_finished_deliveries_past_retention_with_their_tries_and_abandons_stale_ones()
{
    let db = TestDb::new().await.expect("db");
    let hook = endpoint(&db, "acme").await;
    let zero = Duration::ZERO;
    let old_delivered = delivery_to(&db, hook, "acme", 8 * DAY, zero, "delivered").await;
    let old_abandoned = delivery_to(&db, hook, "acme", 9 * DAY, zero, "abandoned").await;
    let recent = delivery_to(&db, hook, "acme", DAY, zero, "delivered").await;
    // Held by an open circuit past the 24 h window: abandoned, kept for the retention.
    let stale = delivery_to(&db, hook, "acme", DAY + DAY / 24, DAY, "pending").await;
    let fresh = delivery_to(&db, hook, "acme", zero, zero, "pending").await;
    sqlx::query(
        "INSERT INTO webhook_attempts (delivery_id, attempt, status_code)
             VALUES ($1, 1, 500), ($1, 2, 204)",
    )
    .bind(old_delivered)
    .execute(&db.pool)
    .await
    .expect("tries");
    // Batches of one: the loop goes on until a batch comes back short.
    let purged = purge(&db.pool, 7 * DAY, 1).await.expect("purge");
    assert_eq!(purged, (1, 2), "(abandoned, deleted)");
    let left: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM webhook_deliveries ORDER BY created_at")
            .fetch_all(&db.pool)
            .await
            .expect("left");
    assert_eq!(left, vec![stale, recent, fresh]);
    assert!(!left.contains(&old_abandoned));
    assert!(state(&db, stale).await.1, "past 24 h: abandoned");
    assert!(!state(&db, fresh).await.1);
    let tries: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_attempts")
        .fetch_one(&db.pool)
        .await
        .expect("tries");
    assert_eq!(tries, 0, "the tries went with their delivery");
    assert_eq!(purge(&db.pool, 7 * DAY, 1).await.expect("purge"), (0, 0));
}

#[tokio::test]
async fn five_failures_in_a_row_open_the_circuit_then_one_try_at_a_time_until_a_2xx_closes_it() {
    let db = TestDb::new().await.expect("db");
    let hook = endpoint(&db, "acme").await;
    let zero = Duration::ZERO;
    for _ in 0..8 {
        delivery_to(&db, hook, "acme", zero, zero, "pending").await;
    }
    let due = claim_due(&db.pool, 5, LEASE, UNCAPPED)
        .await
        .expect("claim");
    assert_eq!(due.len(), 5);
    for (n, d) in due.iter().enumerate() {
        let hook_row = find(&db.pool, hook, "acme")
            .await
            .expect("find")
            .expect("hook");
        assert_eq!(hook_row.consecutive_failures, i32::try_from(n).expect("n"));
        assert!(
            hook_row.circuit_open_until.is_none(),
            "closed before the 5th"
        );
        record(&db.pool, d.id, d.attempts, &failed(zero))
            .await
            .expect("record");
    }
    let hook_row = find(&db.pool, hook, "acme")
        .await
        .expect("find")
        .expect("hook");
    assert_eq!(hook_row.consecutive_failures, BREAKER_THRESHOLD);
    let open = hook_row.circuit_open_until.expect("open");
    let secs = (open - Utc::now()).num_seconds();
    assert!((25..=30).contains(&secs), "open for 30 s: {secs}");
    // Eight due (the five failed ones again at once, retry_in 0), none claimed.
    assert!(
        claim_due(&db.pool, 10, LEASE, UNCAPPED)
            .await
            .expect("claim")
            .is_empty()
    );
    // The open time passes: half-open, one delivery at a time.
    sqlx::query("UPDATE webhooks SET circuit_open_until = now() - interval '1 second'")
        .execute(&db.pool)
        .await
        .expect("time passes");
    let probe = claim_due(&db.pool, 10, LEASE, UNCAPPED)
        .await
        .expect("claim");
    assert_eq!(probe.len(), 1, "one probe");
    assert!(
        claim_due(&db.pool, 10, LEASE, UNCAPPED)
            .await
            .expect("claim")
            .is_empty()
    );
    record(&db.pool, probe[0].id, probe[0].attempts, &failed(zero))
        .await
        .expect("record");
    let hook_row = find(&db.pool, hook, "acme")
        .await
        .expect("find")
        .expect("hook");
    let secs = (hook_row.circuit_open_until.expect("open again") - Utc::now()).num_seconds();
    assert!(
        (55..=60).contains(&secs),
        "a failed probe doubles it: {secs}"
    );
    sqlx::query("UPDATE webhooks SET circuit_open_until = now() - interval '1 second'")
        .execute(&db.pool)
        .await
        .expect("time passes");
    let probe = claim_due(&db.pool, 10, LEASE, UNCAPPED)
        .await
        .expect("claim");
    assert_eq!(probe.len(), 1);
    record(&db.pool, probe[0].id, probe[0].attempts, &ok())
        .await
        .expect("record");
    let hook_row = find(&db.pool, hook, "acme")
        .await
        .expect("find")
        .expect("hook");
    assert_eq!(
        (hook_row.consecutive_failures, hook_row.circuit_open_until),
        (0, None)
    );
    assert_eq!(
        claim_due(&db.pool, 10, LEASE, UNCAPPED)
            .await
            .expect("claim")
            .len(),
        7,
        "closed"
    );
}

#[tokio::test]
async fn tries_recorded_in_one_batch_move_each_delivery_and_count_for_the_circuit_in_order() {
    let db = TestDb::new().await.expect("db");
    let hook = endpoint(&db, "acme").await;
    let zero = Duration::ZERO;
    for _ in 0..8 {
        delivery_to(&db, hook, "acme", zero, zero, "pending").await;
    }
    let due = claim_due(&db.pool, 8, LEASE, UNCAPPED)
        .await
        .expect("claim");
    assert_eq!(due.len(), 8);
    let tries = |from: usize, outcomes: &[Outcome]| -> Vec<(Uuid, i32, Outcome)> {
        due[from..]
            .iter()
            .zip(outcomes)
            .map(|(d, o)| (d.id, d.attempts, o.clone()))
            .collect()
    };
    let circuit = async || {
        let row = find(&db.pool, hook, "acme")
            .await
            .expect("find")
            .expect("hook");
        (row.consecutive_failures, row.circuit_open_until)
    };
    // A failure, a 2xx, two failures: the two after the 2xx count.
    let first = [failed(zero), ok(), failed(zero), failed(zero)];
    record_all(&db.pool, &tries(0, &first))
        .await
        .expect("record");
    assert_eq!(circuit().await, (2, None));
    assert!(state(&db, due[1].id).await.0, "the 2xx is delivered");
    assert!(!state(&db, due[0].id).await.0);
    // Three more failures in one batch: five in a row open the circuit.
    let second = [failed(zero), failed(zero), failed(zero)];
    record_all(&db.pool, &tries(4, &second))
        .await
        .expect("record");
    let (failures, open) = circuit().await;
    assert_eq!(failures, BREAKER_THRESHOLD);
    let secs = (open.expect("open") - Utc::now()).num_seconds();
    assert!((25..=30).contains(&secs), "open for 30 s: {secs}");
    // A 2xx closes it.
    record_all(&db.pool, &tries(7, &[ok()]))
        .await
        .expect("record");
    assert_eq!(circuit().await, (0, None));
    let listed: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_attempts")
        .fetch_one(&db.pool)
        .await
        .expect("tries");
    assert_eq!(listed, 8, "every try is listed");
}

#[tokio::test]
async fn the_oldest_due_age_counts_waiting_deliveries_not_those_in_flight_or_held_by_a_circuit() {
    let db = TestDb::new().await.expect("db");
    assert_eq!(oldest_due_seconds(&db.pool).await.expect("age"), 0.0);
    let minute = Duration::from_secs(60);
    let hook = endpoint(&db, "acme").await;
    delivery_to(&db, hook, "acme", minute, minute, "pending").await;
    let age = oldest_due_seconds(&db.pool).await.expect("age");
    assert!((59.0..70.0).contains(&age), "{age}");
    // A dead endpoint's backlog, held by its circuit, is not the workers' delay.
    let dead = endpoint(&db, "other").await;
    delivery_to(&db, dead, "other", DAY / 2, DAY / 2, "pending").await;
    sqlx::query("UPDATE webhooks SET consecutive_failures = $2 WHERE id = $1")
        .bind(dead)
        .bind(BREAKER_THRESHOLD)
        .execute(&db.pool)
        .await
        .expect("dead");
    let age = oldest_due_seconds(&db.pool).await.expect("age");
    assert!((59.0..70.0).contains(&age), "{age}");
    let due = claim_due(&db.pool, 10, LEASE, UNCAPPED)
        .await
        .expect("claim");
    assert_eq!(due.len(), 2, "acme's, and the dead endpoint's probe");
    assert_eq!(
        oldest_due_seconds(&db.pool).await.expect("age"),
        0.0,
        "in flight"
    );
}

/// Delivered, abandoned, and whether the next try is in the future.
async fn state(db: &TestDb, id: Uuid) -> (bool, bool, bool) {
    sqlx::query_as(
        "SELECT delivered_at IS NOT NULL, abandoned_at IS NOT NULL, next_attempt_at > now()
               FROM webhook_deliveries WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .expect("state")
}

fn failed(retry_in: Duration) -> Outcome {
    Outcome {
        status_code: Some(503),
        error: Some("the receiver answered 503".into()),
        delivered: false,
        retry_in,
    }
}

#[tokio::test]
async fn a_failed_try_is_retried_later_within_the_window_and_abandoned_after_it() {
    let db = TestDb::new().await.expect("db");
    let (_, fresh) = delivery(&db, Duration::ZERO).await;
    let (_, old) = delivery(&db, RETRY_WINDOW - Duration::from_secs(60)).await;
    let due = claim_due(&db.pool, 10, LEASE, UNCAPPED)
        .await
        .expect("claim");
    assert_eq!(due.len(), 2);
    let again = claim_due(&db.pool, 10, LEASE, UNCAPPED)
        .await
        .expect("claim");
    assert!(again.is_empty(), "leased");
    for d in &due {
        assert_eq!(d.attempts, 1);
        record(
            &db.pool,
            d.id,
            d.attempts,
            &failed(Duration::from_secs(300)),
        )
        .await
        .expect("record");
    }
    assert_eq!(
        state(&db, fresh).await,
        (false, false, true),
        "retried in 5 minutes"
    );
    assert_eq!(
        state(&db, old).await,
        (false, true, true),
        "the next try would fall past 24 h: abandoned"
    );
    let later = claim_due(&db.pool, 10, LEASE, UNCAPPED)
        .await
        .expect("claim");
    assert!(later.is_empty(), "not due yet, or abandoned");
}

#[tokio::test]
async fn an_expired_lease_is_claimed_again_and_a_late_failure_cannot_undo_a_delivery() {
    let db = TestDb::new().await.expect("db");
    let (hook, id) = delivery(&db, Duration::ZERO).await;
    let first = claim_due(&db.pool, 10, Duration::ZERO, UNCAPPED)
        .await
        .expect("claim");
    // The first worker's lease ran out (it died, say): another claims the delivery.
    let second = claim_due(&db.pool, 10, LEASE, UNCAPPED)
        .await
        .expect("claim");
    assert_eq!((first.len(), second.len()), (1, 1));
    assert_eq!(second[0].attempts, 2);
    let delivered = Outcome {
        status_code: Some(204),
        error: None,
        delivered: true,
        retry_in: Duration::ZERO,
    };
    record(&db.pool, id, 2, &delivered).await.expect("record");
    record(&db.pool, id, 1, &failed(Duration::from_secs(5)))
        .await
        .expect("record");
    assert!(state(&db, id).await.0, "still delivered");
    let page = deliveries(&db.pool, hook, None, 10).await.expect("page");
    assert_eq!(page.rows[0].tries.0.len(), 2, "both tries are listed");
}

/// The thread of delivery `id`.
async fn thread_of(db: &TestDb, id: Uuid) -> crate::ThreadId {
    let (thread,): (Uuid,) =
        sqlx::query_as("SELECT thread_id FROM webhook_deliveries WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .expect("thread");
    crate::ThreadId(thread)
}

/// Erases `thread` as `DELETE /v1/threads/{id}` does (its rows, in one transaction).
async fn erase_thread(pool: sqlx::PgPool, thread: crate::ThreadId) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    crate::db::threads::erase(&mut tx, thread).await?;
    tx.commit().await
}

#[tokio::test]
async fn an_erasure_waits_for_a_held_send_and_a_hold_after_it_finds_nothing_to_send() {
    let db = TestDb::new().await.expect("db");
    let (_, id) = delivery(&db, Duration::ZERO).await;
    let claimed = claim_due(&db.pool, 10, LEASE, UNCAPPED)
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    assert!(
        hold_for_send(&db.pool, id, 2)
            .await
            .expect("hold")
            .is_none(),
        "not this try's: try 1 was claimed"
    );
    let held = hold_for_send(&db.pool, id, 1)
        .await
        .expect("hold")
        .expect("the claimed try holds it");
    // The erasure starts while the body is being handed over: it waits for the hold.
    let erasing = tokio::spawn(erase_thread(db.pool.clone(), thread_of(&db, id).await));
    poll_until(
        "the erasure waits on the hold",
        Duration::from_secs(10),
        || async {
            let (waiting,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND query LIKE 'DELETE FROM webhook_deliveries%'",
            )
            .fetch_one(&db.pool)
            .await
            .ok()?;
            (waiting == 1).then_some(())
        },
    )
    .await;
    assert!(!erasing.is_finished(), "the erasure waits");
    held.release().await.expect("release");
    erasing.await.expect("task").expect("the erasure commits");
    assert_eq!(db.count("webhook_deliveries").await, 0);
    assert!(
        hold_for_send(&db.pool, id, 1)
            .await
            .expect("hold")
            .is_none(),
        "erased: nothing to send"
    );
}

#[tokio::test]
async fn a_hold_never_waits_for_a_deletion_under_way_and_finds_nothing_to_send() {
    let db = TestDb::new().await.expect("db");
    let (_, id) = delivery(&db, Duration::ZERO).await;
    claim_due(&db.pool, 10, LEASE, UNCAPPED)
        .await
        .expect("claim");
    let mut deleting = db.pool.begin().await.expect("tx");
    crate::db::threads::erase(&mut deleting, thread_of(&db, id).await)
        .await
        .expect("erase");
    let hold = tokio::time::timeout(Duration::from_secs(5), hold_for_send(&db.pool, id, 1))
        .await
        .expect("the hold does not wait for the deletion")
        .expect("hold");
    assert!(hold.is_none(), "a deletion under way: not sent");
    // Rolled back (an erasure that timed out, say): the delivery is there to send again.
    deleting.rollback().await.expect("rollback");
    assert!(
        hold_for_send(&db.pool, id, 1)
            .await
            .expect("hold")
            .is_some()
    );
}

#[tokio::test]
async fn a_try_of_a_delivery_erased_in_flight_is_left_out_and_the_batch_is_recorded() {
    let db = TestDb::new().await.expect("db");
    let (_, gone) = delivery(&db, Duration::ZERO).await;
    let (_, kept) = delivery(&db, Duration::ZERO).await;
    assert_eq!(
        claim_due(&db.pool, 10, LEASE, UNCAPPED)
            .await
            .expect("claim")
            .len(),
        2
    );
    erase_thread(db.pool.clone(), thread_of(&db, gone).await)
        .await
        .expect("erase");
    record_all(&db.pool, &[(gone, 1, ok()), (kept, 1, ok())])
        .await
        .expect("the batch is recorded");
    assert!(state(&db, kept).await.0, "the other try is recorded");
    assert_eq!(db.count("webhook_attempts").await, 1);
}

#[tokio::test]
async fn a_tenant_at_its_in_flight_cap_is_left_out_of_the_claim_and_others_are_not() {
    let db = TestDb::new().await.expect("db");
    let dark = [endpoint(&db, "dark").await, endpoint(&db, "dark").await];
    let acme = endpoint(&db, "acme").await;
    let zero = Duration::ZERO;
    for n in 0..10 {
        delivery_to(&db, dark[n % 2], "dark", zero, zero, "pending").await;
    }
    let first = claim_due(&db.pool, 10, LEASE, 3).await.expect("claim");
    assert_eq!(first.len(), 3, "dark's cap, nothing else due");
    let theirs = delivery_to(&db, acme, "acme", zero, zero, "pending").await;
    let second = claim_due(&db.pool, 10, LEASE, 3).await.expect("claim");
    assert_eq!(
        second.iter().map(|d| d.id).collect::<Vec<_>>(),
        [theirs],
        "dark holds its cap: only acme's is claimed"
    );
    // One of dark's tries ends: one more of its deliveries may go.
    record(&db.pool, first[0].id, 1, &failed(Duration::from_secs(60)))
        .await
        .expect("record");
    let third = claim_due(&db.pool, 10, LEASE, 3).await.expect("claim");
    assert_eq!(third.len(), 1, "room for one: {third:?}");
}
