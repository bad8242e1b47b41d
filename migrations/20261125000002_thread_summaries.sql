-- Summaries of a thread's oldest turns, written when a prompt would not fit the agent's
-- `context_window_tokens` (or the provider said it was too long). A run's history starts from
-- the newest summary that covers messages before its own, then the messages after it; a
-- summary is written once and reused by every later run, never recomputed per call.
CREATE TABLE thread_summaries (
    thread_id   uuid        NOT NULL REFERENCES threads (id),
    -- The last message (by `messages.seq`) the summary covers.
    through_seq bigint      NOT NULL,
    content     text        NOT NULL,
    -- The model that wrote it.
    model       text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, through_seq)
);
