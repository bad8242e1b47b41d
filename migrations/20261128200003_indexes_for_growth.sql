-- Indexes for tables that have grown for months (DESIGN section 15: every query a request or a
-- worker makes is index-backed, foreign keys included). `tests/tests/e2e/growth.rs` checks, on a
-- database filled in bulk, that every foreign key has an index led by its columns and that the
-- hot queries' plans read no big table sequentially; `spool-bench p7` measures them.
--
-- Plain `CREATE INDEX`, not `CONCURRENTLY`: sqlx runs this file in one transaction, and several
-- concurrent builds cannot share one (migrations/README.md). Each is `IF NOT EXISTS`, so an
-- operator whose tables are already big builds them concurrently first, under these names, and
-- this migration then finds them and builds nothing (README.md, "Indexes on big tables").

-- The foreign keys `runs.user_message_id` and `runs.assistant_message_id` (to `messages`): every
-- message deleted (erasing a thread) makes Postgres look for runs that still point at it, one
-- query per message and per key. Without these that look was a scan of all of `runs`, 400 of
-- them for a 200-message thread, with the thread's run rows locked meanwhile (review B-H1).
-- No other foreign key lacked an index led by its columns (pg_constraint, checked by the test).
CREATE INDEX IF NOT EXISTS runs_user_message_idx ON runs (user_message_id);
CREATE INDEX IF NOT EXISTS runs_assistant_message_idx ON runs (assistant_message_id);

-- Erasure deletes the thread's idempotency keys by run (`workflow_id IN (...)`): a scan of every
-- key of the last day without this.
CREATE INDEX IF NOT EXISTS idempotency_keys_workflow_idx ON idempotency_keys (workflow_id);

-- List filters (GET /v1/threads?agent_id=, GET /v1/workflows?agent_id=&status=), in the order
-- of the lists (created_at DESC, id DESC), so a sparse filter is a range scan of the tenant's
-- matching rows rather than a walk of all the tenant's rows in order (review B-L1). A user's own
-- list is bounded by that user's rows and uses the owner indexes of the baseline.
-- Partial on `agent_id IS NOT NULL`: the filter is an equality, which implies it, and rows of
-- the default agent (NULL) are left out of the index.
CREATE INDEX IF NOT EXISTS threads_agent_list_idx
    ON threads (tenant_id, agent_id, created_at DESC, id DESC)
    WHERE erased_at IS NULL AND agent_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_agent_list_idx
    ON runs (tenant_id, agent_id, created_at DESC, id DESC)
    WHERE agent_id IS NOT NULL;
-- Not partial: the status filter is `status = ANY($n)`, whose values a generic plan (sqlx
-- prepares its statements, and Postgres plans them generically after five runs) cannot know.
CREATE INDEX IF NOT EXISTS runs_status_list_idx
    ON runs (tenant_id, status, created_at DESC, id DESC);

-- `metadata[key]=value` on thread lists: the filter is written as containment (`metadata @>
-- {key: value}`, shared/src/db/threads.rs), which this index answers; `jsonb_path_ops` holds
-- only what `@>` needs and is a fraction of the default operator class's size.
CREATE INDEX IF NOT EXISTS threads_metadata_idx ON threads USING gin (metadata jsonb_path_ops)
    WHERE erased_at IS NULL;
