-- What a `POST /v1/responses` asked for that its response object shows (`background`,
-- `instructions`, `previous_response_id`, `text`, ...), so the object is true to its request.
-- One row per response (its run), erased with the run.
CREATE TABLE openai_response_requests (
    workflow_id uuid PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    request     jsonb NOT NULL
);
