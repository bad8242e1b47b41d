//! The claim's tests beside its SQL: fair claiming across tenants, the claim's plans past ended
//! runs, leases from the database clock, pauses, and the fence that keeps a reclaimed attempt
//! out of every write.

use serde_json::json;
use spool_tests::TestDb;

use super::*;
use crate::agent::AgentSpec;
use crate::db::enqueue::{NewMessage, enqueue};
use crate::db::messages;
use crate::db::page::Scope;
use crate::db::runs::{
    NewChild, WaitBounds, children, find, find_in, mcp_tools, request_cancel, resume,
};
use crate::db::threads::Owner;
use crate::ids::{AgentId, ThreadId};
use crate::run::PendingCall;

const WORKER: &str = "worker-a";
const HOUR: Duration = Duration::from_secs(3600);

/// A queued run on a thread of its own, as the enqueue leaves it.
async fn queued(db: &TestDb) -> (WorkflowId, MessageId) {
    let owner = Owner {
        tenant_id: "acme".into(),
        user_id: "alice".into(),
    };
    let message = NewMessage {
        thread_id: ThreadId::new(),
        owner: &owner,
        agent_id: None,
        input_text: "hi",
        metadata: &json!({}),
        idempotency_key: None,
        trace_context: None,
        quotas: &crate::quota::Quotas::default(),
        admission: &crate::db::enqueue::tests::admission(),
        overrides: None,
        history: &[],
        in_transaction: false,
        client: None,
        may_instruct: false,
        problems: &[],
    };
    let mut tx = db.pool.begin().await.expect("begin");
    let enqueued = enqueue(&mut crate::db::LazyConn::Held(&mut tx), &message)
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    (enqueued.workflow_id, enqueued.message_id)
}

fn completed(content: &str) -> Outcome<'_> {
    Outcome {
        status: RunStatus::Completed,
        content,
        parts: &[],
        usage: Usage::default(),
        error: None,
        final_step: None,
        output: None,
        blocked: false,
    }
}

async fn claim(db: &TestDb, lease: Duration) -> Option<Claimed> {
    super::claim(&db.pool, WORKER, lease, 1, None)
        .await
        .expect("claim")
        .pop()
}

/// `count` queued runs of `tenant` (one thread each), queued an hour ago, oldest first:
/// a backlog, written in three statements.
async fn backlog(db: &TestDb, tenant: &str, count: i32) {
    for sql in [
        "INSERT INTO threads (id, tenant_id, owner_id)
         SELECT md5($1 || 't' || n)::uuid, $1, 'u' FROM generate_series(1, $2) n",
        "INSERT INTO messages (id, thread_id, role, status)
         SELECT md5($1 || 'm' || n)::uuid, md5($1 || 't' || n)::uuid, 'user', 'completed'
           FROM generate_series(1, $2) n",
        "INSERT INTO runs (id, thread_id, tenant_id, owner_id, user_message_id,
                           assistant_message_id, queued_at)
         SELECT md5($1 || 'r' || n)::uuid, md5($1 || 't' || n)::uuid, $1, 'u',
                md5($1 || 'm' || n)::uuid, md5($1 || 'm' || n)::uuid,
                now() - interval '1 hour' + n * interval '1 ms'
           FROM generate_series(1, $2) n",
    ] {
        sqlx::query(sql)
            .bind(tenant)
            .bind(count)
            .execute(&db.pool)
            .await
            .expect("backlog");
    }
}

#[tokio::test]
async fn one_tenants_backlog_does_not_starve_another_tenants_run() {
    let db = TestDb::new().await.expect("db");
    backlog(&db, "big", 10_000).await;
    // acme's run is the newest of all: a global FIFO would take it after 10,000 others.
    let (small, _) = queued(&db).await;
    let mut order = Vec::new();
    for _ in 0..3 {
        let claimed = claim(&db, HOUR).await.expect("a claim");
        order.push(claimed.run().tenant_id.clone());
    }
    assert_eq!(order, ["big", "acme", "big"], "acme's run goes second");
    let run = find_in(&db.pool, small, Scope::Tenant("acme"))
        .await
        .expect("find")
        .expect("run");
    assert_eq!(run.status, RunStatus::Running);
    // Within a tenant, the oldest first.
    let (first_of_big,): (WorkflowId,) = sqlx::query_as(
        "SELECT id FROM runs WHERE tenant_id = 'big' AND status = 'running' ORDER BY queued_at LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await
    .expect("big's");
    let (oldest,): (WorkflowId,) = sqlx::query_as("SELECT md5('big' || 'r' || 1)::uuid")
        .fetch_one(&db.pool)
        .await
        .expect("id");
    assert_eq!(first_of_big, oldest);
}

/// The index entries a plan's index scans returned, loops included (a bitmap index scan
/// returns dead entries too: it cannot tell them apart).
fn index_entries_read(plan: &Value) -> f64 {
    let own = if plan["Node Type"].as_str().unwrap_or("").contains("Index") {
        plan["Actual Rows"].as_f64().unwrap_or(0.0) * plan["Actual Loops"].as_f64().unwrap_or(1.0)
    } else {
        0.0
    };
    let children = plan["Plans"]
        .as_array()
        .map_or(0.0, |plans| plans.iter().map(index_entries_read).sum());
    own + children
}

/// Runs that ended since the last vacuum leave dead entries in the indexes their queued and
/// running versions were in; a claim must not read them (it did, through a bitmap scan of
/// an index no query needed, reading every one of them on every claim).
#[tokio::test]
async fn a_claim_reads_the_runs_it_may_take_not_those_that_ended() {
    let db = without_autovacuum().await;
    let plan = plan_of_a_claim_past_ended_runs(&db, async || {
        let (Json(plan),): (Json<Value>,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) {CLAIM}"
        )))
        .bind(WORKER)
        .bind(interval(HOUR))
        .bind(1_i64)
        .bind("")
        .bind(i64::from(TENANTS_PER_CLAIM))
        .fetch_one(&db.pool)
        .await
        .expect("explain the claim");
        plan
    })
    .await;
    let read = index_entries_read(&plan[0]["Plan"]);
    assert!(
        read <= 100.0,
        "the claim read {read} index entries to take one of one queued runs: {plan:#}"
    );
}

/// The plan `explain` returns for a claim of one queued run, made once 5,000 runs have
/// ended; checks that the claim took the run.
async fn plan_of_a_claim_past_ended_runs(
    db: &TestDb,
    explain: impl AsyncFnOnce() -> Value,
) -> Value {
    ended(db, 5_000).await;
    let (run, _) = queued(db).await;
    let plan = explain().await;
    assert_eq!(
        status_of(db, run).await,
        RunStatus::Running,
        "the claim took it"
    );
    plan
}

/// `count` runs of tenant `big` that were claimed and have ended, more than a lease ago.
async fn ended(db: &TestDb, count: i32) {
    backlog(db, "big", count).await;
    for sql in [
        "UPDATE runs SET status = 'running', attempt = 1,
                lease_expires_at = now() - interval '1 minute' WHERE tenant_id = 'big'",
        "UPDATE runs SET status = 'completed', lease_expires_at = NULL, finished_at = now()
          WHERE tenant_id = 'big'",
    ] {
        sqlx::query(sql)
            .execute(&db.pool)
            .await
            .expect("claimed and ended");
    }
}

/// The status of acme's run.
async fn status_of(db: &TestDb, run: WorkflowId) -> RunStatus {
    find_in(&db.pool, run, Scope::Tenant("acme"))
        .await
        .expect("find")
        .expect("run")
        .status
}

/// A database whose `runs` and `messages` autovacuum leaves alone (their dead entries and
/// statistics stay as the test leaves them).
async fn without_autovacuum() -> TestDb {
    let db = TestDb::new().await.expect("db");
    for sql in [
        "ALTER TABLE runs SET (autovacuum_enabled = false)",
        "ALTER TABLE messages SET (autovacuum_enabled = false)",
    ] {
        sqlx::query(sql).execute(&db.pool).await.expect("no vacuum");
    }
    db
}

/// How many sequential scans of `relation` the plan holds.
fn seq_scans(plan: &Value, relation: &str) -> usize {
    let own = plan["Node Type"] == "Seq Scan" && plan["Relation Name"] == relation;
    usize::from(own)
        + plan["Plans"].as_array().map_or(0, |plans| {
            plans.iter().map(|plan| seq_scans(plan, relation)).sum()
        })
}

/// Postgres keeps a prepared statement's generic plan while the tables it reads grow: the
/// claim, planned on a `runs` table of a few rows, looked its picks up with a sequential
/// scan, and went on reading the whole table at every claim until autovacuum's next
/// analyze. The claim's own connection plans without sequential scans.
#[tokio::test]
async fn a_claim_planned_while_the_table_was_small_does_not_read_all_of_it_once_it_grew() {
    let db = without_autovacuum().await;
    let claims = crate::db::claim_pool(&db.url, "claims", crate::db::Timeouts::default())
        .expect("claim pool");
    let mut conn = claims.acquire().await.expect("connection");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "PREPARE claim (text, interval, bigint, text, bigint) AS {CLAIM}"
    )))
    .execute(&mut *conn)
    .await
    .expect("prepare");
    let execute = format!("claim ('{WORKER}', interval '1 hour', 1, '', 64)");
    // Postgres plans the first five executions for their parameters, then keeps one
    // generic plan: made here, on a table of a few runs.
    for _ in 0..8 {
        queued(&db).await;
        sqlx::query(sqlx::AssertSqlSafe(format!("EXECUTE {execute}")))
            .execute(&mut *conn)
            .await
            .expect("a claim");
    }
    let plan = plan_of_a_claim_past_ended_runs(&db, async || {
        let (Json(plan),): (Json<Value>,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {execute}"
        )))
        .fetch_one(&mut *conn)
        .await
        .expect("explain the claim");
        plan
    })
    .await;
    assert_eq!(
        seq_scans(&plan[0]["Plan"], "runs"),
        0,
        "the claim read the whole table to take one run: {plan:#}"
    );
}

/// `tenants` tenants (`t0001`, `t0002`, ...) with `each` queued runs apiece (a thread each),
/// in three statements.
async fn many_tenants(db: &TestDb, tenants: i32, each: i32) {
    for sql in [
        "INSERT INTO threads (id, tenant_id, owner_id)
         SELECT md5('t' || n || '.' || k)::uuid, 't' || lpad(n::text, 4, '0'), 'u'
           FROM generate_series(1, $1) n, generate_series(1, $2) k",
        "INSERT INTO messages (id, thread_id, role, status)
         SELECT md5('m' || n || '.' || k)::uuid, md5('t' || n || '.' || k)::uuid, 'user',
                'completed'
           FROM generate_series(1, $1) n, generate_series(1, $2) k",
        "INSERT INTO runs (id, thread_id, tenant_id, owner_id, user_message_id,
                           assistant_message_id, queued_at)
         SELECT md5('r' || n || '.' || k)::uuid, md5('t' || n || '.' || k)::uuid,
                't' || lpad(n::text, 4, '0'), 'u', md5('m' || n || '.' || k)::uuid,
                md5('m' || n || '.' || k)::uuid,
                now() - interval '1 hour' + (k * $1 + n) * interval '1 ms'
           FROM generate_series(1, $1) n, generate_series(1, $2) k",
    ] {
        sqlx::query(sql)
            .bind(tenants)
            .bind(each)
            .execute(&db.pool)
            .await
            .expect("many tenants");
    }
}

#[tokio::test]
async fn a_claim_examines_a_bounded_window_of_tenants_and_in_turn_serves_every_one() {
    let db = TestDb::new().await.expect("db");
    let tenants = 500;
    many_tenants(&db, tenants, 3).await;
    sqlx::query("ANALYZE runs")
        .execute(&db.pool)
        .await
        .expect("analyze");
    // Bounded: one claim reads the entries of its window, not of every tenant's runs (which
    // were 500 probes, then 500 tenants' queued runs: over 2,000 entries).
    let (Json(plan),): (Json<Value>,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {CLAIM}"
    )))
    .bind(WORKER)
    .bind(interval(HOUR))
    .bind(16_i64)
    .bind("")
    .bind(i64::from(TENANTS_PER_CLAIM))
    .fetch_one(&db.pool)
    .await
    .expect("explain the claim");
    let read = index_entries_read(&plan[0]["Plan"]);
    eprintln!("a claim of 16 among {tenants} tenants read {read} index entries");
    assert!(read <= 800.0, "the claim read {read} index entries");
    // Every tenant served in turn: claims of 16 as a worker makes them, each starting after
    // the previous one's window, serve each tenant's first run before many second ones.
    let mut cursor: Option<String> = None;
    let mut claims = 0;
    loop {
        let batch = super::claim(&db.pool, WORKER, HOUR, 16, cursor.as_deref())
            .await
            .expect("claim");
        claims += 1;
        assert_eq!(batch.len(), 16, "claim {claims} found 16 runs");
        cursor = batch[0].window_end().map(str::to_owned);
        let (served,): (i64,) =
            sqlx::query_as("SELECT count(DISTINCT tenant_id) FROM runs WHERE status = 'running'")
                .fetch_one(&db.pool)
                .await
                .expect("served");
        if served == i64::from(tenants) {
            eprintln!("{tenants} tenants served in {claims} claims of 16 (ideal: 32)");
            break;
        }
        assert!(
            claims < 48,
            "{served} of {tenants} tenants served after {claims} claims"
        );
    }
}

#[tokio::test]
async fn a_batch_takes_turns_between_tenants_and_marks_each_message_streaming() {
    let db = TestDb::new().await.expect("db");
    backlog(&db, "big", 1_000).await;
    let (small, message) = queued(&db).await;
    let batch = super::claim(&db.pool, WORKER, HOUR, 3, None)
        .await
        .expect("claim");
    let mut tenants: Vec<&str> = batch.iter().map(|c| c.run().tenant_id.as_str()).collect();
    tenants.sort_unstable();
    // Turns: big's oldest and acme's run first, then big's second; not big's three oldest.
    assert_eq!(tenants, ["acme", "big", "big"]);
    let mine = batch
        .iter()
        .find(|c| c.run().id == small)
        .expect("acme's run");
    assert_eq!(
        (mine.run().attempt, mine.run().status),
        (1, RunStatus::Running)
    );
    let (status,): (String,) = sqlx::query_as("SELECT status FROM messages WHERE id = $1")
        .bind(message)
        .fetch_one(&db.pool)
        .await
        .expect("message");
    assert_eq!(status, "streaming", "the claim marks the answer streaming");
    // Room for more than is claimable: what there is, each run once.
    let rest = super::claim(&db.pool, WORKER, HOUR, 2_000, None)
        .await
        .expect("claim");
    assert_eq!(rest.len(), 998);
    assert!(rest.iter().all(|c| c.run().attempt == 1));
    assert!(claim(&db, HOUR).await.is_none());
}

#[tokio::test]
async fn an_expired_lease_is_reclaimed_before_any_queued_run() {
    let db = TestDb::new().await.expect("db");
    let (crashed, _) = queued(&db).await;
    let first = claim(&db, HOUR).await.expect("a claim");
    assert_eq!(first.run().id, crashed);
    backlog(&db, "big", 100).await;
    expire(&db, crashed).await;
    let next = claim(&db, HOUR).await.expect("a claim");
    assert_eq!(next.run().id, crashed, "the crashed run first");
    assert_eq!(next.previous_status(), RunStatus::Running);
}

/// Ends the lease now, as time passing would.
async fn expire(db: &TestDb, id: WorkflowId) {
    sqlx::query("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(id)
        .execute(&db.pool)
        .await
        .expect("expire");
}

#[tokio::test]
async fn a_claim_bumps_the_attempt_and_takes_a_lease_of_the_database_s_now_plus_the_lease() {
    let db = TestDb::new().await.expect("db");
    let (id, _) = queued(&db).await;
    let lease = Duration::from_millis(2_500);
    let a = claim(&db, lease).await.expect("a run");
    assert_eq!(
        (a.run().id, a.run().attempt, a.previous_status()),
        (id, 1, RunStatus::Queued)
    );
    assert_eq!(a.run().lease_owner.as_deref(), Some(WORKER));
    // Set by the claim statement itself: expiry minus heartbeat is exactly the lease.
    let (lease_us,): (i64,) = sqlx::query_as(
        "SELECT (extract(epoch FROM lease_expires_at - heartbeat_at) * 1e6)::bigint
           FROM runs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .expect("lease");
    assert_eq!(lease_us, 2_500_000);
    assert!(
        claim(&db, lease).await.is_none(),
        "a leased run is not claimable"
    );
}

#[tokio::test]
async fn a_stale_attempt_is_fenced_out_of_every_write_after_a_reclaim() {
    let db = TestDb::new().await.expect("db");
    let (id, message) = queued(&db).await;
    let pool = &db.pool;
    let lease = Duration::from_secs(60);
    let a = claim(&db, lease).await.expect("a run");
    expire(&db, id).await;
    let b = claim(&db, lease).await.expect("a reclaim");
    assert_eq!(
        (b.run().attempt, b.run().reclaims, b.previous_status()),
        (2, 1, RunStatus::Running)
    );

    assert!(
        heartbeat(pool, &[(id, 1)], lease)
            .await
            .expect("hb")
            .is_empty()
    );
    assert_eq!(
        a.save_step(pool, 1, &SavedStep::default())
            .await
            .expect("save"),
        Fence::Lost
    );
    let action = PendingAction::SubmitToolOutputs {
        tool_calls: vec![PendingCall {
            tool_call_id: "c1".into(),
            tool_name: "t".into(),
            arguments: json!({}),
        }],
        expires_at: None,
    };
    let paused = a.pause(pool, RunStatus::RequiresAction, &action, HOUR);
    assert_eq!(paused.await.expect("pause"), Pause::Lost);
    assert_eq!(a.release(pool).await.expect("release"), Fence::Lost);
    assert_eq!(
        a.finish(pool, &completed("stale")).await.expect("finish"),
        Fence::Lost
    );
    // A summary of the thread (a write outside the run's row) is fenced on the attempt too.
    let summary = messages::save_summary(pool, id, 1, 1, "stale summary", "m").await;
    assert!(
        !summary.expect("summary"),
        "a stale attempt stores no summary"
    );
    let tools = a.save_mcp_tools(pool, &json!({"gh": []})).await;
    assert_eq!(tools.expect("tools"), Fence::Lost);
    // Asked to cancel meanwhile: the stale attempt's wait still hears only that its lease is
    // lost, and starts no child. (A wait that locked the row whatever its attempt would find
    // the request instead; the step's save, which comes next, has a fence of its own.)
    let owner = Owner {
        tenant_id: "acme".into(),
        user_id: "alice".into(),
    };
    let requested = request_cancel(pool, id, &owner, None)
        .await
        .expect("cancel");
    assert_eq!(requested, Some(RunStatus::Running));
    let spec = AgentSpec::default_agent("m", "");
    let child = NewChild {
        id: WorkflowId::new(),
        tool_call_id: "c2",
        agent_id: AgentId::new(),
        agent_spec: &spec,
        input: "hi",
        trace_context: None,
    };
    let (step, waits) = (
        SavedStep::default(),
        PendingAction::AgentRuns { runs: vec![] },
    );
    let bounds = WaitBounds {
        root: id,
        max_tree_runs: 50,
        time_limit_secs: None,
    };
    let waited = a
        .wait_for_children(pool, 1, &step, &[child], &waits, bounds)
        .await;
    assert_eq!(waited.expect("wait"), Wait::Lost);
    assert!(children(pool, id).await.expect("children").is_empty());
    assert_eq!(steps::load(pool, id).await.expect("steps").len(), 0);

    let renewed = heartbeat(pool, &[(id, 2)], Duration::from_secs(30))
        .await
        .expect("hb");
    assert_eq!(renewed.len(), 1);
    // The attempt that holds the run keeps its MCP servers' tools for its later attempts.
    let kept = b.save_mcp_tools(pool, &json!({"gh": []})).await;
    assert_eq!(kept.expect("tools"), Fence::Held);
    let tools = mcp_tools(pool, id).await.expect("tools");
    assert_eq!(tools, Some(json!({"gh": []})));
    assert_eq!(
        b.finish(pool, &completed("fresh")).await.expect("finish"),
        Fence::Held
    );
    // Terminal: nothing changes it again, not even the attempt that finished it.
    assert_eq!(
        b.finish(pool, &completed("again")).await.expect("finish"),
        Fence::Lost
    );
    assert_eq!(b.release(pool).await.expect("release"), Fence::Lost);
    assert!(claim(&db, lease).await.is_none());
    let stored = messages::find_in_thread(pool, message, b.run().thread_id)
        .await
        .expect("message")
        .expect("exists");
    assert_eq!(
        (stored.status, stored.content.as_str()),
        (crate::status::MessageStatus::Completed, "fresh")
    );
}

#[tokio::test]
async fn an_approval_is_claimable_once_it_expires_and_a_release_is_not_a_crash() {
    let db = TestDb::new().await.expect("db");
    let (id, _) = queued(&db).await;
    let pool = &db.pool;
    let lease = Duration::from_secs(60);
    let a = claim(&db, lease).await.expect("a run");
    let action = PendingAction::Approval {
        tool_call_id: "c1".into(),
        tool_name: "t".into(),
        arguments: json!({}),
        expires_at: None,
    };
    let paused = a.pause(pool, RunStatus::AwaitingApproval, &action, HOUR);
    assert!(matches!(paused.await.expect("pause"), Pause::Paused(_)));
    assert!(
        claim(&db, lease).await.is_none(),
        "the approval has not expired"
    );
    sqlx::query("UPDATE runs SET pause_expires_at = now() - interval '1 second'")
        .execute(pool)
        .await
        .expect("expire");
    let b = claim(&db, lease).await.expect("the expired approval");
    assert_eq!(
        (b.run().attempt, b.run().reclaims, b.previous_status()),
        (2, 0, RunStatus::AwaitingApproval)
    );
    assert!(b.run().pending_action.is_none());
    assert_eq!(b.release(pool).await.expect("release"), Fence::Held);
    let c = claim(&db, lease).await.expect("the released run");
    assert_eq!(
        (c.run().id, c.run().attempt, c.run().reclaims),
        (id, 3, 0),
        "a release is not counted as a crash"
    );
}

#[tokio::test]
async fn only_the_attempt_right_after_a_pause_continues_cleanly() {
    let db = TestDb::new().await.expect("db");
    let (id, _) = queued(&db).await;
    let pool = &db.pool;
    let lease = Duration::from_secs(60);
    let a = claim(&db, lease).await.expect("a run");
    assert!(!a.run().resumed, "a first attempt starts");
    let action = PendingAction::SubmitToolOutputs {
        tool_calls: vec![],
        expires_at: None,
    };
    let paused = a.pause(pool, RunStatus::RequiresAction, &action, HOUR);
    assert!(matches!(paused.await.expect("pause"), Pause::Paused(_)));
    let queued = resume(pool, id, RunStatus::RequiresAction, None)
        .await
        .expect("resume")
        .expect("the paused run");
    assert_eq!(queued.status, RunStatus::Queued);
    let b = claim(&db, lease).await.expect("the answered run");
    assert!(
        b.run().resumed,
        "the attempt after an answered pause continues"
    );
    // It crashes: the next attempt restarts, although a pause came before.
    expire(&db, id).await;
    let c = claim(&db, lease).await.expect("a reclaim");
    assert!(!c.run().resumed, "an attempt after a crash restarts");
    // A release after a resume: the next attempt restarts too.
    let paused = c.pause(pool, RunStatus::RequiresAction, &action, HOUR);
    assert!(matches!(paused.await.expect("pause"), Pause::Paused(_)));
    let queued = resume(pool, id, RunStatus::RequiresAction, None)
        .await
        .expect("resume")
        .expect("the paused run");
    assert_eq!(queued.status, RunStatus::Queued);
    let d = claim(&db, lease).await.expect("the answered run");
    assert!(d.run().resumed);
    assert_eq!(d.release(pool).await.expect("release"), Fence::Held);
    let e = claim(&db, lease).await.expect("the released run");
    assert!(!e.run().resumed, "an attempt after a release restarts");
}

#[tokio::test]
async fn a_run_whose_cancel_was_requested_is_not_paused() {
    let db = TestDb::new().await.expect("db");
    let (id, _) = queued(&db).await;
    let pool = &db.pool;
    let a = claim(&db, Duration::from_secs(60)).await.expect("a run");
    let owner = Owner {
        tenant_id: "acme".into(),
        user_id: "alice".into(),
    };
    let requested = request_cancel(pool, id, &owner, Some("stop"))
        .await
        .expect("cancel");
    assert_eq!(
        requested,
        Some(RunStatus::Running),
        "the API only signals a running run"
    );
    let action = PendingAction::SubmitToolOutputs {
        tool_calls: vec![],
        expires_at: None,
    };
    let paused = a.pause(pool, RunStatus::RequiresAction, &action, HOUR);
    assert_eq!(paused.await.expect("pause"), Pause::CancelRequested);
    let run = find(pool, id, &owner).await.expect("find").expect("run");
    assert_eq!(run.status, RunStatus::Running, "still the worker's to end");
    assert!(run.pending_action.is_none());
}

#[tokio::test]
async fn a_pause_s_deadline_is_the_database_s_now_plus_its_timeout_and_it_expires_by_itself() {
    let db = TestDb::new().await.expect("db");
    let (id, _) = queued(&db).await;
    let pool = &db.pool;
    let a = claim(&db, HOUR).await.expect("a run");
    let action = PendingAction::SubmitToolOutputs {
        tool_calls: vec![],
        expires_at: None,
    };
    let timeout = Duration::from_millis(86_400_250);
    let Pause::Paused(deadline) = a
        .pause(pool, RunStatus::RequiresAction, &action, timeout)
        .await
        .expect("pause")
    else {
        panic!("not paused");
    };
    // Set in the pause's own statement: the deadline minus the pause's time is exactly the
    // timeout, and clients see the same deadline in the pending action.
    let (timeout_us, shown): (i64, String) = sqlx::query_as(
        "SELECT (extract(epoch FROM pause_expires_at - updated_at) * 1e6)::bigint,
                pending_action->>'expires_at'
           FROM runs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("deadline");
    assert_eq!(timeout_us, 86_400_250_000);
    assert_eq!(shown.parse::<DateTime<Utc>>().ok(), Some(deadline));
    assert!(!pause_expired(pool, id).await.expect("expired?"));
    assert!(
        claim(&db, HOUR).await.is_none(),
        "a pause in time is not claimable"
    );
    sqlx::query("UPDATE runs SET pause_expires_at = now() - interval '1 second'")
        .execute(pool)
        .await
        .expect("expire");
    assert!(pause_expired(pool, id).await.expect("expired?"));
    let b = claim(&db, HOUR).await.expect("the expired pause");
    assert_eq!(
        (
            b.previous_status(),
            b.run().resumed,
            b.run().pause_expires_at
        ),
        (RunStatus::RequiresAction, true, None)
    );
}

#[tokio::test]
async fn a_heartbeat_skips_a_row_an_erasure_holds_locked_and_renews_the_others_without_waiting() {
    let db = TestDb::new().await.expect("db");
    let pool = &db.pool;
    let (erased, _) = queued(&db).await;
    let (other, _) = queued(&db).await;
    let claimed = super::claim(pool, WORKER, Duration::from_secs(60), 2, None)
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    let held = [(erased, 1), (other, 1)];
    let thread = claimed
        .iter()
        .find(|c| c.run().id == erased)
        .expect("claimed")
        .run()
        .thread_id;
    // The erasure of the first run's thread, in flight: its rows locked and deleted.
    let mut erasure = pool.begin().await.expect("begin");
    crate::db::threads::lock_for_erasure(&mut erasure, thread, Scope::Tenant("acme"))
        .await
        .expect("lock")
        .expect("the thread");
    crate::db::threads::erase(&mut erasure, thread)
        .await
        .expect("erase");
    // Far from a heartbeat's worth of waiting: the renewal answers at once.
    let lease = Duration::from_secs(600);
    let beat = tokio::time::timeout(Duration::from_secs(5), heartbeat(pool, &held, lease));
    let renewed = beat.await.expect("the heartbeat waited").expect("hb");
    let by_id = |id| renewed.iter().find(|r| r.id == id).map(|r| r.renewed);
    assert_eq!(by_id(other), Some(true), "{renewed:?}");
    assert_eq!(
        by_id(erased),
        Some(false),
        "still held, not lost: {renewed:?}"
    );
    let (left,): (f64,) = sqlx::query_as(
        "SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM runs WHERE id = $1",
    )
    .bind(other)
    .fetch_one(pool)
    .await
    .expect("lease");
    assert!(left > 300.0, "renewed for the new lease: {left}");
    // Once the erasure commits, the erased run's lease is lost; the other's is renewed.
    erasure.commit().await.expect("commit");
    let renewed = heartbeat(pool, &held, lease).await.expect("hb");
    assert_eq!(renewed.len(), 1, "{renewed:?}");
    assert_eq!((renewed[0].id, renewed[0].renewed), (other, true));
}

/// Waits until a statement whose text mentions `text` waits for a lock.
async fn waits_for_a_lock(pool: &sqlx::PgPool, text: &str) {
    spool_tests::poll_until(
        "a statement to wait for a lock",
        Duration::from_secs(10),
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND strpos(query, $1) > 0",
            )
            .bind(text)
            .fetch_one(pool)
            .await
            .expect("activity");
            (waiting > 0).then_some(())
        },
    )
    .await;
}

/// The summaries stored for a thread.
async fn summaries(db: &TestDb, thread: ThreadId) -> Vec<String> {
    sqlx::query_scalar("SELECT content FROM thread_summaries WHERE thread_id = $1")
        .bind(thread)
        .fetch_all(&db.pool)
        .await
        .expect("summaries")
}

#[tokio::test]
async fn a_summary_is_not_stored_once_its_thread_is_erased_even_while_the_erasure_runs() {
    let db = TestDb::new().await.expect("db");
    let pool = &db.pool;
    let (id, _) = queued(&db).await;
    let a = claim(&db, HOUR).await.expect("a run");
    let thread = a.run().thread_id;
    // Held: stored.
    let stored = messages::save_summary(pool, id, 1, 1, "before", "m").await;
    assert!(stored.expect("summary"));
    assert_eq!(summaries(&db, thread).await, ["before"]);

    // A summary written while an erasure of the thread is in flight: the erasure deletes the
    // run first, so the write waits for it and then finds no run to write for.
    let mut erasure = pool.begin().await.expect("begin");
    crate::db::threads::erase(&mut erasure, thread)
        .await
        .expect("erase");
    let late = tokio::spawn({
        let pool = pool.clone();
        async move { messages::save_summary(&pool, id, 1, 2, "after", "m").await }
    });
    // The write is blocked on the erased run's row until the erasure commits.
    waits_for_a_lock(pool, "thread_summaries").await;
    erasure.commit().await.expect("commit");
    let stored = late.await.expect("task").expect("summary");
    assert!(!stored, "the run is gone: nothing stored");
    assert!(
        summaries(&db, thread).await.is_empty(),
        "erasure left nothing"
    );

    // After the erasure: nothing either.
    let stored = messages::save_summary(pool, id, 1, 3, "later", "m").await;
    assert!(!stored.expect("summary"));
    assert!(summaries(&db, thread).await.is_empty());
}

#[tokio::test]
async fn a_nul_in_a_structured_answer_or_a_summary_is_stored_not_refused() {
    let db = TestDb::new().await.expect("db");
    let pool = &db.pool;
    let (id, message) = queued(&db).await;
    let a = claim(&db, HOUR).await.expect("a run");
    let thread = a.run().thread_id;
    let stored = messages::save_summary(pool, id, 1, 1, "a\0b", "m").await;
    assert!(stored.expect("a summary with a NUL is stored"));
    assert_eq!(summaries(&db, thread).await, ["a\u{fffd}b"]);
    let output = json!({"answer": "x\u{0}y"});
    let outcome = Outcome {
        output: Some(&output),
        ..completed("done")
    };
    assert_eq!(a.finish(pool, &outcome).await.expect("finish"), Fence::Held);
    let stored = messages::find_in_thread(pool, message, thread)
        .await
        .expect("message")
        .expect("exists");
    assert_eq!(
        stored.output.map(|o| o.0),
        Some(json!({"answer": "x\u{fffd}y"}))
    );
}

/// A child for a wait: a run of `spec` started by call `call`.
fn child<'a>(spec: &'a AgentSpec, call: &'a str) -> NewChild<'a> {
    NewChild {
        id: WorkflowId::new(),
        tool_call_id: call,
        agent_id: AgentId::new(),
        agent_spec: spec,
        input: "go",
        trace_context: None,
    }
}

/// Waits (as attempt `claimed`) for `children`, in a tree rooted at `root` bounded to
/// `max_tree_runs`, the waiting run's time limit `time_limit_secs`.
async fn wait(
    pool: &sqlx::PgPool,
    claimed: &Claimed,
    children: &[NewChild<'_>],
    root: WorkflowId,
    max_tree_runs: u32,
    time_limit_secs: Option<u32>,
) -> Wait {
    let bounds = WaitBounds {
        root,
        max_tree_runs,
        time_limit_secs,
    };
    let action = PendingAction::AgentRuns { runs: vec![] };
    claimed
        .wait_for_children(pool, 1, &SavedStep::default(), children, &action, bounds)
        .await
        .expect("wait")
}

#[tokio::test]
async fn a_waiting_run_is_taken_back_once_its_own_time_limit_passes() {
    let db = TestDb::new().await.expect("db");
    let pool = &db.pool;
    let spec = AgentSpec::default_agent("m", "");
    let (free, _) = queued(&db).await;
    let (timed, _) = queued(&db).await;
    let a = claim(&db, HOUR).await.expect("a run");
    let b = claim(&db, HOUR).await.expect("a run");
    assert_eq!((a.run().id, b.run().id), (free, timed));
    // Without a time limit, a wait has no deadline.
    let waited = wait(pool, &a, &[child(&spec, "c1")], free, 50, None).await;
    assert_eq!(waited, Wait::Waiting);
    // With one, its deadline is the run's own: its enqueue plus the limit.
    let waited = wait(pool, &b, &[child(&spec, "c1")], timed, 50, Some(60)).await;
    assert_eq!(waited, Wait::Waiting);
    let (deadline_us,): (i64,) = sqlx::query_as(
        "SELECT (extract(epoch FROM pause_expires_at - created_at) * 1e6)::bigint
           FROM runs WHERE id = $1",
    )
    .bind(timed)
    .fetch_one(pool)
    .await
    .expect("deadline");
    assert_eq!(deadline_us, 60_000_000);
    // The children are claimable; the waiting runs are not, before the deadline.
    for _ in 0..2 {
        let claimed = claim(&db, HOUR).await.expect("a child");
        assert_eq!(claimed.run().depth, 1);
    }
    assert!(claim(&db, HOUR).await.is_none());
    sqlx::query("UPDATE runs SET pause_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(timed)
        .execute(pool)
        .await
        .expect("expire");
    let back = claim(&db, HOUR).await.expect("the expired wait");
    assert_eq!(
        (back.run().id, back.previous_status(), back.run().resumed),
        (timed, RunStatus::Waiting, true)
    );
    assert_eq!(back.run().pause_expires_at, None);
    assert!(
        claim(&db, HOUR).await.is_none(),
        "the wait without a deadline stays"
    );
    assert_eq!(status_of(&db, free).await, RunStatus::Waiting);
}

#[tokio::test]
async fn a_tree_never_holds_more_runs_than_its_bound_even_when_its_runs_start_children_at_once() {
    let db = TestDb::new().await.expect("db");
    let pool = &db.pool;
    let spec = AgentSpec::default_agent("m", "");
    let (root, _) = queued(&db).await;
    let r = claim(&db, HOUR).await.expect("the root");
    let two = [child(&spec, "a"), child(&spec, "b")];
    assert_eq!(wait(pool, &r, &two, root, 1, None).await, Wait::TreeFull(0));
    assert_eq!(wait(pool, &r, &two, root, 3, None).await, Wait::Waiting);
    let (a, b) = (
        claim(&db, HOUR).await.expect("a"),
        claim(&db, HOUR).await.expect("b"),
    );
    // Room for one more run in the tree: the two children each want one. Both are made to
    // wait on the root's lock, then race; the one that counts second sees the first's child.
    let mut holder = pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
        .bind(root)
        .execute(&mut *holder)
        .await
        .expect("lock the root");
    let (one, other) = (child(&spec, "c"), child(&spec, "d"));
    let racing = futures::future::join(
        wait(pool, &a, std::slice::from_ref(&one), root, 3, None),
        async {
            waits_for_a_lock(pool, "FOR UPDATE").await;
            holder.commit().await.expect("release");
            wait(pool, &b, std::slice::from_ref(&other), root, 3, None).await
        },
    );
    let (first, second) = racing.await;
    let mut outcomes = [first, second];
    outcomes.sort_by_key(|w| matches!(w, Wait::Waiting));
    assert_eq!(
        outcomes,
        [Wait::TreeFull(3), Wait::Waiting],
        "exactly one child more"
    );
    assert_eq!(
        crate::db::runs::tree_size(pool, root).await.expect("size"),
        3
    );
    let grandchild = children(pool, a.run().id).await.expect("children").len()
        + children(pool, b.run().id).await.expect("children").len();
    assert_eq!(grandchild, 1);
}
