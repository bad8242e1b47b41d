//! Webhooks: a tenant's endpoints and the outbox of their deliveries (docs/api.md).
//!
//! The outbox rows are written by the `runs_status_changed` trigger (migration
//! `20261128000001_baseline.sql`) in the transaction that changes a run's status, so an
//! event is recorded exactly when the change commits, whichever process made it. Workers
//! deliver them: [`claim_due`] takes due rows with a lease from the database clock (`FOR
//! UPDATE SKIP LOCKED`, so workers share the work), taking turns between tenants and between
//! endpoints so that one tenant's backlog or dead endpoints cannot hold back another's, and
//! [`record_all`] writes the outcomes of tries (a batch in one statement) and the endpoints'
//! circuit breakers. A worker that dies
//! mid-delivery leaves its lease to expire; another worker delivers again (at least once:
//! receivers de-duplicate on `webhook-id`). [`purge`] keeps the outbox to its retention.
//!
//! Every statement here reads an index of `webhook_deliveries` (migration
//! `20261128200001_webhooks_at_scale.sql` names which) and is bounded: the claim by the number of
//! endpoints with pending deliveries (at most `SPOOL_WEBHOOKS_MAX_PER_TENANT` per tenant), the
//! purge by its batch.

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
    /// Failed tries in a row (a 2xx resets it).
    pub consecutive_failures: i32,
    /// While in the future, no delivery to it is tried (its circuit is open).
    pub circuit_open_until: Option<DateTime<Utc>>,
    /// Until when the secret a rotation replaced still signs deliveries.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
}

/// The columns of [`Webhook`].
const COLUMNS: &str = "id, url, events, secret, created_at, consecutive_failures, \
                       circuit_open_until, previous_secret_expires_at";

/// Stores a new endpoint, unless the tenant already has `max` (`None` then).
///
/// The count and the insert happen under a transaction-scoped advisory lock on the tenant, so
/// two creations at once cannot both pass the count; other tenants never wait on it.
pub async fn create(
    pool: &sqlx::PgPool,
    tenant_id: &str,
    url: &str,
    events: &[String],
    secret: &str,
    max: u32,
) -> sqlx::Result<Option<Webhook>> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('spool.webhooks:' || $1, 0))")
        .bind(tenant_id)
        .execute(&mut *tx)
        .await?;
    let sql = format!(
        "INSERT INTO webhooks (id, tenant_id, url, events, secret)
         SELECT $1, $2, $3, $4, $5
          WHERE (SELECT count(*) FROM webhooks WHERE tenant_id = $2) < $6
         RETURNING {COLUMNS}"
    );
    let created = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(WebhookId::new())
        .bind(tenant_id)
        .bind(url)
        .bind(events)
        .bind(secret)
        .bind(i64::from(max))
        .fetch_optional(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(created)
}

/// A page of the tenant's endpoints, newest first.
pub async fn list(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    after: Option<Cursor>,
    limit: i64,
) -> sqlx::Result<Page<Webhook>> {
    let mut query = sqlx::QueryBuilder::new(
        "SELECT w.id, w.url, w.events, w.secret, w.created_at, w.consecutive_failures,
                w.circuit_open_until, w.previous_secret_expires_at
           FROM webhooks w WHERE w.tenant_id = ",
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
    let sql = format!("SELECT {COLUMNS} FROM webhooks WHERE id = $1 AND tenant_id = $2");
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(tenant_id)
        .fetch_optional(executor)
        .await
}

/// Gives the tenant's endpoint a new signing secret; the one it had keeps signing deliveries
/// (a second signature) for `grace`, so receivers can switch without missing one. A secret
/// rotated away before is dropped at once. `None` if there is no such endpoint.
pub async fn rotate_secret(
    executor: impl PgExecutor<'_>,
    id: WebhookId,
    tenant_id: &str,
    secret: &str,
    grace: Duration,
) -> sqlx::Result<Option<Webhook>> {
    let sql = format!(
        "UPDATE webhooks
            SET previous_secret = secret, previous_secret_expires_at = now() + $4, secret = $3
          WHERE id = $1 AND tenant_id = $2
         RETURNING {COLUMNS}"
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(tenant_id)
        .bind(secret)
        .bind(interval(grace))
        .fetch_optional(executor)
        .await
}

/// Deletes the tenant's endpoint and all its deliveries, pending ones included (they would
/// go to an endpoint its owner removed); returns how many were pending, or `None` if there
/// was no such endpoint.
pub async fn delete(
    executor: impl PgExecutor<'_>,
    id: WebhookId,
    tenant_id: &str,
) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar(
        "WITH gone AS (DELETE FROM webhooks WHERE id = $1 AND tenant_id = $2 RETURNING id)
         SELECT (SELECT count(*) FROM webhook_deliveries d
                  WHERE d.webhook_id = gone.id
                    AND d.delivered_at IS NULL AND d.abandoned_at IS NULL)
           FROM gone",
    )
    .bind(id)
    .bind(tenant_id)
    .fetch_optional(executor)
    .await
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
    /// The secret it replaced, while its grace window lasts: it signs too.
    pub previous_secret: Option<String>,
}

/// Consecutive failed tries after which an endpoint's circuit opens: none of its deliveries is
/// claimed for a while, then one at a time until one succeeds.
pub const BREAKER_THRESHOLD: i32 = 5;
/// How long the circuit first stays open; it doubles with each failed probe.
pub const BREAKER_OPEN: Duration = Duration::from_secs(30);
/// The longest the circuit stays open at once.
pub const BREAKER_MAX_OPEN: Duration = Duration::from_secs(3600);

/// Claims up to `limit` due deliveries for `lease` (database clock), counting a try each,
/// taking turns between tenants and, within a tenant, between its endpoints, and leaving any
/// tenant at most `per_tenant` tries in flight (across all workers): see [`CLAIM`].
pub async fn claim_due(
    executor: impl PgExecutor<'_>,
    limit: i64,
    lease: Duration,
    per_tenant: i64,
) -> sqlx::Result<Vec<Due>> {
    sqlx::query_as(CLAIM)
        .bind(limit)
        .bind(interval(lease))
        .bind(BREAKER_THRESHOLD)
        .bind(per_tenant.max(1))
        .fetch_all(executor)
        .await
}

/// The claim's statement (`$1` limit, `$2` lease, `$3` [`BREAKER_THRESHOLD`], `$4` the
/// tries one tenant may have in flight).
///
/// Fair as the run claim is (`shared/src/db/runs/claim.rs`): every endpoint with a pending
/// delivery is found by a loose index scan (one probe each; a tenant has at most
/// `SPOOL_WEBHOOKS_MAX_PER_TENANT` endpoints), each due one gets a turn from its in-flight
/// tries and its own order, and each tenant's deliveries a turn from the tenant's in-flight
/// tries and those endpoint turns. So a tenant with a backlog, or with endpoints that never
/// answer, takes one slot after another only while no other tenant has a delivery due, and
/// never more than `$4` in all (`SPOOL_WEBHOOKS_MAX_IN_FLIGHT_PER_TENANT`): another tenant's
/// delivery finds a free slot at once while one tenant's dead endpoints hold their cap (and
/// otherwise is claimed by the next slot that frees, within one try's timeout). A tenant at
/// its cap is left out before the turns are counted.
/// An open circuit hides its endpoint; a half-open one (threshold reached, open time past)
/// offers one delivery, and none while that one is in flight.
///
/// A claimed row's `next_attempt_at` moves to its lease's end, so rows in flight are not "due"
/// in the endpoint's order (the lateral read would stop on them) and come back by themselves
/// when a worker dies holding them.
pub const CLAIM: &str = "WITH RECURSIVE
     endpoints (webhook_id, first_at) AS (
         (SELECT webhook_id, next_attempt_at FROM webhook_deliveries
           WHERE delivered_at IS NULL AND abandoned_at IS NULL
           ORDER BY webhook_id, next_attempt_at LIMIT 1)
         UNION ALL
         SELECT n.webhook_id, n.next_attempt_at
           FROM endpoints e
           CROSS JOIN LATERAL (SELECT q.webhook_id, q.next_attempt_at FROM webhook_deliveries q
                                WHERE q.delivered_at IS NULL AND q.abandoned_at IS NULL
                                  AND q.webhook_id > e.webhook_id
                                ORDER BY q.webhook_id, q.next_attempt_at LIMIT 1) n),
     ready AS (
         SELECT w.id, w.tenant_id, e.first_at, w.consecutive_failures >= $3 AS probing,
                (SELECT count(*) FROM webhook_deliveries x
                  WHERE x.tenant_id = w.tenant_id AND x.webhook_id = w.id
                    AND x.delivered_at IS NULL AND x.abandoned_at IS NULL
                    AND x.lease_expires_at > now()) AS busy
           FROM endpoints e JOIN webhooks w ON w.id = e.webhook_id
          WHERE e.first_at <= now()
            AND (w.circuit_open_until IS NULL OR w.circuit_open_until <= now())),
     -- The least busy tenants, the oldest due first among equals: each has a delivery whose
     -- turn is its load + 1, so no tenant past the first $1 could win a slot (a few more for
     -- rows other workers hold).
     tenants AS MATERIALIZED (
         SELECT l.tenant_id, l.busy
           FROM (SELECT t.tenant_id, t.oldest,
                        (SELECT count(*) FROM webhook_deliveries x
                          WHERE x.tenant_id = t.tenant_id
                            AND x.delivered_at IS NULL AND x.abandoned_at IS NULL
                            AND x.lease_expires_at > now()) AS busy
                   FROM (SELECT tenant_id, min(first_at) AS oldest FROM ready GROUP BY tenant_id) t
                ) l
          WHERE l.busy < $4
          ORDER BY l.busy, l.oldest
          LIMIT $1 + 8),
     ranked AS (
         SELECT h.id, r.tenant_id, h.next_attempt_at,
                r.busy + row_number() OVER (PARTITION BY r.id ORDER BY h.next_attempt_at)
                    AS endpoint_turn
           FROM ready r
           JOIN tenants c ON c.tenant_id = r.tenant_id
           CROSS JOIN LATERAL (SELECT q.id, q.next_attempt_at FROM webhook_deliveries q
                                WHERE q.webhook_id = r.id
                                  AND q.delivered_at IS NULL AND q.abandoned_at IS NULL
                                  AND q.next_attempt_at <= now()
                                ORDER BY q.next_attempt_at
                                LIMIT CASE WHEN NOT r.probing THEN least($1 + 8, $4 - c.busy)
                                           WHEN r.busy = 0 THEN 1 ELSE 0 END) h),
     fair AS (
         SELECT f.id, f.next_attempt_at, f.turn
           FROM (SELECT k.id, k.next_attempt_at,
                        t.busy + row_number() OVER (PARTITION BY k.tenant_id
                                                    ORDER BY k.endpoint_turn, k.next_attempt_at)
                            AS turn
                   FROM ranked k JOIN tenants t ON t.tenant_id = k.tenant_id) f
          WHERE f.turn <= $4
          ORDER BY f.turn, f.next_attempt_at
          LIMIT 2 * $1 + 32),
     candidate AS (
         SELECT d.id FROM webhook_deliveries d JOIN fair f ON f.id = d.id
          WHERE d.delivered_at IS NULL AND d.abandoned_at IS NULL AND d.next_attempt_at <= now()
            AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= now())
          ORDER BY f.turn, f.next_attempt_at
          LIMIT $1
            FOR UPDATE OF d SKIP LOCKED)
     UPDATE webhook_deliveries d
        SET attempts = d.attempts + 1, lease_expires_at = now() + $2,
            next_attempt_at = now() + $2
       FROM candidate c, webhooks w
      WHERE d.id = c.id AND w.id = d.webhook_id
     RETURNING d.id, d.attempts, d.payload, w.url, w.secret,
               CASE WHEN w.previous_secret_expires_at > now() THEN w.previous_secret END
                   AS previous_secret";

/// A claimed delivery's row, share-locked while its body is handed to the connection
/// ([`hold_for_send`]); dropping it (or [`Held::release`]) ends the hold.
#[derive(Debug)]
pub struct Held(sqlx::Transaction<'static, sqlx::Postgres>);

impl Held {
    /// Ends the hold now (dropping it does too, with the connection's next use).
    pub async fn release(self) -> sqlx::Result<()> {
        self.0.commit().await
    }
}

/// Holds claimed delivery `id`, try `attempt`, for the moment its body is handed to the
/// receiver's connection: `Some` if it is still pending and still this try's, with its row
/// share-locked (`FOR KEY SHARE`, in a transaction of its own) until the [`Held`] is released
/// or dropped; `None` if it is not to be sent: its thread was erased or its endpoint deleted
/// (the row is gone), another worker took it over after the lease expired, it was delivered,
/// or a deletion of it is under way (a row locked by one is skipped, never waited for).
///
/// This is what makes erasure final for deliveries already claimed: the `DELETE` of the
/// thread's deliveries ([`crate::db::threads::erase`]) or of the endpoint waits for a hold
/// (one round trip and a write into a socket buffer), and a hold taken after the deletion
/// finds nothing. So a delivery's body is sent either before the deletion commits or never.
/// The lock is on that one row: only a deletion of the same tenant's thread or endpoint
/// ever waits on it.
pub async fn hold_for_send(
    pool: &sqlx::PgPool,
    id: Uuid,
    attempt: i32,
) -> sqlx::Result<Option<Held>> {
    let mut tx = pool.begin().await?;
    let found: Option<(Uuid,)> = sqlx::query_as(
        "SELECT id FROM webhook_deliveries
          WHERE id = $1 AND attempts = $2 AND delivered_at IS NULL AND abandoned_at IS NULL
            FOR KEY SHARE SKIP LOCKED",
    )
    .bind(id)
    .bind(attempt)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(found.map(|_| Held(tx)))
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

/// Records try `attempt` of delivery `id` and its outcome: [`record_all`] of one.
pub async fn record(
    executor: impl PgExecutor<'_>,
    id: Uuid,
    attempt: i32,
    outcome: &Outcome,
) -> sqlx::Result<()> {
    record_all(executor, &[(id, attempt, outcome.clone())]).await
}

/// Records tries (delivery id, try number, outcome), in the order they ended, in one
/// statement. A failure is tried again after its `retry_in`, unless [`RETRY_WINDOW`] has
/// passed since the event (by the database clock): then the delivery is abandoned. Only the
/// latest try moves a delivery (a slow worker's late outcome of an earlier try is listed but
/// changes nothing), and a delivered one stays so.
///
/// Each endpoint's circuit follows its tries in order (only tries that moved their delivery
/// count): a 2xx closes it, a failure counts, and the [`BREAKER_THRESHOLD`]th failure in a row
/// opens it for [`BREAKER_OPEN`], doubling with each failure after (at most
/// [`BREAKER_MAX_OPEN`]). So of an endpoint's tries in one call, the failures after its last
/// 2xx count, from 0 if there was a 2xx and from its stored count if not. The endpoint's row is
/// written only when that changes something.
///
/// A try of a delivery that is gone (its thread erased or its endpoint deleted while the try
/// was in flight), or whose row a deletion (or another worker's claim after the lease expired)
/// holds locked, is left out, without waiting: the others are recorded all the same (a try
/// row for a deleted delivery would break its foreign key and lose the whole batch).
pub async fn record_all(
    executor: impl PgExecutor<'_>,
    tries: &[(Uuid, i32, Outcome)],
) -> sqlx::Result<()> {
    if tries.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = tries.iter().map(|(id, _, _)| *id).collect();
    let attempts: Vec<i32> = tries.iter().map(|(_, attempt, _)| *attempt).collect();
    let codes: Vec<Option<i32>> = tries
        .iter()
        .map(|(_, _, o)| o.status_code.map(i32::from))
        .collect();
    let errors: Vec<Option<String>> = tries.iter().map(|(_, _, o)| o.error.clone()).collect();
    let delivered: Vec<bool> = tries.iter().map(|(_, _, o)| o.delivered).collect();
    let retry_us: Vec<i64> = tries
        .iter()
        .map(|(_, _, o)| i64::try_from(o.retry_in.as_micros()).unwrap_or(i64::MAX))
        .collect();
    sqlx::query(
        "WITH o AS (SELECT * FROM unnest($1::uuid[], $2::int4[], $3::int4[], $4::text[],
                                         $5::bool[], $6::int8[])
                             WITH ORDINALITY AS o(id, attempt, status_code, error, delivered,
                                                  retry_us, n)),
              live AS (SELECT id FROM webhook_deliveries WHERE id = ANY($1)
                          FOR KEY SHARE SKIP LOCKED),
              t AS (INSERT INTO webhook_attempts (delivery_id, attempt, status_code, error)
                    SELECT o.id, o.attempt, o.status_code, o.error FROM o JOIN live USING (id)
                    ON CONFLICT DO NOTHING),
              d AS (UPDATE webhook_deliveries d
                       SET lease_expires_at = NULL,
                           delivered_at = CASE WHEN o.delivered THEN now() END,
                           abandoned_at = CASE
                               WHEN NOT o.delivered
                                    AND d.created_at + $7
                                        <= now() + o.retry_us * interval '1 microsecond'
                               THEN now() END,
                           next_attempt_at = now() + o.retry_us * interval '1 microsecond'
                      FROM o JOIN live USING (id)
                     WHERE d.id = o.id AND d.attempts = o.attempt AND d.delivered_at IS NULL
                 RETURNING d.webhook_id, o.delivered, o.n),
              k AS (SELECT webhook_id, max(n) FILTER (WHERE delivered) AS last_ok
                      FROM d GROUP BY webhook_id),
              e AS (SELECT d.webhook_id, k.last_ok IS NOT NULL AS ok,
                           count(*) FILTER (WHERE NOT d.delivered
                                              AND d.n > coalesce(k.last_ok, 0))::int4 AS failed
                      FROM d JOIN k ON k.webhook_id = d.webhook_id
                     GROUP BY d.webhook_id, k.last_ok)
         UPDATE webhooks w
            SET consecutive_failures =
                    CASE WHEN e.ok THEN 0 ELSE w.consecutive_failures END + e.failed,
                circuit_open_until = CASE
                    WHEN e.failed > 0
                         AND CASE WHEN e.ok THEN 0 ELSE w.consecutive_failures END + e.failed >= $8
                    THEN now() + least($9 * power(2, least(
                             CASE WHEN e.ok THEN 0 ELSE w.consecutive_failures END
                                 + e.failed - $8, 16)), $10)
                    WHEN e.ok THEN NULL
                    ELSE w.circuit_open_until END
           FROM e
          WHERE w.id = e.webhook_id
            AND NOT (e.failed = 0 AND w.consecutive_failures = 0 AND w.circuit_open_until IS NULL)",
    )
    .bind(ids)
    .bind(attempts)
    .bind(codes)
    .bind(errors)
    .bind(delivered)
    .bind(retry_us)
    .bind(interval(RETRY_WINDOW))
    .bind(BREAKER_THRESHOLD)
    .bind(interval(BREAKER_OPEN))
    .bind(interval(BREAKER_MAX_OPEN))
    .execute(executor)
    .await?;
    Ok(())
}

/// Housekeeping of the outbox, `batch` rows per statement until a statement finds fewer:
/// pending deliveries older than [`RETRY_WINDOW`] that no try holds (an open circuit kept
/// them) are marked abandoned, then delivered and abandoned ones older than `retention` are
/// deleted with their tries. Each statement reads its own partial index from the oldest row
/// and skips rows another worker holds, so workers doing it at once share the work. Returns
/// (abandoned, deleted).
pub async fn purge(
    pool: &sqlx::PgPool,
    retention: Duration,
    batch: i64,
) -> sqlx::Result<(u64, u64)> {
    let mut abandoned = 0;
    loop {
        let done = sqlx::query(
            "UPDATE webhook_deliveries SET abandoned_at = now(), lease_expires_at = NULL
              WHERE id IN (SELECT id FROM webhook_deliveries
                            WHERE delivered_at IS NULL AND abandoned_at IS NULL
                              AND created_at < now() - $1
                              AND (lease_expires_at IS NULL OR lease_expires_at < now())
                            ORDER BY created_at LIMIT $2
                              FOR UPDATE SKIP LOCKED)",
        )
        .bind(interval(RETRY_WINDOW))
        .bind(batch)
        .execute(pool)
        .await?
        .rows_affected();
        abandoned += done;
        if done < batch.unsigned_abs() {
            break;
        }
    }
    let mut deleted = 0;
    loop {
        let done = sqlx::query(
            "DELETE FROM webhook_deliveries
              WHERE id IN (SELECT id FROM webhook_deliveries
                            WHERE (delivered_at IS NOT NULL OR abandoned_at IS NOT NULL)
                              AND created_at < now() - $1
                            ORDER BY created_at LIMIT $2
                              FOR UPDATE SKIP LOCKED)",
        )
        .bind(interval(retention))
        .bind(batch)
        .execute(pool)
        .await?
        .rows_affected();
        deleted += done;
        if done < batch.unsigned_abs() {
            return Ok((abandoned, deleted));
        }
    }
}

/// Seconds since the oldest delivery that should be under way became due (0 when none is):
/// deliveries held by an open or half-open circuit do not count (the circuit holds them on
/// purpose; the endpoint's state says so). The claim's loose scan, one probe per endpoint
/// with a pending delivery.
pub async fn oldest_due_seconds(executor: impl PgExecutor<'_>) -> sqlx::Result<f64> {
    sqlx::query_scalar(
        "WITH RECURSIVE endpoints (webhook_id, first_at) AS (
             (SELECT webhook_id, next_attempt_at FROM webhook_deliveries
               WHERE delivered_at IS NULL AND abandoned_at IS NULL
               ORDER BY webhook_id, next_attempt_at LIMIT 1)
             UNION ALL
             SELECT n.webhook_id, n.next_attempt_at
               FROM endpoints e
               CROSS JOIN LATERAL (SELECT q.webhook_id, q.next_attempt_at
                                     FROM webhook_deliveries q
                                    WHERE q.delivered_at IS NULL AND q.abandoned_at IS NULL
                                      AND q.webhook_id > e.webhook_id
                                    ORDER BY q.webhook_id, q.next_attempt_at LIMIT 1) n)
         SELECT coalesce(extract(epoch FROM now() - min(e.first_at)), 0)::float8
           FROM endpoints e JOIN webhooks w ON w.id = e.webhook_id
          WHERE e.first_at <= now() AND w.consecutive_failures < $1",
    )
    .bind(BREAKER_THRESHOLD)
    .fetch_one(executor)
    .await
}

fn interval(duration: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: i64::try_from(duration.as_micros()).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests;
