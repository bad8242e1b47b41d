//! The roll-up and the retention purges beside their SQL: totals that do not change when the
//! detail goes, a roll-up that crashes counting nothing, batches that stop at their size, and
//! rows inside each window kept.

use chrono::{DateTime, Duration, TimeZone as _, Utc};
use serde_json::{Value, json};
use spool_tests::TestDb;
use uuid::Uuid;

use super::*;
use crate::db::steps;

/// An ended run of `owner` (`agent`: `None` for the default agent) that finished at `at`, with
/// `usage` as its own total, one saved step per `(model, input, output)` of `steps` and a final
/// step on `last`.
struct Ended<'a> {
    owner: &'a str,
    agent: Option<Uuid>,
    at: DateTime<Utc>,
    usage: (i64, i64),
    steps: &'a [(&'a str, i64, i64)],
    last: Option<(&'a str, i64, i64)>,
    status: &'a str,
    /// The agent snapshot (`runs.agent_spec`): its `provider` and `provider_id`.
    spec: Option<Value>,
}

impl Default for Ended<'_> {
    fn default() -> Self {
        Self {
            owner: "alice",
            agent: None,
            at: Utc::now(),
            usage: (0, 0),
            steps: &[],
            last: None,
            status: "completed",
            spec: None,
        }
    }
}

fn saved(model: &str, input: i64, output: i64) -> Value {
    json!({"assistant": {"text": "t", "tool_calls": []}, "results": [],
           "usage": {"input_tokens": input, "output_tokens": output},
           "model_call": {"model": model, "started_at": "2026-11-01T00:00:00Z",
                          "ended_at": "2026-11-01T00:00:01Z", "finish_reason": "stop"}})
}

async fn ended(db: &TestDb, run: Ended<'_>) -> Uuid {
    let (thread, user, assistant, id) = (
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
    );
    let finished = (run.status != "running").then_some(run.at);
    sqlx::query(
        "WITH t AS (INSERT INTO threads (id, tenant_id, owner_id) VALUES ($1, 'acme', $5)),
              m AS (INSERT INTO messages (id, thread_id, role, status)
                    VALUES ($2, $1, 'user', 'completed'), ($3, $1, 'assistant', 'completed'))
         INSERT INTO runs (id, thread_id, tenant_id, owner_id, agent_id, user_message_id,
                           assistant_message_id, status, usage, finished_at, final_step,
                           agent_spec)
         VALUES ($4, $1, 'acme', $5, $6, $2, $3, $7, $8, $9, $10, $11)",
    )
    .bind(thread)
    .bind(user)
    .bind(assistant)
    .bind(id)
    .bind(run.owner)
    .bind(run.agent)
    .bind(run.status)
    .bind(json!({"input_tokens": run.usage.0, "output_tokens": run.usage.1}))
    .bind(finished)
    .bind(run.last.map(|(m, i, o)| saved(m, i, o)))
    .bind(run.spec)
    .execute(&db.pool)
    .await
    .expect("run");
    for (n, (model, input, output)) in run.steps.iter().enumerate() {
        sqlx::query(
            "INSERT INTO run_steps (workflow_id, step, attempt, data) VALUES ($1, $2, 1, $3)",
        )
        .bind(id)
        .bind(i32::try_from(n).expect("small") + 1)
        .bind(saved(model, *input, *output))
        .execute(&db.pool)
        .await
        .expect("step");
    }
    id
}

fn day(d: u32, h: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 10, d, h, 0, 0)
        .single()
        .expect("date")
}

/// Every group's report over `windows`, to compare before and after.
async fn reports(db: &TestDb, windows: &[Window]) -> Vec<Vec<UsageRow>> {
    let mut all = Vec::new();
    for window in windows {
        for group_by in [
            GroupBy::User,
            GroupBy::Agent,
            GroupBy::Model,
            GroupBy::Provider,
        ] {
            all.push(
                report(&db.pool, "acme", *window, group_by)
                    .await
                    .expect("report"),
            );
        }
    }
    all
}

/// The agent snapshot of a run whose agent names `provider`, one of the tenant's (`Some` id)
/// or the operator's.
fn through(provider: &str, tenant_provider: Option<Uuid>) -> Value {
    let mut spec = json!({"name": "a", "model": "m", "provider": provider});
    if let Some(id) = tenant_provider {
        spec["provider_id"] = json!(id);
    }
    spec
}

/// A month of runs on a few days: two users, an agent, two models, a run with a step on each,
/// through a tenant's provider, an operator's and none.
async fn month(db: &TestDb) -> Vec<Uuid> {
    let agent = Uuid::new_v4();
    let byok = Uuid::new_v4();
    let mut runs = Vec::new();
    for (n, at) in [day(1, 10), day(1, 23), day(2, 0), day(15, 12), day(30, 6)]
        .into_iter()
        .enumerate()
    {
        let n = i64::try_from(n).expect("small");
        runs.push(
            ended(
                db,
                Ended {
                    owner: if n % 2 == 0 { "alice" } else { "bob" },
                    agent: (n % 3 == 0).then_some(agent),
                    at,
                    // The run's own total also counts calls outside steps (compaction).
                    usage: (100 + n, 10 + n),
                    steps: &[("gpt-a", 40, 4), ("gpt-b", 30, 3)],
                    last: Some(("gpt-a", 20 + n, 2)),
                    spec: match n % 3 {
                        0 => Some(through("byok", Some(byok))),
                        1 => Some(through("shared", None)),
                        _ => None,
                    },
                    ..Ended::default()
                },
            )
            .await,
        );
    }
    // Another tenant's run never counts for acme.
    let theirs = ended(
        db,
        Ended {
            at: day(1, 12),
            usage: (5, 5),
            ..Ended::default()
        },
    )
    .await;
    sqlx::query("UPDATE runs SET tenant_id = 'other' WHERE id = $1")
        .bind(theirs)
        .execute(&db.pool)
        .await
        .expect("other tenant");
    runs
}

fn windows() -> Vec<Window> {
    vec![
        // Whole days only.
        Window::new(day(1, 0), day(31, 0)),
        // Edges on both sides, whole days between.
        Window::new(day(1, 12), day(30, 12)),
        // Inside one day.
        Window::new(day(1, 11), day(1, 23)),
        // Across one midnight, no whole day.
        Window::new(day(1, 20), day(2, 3)),
    ]
}

#[tokio::test]
async fn totals_are_the_same_before_the_roll_up_after_it_and_after_the_detail_is_deleted() {
    let db = TestDb::new().await.expect("db");
    month(&db).await;
    let before = reports(&db, &windows()).await;
    let alice = &before[0];
    assert_eq!(
        alice.iter().find(|r| r.group == "alice").map(|r| r.runs),
        Some(3),
        "{alice:?}"
    );
    let by_model = &before[2];
    let a = by_model.iter().find(|r| r.group == "gpt-a").expect("gpt-a");
    assert_eq!((a.runs, a.input_tokens), (5, 5 * 40 + 5 * 20 + 10));
    // Runs 0 and 3 through the tenant's provider, 1 and 4 the operator's, 2 neither.
    let by_provider: Vec<_> = before[3]
        .iter()
        .map(|r| (r.group.as_str(), r.runs, r.input_tokens, r.output_tokens))
        .collect();
    assert_eq!(
        by_provider,
        [
            ("operator:shared", 2, 101 + 104, 11 + 14),
            ("tenant:byok", 2, 100 + 103, 10 + 13),
            ("unknown", 1, 102, 12),
        ],
        "each run's own total under its provider"
    );

    // Rolled up in batches of 2: 5 runs (and the other tenant's) take 3 full ones and a last.
    let mut batches = Vec::new();
    loop {
        let rolled = roll_up(&db.pool, 2).await.expect("roll up");
        batches.push(rolled);
        if rolled < 2 {
            break;
        }
    }
    assert_eq!(batches, [2, 2, 2, 0], "bounded batches");
    assert_eq!(
        reports(&db, &windows()).await,
        before,
        "the same totals from the roll-up"
    );
    assert!(db.count("usage_daily").await > 0);

    // The steps go (they are the detail the report by model read), then the per-run figures:
    // whole days still add up.
    let steps = steps::purge_expired(&db.pool, Duration::days(1), 1_000)
        .await
        .expect("purge steps");
    assert_eq!(steps, 6);
    assert_eq!(db.count("run_steps").await, 0);
    assert_eq!(reports(&db, &windows()).await, before, "without the steps");
    let detail = purge_detail(&db.pool, Duration::days(1), 1_000)
        .await
        .expect("purge detail");
    assert!(detail > 0);
    assert_eq!(db.count("usage_detail").await, 0);
    let whole = [Window::new(day(1, 0), day(31, 0))];
    assert_eq!(
        reports(&db, &whole).await,
        before[..4],
        "whole days without any detail"
    );
}

#[tokio::test]
async fn a_roll_up_that_crashes_counts_nothing_and_a_second_one_counts_nothing_twice() {
    let db = TestDb::new().await.expect("db");
    month(&db).await;
    let before = reports(&db, &windows()).await;

    // The worker dies before its statement commits: nothing is counted, nothing marked.
    let mut tx = db.pool.begin().await.expect("begin");
    assert_eq!(roll_up(&mut *tx, 100).await.expect("roll up"), 6);
    drop(tx);
    assert_eq!(db.count("usage_daily").await, 0);
    assert_eq!(reports(&db, &windows()).await, before);

    // Restarted, it rolls up once; another pass (a second worker, the next tick) finds nothing.
    assert_eq!(roll_up(&db.pool, 100).await.expect("roll up"), 6);
    assert_eq!(roll_up(&db.pool, 100).await.expect("again"), 0);
    assert_eq!(reports(&db, &windows()).await, before, "counted once");

    // Even a run whose mark were lost could not be counted twice: its detail row is unique,
    // and the statement fails whole.
    sqlx::query("UPDATE runs SET usage_rolled_up_at = NULL")
        .execute(&db.pool)
        .await
        .expect("unmark");
    roll_up(&db.pool, 100)
        .await
        .expect_err("a second roll-up of a run fails");
    sqlx::query("UPDATE runs SET usage_rolled_up_at = now()")
        .execute(&db.pool)
        .await
        .expect("mark");
    assert_eq!(reports(&db, &windows()).await, before);
}

#[tokio::test]
async fn steps_go_only_from_ended_rolled_up_runs_past_the_window_in_bounded_batches() {
    let db = TestDb::new().await.expect("db");
    let old = Utc::now() - Duration::days(31);
    let step = [("m", 1, 1)];
    let mut expired = Vec::new();
    for status in ["completed", "failed", "cancelled", "completed", "completed"] {
        let run = Ended {
            at: old,
            steps: &step,
            last: Some(("m", 1, 1)),
            status,
            ..Ended::default()
        };
        expired.push(ended(&db, run).await);
    }
    let recent = ended(
        &db,
        Ended {
            at: Utc::now() - Duration::days(29),
            steps: &step,
            last: Some(("m", 1, 1)),
            ..Ended::default()
        },
    )
    .await;
    let running = ended(
        &db,
        Ended {
            steps: &step,
            status: "running",
            ..Ended::default()
        },
    )
    .await;
    let window = Duration::days(30);

    // Not rolled up yet: their steps are still the usage report's detail.
    assert_eq!(
        steps::purge_expired(&db.pool, window, 2)
            .await
            .expect("purge"),
        0
    );
    roll_up(&db.pool, 100).await.expect("roll up");
    let mut batches = Vec::new();
    loop {
        let purged = steps::purge_expired(&db.pool, window, 2)
            .await
            .expect("purge");
        batches.push(purged);
        if purged < 2 {
            break;
        }
    }
    assert_eq!(batches, [2, 2, 1], "bounded batches");

    let left: Vec<(Uuid,)> =
        sqlx::query_as("SELECT DISTINCT workflow_id FROM run_steps ORDER BY 1")
            .fetch_all(&db.pool)
            .await
            .expect("steps");
    let mut kept = vec![(recent,), (running,)];
    kept.sort();
    assert_eq!(left, kept, "inside the window and running runs keep theirs");
    for run in &expired {
        let at = steps::expired_at(&db.pool, crate::ids::WorkflowId(*run))
            .await
            .expect("read");
        assert!(at.is_some(), "{run} marked");
        let (last,): (Option<Value>,) = sqlx::query_as("SELECT final_step FROM runs WHERE id = $1")
            .bind(run)
            .fetch_one(&db.pool)
            .await
            .expect("run");
        assert_eq!(last, None, "the final step is a step payload too");
    }
    assert_eq!(
        steps::expired_at(&db.pool, crate::ids::WorkflowId(recent))
            .await
            .expect("read"),
        None
    );
}

#[tokio::test]
async fn usage_detail_goes_past_its_window_in_bounded_batches() {
    let db = TestDb::new().await.expect("db");
    for days in [100, 95, 91, 89] {
        ended(
            &db,
            Ended {
                at: Utc::now() - Duration::days(days),
                steps: &[("m", 1, 1)],
                ..Ended::default()
            },
        )
        .await;
    }
    roll_up(&db.pool, 100).await.expect("roll up");
    // Two rows per run: its own total and its model's.
    assert_eq!(db.count("usage_detail").await, 8);
    let window = Duration::days(90);
    let mut batches = Vec::new();
    loop {
        let purged = purge_detail(&db.pool, window, 4).await.expect("purge");
        batches.push(purged);
        if purged < 4 {
            break;
        }
    }
    assert_eq!(batches, [4, 2]);
    assert_eq!(
        db.count("usage_detail").await,
        2,
        "the run inside the window"
    );
    let kept: i64 =
        sqlx::query_scalar("SELECT sum(runs)::bigint FROM usage_daily WHERE model = ''")
            .fetch_one(&db.pool)
            .await
            .expect("sum");
    assert_eq!(kept, 4, "the days keep every run");
}

#[test]
fn a_window_splits_into_whole_days_and_its_edges() {
    let w = Window::new(day(1, 12), day(3, 6));
    assert_eq!((w.days_from, w.days_to), (day(2, 0), day(3, 0)));
    assert_eq!(w.oldest_edge(), Some(day(1, 12)));
    let w = Window::new(day(1, 0), day(3, 0));
    assert_eq!((w.days_from, w.days_to), (day(1, 0), day(3, 0)));
    assert_eq!(w.oldest_edge(), None);
    let w = Window::new(day(1, 0), day(3, 6));
    assert_eq!(w.oldest_edge(), Some(day(3, 0)));
    let w = Window::new(day(1, 20), day(2, 3));
    assert_eq!(
        (w.days_from, w.days_to),
        (day(2, 3), day(2, 3)),
        "no whole day"
    );
    assert_eq!(w.oldest_edge(), Some(day(1, 20)));
}

/// Sequential scans of `relation` anywhere in an EXPLAIN (FORMAT JSON) plan node.
fn seq_scans(plan: &Value, relation: &str) -> usize {
    usize::from(plan["Node Type"] == "Seq Scan" && plan["Relation Name"].as_str() == Some(relation))
        + plan["Plans"].as_array().map_or(0, |plans| {
            plans.iter().map(|plan| seq_scans(plan, relation)).sum()
        })
}

/// Every statement of the report, the roll-up and the purges has an index to read through:
/// with sequential scans priced out, none is left (a missing index would leave one, whatever
/// the table's size). The report over 366 days reads `usage_daily` by its key, not the runs.
#[tokio::test]
async fn the_report_the_roll_up_and_the_purges_are_index_backed() {
    let db = TestDb::new().await.expect("db");
    month(&db).await;
    let mut conn = db.pool.acquire().await.expect("connection");
    sqlx::query("SET enable_seqscan = off")
        .execute(&mut *conn)
        .await
        .expect("set");
    let year = "'acme', '2025-10-31T12:00:00Z', '2025-11-01T00:00:00Z', '2026-10-31T00:00:00Z',
                '2026-10-31T12:00:00Z', '2025-11-01', '2026-10-31'";
    let statements = [
        (
            "report (text, timestamptz, timestamptz, timestamptz, timestamptz, date, date)",
            report_sql(GroupBy::User),
            year,
        ),
        (
            "report (text, timestamptz, timestamptz, timestamptz, timestamptz, date, date)",
            report_sql(GroupBy::Agent),
            year,
        ),
        (
            "report (text, timestamptz, timestamptz, timestamptz, timestamptz, date, date)",
            report_sql(GroupBy::Model),
            year,
        ),
        (
            "report (text, timestamptz, timestamptz, timestamptz, timestamptz, date, date)",
            report_sql(GroupBy::Provider),
            year,
        ),
        ("report (bigint)", ROLL_UP, "100"),
        (
            "report (interval, bigint)",
            PURGE_DETAIL,
            "interval '90 days', 100",
        ),
        (
            "report (interval, bigint)",
            steps::PURGE_EXPIRED,
            "interval '30 days', 100",
        ),
    ];
    for (prepare, sql, args) in statements {
        sqlx::query(sqlx::AssertSqlSafe(format!("PREPARE {prepare} AS {sql}")))
            .execute(&mut *conn)
            .await
            .expect("prepare");
        let (sqlx::types::Json(plan),): (sqlx::types::Json<Value>,) = sqlx::query_as(
            sqlx::AssertSqlSafe(format!("EXPLAIN (FORMAT JSON) EXECUTE report ({args})")),
        )
        .fetch_one(&mut *conn)
        .await
        .expect("explain");
        for table in [
            "runs",
            "run_steps",
            "usage_daily",
            "usage_daily_providers",
            "usage_detail",
        ] {
            assert_eq!(
                seq_scans(&plan[0]["Plan"], table),
                0,
                "{table} read whole by {sql}: {plan:#}"
            );
        }
        sqlx::query("DEALLOCATE report")
            .execute(&mut *conn)
            .await
            .expect("deallocate");
    }
}

/// The idempotency keys' purge, with the rest of retention: keys past the window go in
/// batches of the given size, a key inside it stays and still answers.
#[tokio::test]
async fn idempotency_keys_go_past_their_window_in_bounded_batches() {
    use crate::db::idempotency;
    let db = TestDb::new().await.expect("db");
    sqlx::raw_sql(
        "INSERT INTO idempotency_keys (tenant_id, key, request_hash, status_code, response,
                                       created_at)
         SELECT 'acme', 'old-' || n, 'h', 202, '{}', now() - interval '3 hours'
           FROM generate_series(1, 5) n;
         INSERT INTO idempotency_keys (tenant_id, key, request_hash, status_code, response,
                                       created_at)
         VALUES ('acme', 'fresh', 'h', 202, '{}', now() - interval '1 hour')",
    )
    .execute(&db.pool)
    .await
    .expect("keys");
    let window = Duration::hours(2);
    assert!(
        idempotency::find(&db.pool, "acme", "old-1", window)
            .await
            .expect("find")
            .is_none(),
        "past the window a key answers nothing"
    );
    let mut batches = Vec::new();
    loop {
        let purged = idempotency::purge_expired(&db.pool, window, 2)
            .await
            .expect("purge");
        batches.push(purged);
        if purged < 2 {
            break;
        }
    }
    assert_eq!(batches, [2, 2, 1]);
    assert_eq!(db.count("idempotency_keys").await, 1);
    assert!(
        idempotency::find(&db.pool, "acme", "fresh", window)
            .await
            .expect("find")
            .is_some()
    );
}

/// A step naming no model counts as `unknown`: '' is the roll-up's row of the runs' own
/// totals, and a step there would collide with it and stop every later roll-up.
#[tokio::test]
async fn a_step_naming_no_model_counts_as_unknown_before_and_after_the_roll_up() {
    let db = TestDb::new().await.expect("db");
    ended(
        &db,
        Ended {
            at: day(3, 9),
            usage: (7, 7),
            steps: &[("", 5, 5)],
            ..Ended::default()
        },
    )
    .await;
    let window = Window::new(day(3, 0), day(4, 0));
    let before = report(&db.pool, "acme", window, GroupBy::Model)
        .await
        .expect("report");
    assert_eq!(
        before.iter().map(|r| r.group.as_str()).collect::<Vec<_>>(),
        ["unknown"]
    );
    assert_eq!(roll_up(&db.pool, 10).await.expect("roll up"), 1);
    assert_eq!(
        report(&db.pool, "acme", window, GroupBy::Model)
            .await
            .expect("report"),
        before
    );
}

/// The roll-up of the release before usage by provider (its statement as it shipped): it
/// writes `usage_daily` and `usage_detail` and names no provider.
const PREVIOUS_ROLL_UP: &str = "WITH batch AS (
         SELECT id FROM runs
          WHERE finished_at IS NOT NULL AND usage_rolled_up_at IS NULL
          LIMIT $1 FOR NO KEY UPDATE SKIP LOCKED),
     rolled AS (
         UPDATE runs r SET usage_rolled_up_at = now()
           FROM batch WHERE r.id = batch.id
         RETURNING r.id, r.tenant_id, r.owner_id,
                   coalesce(r.agent_id::text, 'default') AS agent_id, r.finished_at,
                   coalesce((r.usage->>'input_tokens')::bigint, 0) AS input_tokens,
                   coalesce((r.usage->>'output_tokens')::bigint, 0) AS output_tokens,
                   CASE WHEN coalesce((r.usage->>'input_tokens')::bigint, 0) = 0
                         AND coalesce((r.usage->>'output_tokens')::bigint, 0) = 0 THEN 0
                        ELSE (r.usage->>'cost_usd')::float8 END AS cost_usd),
     detail AS (
         SELECT id AS workflow_id, '' AS model, tenant_id, owner_id, agent_id, finished_at,
                input_tokens, output_tokens, cost_usd
           FROM rolled
         UNION ALL
         SELECT r.id, coalesce(nullif(u.model, ''), 'unknown'), r.tenant_id, r.owner_id,
                r.agent_id, r.finished_at, sum(u.input_tokens)::bigint, sum(u.output_tokens)::bigint,
                CASE WHEN bool_and(u.cost_usd IS NOT NULL) THEN sum(u.cost_usd) END
           FROM rolled r JOIN step_usage u ON u.workflow_id = r.id
          GROUP BY r.id, coalesce(nullif(u.model, ''), 'unknown'), r.tenant_id, r.owner_id,
                   r.agent_id, r.finished_at),
     kept AS (
         INSERT INTO usage_detail (workflow_id, model, tenant_id, owner_id, agent_id,
                                   finished_at, input_tokens, output_tokens, cost_usd)
         SELECT workflow_id, model, tenant_id, owner_id, agent_id, finished_at,
                input_tokens, output_tokens, cost_usd
           FROM detail),
     summed AS (
         INSERT INTO usage_daily AS d (tenant_id, day, owner_id, agent_id, model,
                                       input_tokens, output_tokens, runs, cost_usd)
         SELECT tenant_id, (finished_at AT TIME ZONE 'UTC')::date, owner_id, agent_id,
                model, sum(input_tokens), sum(output_tokens), count(*),
                CASE WHEN bool_and(cost_usd IS NOT NULL) THEN sum(cost_usd) END
           FROM detail
          GROUP BY 1, 2, 3, 4, 5
          ORDER BY 1, 2, 3, 4, 5
         ON CONFLICT (tenant_id, day, owner_id, agent_id, model) DO UPDATE
            SET input_tokens = d.input_tokens + EXCLUDED.input_tokens,
                output_tokens = d.output_tokens + EXCLUDED.output_tokens,
                runs = d.runs + EXCLUDED.runs,
                -- Unknown once any part is.
                cost_usd = d.cost_usd + EXCLUDED.cost_usd)
     SELECT count(*) FROM rolled";

/// The migration that records providers.
const USAGE_BY_PROVIDER: &str =
    include_str!("../../../../migrations/20261129040406_usage_by_provider.sql");

/// Totals over every group of a report: (input, output, runs).
fn totals(rows: &[UsageRow]) -> (i64, i64, i64) {
    rows.iter().fold((0, 0, 0), |(i, o, n), r| {
        (i + r.input_tokens, o + r.output_tokens, n + r.runs)
    })
}

/// Rows the migration found (rolled up before it) read `unknown`, whole days and edges alike,
/// with every total exact; runs rolled up after it add to the same days under their own
/// providers, and the report by user does not move.
#[tokio::test]
async fn rows_rolled_up_before_the_migration_count_as_unknown_and_exactly() {
    let db = TestDb::new().await.expect("db");
    // The schema as the release before had it, its roll-up done.
    sqlx::raw_sql(
        "DROP TABLE usage_daily_providers;
         ALTER TABLE usage_detail DROP COLUMN provider",
    )
    .execute(&db.pool)
    .await
    .expect("the previous schema");
    month(&db).await;
    assert_eq!(
        sqlx::query_scalar::<_, i64>(PREVIOUS_ROLL_UP)
            .bind(100_i64)
            .fetch_one(&db.pool)
            .await
            .expect("the previous roll-up"),
        6
    );
    let by_user: Vec<_> = {
        let mut all = Vec::new();
        for window in windows() {
            all.push(
                report(&db.pool, "acme", window, GroupBy::User)
                    .await
                    .expect("by user"),
            );
        }
        all
    };
    sqlx::raw_sql(USAGE_BY_PROVIDER)
        .execute(&db.pool)
        .await
        .expect("the migration");

    let unattributed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM usage_detail WHERE provider IS DISTINCT FROM 'unknown'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("count");
    assert_eq!(unattributed, 0, "the rows it found read unknown");
    for (window, by_user) in windows().into_iter().zip(&by_user) {
        let by_provider = report(&db.pool, "acme", window, GroupBy::Provider)
            .await
            .expect("by provider");
        assert!(
            by_provider.iter().all(|r| r.group == "unknown"),
            "{by_provider:?}"
        );
        assert_eq!(totals(&by_provider), totals(by_user), "{window:?}");
    }

    // A run through the tenant's provider ends on a rolled-up day and is rolled up now.
    ended(
        &db,
        Ended {
            at: day(15, 13),
            usage: (1_000, 100),
            spec: Some(through("byok", Some(Uuid::new_v4()))),
            ..Ended::default()
        },
    )
    .await;
    let whole = Window::new(day(1, 0), day(31, 0));
    let pending = report(&db.pool, "acme", whole, GroupBy::Provider)
        .await
        .expect("report");
    assert_eq!(roll_up(&db.pool, 100).await.expect("roll up"), 1);
    let rolled = report(&db.pool, "acme", whole, GroupBy::Provider)
        .await
        .expect("report");
    assert_eq!(rolled, pending, "the same before and after its roll-up");
    let groups: Vec<_> = rolled
        .iter()
        .map(|r| (r.group.as_str(), r.runs, r.input_tokens))
        .collect();
    let (unknown_in, _, unknown_runs) = totals(&by_user[0]);
    assert_eq!(
        groups,
        [
            ("tenant:byok", 1, 1_000),
            ("unknown", unknown_runs, unknown_in)
        ]
    );
}

/// During a rolling deploy a worker of the previous release rolls runs up without a provider:
/// they count once, as `unknown`, before and after the new roll-up adopts them, and their
/// detail is not purged before it has.
#[tokio::test]
async fn runs_rolled_up_by_the_previous_release_count_once_and_are_adopted() {
    let db = TestDb::new().await.expect("db");
    month(&db).await;
    let before = reports(&db, &windows()).await;
    assert_eq!(
        sqlx::query_scalar::<_, i64>(PREVIOUS_ROLL_UP)
            .bind(100_i64)
            .fetch_one(&db.pool)
            .await
            .expect("the previous roll-up"),
        6
    );
    let unattributed = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM usage_detail WHERE provider IS NULL")
            .fetch_one(&db.pool)
            .await
            .expect("count")
    };
    assert!(unattributed().await > 0, "written without a provider");
    let previous = reports(&db, &windows()).await;
    for (n, (now, then)) in previous.iter().zip(&before).enumerate() {
        if n % 4 == 3 {
            // By provider: every run is there, as unknown.
            assert!(now.iter().all(|r| r.group == "unknown"), "{now:?}");
            assert_eq!(totals(now), totals(then));
        } else {
            assert_eq!(now, then, "by user, agent and model as before");
        }
    }
    // Not purged while not adopted.
    assert_eq!(
        purge_detail(&db.pool, Duration::zero(), 1_000)
            .await
            .expect("purge"),
        0
    );

    // The new roll-up adopts them in bounded batches, counting each once.
    let mut batches = Vec::new();
    while unattributed().await > 0 {
        assert_eq!(
            roll_up(&db.pool, 4).await.expect("roll up"),
            0,
            "no run left"
        );
        batches.push(unattributed().await);
    }
    assert!(batches.len() > 1, "in batches: {batches:?}");
    assert_eq!(
        reports(&db, &windows()).await,
        previous,
        "adopted, not moved"
    );
    let purged = purge_detail(&db.pool, Duration::zero(), 1_000)
        .await
        .expect("purge");
    assert!(purged > 0);
    let whole = [Window::new(day(1, 0), day(31, 0))];
    assert_eq!(
        reports(&db, &whole).await,
        previous[..4],
        "whole days without any detail"
    );
}
