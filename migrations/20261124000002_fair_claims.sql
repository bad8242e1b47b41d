-- Fair claiming (DESIGN §8): the claim walks the tenants that have queued runs (a loose index
-- scan over `runs_queued_tenant_idx`), takes each one's oldest, and prefers the tenant with the
-- fewest running runs (counted on `runs_running_tenant_idx`, at most the workers' concurrency
-- rows per tenant). One tenant's backlog of 10,000 runs no longer starves another's single run.
CREATE INDEX runs_queued_tenant_idx ON runs (tenant_id, queued_at) WHERE status = 'queued';
CREATE INDEX runs_running_tenant_idx ON runs (tenant_id) WHERE status = 'running';
-- The claim's first look: expired leases and expired pauses, each by its own deadline, without
-- walking the queue.
CREATE INDEX runs_lease_expiry_idx ON runs (lease_expires_at) WHERE status = 'running';
CREATE INDEX runs_pause_expiry_idx ON runs (pause_expires_at)
    WHERE status IN ('awaiting_approval', 'requires_action');
