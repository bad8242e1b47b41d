-- API keys for servers (DESIGN section 13, docs/security.md "API keys"): a tenant's long-lived
-- bearer credentials, `spk_` and 43 characters of base64url. Only the SHA-256 of a key is kept,
-- so the table cannot be replayed; the key itself is shown once, in the answer that creates it.
-- A key acts as the user `apikey:<id>` of its tenant, with exactly its `permissions`.
--
-- Every API process reads the row on every request made with the key (no cache), so a revoked
-- key is refused by all of them from the moment the revocation commits. A revoked key keeps its
-- row (`revoked_at`) so that it is refused with its own code, `api_key_revoked`.
CREATE TABLE api_keys (
    id            uuid PRIMARY KEY,
    tenant_id     text NOT NULL,
    name          text NOT NULL,
    -- Permission names (api/src/auth/permission.rs), each one its creator held.
    permissions   text[] NOT NULL,
    -- SHA-256 of the whole key (`spk_...`): the authentication's lookup.
    key_hash      bytea NOT NULL,
    -- The user (`sub`) whose token created it.
    created_by    text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- Updated at most once a minute per key, by the request that uses it.
    last_used_at  timestamptz,
    revoked_at    timestamptz
);

CREATE UNIQUE INDEX api_keys_hash_idx ON api_keys (key_hash);

-- `GET /v1/api_keys`: a tenant's keys not revoked, newest first.
CREATE INDEX api_keys_tenant_list_idx ON api_keys (tenant_id, created_at DESC, id DESC)
    WHERE revoked_at IS NULL;
