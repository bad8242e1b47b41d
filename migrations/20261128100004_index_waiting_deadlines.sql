-- no-transaction
-- The claim's look for runs waiting for their child runs (agents called as tools) past their own
-- time limit (`pause_expires_at`, set by the wait from `limits.timeout_secs`), which it takes back
-- to fail with `timeout` (shared/src/db/runs/claim.rs, `rescue`). Built concurrently: `runs` is
-- large, and a plain build would block its writes.
--
-- Also from this release (no schema change, noted here since the baseline's comment on
-- `runs.quota` says otherwise): a child run carries its root's counters with their concurrency
-- limits as well as their token budgets (shared/src/quota.rs `RunQuota::for_child`): it takes
-- room among the root's active runs, and `db::quota::account` counts it there.
CREATE INDEX CONCURRENTLY IF NOT EXISTS runs_wait_expiry_idx ON runs (pause_expires_at)
    WHERE status = 'waiting' AND pause_expires_at IS NOT NULL;
