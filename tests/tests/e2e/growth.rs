//! Growth (DESIGN section 15): every foreign key has an index led by its columns, and on a
//! database filled like months of use (`spool_tests::growth`, the generator `spool-bench p7`
//! uses, at a size that fills in seconds) the hot queries read no big table sequentially.
//!
//! Two views of the same queries, each taken from the code rather than copied:
//! - `EXPLAIN` of the list statements (`threads::push_list`, `runs::push_list`, what `GET
//!   /v1/threads` and `GET /v1/workflows` run), first page and deep page, with each filter:
//!   the queries whose plan depends on the filter; an admin's page with a sparse filter must
//!   also find the filter's column in an index condition.
//! - the tables' own counters of sequential scans in the transaction
//!   (`pg_stat_xact_user_tables`) around the real functions of each hot path: the lists, the
//!   `/steps` timeline, the enqueue, the claim, the heartbeat and the erasure of a 200-message
//!   thread whose run is held. These count what executed, with the plans the code's prepared
//!   statements got, and the foreign-key checks Postgres runs for each deleted row, which no
//!   `EXPLAIN` shows.

use std::time::Duration;

use anyhow::Context as _;

use serde_json::Value;
use spool_shared::db::page::{Cursor, Scope};
use spool_shared::db::threads::{self, Owner, ThreadFilter};
use spool_shared::db::{runs, steps};
use spool_shared::status::RunStatus;
use spool_shared::{AgentId, MessageId, ThreadId, WorkflowId};
use spool_tests::TestDb;
use spool_tests::growth::{self, RARE_AGENT, Size, TENANT, USER};
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, QueryBuilder};

/// Tables that grow with use: a sequential scan of one is a cost that grows with the history.
const BIG: &[&str] = &["threads", "messages", "runs", "run_steps"];

/// Enough rows that scanning a table costs the planner thousands of pages (runs and messages
/// are tens of megabytes), filled in a few seconds.
const SIZE: Size = Size {
    threads: 20_000,
    tenants: 40,
    users: 5,
};

#[tokio::test]
async fn every_foreign_key_has_an_index_led_by_its_columns() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    // An index serves a key's checks if its first columns are the key's columns (in any
    // order) and it is whole, or partial only on those columns being set.
    let keys: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT c.conrelid::regclass::text, c.conname,
                EXISTS (
                    SELECT 1 FROM pg_index i
                     WHERE i.indrelid = c.conrelid AND i.indisvalid
                       AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] @> c.conkey
                       AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] <@ c.conkey
                       AND (i.indpred IS NULL OR pg_get_expr(i.indpred, i.indrelid) = (
                            SELECT '(' || string_agg(quote_ident(a.attname) || ' IS NOT NULL',
                                                     ') AND (') || ')'
                              FROM pg_attribute a
                             WHERE a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey))))
           FROM pg_constraint c
          WHERE c.contype = 'f' AND c.connamespace = 'public'::regnamespace
          ORDER BY 1, 2",
    )
    .fetch_all(&db.pool)
    .await?;
    // The schema's keys (messages, runs ×4, run_steps, webhook deliveries and attempts,
    // summaries): none may go unchecked because the query found none.
    assert!(keys.len() >= 9, "foreign keys found: {keys:?}");
    let unindexed: Vec<_> = keys.iter().filter(|(_, _, indexed)| !indexed).collect();
    assert!(
        unindexed.is_empty(),
        "foreign keys without an index led by their columns: {unindexed:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_hot_queries_read_no_big_table_sequentially_after_months_of_growth()
-> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let mut conn = db.pool.acquire().await?;
    growth::fill(&mut conn, SIZE, |_, _| {}).await?;
    let owner = Owner {
        tenant_id: TENANT.into(),
        user_id: USER.into(),
    };
    let common = AgentId(growth::agent_id(&mut conn, 0, 0).await?);
    let rare = AgentId(growth::agent_id(&mut conn, 0, RARE_AGENT).await?);
    let scopes = [Scope::Owner(&owner), Scope::Tenant(TENANT)];

    let mut found = Vec::new();
    for scope in scopes {
        for (name, filter) in thread_filters(common, rare) {
            for (page, after) in [("first", None), ("deep", deep(&mut conn, scope).await?)] {
                let case = format!("threads {scope:?} {name} {page} page");
                let plan = explain(&mut conn, |q| {
                    threads::push_list(q, scope, &filter, after, 20);
                })
                .await?;
                found.extend(seq_scans(&plan).into_iter().map(|t| format!("{case}: {t}")));
                found.extend(sparse_unindexed(&case, scope, name, &plan));
                let run = counted(&mut conn, async |tx| {
                    threads::list(tx, scope, &filter, after, 20).await?;
                    Ok(())
                });
                found.extend(run.await?.into_iter().map(|t| format!("{case}: {t}")));
            }
        }
        for (name, filter) in run_filters(common, rare, &mut conn).await? {
            for (page, after) in [("first", None), ("deep", deep(&mut conn, scope).await?)] {
                let case = format!("runs {scope:?} {name} {page} page");
                let plan = explain(&mut conn, |q| {
                    runs::push_list(q, scope, &filter, after, 20);
                })
                .await?;
                found.extend(seq_scans(&plan).into_iter().map(|t| format!("{case}: {t}")));
                found.extend(sparse_unindexed(&case, scope, name, &plan));
                let run = counted(&mut conn, async |tx| {
                    runs::list(tx, scope, &filter, after, 20).await?;
                    Ok(())
                });
                found.extend(run.await?.into_iter().map(|t| format!("{case}: {t}")));
            }
        }
    }
    found.extend(worker_and_erasure_paths(&mut conn, &owner).await?);
    assert!(
        found.is_empty(),
        "queries not index-backed on a grown database:\n{}",
        found.join("\n")
    );
    Ok(())
}

/// The thread lists' filters, a common and a sparse one of each kind.
fn thread_filters(common: AgentId, rare: AgentId) -> Vec<(&'static str, ThreadFilter)> {
    let metadata = |k: &str, v: &str| ThreadFilter {
        metadata: vec![(k.into(), v.into())],
        ..ThreadFilter::default()
    };
    vec![
        ("no filter", ThreadFilter::default()),
        (
            "busy",
            ThreadFilter {
                busy: Some(true),
                ..ThreadFilter::default()
            },
        ),
        (
            "idle",
            ThreadFilter {
                busy: Some(false),
                ..ThreadFilter::default()
            },
        ),
        (
            "agent",
            ThreadFilter {
                agent_id: Some(common),
                ..ThreadFilter::default()
            },
        ),
        (
            "rare agent",
            ThreadFilter {
                agent_id: Some(rare),
                ..ThreadFilter::default()
            },
        ),
        ("metadata", metadata("project", "p7")),
        ("rare metadata", metadata("flag", "rare")),
        ("numeric metadata", metadata("n", "3")),
    ]
}

/// The run lists' filters, a common and a sparse one of each kind.
async fn run_filters(
    common: AgentId,
    rare: AgentId,
    conn: &mut PgConnection,
) -> anyhow::Result<Vec<(&'static str, runs::RunFilter)>> {
    let (thread,): (ThreadId,) = sqlx::query_as(
        "SELECT id FROM threads WHERE tenant_id = $1 AND owner_id = $2 ORDER BY created_at LIMIT 1",
    )
    .bind(TENANT)
    .bind(USER)
    .fetch_one(conn)
    .await?;
    let statuses = |s: &[RunStatus]| runs::RunFilter {
        statuses: s.to_vec(),
        ..runs::RunFilter::default()
    };
    Ok(vec![
        ("no filter", runs::RunFilter::default()),
        (
            "thread",
            runs::RunFilter {
                thread_id: Some(thread),
                ..Default::default()
            },
        ),
        (
            "agent",
            runs::RunFilter {
                agent_id: Some(common),
                ..Default::default()
            },
        ),
        (
            "rare agent",
            runs::RunFilter {
                agent_id: Some(rare),
                ..Default::default()
            },
        ),
        ("completed", statuses(&[RunStatus::Completed])),
        ("failed", statuses(&[RunStatus::Failed])),
        (
            "failed or cancelled",
            statuses(&[RunStatus::Failed, RunStatus::Cancelled]),
        ),
        ("running", statuses(&[RunStatus::Running])),
    ])
}

/// A cursor four fifths of the way down the scope's threads (a user has 100 of them, the
/// tenant 500; runs are keyed the same way, 2.5 per thread, so it is deep in either list).
async fn deep(conn: &mut PgConnection, scope: Scope<'_>) -> anyhow::Result<Option<Cursor>> {
    let (user, depth) = match scope {
        Scope::Owner(owner) => (Some(owner.user_id.clone()), 80),
        Scope::Tenant(_) => (None, 400),
    };
    let (created_at, id): (chrono::DateTime<chrono::Utc>, uuid::Uuid) = sqlx::query_as(
        "SELECT created_at, id FROM threads
          WHERE tenant_id = $1 AND ($2::text IS NULL OR owner_id = $2) AND erased_at IS NULL
          ORDER BY created_at DESC, id DESC OFFSET $3 LIMIT 1",
    )
    .bind(TENANT)
    .bind(user)
    .bind(depth)
    .fetch_one(conn)
    .await
    .context("a deep page's cursor")?;
    Ok(Some(Cursor { created_at, id }))
}

/// For an admin's list (the whole tenant) with a sparse filter: the filter's column must be in
/// an index's condition, or the page walks the tenant's rows until it finds enough that match.
fn sparse_unindexed(case: &str, scope: Scope<'_>, filter: &str, plan: &Value) -> Option<String> {
    let column = match filter {
        "rare agent" => "agent_id",
        "rare metadata" => "metadata",
        "failed" | "failed or cancelled" => "status",
        _ => return None,
    };
    if matches!(scope, Scope::Owner(_)) {
        return None;
    }
    let mut nodes = vec![plan];
    while let Some(node) = nodes.pop() {
        match node {
            Value::Array(items) => nodes.extend(items),
            Value::Object(fields) => {
                let conditions = ["Index Cond", "Recheck Cond"].map(|c| fields.get(c));
                if conditions
                    .iter()
                    .flatten()
                    .any(|c| c.as_str().is_some_and(|c| c.contains(column)))
                {
                    return None;
                }
                nodes.extend(fields.values());
            }
            _ => {}
        }
    }
    Some(format!("{case}: no index condition on {column}"))
}

/// `EXPLAIN (FORMAT JSON)` of the statement `build` writes, with its bound values.
async fn explain(
    conn: &mut PgConnection,
    build: impl FnOnce(&mut QueryBuilder<Postgres>),
) -> anyhow::Result<Value> {
    let mut query = QueryBuilder::new("EXPLAIN (FORMAT JSON) ");
    build(&mut query);
    let (plan,): (Json<Value>,) = query.build_query_as().fetch_one(conn).await?;
    Ok(plan.0)
}

/// The big tables a plan reads with a `Seq Scan` node.
fn seq_scans(plan: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let mut nodes = vec![plan];
    while let Some(node) = nodes.pop() {
        match node {
            Value::Array(items) => nodes.extend(items),
            Value::Object(fields) => {
                let table = fields.get("Relation Name").and_then(Value::as_str);
                if fields.get("Node Type").and_then(Value::as_str) == Some("Seq Scan")
                    && let Some(table) = table.filter(|t| BIG.contains(t))
                {
                    found.push(format!("Seq Scan on {table}"));
                }
                nodes.extend(fields.values());
            }
            _ => {}
        }
    }
    found
}

/// Runs `work` in a transaction (rolled back) and returns the big tables it scanned
/// sequentially, by the session's own counters: what executed, foreign-key checks included.
/// (`pg_stat_xact_user_tables` also holds counts of the session's earlier transactions that
/// it has not reported yet, so the difference is taken.)
async fn counted(
    conn: &mut PgConnection,
    work: impl AsyncFnOnce(&mut PgConnection) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<String>> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let before = seq_scan_counts(&mut tx).await?;
    work(&mut *tx).await?;
    let after = seq_scan_counts(&mut tx).await?;
    tx.rollback().await?;
    Ok(after
        .into_iter()
        .zip(before)
        .filter(|((_, after), (_, before))| after > before)
        .map(|((table, after), (_, before))| {
            format!("{} sequential scan(s) of {table}", after - before)
        })
        .collect())
}

/// Each big table's count of sequential scans in this session, in [`BIG`]'s order.
async fn seq_scan_counts(conn: &mut PgConnection) -> anyhow::Result<Vec<(String, i64)>> {
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT big.relname, coalesce(s.seq_scan, 0)
           FROM unnest($1::text[]) WITH ORDINALITY AS big (relname, n)
           LEFT JOIN pg_stat_xact_user_tables s ON s.relname = big.relname
          ORDER BY big.n",
    )
    .bind(BIG)
    .fetch_all(conn)
    .await?;
    Ok(counts)
}

/// The enqueue, the claim, the heartbeat, the timeline and the erasure of a 200-message thread
/// whose run a worker holds beside other tenants' runs, each counted by [`counted`].
async fn worker_and_erasure_paths(
    conn: &mut PgConnection,
    owner: &Owner,
) -> anyhow::Result<Vec<String>> {
    let mut found = Vec::new();
    let long = ThreadId(growth::long_thread(conn, "plan", 100).await?);
    let (messages,): (i64,) = sqlx::query_as("SELECT count(*) FROM messages WHERE thread_id = $1")
        .bind(long)
        .fetch_one(&mut *conn)
        .await?;
    assert_eq!(messages, 200, "the thread to erase");
    // Runs of other tenants and the long thread's own, enqueued and claimed by one worker, as
    // the erasure finds them; each step counted on its own.
    let others: Vec<Owner> = (1..4)
        .map(|n| Owner {
            tenant_id: format!("growth-{n}"),
            user_id: "user-0".into(),
        })
        .collect();
    let mut threads = vec![(long, owner)];
    threads.extend(others.iter().map(|o| (ThreadId::new(), o)));
    for (thread, owner) in &threads {
        let scanned = counted(conn, async |tx| {
            enqueue(tx, *thread, owner).await?;
            Ok(())
        });
        found.extend(prefixed("enqueue", scanned.await?));
        enqueue(conn, *thread, owner).await?;
    }
    let lease = Duration::from_secs(30);
    let claimed = runs::claim(&mut *conn, "plan-worker", lease, 8, None).await?;
    assert_eq!(claimed.len(), threads.len(), "every enqueued run claimed");
    let held: Vec<(WorkflowId, i32)> = claimed
        .iter()
        .map(|c| (c.run().id, c.run().attempt))
        .collect();
    let scanned = counted(conn, async |tx| {
        runs::claim(tx, "plan-worker", lease, 8, None).await?;
        Ok(())
    });
    found.extend(prefixed("claim", scanned.await?));
    let scanned = counted(conn, async |tx| {
        anyhow::ensure!(runs::heartbeat(tx, &held, lease).await?.len() == held.len());
        Ok(())
    });
    found.extend(prefixed("heartbeat", scanned.await?));
    let (step_run, tenant): (WorkflowId, String) = sqlx::query_as(
        "SELECT r.id, r.tenant_id FROM run_steps s JOIN runs r ON r.id = s.workflow_id
          ORDER BY s.workflow_id LIMIT 1",
    )
    .fetch_one(&mut *conn)
    .await?;
    let scanned = counted(conn, async |tx| {
        let run = runs::find_in(&mut *tx, step_run, Scope::Tenant(&tenant)).await?;
        anyhow::ensure!(run.is_some(), "the run of the timeline");
        anyhow::ensure!(!steps::load(&mut *tx, step_run).await?.is_empty());
        runs::final_step(&mut *tx, step_run).await?;
        Ok(())
    });
    found.extend(prefixed("timeline", scanned.await?));
    let scanned = counted(conn, async |tx| {
        let erasing = threads::lock_for_erasure(tx, long, Scope::Owner(owner)).await?;
        anyhow::ensure!(erasing.is_some_and(|e| e.runs.len() == 101));
        threads::erase(tx, long).await?;
        Ok(())
    });
    found.extend(prefixed("erasure", scanned.await?));
    Ok(found)
}

fn prefixed(path: &str, found: Vec<String>) -> impl Iterator<Item = String> {
    found.into_iter().map(move |t| format!("{path}: {t}"))
}

/// A turn on `thread` for `owner`, through the enqueue's statement.
async fn enqueue(conn: &mut PgConnection, thread: ThreadId, owner: &Owner) -> anyhow::Result<()> {
    let run = runs::NewRun {
        id: WorkflowId::new(),
        thread_id: thread,
        owner,
        agent_id: None,
        agent_spec: None,
        user_message_id: MessageId::new(),
        assistant_message_id: MessageId::new(),
        idempotency_key: None,
        trace_context: None,
        quota: None,
        overrides: None,
    };
    let metadata = serde_json::json!({});
    let inserted = runs::insert_with_thread(conn, &run, None, "hello", &metadata);
    anyhow::ensure!(inserted.await?, "the enqueue took the turn");
    Ok(())
}
