-- Usage (GET /v1/usage, DESIGN §8): tokens and runs of the runs that ended in a window, by
-- user, agent or model, read from the runs (and, by model, from their steps).
CREATE INDEX runs_tenant_finished_idx ON runs (tenant_id, finished_at)
    WHERE finished_at IS NOT NULL;
