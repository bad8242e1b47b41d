-- Every pause has a deadline, set from the database clock when the run pauses (so no worker's or
-- API process's clock decides it): an approval nobody answers in time counts as denied, and a
-- client tool whose outputs never come fails the run with `human_timeout`. Each approval of a
-- step gets its own deadline, from the moment it is presented. The claim picks up expired
-- pauses of both kinds by itself.
ALTER TABLE runs RENAME COLUMN approval_expires_at TO pause_expires_at;
DROP INDEX runs_claimable_idx;
CREATE INDEX runs_claimable_idx ON runs (queued_at)
    WHERE status IN ('queued', 'running', 'awaiting_approval', 'requires_action');
