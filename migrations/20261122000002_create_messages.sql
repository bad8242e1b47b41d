-- User and assistant messages. The assistant message of a run is inserted (status `queued`) in the
-- same transaction as its run, so the id clients stream is known at once and the final content is
-- written exactly once, by an UPDATE fenced on the run's attempt.
CREATE TABLE messages (
    id           uuid PRIMARY KEY,
    thread_id    uuid NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    -- Insertion order within the thread; timestamps can tie.
    seq          bigint GENERATED ALWAYS AS IDENTITY,
    role         text NOT NULL CHECK (role IN ('user', 'assistant')),
    content      text NOT NULL DEFAULT '',
    -- Structured content: text blocks, tool steps, citations (assistant messages).
    parts        jsonb NOT NULL DEFAULT '[]'::jsonb,
    status       text NOT NULL CHECK (status IN ('queued', 'streaming', 'completed', 'failed', 'cancelled')),
    -- Token usage summed over the model calls that produced the message.
    usage        jsonb,
    metadata     jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- The run that produced (assistant) or was started by (user) this message.
    workflow_id  uuid,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX messages_thread_seq_idx ON messages (thread_id, seq);
