-- Knowledge bases (DESIGN section 12, docs/tools.md): a tenant's retrieval endpoints, which the
-- built-in `knowledge_search` tool asks for chunks. Read at each call (not snapshot with a run):
-- a knowledge base is data a run looks up, like the web.
CREATE TABLE knowledge_bases (
    id          uuid PRIMARY KEY,
    tenant_id   text NOT NULL,
    -- Unique per tenant (409 `name_taken`); what `knowledge_search` takes to search one.
    name        text NOT NULL,
    url         text NOT NULL,
    -- Sent with every search; write-only (every read shows `"<redacted>"`).
    headers     jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX knowledge_bases_tenant_name_idx ON knowledge_bases (tenant_id, name);

-- `GET /v1/knowledge_bases`, and a search's read of the tenant's (bounded) set: newest first.
CREATE INDEX knowledge_bases_tenant_list_idx ON knowledge_bases (tenant_id, created_at DESC, id DESC);
