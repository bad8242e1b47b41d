-- DELETE /v1/conversations/{id}/items/{item_id} takes a message out of its conversation: the
-- item lists, the thread's message list and the history later runs replay leave it out, while
-- the run that wrote it keeps it as its response's output (as OpenAI keeps a response whose
-- item was deleted from its conversation). Erasing the thread deletes it with the rest.
-- A nullable column without a default: no rewrite of the table.
ALTER TABLE messages ADD COLUMN IF NOT EXISTS deleted_at timestamptz;
