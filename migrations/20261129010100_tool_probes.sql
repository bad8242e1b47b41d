-- MCP servers as tool resources (DESIGN section 12): the result of the last probe of a tool of
-- type `mcp` (initialize + `tools/list` through the network policy). NULL for other kinds.
-- A probe's result is written only if the tool has not changed since the probe began
-- (`updated_at` unchanged), so a slow probe of an old URL never overwrites a newer one's.
ALTER TABLE tools
    -- `pending` (a probe is due or running), `healthy` or `unhealthy`.
    ADD COLUMN probe_status     text CHECK (probe_status IN ('pending', 'healthy', 'unhealthy')),
    ADD COLUMN last_probed_at   timestamptz,
    -- Why the last probe failed (never a secret or the server's URL); NULL when it succeeded.
    ADD COLUMN probe_error      text,
    -- The names of the tools the server listed at the last successful probe.
    ADD COLUMN discovered_tools jsonb;
