-- Tools as resources (DESIGN section 12, docs/tools.md): a tenant's HTTP, MCP, client and agent
-- tools, stored once and referenced by agents (`tool_ids` in `agents.spec`). A run snapshots the
-- tools its agent references at enqueue, so changing or disabling one never changes a run
-- already enqueued.
CREATE TABLE tools (
    id          uuid PRIMARY KEY,
    tenant_id   text NOT NULL,
    -- The name the model sees (for MCP: the prefix of its tools), unique per tenant.
    name        text NOT NULL,
    -- The tool as posted (`{type, name, ..., enabled}`), header values included: every read
    -- redacts them.
    spec        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Names are unique per tenant (409 `name_taken`).
CREATE UNIQUE INDEX tools_tenant_name_idx ON tools (tenant_id, name);

-- `GET /v1/tools`: a tenant's tools, newest first.
CREATE INDEX tools_tenant_list_idx ON tools (tenant_id, created_at DESC, id DESC);

-- Which agents reference a tool (`spec->'tool_ids' @> '[{"tool_id": ...}]'`): the refusal of
-- a DELETE of a tool in use (409 `tool_in_use`) and the collision check of a tool's change.
CREATE INDEX agents_tool_ids_idx ON agents USING gin ((spec -> 'tool_ids') jsonb_path_ops);
