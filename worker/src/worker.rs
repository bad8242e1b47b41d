//! A worker: what its claim loop and every attempt it runs share (the database, its settings,
//! its name, where events go, and the engine of models and tools).

use std::sync::Arc;

use sqlx::PgPool;

use spool_shared::db::Timeouts;
use spool_shared::egress::NetworkPolicy;
use spool_shared::quota::admission::Admission;

use crate::agent::engine::Engine;
use crate::config::WorkerArgs;
use crate::publish::Streams;

/// What a worker needs: its database, its settings and its name.
#[derive(Clone)]
pub struct Worker {
    /// The shared Postgres pool.
    pub db: PgPool,
    /// The claim's own connection ([`spool_shared::db::claim_pool`]).
    pub claims: PgPool,
    /// Where this worker's next claim starts its window of tenants
    /// ([`spool_shared::db::runs::claim`]'s `after_tenant`).
    pub claim_cursor: Arc<tokio::sync::Mutex<Option<String>>>,
    /// The database URL (the lease keeper opens its own pool on its own thread).
    pub database_url: String,
    /// The session timeouts of the claim's and the lease keeper's pools (the shared pool's are
    /// set where it was made, [`spool_shared::db::connect`]).
    pub db_timeouts: Timeouts,
    /// Settings.
    pub args: Arc<WorkerArgs>,
    /// This worker's name in `runs.lease_owner`: host, pid and a random suffix.
    pub id: String,
    /// Where run events are published.
    pub streams: Streams,
    /// Models, tools and the default agent.
    pub engine: Arc<Engine>,
    /// The quota counters (Redis): a run's end gives back its room, a model call's tokens are
    /// copied there.
    pub admission: Admission,
    /// What tools, MCP servers, hooks and webhook deliveries may reach.
    pub egress: Arc<NetworkPolicy>,
}

impl Worker {
    /// A worker with a fresh unique name; fails on settings that cannot work (a bad network
    /// allow list, say).
    pub fn new(
        db: PgPool,
        database_url: String,
        db_timeouts: Timeouts,
        args: WorkerArgs,
        streams: Streams,
    ) -> anyhow::Result<Self> {
        let egress = Arc::new(args.egress.policy()?);
        let engine = Arc::new(Engine::new(&args, &egress)?);
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".to_owned());
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let id = format!("{host}-{}-{}", std::process::id(), &suffix[..8]);
        let admission = Admission::new(streams.conn.clone(), &streams.keys);
        let claims = spool_shared::db::claim_pool(&database_url, "spool-worker", db_timeouts)?;
        Ok(Self {
            db,
            claims,
            claim_cursor: Arc::default(),
            database_url,
            db_timeouts,
            args: Arc::new(args),
            id,
            streams,
            engine,
            admission,
            egress,
        })
    }
}
