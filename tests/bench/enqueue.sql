-- pgbench script: the enqueue of `POST /v1/threads/{id}/user_message` for a NEW thread, with no
-- Idempotency-Key, no agent_id and no metadata: one statement outside a transaction.
--
-- Mirrors (one round trip, as sqlx does):
--   1 WITH thread AS (INSERT INTO threads ... ON CONFLICT DO UPDATE), turn AS (INSERT INTO
--     messages: user, assistant), run AS (INSERT INTO runs) SELECT true
--                          runs::insert_with_thread, called by db::enqueue   shared/src/db/
--                          on a pooled connection   api/src/routes/threads.rs enqueue_message
-- Not mirrored: the NOTIFY that wakes the workers. The API sends it after the commit from one
-- task, folding the wakes of every enqueue that committed while the previous one was in flight
-- (api/src/wake.rs): under load about one per round trip, not one per request. spool-bench
-- also runs this script with `SELECT pg_notify('spool_runs', '') FROM thread` as its last
-- line, the baseline issue 14 names ("the three rows and the NOTIFY" in one transaction).
-- Not issued on this path: agents::find (only with an agent_id), threads::find (only when the
-- thread has an agent the message does not name), idempotency::find / reserve / record and the
-- transaction around them (only with an Idempotency-Key). The auth extractor does no SQL.
--
-- With SPOOL_QUOTA_* set, the run carries its quota counters; it was admitted against them in
-- Redis before the statement (shared/src/quota/admission.rs), which pgbench does not do.
--
-- KEEP IN SYNC with those functions: when their SQL changes, change this file and the copy of
-- this statement at the top of tests/bench/lifecycle.sql.
--
-- Differences that cannot be avoided in pgbench:
-- * Spool makes its ids client-side with Uuid::now_v7() and binds them. Here they are derived
--   server-side from one random number, with no extra round trip: a UUIDv7-like value whose
--   first 48 bits are now() in ms (constant within the statement, so every expression computes
--   the same id) and whose rest is md5(r || '-<kind>'). Time-ordered like v7, so the primary-key
--   indexes see the same right-edge inserts as with Spool's ids.
-- * Values Spool binds as $n (tenant, owner, role, status, content, metadata, NULLs) are
--   literals here: pgbench has no string variables. The statement shapes are unchanged.
-- * Not issued by Spool under load either: a ping before a pooled connection is used, which
--   shared/src/db.rs sends only for a connection idle for SPOOL_DB_CHECK_IDLE_SECS (1 s).
-- Run it with -M prepared: sqlx prepares each statement once per connection and reuses it.

\set r random(1, 9000000000000000000)

-- runs::insert_with_thread($2 thread_id, $3 tenant_id, $4 owner_id, $5 run's agent_id = NULL,
-- $16 the message's agent_id = NULL): the thread upsert, the user message (role user, status
-- completed; metadata {} when none given) and the assistant message (empty, queued) in one
-- INSERT, the run (agent_id NULL: the new thread's agent, the default; idempotency_key NULL: no
-- header; trace_context NULL: what inject_traceparent() gives without OpenTelemetry), in one
-- statement outside a transaction
WITH thread AS (
     INSERT INTO threads AS t (id, tenant_id, owner_id, agent_id, last_message_at)
     VALUES ((lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-thread'), 13))::uuid,
             'bench', 'bench-user', NULL, now())
     ON CONFLICT (id) DO UPDATE SET last_message_at = now()
      WHERE t.tenant_id = 'bench' AND t.owner_id = 'bench-user' AND t.erased_at IS NULL
        AND (NULL::uuid IS NOT NULL OR t.agent_id IS NOT DISTINCT FROM NULL::uuid)
     RETURNING t.id),
 turn AS (
     INSERT INTO messages (id, thread_id, role, content, status, metadata, workflow_id)
     SELECT m.id, thread.id, m.role, m.content, m.status, m.metadata,
            (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-run'), 13))::uuid
       FROM thread,
            (VALUES (1, (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-user'), 13))::uuid,
                     'user', 'Hello!'::text, 'completed', '{}'::jsonb),
                    (2, (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-assistant'), 13))::uuid,
                     'assistant', '', 'queued', '{}'::jsonb))
              AS m (turn, id, role, content, status, metadata)
      ORDER BY m.turn),
 run AS (
     INSERT INTO runs (id, thread_id, tenant_id, owner_id, agent_id, user_message_id,
                       assistant_message_id, idempotency_key, trace_context, agent_spec, quota,
                       overrides)
     SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-run'), 13))::uuid,
            thread.id, 'bench', 'bench-user', NULL::uuid,
            (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-user'), 13))::uuid,
            (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0')
         || substr(md5(:r::text || '-assistant'), 13))::uuid,
            NULL::text, NULL::text, NULL::jsonb, /* quota */ NULL, NULL::jsonb
       FROM thread)
SELECT true FROM thread;
