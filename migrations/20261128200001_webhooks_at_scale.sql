-- Webhooks delivered at the rate receivers answer, fairly per tenant and per endpoint, with a
-- circuit breaker per endpoint, secret rotation, and an outbox that is purged (issue 37 item 4;
-- review B-H4, B-L14). The statements that use each index are in shared/src/db/webhooks.rs.
--
-- Plain (not concurrent) index builds: the brief for this change asks for one file, and a
-- `CREATE INDEX CONCURRENTLY` needs a file of its own (migrations/README.md). On a deployment
-- whose `webhook_deliveries` is already large, split these into one `-- no-transaction` file each
-- before applying, or the builds block the outbox's writes (run ends) while they run.

-- The endpoint's circuit breaker: consecutive failed tries (any endpoint's delivery; a 2xx
-- resets it), and while `circuit_open_until` is in the future no delivery to it is claimed.
-- Past it, with `consecutive_failures` still at the threshold, one delivery at a time is tried
-- (half-open) until one succeeds.
ALTER TABLE webhooks ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0;
ALTER TABLE webhooks ADD COLUMN circuit_open_until timestamptz;
-- Secret rotation (`POST /v1/webhooks/{id}/rotate-secret`): the secret replaced, which also
-- signs every delivery (a second signature in `webhook-signature`) until it expires.
ALTER TABLE webhooks ADD COLUMN previous_secret text;
ALTER TABLE webhooks ADD COLUMN previous_secret_expires_at timestamptz;

-- The claim's loose scan over endpoints with pending deliveries, and each endpoint's due ones
-- in order.
CREATE INDEX webhook_deliveries_endpoint_due_idx ON webhook_deliveries (webhook_id, next_attempt_at)
    WHERE delivered_at IS NULL AND abandoned_at IS NULL;
-- Deliveries in flight (leased), counted per tenant and per endpoint by the claim.
CREATE INDEX webhook_deliveries_in_flight_idx
    ON webhook_deliveries (tenant_id, webhook_id, lease_expires_at)
    WHERE delivered_at IS NULL AND abandoned_at IS NULL AND lease_expires_at IS NOT NULL;
-- Housekeeping: delivered and abandoned rows past retention (SPOOL_RETENTION_WEBHOOKS_DAYS),
-- oldest first; and pending rows past the 24 h retry window (held by an open circuit), which
-- it marks abandoned.
CREATE INDEX webhook_deliveries_finished_idx ON webhook_deliveries (created_at)
    WHERE delivered_at IS NOT NULL OR abandoned_at IS NOT NULL;
CREATE INDEX webhook_deliveries_pending_age_idx ON webhook_deliveries (created_at)
    WHERE delivered_at IS NULL AND abandoned_at IS NULL;
