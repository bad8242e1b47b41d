-- pgbench script: the worker's side of the redesigned run lifecycle (issue 44; the review
-- docs "performance-2026-11-27", §3.2-3.3 and §3.10), to measure its SQL ceiling before it is
-- built. It is NOT what Spool runs today: tests/bench/lifecycle.sql is today's twin.
--
-- One pgbench transaction of this script = one cycle of one worker's claim loop in phases 1+2
-- of the redesign, ONE statement (autocommit, synchronous commit):
--   * FINISH_MANY: the runs this client claimed in its previous cycle are finished together,
--     fenced per row (id, attempt, status = 'running'), locked in id order first (the lock
--     order every multi-run writer is to share), each run's assistant message written;
--   * then CLAIM: today's fair claim (runs::claim, shared/src/db/runs/claim.rs) for up to
--     room runs, which marks each assistant message streaming, and returns each claimed
--     run's history and summary in the same statement (a LATERAL join shaped like
--     messages::history, shared/src/db/messages.rs): no separate history read.
-- A run's slot is freed when its finish is durable, which is this statement's commit, so the
-- finishes and the next claim share the statement (Oban Pro's "acks flushed with the next
-- fetch"), and the claim's room counts the slots the batch frees.
--
-- The enqueue is unchanged by phases 1-2 (one statement and one commit per run). Run this
-- script beside tests/bench/enqueue.sql, weighted k to 1, so that each client enqueues k runs
-- per cycle on average: k is the batch, the runs a cycle finishes on average. The claim's room
-- (the variable room) is 2k: the slots the batch frees plus those a short claim left free (16
-- clients claiming at once skip each other's locked rows and come back short; with a room of
-- exactly k the queue grew without end). held_ids and held_attempts, the batch a client holds,
-- start empty:
--
--   pgbench -n -M prepared -c 16 -j 2 -T 10 -D room=8 -D held_ids={} -D held_attempts={} \
--     -f tests/bench/enqueue.sql@4 -f tests/bench/lifecycle_batched.sql@1 <migrated database>
--
-- spool-bench (P5) runs exactly that on a database of its own and counts the runs completed
-- per second (completed rows over pgbench's measured time), beside lifecycle.sql in the same
-- round. Each of the 16 clients stands for a worker whose batches are k runs on average.
--
-- Why k = 4 (spool-bench's choice): the review's conservative end. Today's claims already
-- take 2-3 runs on average under P5's load (894 and 1,712 claims for 3,000 runs), and a
-- completer that takes every finish queued while its previous statement was in flight gets
-- batches of 4-16 under that load; its estimates (§3.7, §3.8) use k = 4 and 8. At k = 4 a run
-- costs 1 + 1/4 statements and synchronous commits (the enqueue, a quarter of a cycle) instead
-- of lifecycle.sql's 4 statements and 3 synchronous commits.
--
-- Differences from the design that pgbench imposes (the statement shapes are the design's):
-- * FINISH_MANY binds ten arrays (one per column written); pgbench can bind only the ids and
--   attempts (as array literals kept with \aset), so the outcome's columns are the same
--   literals for every run: exactly what the demo model writes (see lifecycle.sql).
-- * The claimed rows and their history are returned one row per run as the worker would read
--   them, plus (on every row, the same) the arrays of ids and attempts claimed, which \aset
--   keeps (from the last row) for the next cycle. The first row always exists: a cycle that
--   claims nothing sets empty arrays.
-- * Values Spool binds are literals (lease owner, lease, tenant window, history depth).
-- * The claim's tenant window starts from the first tenant ('' as the previous window's end),
--   as a worker's first claim does; the bench has one tenant.
-- Not modelled: the heartbeat (every 10 s per worker), the LISTEN connections and NOTIFYs, the
-- retry of a batch whose statement fails. Nothing in tests/bench/lifecycle.sql changes.
-- Run it with -M prepared: the design's worker prepares its one statement once per connection.

WITH RECURSIVE
 -- FINISH_MANY: the previous cycle's runs of this client.
 input AS (
     SELECT * FROM unnest(:held_ids::uuid[], :held_attempts::int[]) AS i (id, attempt)),
 -- One lock order for every multi-run writer (the heartbeat must take the same): no deadlocks.
 locked AS (
     SELECT r.id FROM runs r JOIN input i ON i.id = r.id AND i.attempt = r.attempt
      WHERE r.status = 'running'
      ORDER BY r.id
        FOR NO KEY UPDATE OF r),
 finished AS (
     UPDATE runs r
        SET status = 'completed', error = NULL,
            usage = '{"input_tokens":1,"output_tokens":32}'::jsonb,
            finished_at = now(), updated_at = now(), lease_expires_at = NULL,
            final_step = '{"assistant":{"text":"[demo] You said \"Hello!\". This is Spool''s built-in demo model, streaming a deterministic reply so the whole pipeline runs without a provider. This is Spool''s built-in demo model, streaming a deterministic reply so the whole","tool_calls":[]},"results":[],"usage":{"input_tokens":1,"output_tokens":32},"citations":[],"model_call":{"model":"demo","started_at":"2026-11-24T00:00:00Z","ended_at":"2026-11-24T00:00:00Z","finish_reason":"stop"}}'::jsonb
       FROM input i JOIN locked l ON l.id = i.id
      WHERE r.id = i.id AND r.attempt = i.attempt AND r.status = 'running'
  RETURNING r.id, r.assistant_message_id),
 written AS (
     UPDATE messages m
        SET content = '[demo] You said "Hello!". This is Spool''s built-in demo model, streaming a deterministic reply so the whole pipeline runs without a provider. This is Spool''s built-in demo model, streaming a deterministic reply so the whole',
            parts = '[{"text":"[demo] You said \"Hello!\". This is Spool''s built-in demo model, streaming a deterministic reply so the whole pipeline runs without a provider. This is Spool''s built-in demo model, streaming a deterministic reply so the whole","type":"text"}]'::jsonb,
            usage = '{"input_tokens":1,"output_tokens":32}'::jsonb,
            status = 'completed', updated_at = now(), output = NULL, blocked = false
       FROM finished f
      WHERE m.id = f.assistant_message_id
  RETURNING f.id),
 -- CLAIM (runs::claim: $1 'pgbench', $2 30 s, $3 room, $4 '' (from the first
 -- tenant), $5 the window = greatest(room, 64)).
 after_cursor (tenant_id, n) AS (
     (SELECT tenant_id, 1 FROM runs WHERE status = 'queued' AND tenant_id > ''
       ORDER BY tenant_id LIMIT 1)
     UNION ALL
     SELECT (SELECT q.tenant_id FROM runs q
              WHERE q.status = 'queued' AND q.tenant_id > t.tenant_id
              ORDER BY q.tenant_id LIMIT 1), t.n + 1
       FROM after_cursor t WHERE t.tenant_id IS NOT NULL AND t.n < 64),
 from_first (tenant_id, n) AS (
     (SELECT tenant_id, (SELECT count(tenant_id) FROM after_cursor) + 1 FROM runs
       WHERE status = 'queued' AND tenant_id <= ''
         AND (SELECT count(tenant_id) FROM after_cursor) < 64
       ORDER BY tenant_id LIMIT 1)
     UNION ALL
     SELECT (SELECT q.tenant_id FROM runs q
              WHERE q.status = 'queued' AND q.tenant_id > t.tenant_id
                AND q.tenant_id <= ''
              ORDER BY q.tenant_id LIMIT 1), t.n + 1
       FROM from_first t WHERE t.tenant_id IS NOT NULL AND t.n < 64),
 tenants (tenant_id, n) AS (
     SELECT tenant_id, n FROM after_cursor WHERE tenant_id IS NOT NULL
     UNION ALL
     SELECT tenant_id, n FROM from_first WHERE tenant_id IS NOT NULL),
 fair AS (
     SELECT h.id, h.queued_at,
            c.running
            + row_number() OVER (PARTITION BY t.tenant_id ORDER BY h.queued_at) AS turn
       FROM tenants t
       CROSS JOIN LATERAL (SELECT count(*) AS running FROM runs x
                            WHERE x.tenant_id = t.tenant_id AND x.status = 'running') c
       CROSS JOIN LATERAL (SELECT q.id, q.queued_at FROM runs q
                            WHERE q.status = 'queued' AND q.tenant_id = t.tenant_id
                            ORDER BY q.queued_at LIMIT :room::int + 16) h
      WHERE t.tenant_id IS NOT NULL
      ORDER BY turn, h.queued_at
      LIMIT 2 * :room::int + 32),
 rescue AS (
     SELECT id, queued_at FROM (
         (SELECT id, queued_at, lease_expires_at AS deadline FROM runs
           WHERE status = 'running'
           ORDER BY lease_expires_at LIMIT :room::int + 8)
         UNION ALL
         (SELECT id, queued_at, pause_expires_at FROM runs
           WHERE status IN ('awaiting_approval', 'requires_action')
           ORDER BY pause_expires_at LIMIT :room::int + 8)
         UNION ALL
         (SELECT id, queued_at, pause_expires_at FROM runs
           WHERE status = 'waiting' AND pause_expires_at IS NOT NULL
           ORDER BY pause_expires_at LIMIT :room::int + 8)) earliest
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
                WHEN 'waiting' THEN r.pause_expires_at < now()
                ELSE false
            END
      ORDER BY p.tier, p.turn, p.queued_at
      LIMIT :room::int
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
                          WHEN 'waiting' THEN true
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
-- One row per claimed run (its columns, history and summary), or one row of NULLs; each row
-- carries the ids FINISH_MANY wrote and the batch this client now holds.
SELECT c.*, h.history, h.summary_through, h.summary,
       (SELECT coalesce(array_agg(id), '{}') FROM written) AS finished_ids,
       (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM claimed) AS held_ids,
       (SELECT coalesce(array_agg(attempt ORDER BY id), '{}') FROM claimed) AS held_attempts
  FROM (VALUES (true)) AS one (always)
  LEFT JOIN claimed c ON true
  -- The history of a top-level run (the default agent's history_depth, 10, plus one: its
  -- presence says a backlog exists), as messages::history reads it.
  LEFT JOIN LATERAL (
      SELECT (SELECT json_agg(json_build_object('role', m.role, 'content', m.content,
                                                'parts', m.parts, 'seq', m.seq) ORDER BY m.seq)
                FROM (SELECT role, content, parts, seq FROM messages
                       WHERE thread_id = c.thread_id AND seq <= u.seq
                         AND seq > coalesce(s.through_seq, 0)
                         AND status = 'completed' AND content <> '' AND depth = 0
                         AND deleted_at IS NULL
                       ORDER BY seq DESC
                       LIMIT greatest(coalesce((c.agent_spec->>'history_depth')::int, 10), 1)
                             + 1) m)
               AS history,
             s.through_seq AS summary_through, s.content AS summary
        FROM (SELECT seq FROM messages WHERE id = c.user_message_id) u
        LEFT JOIN LATERAL (SELECT through_seq, content FROM thread_summaries
                            WHERE thread_id = c.thread_id AND through_seq < u.seq
                            ORDER BY through_seq DESC LIMIT 1) s ON true
       WHERE c.depth = 0 AND (c.agent_spec IS NOT NULL OR c.agent_id IS NULL)) h ON true
\aset
