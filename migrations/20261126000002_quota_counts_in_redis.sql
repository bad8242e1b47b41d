-- Admission moves to Redis (shared/src/quota/admission.rs): a run takes room in its counters
-- there, in one script, before its enqueue statement. In Postgres every enqueue under a quota
-- updated counter rows that all of a tenant's enqueues share (and every run's end updated them
-- again); whatever the layout (one row per counter, 8 or 32 shards, a trigger deferred to
-- COMMIT), those updates cost the enqueue about a quarter of its throughput with every quota
-- set (BENCHMARKS.md). Postgres stays the truth Redis's counters are made from: `runs.quota`
-- names the counters each run was admitted under, and `quota_counters` keeps the day's tokens.
DROP TRIGGER runs_quota_admit ON runs;
DROP TRIGGER runs_quota_release ON runs;
DROP TRIGGER runs_quota_release_deleted ON runs;
DROP FUNCTION spool_quota_admit();
DROP FUNCTION spool_quota_release();
DROP FUNCTION spool_quota_take(text, text, text, bigint, bigint);
DROP FUNCTION spool_quota_cap(bigint, smallint, smallint);
DROP TABLE quota_slots;
