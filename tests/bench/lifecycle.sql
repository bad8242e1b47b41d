-- pgbench script: the whole SQL life of one run, as Spool does it for a message posted to a new
-- thread and answered by the default agent with the built-in `demo` model (no tools, no hooks,
-- first attempt). One pgbench transaction = the API's enqueue statement + one worker claim +
-- the worker's statements for the run it claimed.
--
-- Mirrors, in this order (one round trip each, autocommit):
--  API, api/src/routes/threads.rs enqueue_message (identical to tests/bench/enqueue.sql):
--   1 WITH thread AS (INSERT threads ON CONFLICT UPDATE), turn AS (INSERT INTO messages),
--     run AS (INSERT INTO runs) SELECT true (the API's coalesced NOTIFY after it is not
--     mirrored: see enqueue.sql)
--                                         runs::insert_with_thread   shared/src/db/runs.rs
--  Worker (autocommit statements on the pool):
--   2 WITH candidate AS (... FOR UPDATE SKIP LOCKED), claimed AS (UPDATE runs ... RETURNING),
--     streaming AS (UPDATE messages) SELECT ...
--                                         runs::claim                shared/src/db/runs.rs,
--                                         called by claim::run       worker/src/claim.rs
--                                         (up to the worker's free slots at once; one here)
--   3 WITH summary AS (...) SELECT role, content, parts, seq, ... FROM (... messages ...)
--                                         messages::history          called by prompt::start
--                                                                    worker/src/agent/prompt.rs
--   4 WITH finished AS (UPDATE runs) UPDATE messages
--                                         runs::finish               called by attempt::end
--                                                                    worker/src/attempt.rs
-- Not issued for such a run: agents::find (only for a run enqueued without its spec),
-- steps::load (checkpoint::restore, only from the second attempt on), steps::save (only for
-- steps with tool calls), runs::pause / release.
-- Not mirrored: runs::heartbeat (the lease keeper renews all held leases in one statement every
-- SPOOL_HEARTBEAT_SECS, not per run) and the LISTEN connections; events go to Redis, not here.
--
-- KEEP IN SYNC with those functions: when their SQL or the worker's sequence changes, change this
-- file (and tests/bench/enqueue.sql for statement 1).
--
-- Differences that cannot be avoided in pgbench (see also enqueue.sql):
-- * Ids: UUIDv7-like values computed server-side from one random number (Spool binds
--   Uuid::now_v7() values); values bound as $n in Rust are literals here where pgbench has no
--   string variables (lease owner, lease interval, the final status, content, parts, usage).
-- * The claim takes the oldest claimable run, which may be another client's, as a worker does.
--   Its RETURNING row is kept with \aset (not \gset) because under concurrency it can
--   legitimately return no row: a run visible in its snapshot was taken by a concurrent claim,
--   and a run committed after its snapshot started is invisible to it. \gset would abort the
--   client on that; the worker gets Ok(None) and does nothing, which the \if below reproduces
--   (the run left queued is claimed by a later transaction).
-- * The content, parts and usage written by the finish are exactly what the demo model
--   produces for the input 'Hello!' with the default SPOOL_DEMO_TOKENS=32: its deltas, one text
--   part, {input_tokens: 1 (words of the input), output_tokens: 32}.
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

-- The worker's lease (SPOOL_LEASE_SECS, default 30) and messages::history's depth (the default
-- agent's history_depth, 10). c_attempt stays 0 when the claim finds nothing.
\set history_depth 10
\set c_attempt 0

-- runs::claim($1 worker id, $2 lease, $3 room = 1): every column of the run, plus previous_status
WITH RECURSIVE
 -- Every tenant with a queued run: a loose index scan, one probe per tenant.
 tenants (tenant_id) AS (
     (SELECT tenant_id FROM runs WHERE status = 'queued' ORDER BY tenant_id LIMIT 1)
     UNION ALL
     SELECT (SELECT q.tenant_id FROM runs q
              WHERE q.status = 'queued' AND q.tenant_id > t.tenant_id
              ORDER BY q.tenant_id LIMIT 1)
       FROM tenants t WHERE t.tenant_id IS NOT NULL),
 fair AS (
     SELECT h.id, h.queued_at,
            c.running
            + row_number() OVER (PARTITION BY t.tenant_id ORDER BY h.queued_at) AS turn
       FROM tenants t
       CROSS JOIN LATERAL (SELECT count(*) AS running FROM runs x
                            WHERE x.tenant_id = t.tenant_id AND x.status = 'running') c
       CROSS JOIN LATERAL (SELECT q.id, q.queued_at FROM runs q
                            WHERE q.status = 'queued' AND q.tenant_id = t.tenant_id
                            ORDER BY q.queued_at LIMIT 1 + 16) h
      WHERE t.tenant_id IS NOT NULL
      ORDER BY turn, h.queued_at
      LIMIT 2 * 1 + 32),
 rescue AS (
     SELECT id, queued_at FROM (
         (SELECT id, queued_at, lease_expires_at AS deadline FROM runs
           WHERE status = 'running'
           ORDER BY lease_expires_at LIMIT 1 + 8)
         UNION ALL
         (SELECT id, queued_at, pause_expires_at FROM runs
           WHERE status IN ('awaiting_approval', 'requires_action')
           ORDER BY pause_expires_at LIMIT 1 + 8)) earliest
      WHERE deadline < now()),
 picks AS (
     SELECT id, 0 AS tier, 0::bigint AS turn, queued_at FROM rescue
     UNION ALL
     SELECT id, 1, turn, queued_at FROM fair),
 candidate AS (
     SELECT r.id, r.status AS previous_status
       FROM runs r JOIN picks p ON p.id = r.id
      WHERE CASE r.status
                WHEN 'queued' THEN true
                WHEN 'running' THEN r.lease_expires_at < now()
                WHEN 'awaiting_approval' THEN r.pause_expires_at < now()
                WHEN 'requires_action' THEN r.pause_expires_at < now()
                ELSE false
            END
      ORDER BY p.tier, p.turn, p.queued_at
      LIMIT 1
        FOR UPDATE OF r SKIP LOCKED),
 claimed AS (
     UPDATE runs r
        SET status = 'running',
            attempt = r.attempt + 1,
            reclaims = r.reclaims + (candidate.previous_status = 'running')::int,
            resumed = CASE candidate.previous_status
                          WHEN 'running' THEN false
                          WHEN 'awaiting_approval' THEN true
                          WHEN 'requires_action' THEN true
                          ELSE r.resumed END,
            pending_action = NULL,
            pause_expires_at = NULL,
            lease_owner = 'pgbench',
            lease_expires_at = now() + interval '30 seconds',
            heartbeat_at = now(),
            started_at = coalesce(r.started_at, now()),
            updated_at = now()
       FROM candidate
      WHERE r.id = candidate.id
  RETURNING r.id, r.thread_id, r.tenant_id, r.owner_id, r.agent_id, r.user_message_id,
            r.assistant_message_id, r.status, r.attempt, r.reclaims, r.lease_owner,
            r.lease_expires_at, r.heartbeat_at, r.cancel_requested_at, r.error, r.usage,
            r.trace_context, r.created_at, r.started_at, r.finished_at, r.updated_at,
            r.pending_action, r.pause_expires_at, r.resumed, r.overrides, r.cancel_reason,
            r.cancelled_by, r.queued_at, r.agent_spec, r.quota, r.parent_workflow_id,
            r.parent_tool_call_id, r.depth, candidate.previous_status),
 streaming AS (
     UPDATE messages m
        SET status = 'streaming', updated_at = now()
       FROM claimed c
      WHERE m.id = c.assistant_message_id)
 SELECT * FROM claimed
\aset c_

\if :c_attempt > 0

-- messages::history($1 thread_id, $2 user_message_id, $3 depth)
WITH summary AS (
     SELECT through_seq, content FROM thread_summaries
      WHERE thread_id = :c_thread_id
        AND through_seq < (SELECT seq FROM messages WHERE id = :c_user_message_id)
      ORDER BY through_seq DESC
      LIMIT 1)
SELECT role, content, parts, seq,
       (SELECT through_seq FROM summary) AS summary_through,
       (SELECT content FROM summary) AS summary
  FROM (SELECT role, content, parts, seq FROM messages
         WHERE thread_id = :c_thread_id
           AND seq <= (SELECT seq FROM messages WHERE id = :c_user_message_id)
           AND seq > COALESCE((SELECT through_seq FROM summary), 0)
           AND status = 'completed' AND content <> ''
         ORDER BY seq DESC
         LIMIT :history_depth) recent
 ORDER BY seq;

-- runs::finish($1 id, $2 attempt, $3 'completed', $4 content, $5 parts, $6 usage, $7 error NULL)
WITH finished AS (
     UPDATE runs
        SET status = 'completed', error = NULL, usage = '{"input_tokens":1,"output_tokens":32}'::jsonb,
            finished_at = now(), updated_at = now(), lease_expires_at = NULL,
            final_step = '{"assistant":{"text":"[demo] You said \"Hello!\". This is Spool''s built-in demo model, streaming a deterministic reply so the whole pipeline runs without a provider. This is Spool''s built-in demo model, streaming a deterministic reply so the whole","tool_calls":[]},"results":[],"usage":{"input_tokens":1,"output_tokens":32},"citations":[],"model_call":{"model":"demo","started_at":"2026-11-24T00:00:00Z","ended_at":"2026-11-24T00:00:00Z","finish_reason":"stop"}}'::jsonb
      WHERE id = :c_id AND attempt = :c_attempt AND status = 'running'
  RETURNING assistant_message_id)
 UPDATE messages m
    SET content = '[demo] You said "Hello!". This is Spool''s built-in demo model, streaming a deterministic reply so the whole pipeline runs without a provider. This is Spool''s built-in demo model, streaming a deterministic reply so the whole',
        parts = '[{"text":"[demo] You said \"Hello!\". This is Spool''s built-in demo model, streaming a deterministic reply so the whole pipeline runs without a provider. This is Spool''s built-in demo model, streaming a deterministic reply so the whole","type":"text"}]'::jsonb,
        usage = '{"input_tokens":1,"output_tokens":32}'::jsonb,
        status = 'completed', updated_at = now(), output = NULL, blocked = false
   FROM finished
  WHERE m.id = finished.assistant_message_id
RETURNING m.id;

\endif
