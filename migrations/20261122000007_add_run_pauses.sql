-- Durable pauses. A run that waits for client tool outputs (requires_action) or a person's
-- approval (awaiting_approval) holds no worker and no lease; what it waits for is stored here.
ALTER TABLE runs
    -- {type: "submit_tool_outputs", tool_calls: [...]} or
    -- {type: "approval", tool_call_id, tool_name, arguments, expires_at}.
    ADD COLUMN pending_action jsonb,
    -- When an unanswered approval counts as denied; the claim picks such runs up by itself.
    ADD COLUMN approval_expires_at timestamptz,
    -- Set when a pause is answered: the next attempt continues, it does not restart.
    ADD COLUMN resumed boolean NOT NULL DEFAULT false,
    -- Overrides given with tool outputs: {tool_choice, active_tools} for the next step,
    -- step_rules for later steps.
    ADD COLUMN overrides jsonb;

-- The claim also scans paused runs whose approval has expired.
DROP INDEX runs_claimable_idx;
CREATE INDEX runs_claimable_idx ON runs (queued_at)
    WHERE status IN ('queued', 'running', 'awaiting_approval');
