-- The model's text of each saved step, as a column of its own: a run cancelled while no worker
-- holds it gets the text of its steps as its partial message, without reading inside `data`.
-- `data` holds the `SavedStep` type of `shared/src/db/steps.rs` (the model's text and tool
-- calls, one result with its state per call, usage, citations); only that type reads it.
ALTER TABLE run_steps ADD COLUMN text text NOT NULL DEFAULT '';
UPDATE run_steps SET text = coalesce(data->'assistant'->>'text', '');
