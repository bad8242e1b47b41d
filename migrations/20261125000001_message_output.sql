-- Structured output and blocked answers on assistant messages: `output` holds the final answer
-- parsed as JSON when the agent has a `response_format` (it validated against the schema);
-- `blocked` is set when a `pre_response` hook denied the answer and its text replaced it.
ALTER TABLE messages
    ADD COLUMN output jsonb,
    ADD COLUMN blocked boolean NOT NULL DEFAULT false;
