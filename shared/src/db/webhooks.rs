//! Webhooks: a tenant's endpoints and the outbox of their deliveries (docs/api.md).
//!
//! The outbox rows are written by the `runs_status_changed` trigger (migration
//! `20261124000001_control_plane.sql`) in the transaction that changes a run's status, so an
//! event is recorded exactly when the change commits, whichever process made it. Workers
//! deliver them: [`claim_due`] takes due rows with a lease from the database clock (`FOR
//! UPDATE SKIP LOCKED`, so workers share the work), and [`record`] writes each try's outcome.
//! A worker that dies mid-delivery leaves its lease to expire; another worker delivers again
//! (at least once: receivers de-duplicate on `webhook-id`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgExecutor;
use sqlx::postgres::types::PgInterval;
use sqlx::types::Json;
use uuid::Uuid;

use crate::db::page::{self, Cursor, Page};
use crate::ids::{WebhookId, WorkflowId};

/// The events an endpoint may ask for.
pub const EVENTS: [&str; 5] = [
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run.requires_action",
    "run.awaiting_approval",
];

/// How long a delivery is retried after its event.
pub const RETRY_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// An endpoint as stored.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Webhook {
    /// Its id.
    pub id: WebhookId,
    /// Where deliveries go.
    pub url: String,
    /// The events it receives.
    pub events: Vec<String>,
    /// The signing secret (`whsec_<base64>`).
    pub secret: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

/// Stores a new endpoint.
pub async fn create(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    url: &str,
    events: &[String],
    secret: &str,
) -> sqlx::Result<Webhook> {
    sqlx::query_as(
        "INSERT INTO webhooks (id, tenant_id, url, events, secret) VALUES ($1, $2, $3, $4, $5)
         RETURNING id, url, events, secret, created_at",
    )
    .bind(WebhookId::new())
    .bind(tenant_id)
    .bind(url)
    .bind(events)
    .bind(secret)
    .fetch_one(executor)
    .await
}

/// A page of the tenant's endpoints, newest first.
pub async fn list(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    after: Option<Cursor>,
    limit: i64,
) -> sqlx::Result<Page<Webhook>> {
    let mut query = sqlx::QueryBuilder::new(
        "SELECT w.id, w.url, w.events, w.secret, w.created_at FROM webhooks w WHERE w.tenant_id = ",
    );
    query.push_bind(tenant_id.to_owned());
    page::push_after(&mut query, "w", after);
    page::push_order(&mut query, "w", limit);
    let rows: Vec<Webhook> = query.build_query_as().fetch_all(executor).await?;
    Ok(page::page(rows, limit, |w| (w.created_at, w.id.0)))
}

/// The tenant's endpoint, if it exists.
pub async fn find(
    executor: impl PgExecutor<'_>,
    id: WebhookId,
    tenant_id: &str,
) -> sqlx::Result<Option<Webhook>> {
    sqlx::query_as(
        "SELECT id, url, events, secret, created_at FROM webhooks WHERE id = $1 AND tenant_id = $2",
    )
    .bind(id)
    .bind(tenant_id)
    .fetch_optional(executor)
    .await
}

/// Deletes the tenant's endpoint and its deliveries; `false` if there was none.
pub async fn delete(
    executor: impl PgExecutor<'_>,
    id: WebhookId,
    tenant_id: &str,
) -> sqlx::Result<bool> {
    let deleted = sqlx::query("DELETE FROM webhooks WHERE id = $1 AND tenant_id = $2")
        .bind(id)
        .bind(tenant_id)
        .execute(executor)
        .await?;
    Ok(deleted.rows_affected() > 0)
}

/// One try of a delivery.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Try {
    /// Its number, from 1.
    pub attempt: i32,
    /// The receiver's status code, if it answered.
    pub status_code: Option<i32>,
    /// What went wrong, if it failed.
    pub error: Option<String>,
    /// When it was made.
    pub at: DateTime<Utc>,
}

/// A delivery as stored, with its tries.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Delivery {
    /// Its id (the `webhook-id` header).
    pub id: Uuid,
    /// The event.
    pub event: String,
    /// The run it is about.
    pub workflow_id: WorkflowId,
    /// What is sent.
    pub payload: Json<Value>,
    /// When it was delivered (a 2xx).
    pub delivered_at: Option<DateTime<Utc>>,
    /// When retries stopped without a 2xx.
    pub abandoned_at: Option<DateTime<Utc>>,
    /// When the next try is due, while pending.
    pub next_attempt_at: DateTime<Utc>,
    /// When the event happened.
    pub created_at: DateTime<Utc>,
    /// Its tries, in order.
    pub tries: Json<Vec<Try>>,
}

/// A page of an endpoint's deliveries, newest first.
pub async fn deliveries(
    executor: impl PgExecutor<'_>,
    webhook_id: WebhookId,
    after: Option<Cursor>,
    limit: i64,
) -> sqlx::Result<Page<Delivery>> {
    let mut query = sqlx::QueryBuilder::new(
        "SELECT d.id, d.event, d.workflow_id, d.payload, d.delivered_at, d.abandoned_at,
                d.next_attempt_at, d.created_at,
                coalesce((SELECT jsonb_agg(jsonb_build_object('attempt', a.attempt,
                            'status_code', a.status_code, 'error', a.error,
                            'at', to_char(a.at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'))
                            ORDER BY a.attempt)
                            FROM webhook_attempts a WHERE a.delivery_id = d.id), '[]') AS tries
           FROM webhook_deliveries d WHERE d.webhook_id = ",
    );
    query.push_bind(webhook_id);
    page::push_after(&mut query, "d", after);
    page::push_order(&mut query, "d", limit);
    let rows: Vec<Delivery> = query.build_query_as().fetch_all(executor).await?;
    Ok(page::page(rows, limit, |d| (d.created_at, d.id)))
}

/// A delivery a worker holds.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Due {
    /// Its id (the `webhook-id` header).
    pub id: Uuid,
    /// Which try this is, from 1.
    pub attempts: i32,
    /// The body, as JSON.
    pub payload: Json<Value>,
    /// Where it goes.
    pub url: String,
    /// The endpoint's signing secret.
    pub secret: String,
}

/// Claims up to `limit` due deliveries for `lease` (database clock), counting a try each.
pub async fn claim_due(
    executor: impl PgExecutor<'_>,
    limit: i64,
    lease: Duration,
) -> sqlx::Result<Vec<Due>> {
    sqlx::query_as(
        "UPDATE webhook_deliveries d
            SET attempts = d.attempts + 1, lease_expires_at = now() + $2
           FROM webhooks w
          WHERE w.id = d.webhook_id
            AND d.id IN (SELECT id FROM webhook_deliveries
                          WHERE delivered_at IS NULL AND abandoned_at IS NULL
                            AND next_attempt_at <= now()
                            AND (lease_expires_at IS NULL OR lease_expires_at <= now())
                          ORDER BY next_attempt_at
                          LIMIT $1
                            FOR UPDATE SKIP LOCKED)
         RETURNING d.id, d.attempts, d.payload, w.url, w.secret",
    )
    .bind(limit)
    .bind(interval(lease))
    .fetch_all(executor)
    .await
}

/// How a try ended.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The receiver's status, if it answered.
    pub status_code: Option<u16>,
    /// What went wrong, if anything.
    pub error: Option<String>,
    /// Whether it counts as delivered (a 2xx).
    pub delivered: bool,
    /// When to try again, if not delivered.
    pub retry_in: Duration,
}

/// Records try `attempt` of delivery `id` and its outcome. A failure is tried again after
/// `retry_in`, unless [`RETRY_WINDOW`] has passed since the event (by the database clock):
/// then the delivery is abandoned. Only the latest try moves the delivery (a slow worker's late
/// outcome of an earlier try is listed but changes nothing), and a delivered one stays so.
pub async fn record(
    executor: impl PgExecutor<'_>,
    id: Uuid,
    attempt: i32,
    outcome: &Outcome,
) -> sqlx::Result<()> {
    sqlx::query(
        "WITH t AS (INSERT INTO webhook_attempts (delivery_id, attempt, status_code, error)
                    VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING)
         UPDATE webhook_deliveries
            SET lease_expires_at = NULL,
                delivered_at = CASE WHEN $5 THEN now() END,
                abandoned_at = CASE WHEN NOT $5 AND created_at + $7 <= now() + $6 THEN now() END,
                next_attempt_at = now() + $6
          WHERE id = $1 AND attempts = $2 AND delivered_at IS NULL",
    )
    .bind(id)
    .bind(attempt)
    .bind(outcome.status_code.map(i32::from))
    .bind(outcome.error.as_deref())
    .bind(outcome.delivered)
    .bind(interval(outcome.retry_in))
    .bind(interval(RETRY_WINDOW))
    .execute(executor)
    .await?;
    Ok(())
}

fn interval(duration: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: i64::try_from(duration.as_micros()).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use spool_tests::TestDb;

    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    /// An endpoint of `acme` and one delivery to it of an event `age` old.
    async fn delivery(db: &TestDb, age: Duration) -> (WebhookId, Uuid) {
        let events = ["run.completed".to_owned()];
        let hook = create(&db.pool, "acme", "http://127.0.0.1:9/", &events, "whsec_x")
            .await
            .expect("webhook");
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
        let due = claim_due(&db.pool, 10, LEASE).await.expect("claim");
        assert_eq!(due.len(), 2);
        let again = claim_due(&db.pool, 10, LEASE).await.expect("claim");
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
        let later = claim_due(&db.pool, 10, LEASE).await.expect("claim");
        assert!(later.is_empty(), "not due yet, or abandoned");
    }

    #[tokio::test]
    async fn an_expired_lease_is_claimed_again_and_a_late_failure_cannot_undo_a_delivery() {
        let db = TestDb::new().await.expect("db");
        let (hook, id) = delivery(&db, Duration::ZERO).await;
        let first = claim_due(&db.pool, 10, Duration::ZERO)
            .await
            .expect("claim");
        // The first worker's lease ran out (it died, say): another claims the delivery.
        let second = claim_due(&db.pool, 10, LEASE).await.expect("claim");
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
}
