//! Months of use, made in bulk: threads, messages, runs and their steps for many tenants, written
//! by SQL (`generate_series` and `INSERT … SELECT`) through the real schema, its indexes,
//! constraints and foreign keys in place as the migrations made them.
//!
//! One generator, parameterised by [`Size`], serves both the plan test
//! (`tests/tests/e2e/growth.rs`, a few seconds' fill) and `spool-bench p7` (a million threads):
//! what the test proves about plans is proved on the same shape of data the benchmark measures.
//!
//! The shape: thread `i` belongs to tenant `i % tenants` and, within it, to user
//! `(i / tenants) % users`; tenant 0 is [`TENANT`] and its user 0 is [`USER`] (the bench's and
//! the test's caller). Threads are spread evenly over the 180 days before the fill, each with 2
//! or 3 runs (5 messages for every 2 threads' runs: two per run), every run ended
//! (`completed`, 1% `failed`, 1% `cancelled`), so no worker ever claims a generated run. A
//! quarter of the threads (and their runs) have one of the tenant's three agents, one in a
//! thousand its rare agent ([`RARE_AGENT`]); each thread has `{"project": "p<0..49>", "n":
//! <0..6>}` as metadata, one in 997 also `{"flag": "rare"}`. Every other run has one saved tool
//! step; every completed run keeps its final step, as the worker writes them.
//!
//! Retention's steady state at its default windows (DESIGN section 15), as a deployment that has
//! run for months holds it: every run's usage is rolled up (`usage_rolled_up_at`, its rows in
//! `usage_daily` and `usage_daily_providers`, and in `usage_detail` for the runs that ended in
//! the last 90 days, `SPOOL_RETENTION_USAGE_DETAIL_DAYS`); runs that ended more than 30 days ago
//! (`SPOOL_RETENTION_STEPS_DAYS`) have lost their steps and final step (`steps_expired_at`). A fill without it would leave the workers' housekeeping
//! months of backlog to roll up and delete while a benchmark measures.

use anyhow::Context as _;
use sqlx::PgConnection;
use sqlx::postgres::PgQueryResult;

/// The tenant whose user the callers are.
pub const TENANT: &str = "bench";
/// The user of [`TENANT`] the callers are.
pub const USER: &str = "bench-user";
/// The agent number of each tenant's rare agent (see [`agent_id`]).
pub const RARE_AGENT: i64 = 9;

/// How much to make.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    /// Threads, over all tenants.
    pub threads: i64,
    /// Tenants.
    pub tenants: i64,
    /// Users per tenant.
    pub users: i64,
}

impl Size {
    /// Months of a busy deployment: a million threads, 2.5 million runs, 5 million messages.
    pub const MONTHS: Size = Size {
        threads: 1_000_000,
        tenants: 200,
        users: 5,
    };

    /// Runs of each thread are 2 or 3: this many over all threads.
    pub fn runs(&self) -> i64 {
        self.threads * 2 + self.threads / 2
    }
}

/// The SQL helpers of the statements below, as temporary functions of the filling session
/// (inlined by the planner: plain SQL, immutable).
const HELPERS: &[&str] = &[
    "CREATE FUNCTION pg_temp.growth_tenant(i bigint, tenants bigint) RETURNS text
       LANGUAGE sql IMMUTABLE AS
     $$ SELECT CASE WHEN i % tenants = 0 THEN 'bench' ELSE 'growth-' || i % tenants END $$",
    "CREATE FUNCTION pg_temp.growth_owner(i bigint, tenants bigint, users bigint) RETURNS text
       LANGUAGE sql IMMUTABLE AS
     $$ SELECT CASE WHEN (i / tenants) % users = 0 AND i % tenants = 0 THEN 'bench-user'
                    ELSE 'user-' || (i / tenants) % users END $$",
    "CREATE FUNCTION pg_temp.growth_agent(i bigint, tenants bigint) RETURNS uuid
       LANGUAGE sql IMMUTABLE AS
     $$ SELECT CASE WHEN i % 1000 = 0 THEN md5('agent' || i % tenants || '.9')::uuid
                    WHEN i % 4 = 0 THEN md5('agent' || i % tenants || '.' || (i / 4) % 3)::uuid
                END $$",
    // Evenly over the 180 days before the fill, oldest first; a thread's runs a minute apart.
    "CREATE FUNCTION pg_temp.growth_at(i bigint, threads bigint, j bigint) RETURNS timestamptz
       LANGUAGE sql STABLE AS
     $$ SELECT now() - interval '180 days' * (1 - i::float8 / threads)
               + j * interval '1 minute' $$",
    // The usage rows the roll-up writes for run `j` of thread `i`: the run's own totals
    // (`model` ''), and its step's tokens under 'unknown' (the fill's steps name no model) for
    // the runs that have a step.
    "CREATE FUNCTION pg_temp.growth_usage(i bigint, j bigint)
       RETURNS TABLE (model text, input bigint, output bigint)
       LANGUAGE sql IMMUTABLE AS
     $$ SELECT '', 1624::bigint, 192::bigint
        UNION ALL SELECT 'unknown', 812, 96 WHERE (i + j) % 2 = 0 $$",
];

/// The statements that fill, in order (parents before children), each with `$1` threads, `$2`
/// tenants and `$3` users per tenant.
const FILL: &[(&str, &str)] = &[
    (
        "threads",
        "INSERT INTO threads (id, tenant_id, owner_id, agent_id, metadata, created_at,
                              updated_at, last_message_at)
         SELECT md5('thread' || i)::uuid, pg_temp.growth_tenant(i, $2),
                pg_temp.growth_owner(i, $2, $3), pg_temp.growth_agent(i, $2),
                jsonb_build_object('project', 'p' || i % 50, 'n', i % 7)
                || CASE WHEN i % 997 = 0 THEN '{\"flag\": \"rare\"}'::jsonb ELSE '{}' END,
                pg_temp.growth_at(i, $1, 0), pg_temp.growth_at(i, $1, 3),
                pg_temp.growth_at(i, $1, 2)
           FROM generate_series(0::bigint, $1 - 1) i",
    ),
    (
        "messages",
        "INSERT INTO messages (id, thread_id, role, content, status, usage, workflow_id,
                               created_at, updated_at)
         SELECT md5(m.kind || i || '.' || j)::uuid, md5('thread' || i)::uuid, m.role,
                m.content, 'completed', m.usage, md5('run' || i || '.' || j)::uuid,
                pg_temp.growth_at(i, $1, j), pg_temp.growth_at(i, $1, j)
           FROM generate_series(0::bigint, $1 - 1) i
          CROSS JOIN LATERAL generate_series(0::bigint, 1 + i % 2) j
          CROSS JOIN LATERAL (VALUES
                ('user', 'user', 'Question ' || j || ' of thread ' || i
                  || ': what changed in the quarterly figures, and why?', NULL::jsonb),
                ('assistant', 'assistant', repeat('The figures moved because of seasonal '
                  || 'demand and a one-off cost. ', 4),
                 '{\"input_tokens\": 812, \"output_tokens\": 96}'::jsonb))
             AS m (kind, role, content, usage)",
    ),
    (
        "runs",
        "INSERT INTO runs (id, thread_id, tenant_id, owner_id, agent_id, user_message_id,
                           assistant_message_id, status, attempt, lease_owner, lease_expires_at,
                           heartbeat_at, error, usage, queued_at, created_at, started_at,
                           finished_at, updated_at, final_step, usage_rolled_up_at,
                           steps_expired_at)
         SELECT md5('run' || i || '.' || j)::uuid, md5('thread' || i)::uuid,
                pg_temp.growth_tenant(i, $2), pg_temp.growth_owner(i, $2, $3),
                pg_temp.growth_agent(i, $2), md5('user' || i || '.' || j)::uuid,
                md5('assistant' || i || '.' || j)::uuid, s.status, 1, 'worker-' || i % 8,
                at + interval '35 seconds', at + interval '5 seconds',
                CASE s.status WHEN 'failed' THEN
                    '{\"code\": \"model_error\", \"message\": \"the provider answered 500\"}'::jsonb
                END,
                '{\"input_tokens\": 1624, \"output_tokens\": 192}'::jsonb, at, at,
                at + interval '1 second', at + interval '6 seconds', at + interval '6 seconds',
                CASE WHEN s.status = 'completed' AND NOT s.expired THEN jsonb_build_object(
                    'assistant', jsonb_build_object('text', 'The figures moved because of '
                        || 'seasonal demand and a one-off cost.', 'tool_calls', '[]'::jsonb),
                    'usage', '{\"input_tokens\": 812, \"output_tokens\": 96}'::jsonb)
                END,
                at + interval '10 seconds',
                CASE WHEN s.expired THEN at + interval '30 days 1 minute' END
           FROM generate_series(0::bigint, $1 - 1) i
          CROSS JOIN LATERAL generate_series(0::bigint, 1 + i % 2) j
          CROSS JOIN LATERAL (SELECT pg_temp.growth_at(i, $1, j) AS at,
                                     CASE (i * 3 + j) % 100 WHEN 0 THEN 'failed'
                                          WHEN 1 THEN 'cancelled' ELSE 'completed' END
                                       AS status,
                                     pg_temp.growth_at(i, $1, j) < now() - interval '30 days'
                                       AS expired) s",
    ),
    (
        "run_steps",
        "INSERT INTO run_steps (workflow_id, step, attempt, data, created_at, text)
         SELECT md5('run' || i || '.' || j)::uuid, 1, 1, jsonb_build_object(
                    'assistant', jsonb_build_object('text', 'Looking it up.', 'tool_calls',
                        jsonb_build_array(jsonb_build_object('id', 'call_' || i || '_' || j,
                            'name', 'search', 'arguments', '{\"q\": \"quarterly figures\"}'))),
                    'results', jsonb_build_array(jsonb_build_object(
                        'tool_call_id', 'call_' || i || '_' || j, 'name', 'search',
                        'output', repeat('Revenue rose 4% on seasonal demand. ', 6),
                        'state', 'done', 'published', true, 'attempt', 1)),
                    'usage', '{\"input_tokens\": 812, \"output_tokens\": 96}'::jsonb),
                pg_temp.growth_at(i, $1, j) + interval '3 seconds', 'Looking it up.'
           FROM generate_series(0::bigint, $1 - 1) i
          CROSS JOIN LATERAL generate_series(0::bigint, 1 + i % 2) j
          WHERE (i + j) % 2 = 0 AND pg_temp.growth_at(i, $1, j) >= now() - interval '30 days'",
    ),
    (
        "usage_detail",
        "INSERT INTO usage_detail (workflow_id, model, tenant_id, owner_id, agent_id, provider,
                                   finished_at, input_tokens, output_tokens)
         SELECT md5('run' || i || '.' || j)::uuid, u.model, pg_temp.growth_tenant(i, $2),
                pg_temp.growth_owner(i, $2, $3),
                coalesce(pg_temp.growth_agent(i, $2)::text, 'default'), 'unknown',
                pg_temp.growth_at(i, $1, j) + interval '6 seconds', u.input, u.output
           FROM generate_series(0::bigint, $1 - 1) i
          CROSS JOIN LATERAL generate_series(0::bigint, 1 + i % 2) j
          CROSS JOIN LATERAL pg_temp.growth_usage(i, j) u
          WHERE pg_temp.growth_at(i, $1, j) >= now() - interval '90 days'",
    ),
    (
        "usage_daily",
        "INSERT INTO usage_daily (tenant_id, day, owner_id, agent_id, model, input_tokens,
                                  output_tokens, runs)
         SELECT pg_temp.growth_tenant(i, $2),
                ((pg_temp.growth_at(i, $1, j) + interval '6 seconds') AT TIME ZONE 'UTC')::date,
                pg_temp.growth_owner(i, $2, $3),
                coalesce(pg_temp.growth_agent(i, $2)::text, 'default'), u.model,
                sum(u.input), sum(u.output), count(*)
           FROM generate_series(0::bigint, $1 - 1) i
          CROSS JOIN LATERAL generate_series(0::bigint, 1 + i % 2) j
          CROSS JOIN LATERAL pg_temp.growth_usage(i, j) u
          GROUP BY 1, 2, 3, 4, 5",
    ),
    (
        "usage_daily_providers",
        // The same days by provider (every fill statement is given the same three parameters).
        "INSERT INTO usage_daily_providers (tenant_id, day, provider, model, input_tokens,
                                            output_tokens, runs)
         SELECT tenant_id, day, 'unknown', model, sum(input_tokens), sum(output_tokens),
                sum(runs)
           FROM usage_daily
          WHERE $1::bigint > 0 AND $2::bigint > 0 AND $3::bigint > 0
          GROUP BY tenant_id, day, model",
    ),
];

/// The agent `n` of tenant number `tenant` (0 is [`TENANT`]; `n` is 0, 1, 2 or
/// [`RARE_AGENT`]), as the fill names it.
pub async fn agent_id(conn: &mut PgConnection, tenant: i64, n: i64) -> sqlx::Result<uuid::Uuid> {
    let (id,): (uuid::Uuid,) = sqlx::query_as("SELECT md5('agent' || $1 || '.' || $2)::uuid")
        .bind(tenant)
        .bind(n)
        .fetch_one(conn)
        .await?;
    Ok(id)
}

/// Fills the (migrated, empty) database of `conn` to `size`, then vacuums and analyzes what it
/// filled, as autovacuum would have over the months. Prints each table's time with `progress`.
pub async fn fill(
    conn: &mut PgConnection,
    size: Size,
    mut progress: impl FnMut(&str, std::time::Duration),
) -> anyhow::Result<()> {
    // Each statement commits alone; a crash midway leaves a database to drop, not to trust.
    sqlx::query("SET synchronous_commit = off")
        .execute(&mut *conn)
        .await?;
    for helper in HELPERS {
        sqlx::raw_sql(sqlx::AssertSqlSafe(*helper))
            .execute(&mut *conn)
            .await
            .context("creating the fill's helpers")?;
    }
    for (table, sql) in FILL {
        let started = std::time::Instant::now();
        let _: PgQueryResult = sqlx::query(*sql)
            .bind(size.threads)
            .bind(size.tenants)
            .bind(size.users)
            .execute(&mut *conn)
            .await
            .with_context(|| format!("filling {table}"))?;
        progress(table, started.elapsed());
    }
    let started = std::time::Instant::now();
    for (table, _) in FILL {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM (ANALYZE) {table}")))
            .execute(&mut *conn)
            .await
            .with_context(|| format!("vacuuming {table}"))?;
    }
    progress("vacuum and analyze", started.elapsed());
    Ok(())
}

/// Adds one thread of [`USER`] with `turns` ended runs (two messages each, and every other run
/// one tool step), made the way [`fill`] makes them, and returns its id: a long conversation to
/// erase. `seed` makes its ids (distinct from the fill's and from other seeds').
pub async fn long_thread(
    conn: &mut PgConnection,
    seed: &str,
    turns: i64,
) -> anyhow::Result<uuid::Uuid> {
    let thread: (uuid::Uuid,) = sqlx::query_as(
        "INSERT INTO threads (id, tenant_id, owner_id, last_message_at)
         VALUES (md5('long' || $1)::uuid, $2, $3, now()) RETURNING id",
    )
    .bind(seed)
    .bind(TENANT)
    .bind(USER)
    .fetch_one(&mut *conn)
    .await
    .context("a long thread")?;
    let run = |n: &str| format!("md5('long' || $1 || '{n}' || j)::uuid");
    let messages = format!(
        "INSERT INTO messages (id, thread_id, role, content, status, workflow_id)
         SELECT {user}, $2, 'user', 'Question ' || j, 'completed', {run}
           FROM generate_series(1::bigint, $3) j
         UNION ALL
         SELECT {assistant}, $2, 'assistant', repeat('An answer. ', 20), 'completed', {run}
           FROM generate_series(1::bigint, $3) j",
        user = run("u"),
        assistant = run("a"),
        run = run("r"),
    );
    let runs = format!(
        "INSERT INTO runs (id, thread_id, tenant_id, owner_id, user_message_id,
                           assistant_message_id, status, attempt, finished_at)
         SELECT {run}, $2, '{TENANT}', '{USER}', {user}, {assistant}, 'completed', 1, now()
           FROM generate_series(1::bigint, $3) j",
        user = run("u"),
        assistant = run("a"),
        run = run("r"),
    );
    let steps = format!(
        "INSERT INTO run_steps (workflow_id, step, attempt, data)
         SELECT {run}, 1, 1, '{{\"assistant\": {{\"text\": \"Looking.\"}}}}'
           FROM generate_series(1::bigint, $3) j WHERE j % 2 = 0",
        run = run("r"),
    );
    for sql in [messages, runs, steps] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(seed)
            .bind(thread.0)
            .bind(turns)
            .execute(&mut *conn)
            .await
            .context("the long thread's rows")?;
    }
    Ok(thread.0)
}
