#!/usr/bin/env bash
# The control plane's lists at scale (BENCHMARKS.md, "Lists"): 1,000,000 runs and 2,000,000
# messages on 100,000 threads of 10,000 users (20,000 of them queued), then EXPLAIN (ANALYZE, BUFFERS) of one page of
# GET /v1/threads and GET /v1/workflows as the API issues them (the statements mirror
# shared/src/db/threads.rs `list` and shared/src/db/runs.rs `list`; keep them in step).
# Usage: tests/bench/lists.sh [database name]   (Postgres as for the tests; about 5 minutes on
# 2 cores, most of it loading; with SPOOL_BENCH_REUSE=1 an earlier load is reused)
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
db="${1:-spool_bench_lists}"
base="${SPOOL_BENCH_PG:-postgres://root@127.0.0.1:5432}"
q() { psql "$base/$db" -qAt "$@"; }
if [ "${SPOOL_BENCH_REUSE:-}" != 1 ]; then
psql "$base/postgres" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
DATABASE_URL="$base/$db" cargo run -q -p spool-api -- migrate >/dev/null
  echo "loading 100,000 threads, 2,000,000 messages, 1,000,000 runs..."
time q <<'SQL'
SET synchronous_commit = off;
INSERT INTO threads (id, tenant_id, owner_id, metadata, created_at, updated_at)
SELECT md5('t' || n)::uuid, 'acme', 'user-' || (n % 10000), jsonb_build_object('n', n % 7),
       now() - make_interval(secs => 100000 - n), now()
  FROM generate_series(1, 100000) n;
INSERT INTO messages (id, thread_id, role, content, status, workflow_id, created_at)
SELECT md5('m' || r || role)::uuid, t.id, role, 'x', 'completed', md5('r' || r)::uuid,
       t.created_at + make_interval(secs => r % 10)
  FROM (SELECT t.id, t.created_at, row_number() OVER (ORDER BY t.id) AS tn FROM threads t) t,
       generate_series(0, 9) k, LATERAL (SELECT (t.tn - 1) * 10 + k AS r) rr,
       unnest(ARRAY['user', 'assistant']) role;
INSERT INTO runs (id, thread_id, tenant_id, owner_id, user_message_id, assistant_message_id,
                  status, attempt, created_at, queued_at, finished_at)
SELECT md5('r' || r)::uuid, t.id, t.tenant_id, t.owner_id, md5('m' || r || 'user')::uuid,
       md5('m' || r || 'assistant')::uuid,
       (ARRAY['completed', 'completed', 'completed', 'failed', 'cancelled'])[1 + r % 5], 1,
       t.created_at + make_interval(secs => r % 10), t.created_at, t.created_at
  FROM (SELECT t.*, row_number() OVER (ORDER BY t.id) AS tn FROM threads t) t,
       generate_series(0, 9) k, LATERAL (SELECT (t.tn - 1) * 10 + k AS r) rr;
-- A backlog: 20,000 threads with a queued run (the busy ones), none of them user-42's.
UPDATE runs SET status = 'queued', finished_at = NULL
 WHERE id IN (SELECT DISTINCT ON (thread_id) id FROM runs WHERE owner_id <> 'user-42'
               ORDER BY thread_id LIMIT 20000);
VACUUM ANALYZE threads; VACUUM ANALYZE runs; VACUUM ANALYZE messages;
SQL
fi
q -c "SELECT count(*) || ' runs, ' || count(DISTINCT owner_id) || ' users' FROM runs"

explain() { # title, statement
  echo; echo "== $1"; q -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) $2"
}
threads="SELECT * FROM (SELECT t.id, t.agent_id, t.metadata, t.title, t.last_message_at,
    t.created_at, t.updated_at,
    (SELECT r.id FROM runs r WHERE r.thread_id = t.id
        AND r.status IN ('queued', 'running', 'requires_action', 'awaiting_approval')
    ) AS active_workflow_id
  FROM threads t WHERE t.erased_at IS NULL AND t.tenant_id = 'acme' AND t.owner_id = 'user-42'"
runs="SELECT r.id, r.thread_id, r.tenant_id, r.owner_id, r.agent_id, r.user_message_id,
    r.assistant_message_id, r.status, r.attempt, r.reclaims, r.lease_owner, r.lease_expires_at,
    r.heartbeat_at, r.cancel_requested_at, r.error, r.usage, r.trace_context, r.created_at,
    r.started_at, r.finished_at, r.updated_at, r.pending_action, r.pause_expires_at,
    r.resumed, r.overrides, r.cancel_reason, r.cancelled_by, r.queued_at, r.agent_spec
  FROM runs r WHERE true AND r.tenant_id = 'acme'"
# The third page's cursor, as a client would hold it (a literal, not a subquery).
cursor="'$(q -c "SELECT created_at FROM runs WHERE tenant_id = 'acme' AND owner_id = 'user-42'
  ORDER BY created_at DESC, id DESC LIMIT 1 OFFSET 40")'::timestamptz"
thread="'$(q -c "SELECT id FROM threads WHERE tenant_id = 'acme' AND owner_id = 'user-42' LIMIT 1")'::uuid"
explain "GET /v1/threads?limit=20 (a user's first page)" \
  "$threads ORDER BY t.created_at DESC, t.id DESC LIMIT 21) t"
explain "GET /v1/threads?status=busy&limit=20 (the status filter wraps the scan)" \
  "$threads) t WHERE (t.active_workflow_id IS NOT NULL) = true ORDER BY t.created_at DESC, t.id DESC LIMIT 21"
explain "GET /v1/workflows?limit=20 (a user's first page)" \
  "$runs AND r.owner_id = 'user-42' ORDER BY r.created_at DESC, r.id DESC LIMIT 21"
explain "GET /v1/workflows?status=failed&limit=20&cursor=... (a later page)" \
  "$runs AND r.owner_id = 'user-42' AND r.status = ANY('{failed}')
   AND (r.created_at, r.id) < ($cursor, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
   ORDER BY r.created_at DESC, r.id DESC LIMIT 21"
explain "GET /v1/workflows?limit=20 (an admin: the tenant's million)" \
  "$runs ORDER BY r.created_at DESC, r.id DESC LIMIT 21"
explain "GET /v1/workflows?thread_id=...&limit=20" \
  "$runs AND r.owner_id = 'user-42' AND r.thread_id = $thread
   ORDER BY r.created_at DESC, r.id DESC LIMIT 21"
