-- Model providers as resources (DESIGN section 12, docs/providers.md): a tenant's own OpenAI or
-- Anthropic endpoint and key ("bring your own key"). An agent's `provider` names one of these
-- first, then one of the operator's (`SPOOL_PROVIDERS`); a run snapshots the provider's id at
-- enqueue (never its key) and the worker reads the row when it calls the model.
CREATE TABLE providers (
    id              uuid PRIMARY KEY,
    tenant_id       text NOT NULL,
    -- The name agents use in `provider`, unique per tenant.
    name            text NOT NULL,
    -- Everything but the key, as posted: `{name, kind, base_url, default_model?, models?,
    -- prices?}`.
    spec            jsonb NOT NULL,
    -- The API key, sealed with the operator's SPOOL_SECRETS_KEY (AES-256-GCM, the 16-byte tag
    -- appended), bound to the tenant and this id; never stored or shown in clear.
    api_key_ciphertext  bytea NOT NULL,
    -- Its 12-byte nonce, fresh for every write.
    api_key_nonce       bytea NOT NULL,
    -- The fingerprint of the key that sealed it: after a rotation the former key stays in
    -- SPOOL_SECRETS_KEYS_RETIRED until every row is sealed with the new one.
    api_key_version     text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Names are unique per tenant (409 `name_taken`); also the lookup of an agent's `provider`.
CREATE UNIQUE INDEX providers_tenant_name_idx ON providers (tenant_id, name);

-- `GET /v1/providers`: a tenant's providers, newest first.
CREATE INDEX providers_tenant_list_idx ON providers (tenant_id, created_at DESC, id DESC);
