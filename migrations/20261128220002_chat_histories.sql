-- Chat Completions clients resend the whole conversation with every request. Without
-- `metadata.thread_id`, the thread a request continues is found by the conversation it resends
-- (api/src/openai/history.rs): each completion records the hash of the conversation it was
-- sent (its messages' roles and texts) for its caller and thread; the next request of that
-- conversation resends those messages plus the answer, and is matched by that hash and by the
-- answer's text on the thread. Rows go with their thread (ON DELETE CASCADE).
CREATE TABLE IF NOT EXISTS chat_histories (
    tenant_id     text NOT NULL,
    owner_id      text NOT NULL,
    -- SHA-256 (hex) of the conversation as sent.
    history_hash  text NOT NULL,
    thread_id     uuid NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, owner_id, history_hash)
);
CREATE INDEX IF NOT EXISTS chat_histories_thread_idx ON chat_histories (thread_id);
