//! Webhook delivery: every worker delivers what the outbox holds (no process of its own).
//!
//! - [`run`] keeps up to `SPOOL_WEBHOOKS_CONCURRENCY` tries in flight, each on its own task
//!   off every run's path (a slow receiver never delays a run). It claims
//!   ([`webhooks::claim_due`]: a lease from the database clock, `SKIP LOCKED` among workers,
//!   turns taken between tenants and between endpoints) as many deliveries as it has free
//!   slots, and claims again as soon as a slot frees while deliveries are due (after [`GATHER`],
//!   so that one claim serves the slots that free meanwhile): delivery goes at the pace
//!   receivers answer, not at a fixed one. When a claim finds fewer than it had room for, the
//!   outbox is drained and it looks again after the poll interval (the outbox has no NOTIFY:
//!   one on every run's end would serialize their commits).
//! - Back-pressure: a receiver that is slow or never answers holds a slot for at most one try's
//!   timeout, a tenant holds at most `SPOOL_WEBHOOKS_MAX_IN_FLIGHT_PER_TENANT` slots (across
//!   workers), and the claim's turns give the next free slot to another tenant's delivery; an
//!   endpoint that keeps failing opens its circuit ([`webhooks::BREAKER_THRESHOLD`]) and
//!   holds no slot at all while it is open.
//! - Each try POSTs the payload, signed per Standard Webhooks ([`sign`]): `webhook-id` (the
//!   delivery's id, the same on every try), `webhook-timestamp` (seconds) and
//!   `webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, with the key the
//!   base64 after `whsec_` in the endpoint's secret; after a rotation, a second signature with
//!   the previous secret, space-separated, while its grace window lasts.
//! - A claim is made only for slots in hand, and each claimed delivery's POST starts at once.
//!   An erasure of its thread (or a deletion of its endpoint) may still commit while the try
//!   connects, so the body is handed to the connection only under a hold on the delivery's row
//!   ([`webhooks::hold_for_send`], [`gated`]): the hold finds the row gone and the body is
//!   never sent (the connection is dropped after the headers, which carry no payload), or the
//!   deletion waits the moment the hold lasts. Either the body went before the erasure
//!   committed, or it never goes.
//! - Tries' outcomes are recorded together ([`webhooks::record_all`], one statement for every
//!   outcome that ended while the previous statement ran); a try's slot frees once its outcome
//!   is recorded, so a worker never holds more than its concurrency in leases.
//! - The URL goes through the tools' network policy ([`NetworkPolicy::check_url`], and the
//!   resolver of [`guarded_client`]) at every try; redirects are never followed: a 3xx is a
//!   failed try (following a 303 would turn the signed POST into a GET whose 2xx would count as
//!   delivered). An `http://` URL goes through a client whose policy permits only the networks
//!   the operator allowed ([`NetworkPolicy::cleartext`]): signed payloads never cross the
//!   public internet in clear text.
//! - A 2xx delivers it. Anything else is retried with exponential backoff ([`retry_in`]: 5 s
//!   doubling to at most an hour) until 24 h after the event, then abandoned. A worker that
//!   dies mid-try leaves the lease to expire (the `lease` [`run`] is given); another worker
//!   tries again (at least once: receivers de-duplicate on `webhook-id`).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use chrono::Utc;
use hmac::{KeyInit as _, Mac as _};
use sqlx::PgPool;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use spool_shared::db::webhooks::{self, Due, Outcome};

use spool_shared::egress::{NetworkPolicy, Redirects, Refused, guarded_client};

/// The longest a try may take.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a claim waits, from its first free slot, for more slots to free and more
/// deliveries to fall due: one claim then serves them all.
pub const GATHER: Duration = Duration::from_millis(5);
/// Tries' outcomes recorded in one statement at most.
const RECORD_BATCH: usize = 64;
/// How often the oldest due delivery's age is measured for the metric.
pub const GAUGE_EVERY: Duration = Duration::from_secs(5);

/// How [`run`] delivers.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Tries in flight at most.
    pub concurrency: usize,
    /// Tries of one tenant in flight at most, across all workers.
    pub per_tenant: usize,
    /// How long a claim holds a delivery (a try takes at most half of it, 10 s at most).
    pub lease: Duration,
    /// How long to wait before looking again once the outbox has nothing due.
    pub idle_poll: Duration,
}

/// The clients a try may use: by the URL's scheme.
struct Clients {
    policy: Arc<NetworkPolicy>,
    https: reqwest::Client,
    cleartext: Arc<NetworkPolicy>,
    http: reqwest::Client,
}

impl Clients {
    fn new(policy: Arc<NetworkPolicy>, timeout: Duration) -> anyhow::Result<Self> {
        let cleartext = Arc::new(policy.cleartext());
        Ok(Self {
            https: guarded_client(Arc::clone(&policy), timeout, Redirects::Never)?,
            http: guarded_client(Arc::clone(&cleartext), timeout, Redirects::Never)?,
            policy,
            cleartext,
        })
    }

    /// The policy and client for `url`.
    fn for_url(&self, url: &reqwest::Url) -> (&NetworkPolicy, &reqwest::Client) {
        if url.scheme() == "http" {
            (&self.cleartext, &self.http)
        } else {
            (&self.policy, &self.https)
        }
    }
}

/// One try of `due`, just claimed by [`webhooks::claim_due`], as [`run`] makes it with a try
/// timeout of `timeout`: its outcome (for [`webhooks::record_all`]), or `None` when the body was
/// not sent because the delivery is no longer this try's (see [`gated`]).
pub async fn try_once(
    db: &PgPool,
    policy: Arc<NetworkPolicy>,
    timeout: Duration,
    due: &Due,
) -> anyhow::Result<Option<Outcome>> {
    let clients = Clients::new(policy, timeout)?;
    Ok(attempt(db, &clients, due).await)
}

/// Delivers due webhooks until `shutdown` fires; tries in flight then end with the process
/// (their leases expire and another worker tries again).
pub async fn run(db: PgPool, policy: Arc<NetworkPolicy>, pace: Pace, shutdown: CancellationToken) {
    let timeout = (pace.lease / 2).min(MAX_TIMEOUT);
    let clients = match Clients::new(policy, timeout) {
        Ok(clients) => Arc::new(clients),
        Err(err) => {
            tracing::error!(error = %err, "webhook client; webhooks will not be delivered");
            return;
        }
    };
    let gauge = tokio::spawn(measure(db.clone(), shutdown.clone()));
    let (tried, outcomes) = mpsc::unbounded_channel();
    let recorder = tokio::spawn(record(db.clone(), outcomes));
    let slots = Arc::new(Semaphore::new(pace.concurrency.max(1)));
    let tries = TaskTracker::new();
    loop {
        // Wait for a free slot, then a moment for more, and take every free one: one claim
        // fills them all.
        let first = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = shutdown.cancelled() => break,
        };
        tokio::select! {
            () = tokio::time::sleep(GATHER) => {}
            () = shutdown.cancelled() => break,
        }
        let mut permits = vec![first];
        while let Ok(permit) = Arc::clone(&slots).try_acquire_owned() {
            permits.push(permit);
        }
        let room = permits.len();
        let claimed = match webhooks::claim_due(
            &db,
            i64::try_from(room).unwrap_or(1),
            pace.lease,
            i64::try_from(pace.per_tenant).unwrap_or(i64::MAX),
        )
        .await
        {
            Ok(claimed) => {
                let count = claimed.len();
                for (delivery, permit) in claimed.into_iter().zip(permits.drain(..)) {
                    let (db, clients, tried) = (db.clone(), Arc::clone(&clients), tried.clone());
                    tries.spawn(
                        async move { deliver(&db, &clients, delivery, permit, tried).await },
                    );
                }
                count
            }
            Err(err) => {
                tracing::warn!(error = %err, "claiming webhook deliveries failed");
                0
            }
        };
        drop(permits);
        if claimed == room {
            // Every slot found a delivery: more may be due. Claim again when one frees.
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep(pace.idle_poll) => {}
            () = shutdown.cancelled() => break,
        }
    }
    gauge.abort();
    tries.close();
    drop(tried);
    // The tries in flight end and their outcomes are recorded (the recorder ends with the last
    // try), within one try's timeout.
    let _ = tokio::time::timeout(timeout, async {
        tries.wait().await;
        let _ = recorder.await;
    })
    .await;
}

/// A try that ended, and the slot it holds until its outcome is recorded.
struct Tried {
    id: uuid::Uuid,
    attempt: i32,
    outcome: Outcome,
    slot: OwnedSemaphorePermit,
}

/// Records tries' outcomes as they end: every outcome that arrived while the previous
/// statement ran goes in the next one (at most [`RECORD_BATCH`]), then their slots free.
async fn record(db: PgPool, mut ended: mpsc::UnboundedReceiver<Tried>) {
    let mut batch = Vec::with_capacity(RECORD_BATCH);
    while ended.recv_many(&mut batch, RECORD_BATCH).await > 0 {
        let (rows, slots): (Vec<_>, Vec<_>) = batch
            .drain(..)
            .map(|t| ((t.id, t.attempt, t.outcome), t.slot))
            .unzip();
        if let Err(err) = webhooks::record_all(&db, &rows).await {
            // Their leases expire and the deliveries are tried again.
            tracing::warn!(error = %err, tries = rows.len(), "recording webhook tries failed");
        }
        drop(slots);
    }
}

/// Sets `spool_webhook_oldest_due_seconds` every [`GAUGE_EVERY`]: a scrape reads the last
/// value, so scrapes cost the database nothing.
async fn measure(db: PgPool, shutdown: CancellationToken) {
    let mut ticks = tokio::time::interval(GAUGE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = shutdown.cancelled() => return,
        }
        match webhooks::oldest_due_seconds(&db).await {
            Ok(age) => metrics::gauge!("spool_webhook_oldest_due_seconds").set(age),
            Err(err) => tracing::debug!(error = %err, "measuring the webhook outbox failed"),
        }
    }
}

/// One try of one delivery; its outcome and slot go to the recorder (a try whose body was not
/// sent has nothing to record: its slot frees at once).
async fn deliver(
    db: &PgPool,
    clients: &Clients,
    due: Due,
    slot: OwnedSemaphorePermit,
    tried: mpsc::UnboundedSender<Tried>,
) {
    let Some(outcome) = attempt(db, clients, &due).await else {
        tracing::debug!(webhook.delivery = %due.id, attempt = due.attempts,
            "webhook delivery not sent: erased, deleted or no longer this try's");
        metrics::counter!("spool_webhook_deliveries_total", "outcome" => "not_sent").increment(1);
        return;
    };
    let outcome = Outcome {
        retry_in: retry_in(due.attempts),
        ..outcome
    };
    match &outcome.error {
        Some(error) => tracing::info!(webhook.delivery = %due.id, attempt = due.attempts,
            status = outcome.status_code, %error, "webhook delivery failed"),
        None => tracing::debug!(webhook.delivery = %due.id, attempt = due.attempts,
            "webhook delivered"),
    }
    metrics::counter!("spool_webhook_deliveries_total",
        "outcome" => if outcome.delivered { "delivered" } else { "failed" })
    .increment(1);
    // Without a recorder (shutdown), the lease expires and the delivery is tried again.
    let _ = tried.send(Tried {
        id: due.id,
        attempt: due.attempts,
        outcome,
        slot,
    });
}

/// Why a try's body was not handed to the connection: [`webhooks::hold_for_send`] found the
/// delivery no longer this try's to send.
#[derive(Debug)]
struct NotSent;

impl std::fmt::Display for NotSent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the delivery is no longer this try's to send")
    }
}

impl std::error::Error for NotSent {}

/// The body of try `attempt` of delivery `id`, handed to the connection only under a hold on
/// the delivery's row ([`webhooks::hold_for_send`]): the connection polls it once it is
/// established and the headers are on their way; the hold is taken then, and ends when the
/// connection has taken the bytes (it drops the body once the `Content-Length` is written, or
/// polls it for more). If the hold finds the delivery gone, the body fails with [`NotSent`]
/// and the request is abandoned without a byte of the payload.
fn gated(db: PgPool, id: uuid::Uuid, attempt: i32, body: String) -> reqwest::Body {
    enum Gate {
        Shut(PgPool, String),
        Open(webhooks::Held),
        Done,
    }
    type BoxError = Box<dyn std::error::Error + Send + Sync>;
    let chunks = futures::stream::unfold(Gate::Shut(db, body), move |gate| async move {
        match gate {
            Gate::Shut(db, body) => match webhooks::hold_for_send(&db, id, attempt).await {
                Ok(Some(held)) => Some((Ok(bytes::Bytes::from(body)), Gate::Open(held))),
                Ok(None) => Some((Err(BoxError::from(NotSent)), Gate::Done)),
                Err(err) => Some((Err(BoxError::from(err)), Gate::Done)),
            },
            Gate::Open(held) => {
                if let Err(err) = held.release().await {
                    tracing::debug!(error = %err, "ending a webhook delivery's hold failed");
                }
                None
            }
            Gate::Done => None,
        }
    });
    reqwest::Body::wrap_stream(chunks)
}

/// The POST itself; `None` if its body was not sent ([`gated`]).
async fn attempt(db: &PgPool, clients: &Clients, due: &Due) -> Option<Outcome> {
    let failed = |status_code: Option<u16>, error: String| Outcome {
        status_code,
        error: Some(error),
        delivered: false,
        retry_in: Duration::ZERO,
    };
    let Ok(url) = reqwest::Url::parse(&due.url) else {
        return Some(failed(None, "the URL does not parse".into()));
    };
    // An IP-literal host is judged here (the resolver never sees it); names at connect time.
    let (policy, client) = clients.for_url(&url);
    if let Err(reason) = policy.check_url(&url) {
        return Some(failed(None, Refused::new(reason).to_string()));
    }
    let body = due.payload.0.to_string();
    let id = due.id.to_string();
    let timestamp = Utc::now().timestamp();
    let Some(mut signature) = sign(&due.secret, &id, timestamp, &body) else {
        return Some(failed(
            None,
            "the endpoint's secret is not a whsec_ secret".into(),
        ));
    };
    // Standard Webhooks: several signatures, space-separated; a receiver accepts any it can
    // verify, so one still holding the previous secret keeps verifying during the grace.
    if let Some(previous) = due.previous_secret.as_deref()
        && let Some(old) = sign(previous, &id, timestamp, &body)
    {
        signature = format!("{signature} {old}");
    }
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .header("content-length", body.len())
        .body(gated(db.clone(), due.id, due.attempts, body))
        .send()
        .await;
    Some(match response {
        Ok(response) if response.status().is_success() => Outcome {
            status_code: Some(response.status().as_u16()),
            error: None,
            delivered: true,
            retry_in: Duration::ZERO,
        },
        Ok(response) => {
            let status = response.status();
            failed(
                Some(status.as_u16()),
                format!("the receiver answered {status}"),
            )
        }
        Err(err) => {
            let chain =
                std::iter::successors(Some(&err as &(dyn std::error::Error + 'static)), |e| {
                    e.source()
                });
            let mut refused = None;
            for cause in chain {
                if cause.is::<NotSent>() {
                    return None;
                }
                if let Some(reason) = cause.downcast_ref::<Refused>() {
                    refused.get_or_insert_with(|| reason.to_string());
                }
            }
            failed(
                None,
                refused.unwrap_or_else(|| err.without_url().to_string()),
            )
        }
    })
}

/// The delay before try `attempts + 1`: 5 s, doubling, at most an hour.
pub fn retry_in(attempts: i32) -> Duration {
    let doublings = u32::try_from(attempts.saturating_sub(1))
        .unwrap_or(0)
        .min(20);
    Duration::from_secs(5u64.saturating_mul(1 << doublings)).min(Duration::from_secs(3600))
}

/// The `webhook-signature` of a delivery (Standard Webhooks): `v1,` and the base64 of
/// HMAC-SHA256 over `{id}.{timestamp}.{body}`, keyed with the bytes the secret's base64 after
/// `whsec_` encodes. `None` for a secret of another form.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &str) -> Option<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64.decode(secret.strip_prefix("whsec_")?).ok()?;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).ok()?;
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    Some(format!("v1,{}", b64.encode(mac.finalize().into_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_standard_webhooks_test_vector() {
        // From the Standard Webhooks reference libraries' tests.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            sign(secret, id, 1_614_265_330, body).as_deref(),
            Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
        assert_eq!(sign("not-a-secret", id, 0, body), None);
    }

    #[test]
    fn retries_back_off_to_an_hour() {
        assert_eq!(retry_in(1), Duration::from_secs(5));
        assert_eq!(retry_in(2), Duration::from_secs(10));
        assert_eq!(retry_in(5), Duration::from_secs(80));
        assert_eq!(retry_in(40), Duration::from_secs(3600));
    }
}
