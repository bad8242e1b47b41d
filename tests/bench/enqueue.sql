-- pgbench script: the enqueue transaction of `POST /v1/threads/{id}/user_message` for a NEW
-- thread, with no Idempotency-Key, no agent_id and no metadata.
--
-- Mirrors, statement for statement and in this order (one round trip each, as sqlx does):
--   1 BEGIN                state.db.begin()        api/src/routes/threads.rs post_user_message
--   2 INSERT INTO threads ... ON CONFLICT DO UPDATE
--                          threads::ensure_owned   shared/src/db/threads.rs
--   3 WITH turn AS (INSERT INTO messages: user, assistant), run AS (INSERT INTO runs)
--     SELECT pg_notify     runs::insert_with_messages   shared/src/db/runs.rs
--   4 COMMIT               tx.commit()
-- Not issued on this path: agents::exists (only with an agent_id) and idempotency::find /
-- reserve / record (only with an Idempotency-Key). The auth extractor does no SQL.
--
-- With SPOOL_QUOTA_* set, the run carries its quota counters and the COMMIT counts it in them
-- (the deferred trigger runs_quota_admit, migrations/20261124000005_quotas.sql).
--
-- KEEP IN SYNC with those functions: when their SQL changes, change this file and the copy of
-- this transaction at the top of tests/bench/lifecycle.sql.
--
-- Differences that cannot be avoided in pgbench:
-- * Spool makes its ids client-side with Uuid::now_v7() and binds them. Here they are derived
--   server-side from one random number, with no extra round trip: a UUIDv7-like value whose
--   first 48 bits are now() in ms (constant within the transaction, so every statement computes
--   the same id) and whose rest is md5(r || '-<kind>'). Time-ordered like v7, so the primary-key
--   indexes see the same right-edge inserts as with Spool's ids.
-- * Values Spool binds as $n (tenant, owner, role, status, content, metadata, NULLs) are
--   literals here: pgbench has no string variables. The statement shapes are unchanged.
-- * Not issued by Spool under load either: a ping before a pooled connection is used, which
--   shared/src/db.rs sends only for a connection idle for SPOOL_DB_CHECK_IDLE_SECS (1 s).
-- Run it with -M prepared: sqlx prepares each statement once per connection and reuses it.

\set r random(1, 9000000000000000000)

BEGIN;

-- threads::ensure_owned($1 thread_id, $2 tenant_id, $3 owner_id, $4 agent_id = NULL)
INSERT INTO threads AS t (id, tenant_id, owner_id, agent_id, last_message_at)
VALUES ((lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-thread'), 13))::uuid,
        'bench', 'bench-user', NULL, now())
ON CONFLICT (id) DO UPDATE SET last_message_at = now()
 WHERE t.tenant_id = 'bench' AND t.owner_id = 'bench-user' AND t.erased_at IS NULL
RETURNING t.agent_id;

-- runs::insert_with_messages: the user message (role user, status completed; metadata {} when
-- none given) and the assistant message (empty, queued) in one INSERT, the run (agent_id NULL:
-- the new thread's agent, the default; idempotency_key NULL: no header; trace_context NULL:
-- what inject_traceparent() gives without OpenTelemetry), and the NOTIFY (RUNS_CHANNEL =
-- 'spool_runs', empty payload), in one statement
WITH turn AS (
     INSERT INTO messages (id, thread_id, role, content, status, metadata, workflow_id)
     VALUES ((lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-user'), 13))::uuid,
             (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-thread'), 13))::uuid,
             'user', 'Hello!', 'completed', '{}'::jsonb,
             (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-run'), 13))::uuid),
            ((lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-assistant'), 13))::uuid,
             (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-thread'), 13))::uuid,
             'assistant', '', 'queued', '{}'::jsonb,
             (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-run'), 13))::uuid)),
 run AS (
     INSERT INTO runs (id, thread_id, tenant_id, owner_id, agent_id, user_message_id,
                       assistant_message_id, idempotency_key, trace_context, agent_spec, quota,
                       overrides)
     VALUES ((lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-run'), 13))::uuid,
             (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-thread'), 13))::uuid,
             'bench', 'bench-user', NULL,
             (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-user'), 13))::uuid,
             (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-assistant'), 13))::uuid,
             NULL, NULL, NULL, /* quota */ NULL, NULL))
SELECT pg_notify('spool_runs', '');

COMMIT;
