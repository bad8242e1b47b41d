//! Messages. An assistant message is inserted with its run (status `queued`) and written once
//! more when the run ends, by a statement fenced on the run's attempt.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgExecutor;
use sqlx::types::Json;

use crate::ids::{MessageId, ThreadId, WorkflowId};
use crate::run::{MessagePart, Usage};
use crate::status::{MessageStatus, Role};

/// A message as stored.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Message {
    /// The message's id.
    pub id: MessageId,
    /// Its thread.
    pub thread_id: ThreadId,
    /// Who wrote it.
    pub role: Role,
    /// Its text.
    pub content: String,
    /// Structured content: text blocks, tool steps, citations.
    pub parts: Json<Vec<MessagePart>>,
    /// Whether the content is final.
    pub status: MessageStatus,
    /// Token usage (assistant messages).
    pub usage: Option<Json<Usage>>,
    /// Caller-defined metadata (user messages).
    pub metadata: Json<Value>,
    /// The run that produced it (assistant) or that it started (user).
    pub workflow_id: Option<WorkflowId>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// The answer as JSON valid against its agent's `response_format` (assistant messages of
    /// agents that have one, once their run has completed).
    pub output: Option<Json<Value>>,
    /// Whether a `pre_response` hook denied the answer (the content is then the hook's text).
    pub blocked: bool,
}

macro_rules! columns {
    () => {
        "id, thread_id, role, content, parts, status, usage, metadata, workflow_id, created_at, \
         updated_at, output, blocked"
    };
}

/// Inserts a completed message that no run wrote or answered: an earlier turn of a
/// conversation the client kept.
pub async fn insert_turn(
    executor: impl PgExecutor<'_>,
    id: MessageId,
    thread_id: ThreadId,
    role: Role,
    content: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO messages (id, thread_id, role, content, status, metadata)
         VALUES ($1, $2, $3, $4, 'completed', '{}')",
    )
    .bind(id)
    .bind(thread_id)
    .bind(role)
    .bind(content)
    .execute(executor)
    .await?;
    Ok(())
}

/// Up to `limit` messages of the thread, oldest first; with `before`, those older than it.
/// The caller has checked that the thread is the owner's.
pub async fn list(
    executor: impl PgExecutor<'_>,
    thread_id: ThreadId,
    limit: i64,
    before: Option<MessageId>,
) -> sqlx::Result<Vec<Message>> {
    const SQL: &str = concat!(
        "SELECT ",
        columns!(),
        " FROM (
             SELECT * FROM messages
              WHERE thread_id = $1 AND depth = 0 AND deleted_at IS NULL
                AND ($3::uuid IS NULL
                     OR seq < (SELECT seq FROM messages WHERE id = $3 AND thread_id = $1))
              ORDER BY seq DESC
              LIMIT $2) newest
          ORDER BY seq ASC"
    );
    sqlx::query_as(SQL)
        .bind(thread_id)
        .bind(limit)
        .bind(before)
        .fetch_all(executor)
        .await
}

/// Up to `limit` top-level messages of the thread after the message `after` (in the order
/// given: oldest first when `ascending`, else newest first), in that order. The caller has
/// checked that the thread is the owner's.
pub async fn page(
    executor: impl PgExecutor<'_>,
    thread_id: ThreadId,
    limit: i64,
    after: Option<MessageId>,
    ascending: bool,
) -> sqlx::Result<Vec<Message>> {
    const ASC: &str = concat!(
        "SELECT ",
        columns!(),
        " FROM messages
          WHERE thread_id = $1 AND depth = 0 AND deleted_at IS NULL
            AND ($3::uuid IS NULL
                 OR seq > (SELECT seq FROM messages WHERE id = $3 AND thread_id = $1))
          ORDER BY seq ASC
          LIMIT $2"
    );
    const DESC: &str = concat!(
        "SELECT ",
        columns!(),
        " FROM messages
          WHERE thread_id = $1 AND depth = 0 AND deleted_at IS NULL
            AND ($3::uuid IS NULL
                 OR seq < (SELECT seq FROM messages WHERE id = $3 AND thread_id = $1))
          ORDER BY seq DESC
          LIMIT $2"
    );
    sqlx::query_as(if ascending { ASC } else { DESC })
        .bind(thread_id)
        .bind(limit)
        .bind(after)
        .fetch_all(executor)
        .await
}

/// One message by id within a thread.
pub async fn find_in_thread(
    executor: impl PgExecutor<'_>,
    id: MessageId,
    thread_id: ThreadId,
) -> sqlx::Result<Option<Message>> {
    sqlx::query_as(concat!(
        "SELECT ",
        columns!(),
        " FROM messages WHERE id = $1 AND thread_id = $2"
    ))
    .bind(id)
    .bind(thread_id)
    .fetch_optional(executor)
    .await
}

/// A top-level message of a thread that is not deleted from it ([`delete_item`]).
pub async fn find_item(
    executor: impl PgExecutor<'_>,
    id: MessageId,
    thread_id: ThreadId,
) -> sqlx::Result<Option<Message>> {
    sqlx::query_as(concat!(
        "SELECT ",
        columns!(),
        " FROM messages
          WHERE id = $1 AND thread_id = $2 AND depth = 0 AND deleted_at IS NULL"
    ))
    .bind(id)
    .bind(thread_id)
    .fetch_optional(executor)
    .await
}

/// Takes a top-level message out of its thread: listings and the history later runs replay
/// leave it out; the run that wrote it still reads it ([`find_in_thread`]). Returns whether
/// it was there.
pub async fn delete_item(
    executor: impl PgExecutor<'_>,
    id: MessageId,
    thread_id: ThreadId,
) -> sqlx::Result<bool> {
    let result = sqlx::query(
        "UPDATE messages SET deleted_at = now(), updated_at = now()
          WHERE id = $1 AND thread_id = $2 AND depth = 0 AND deleted_at IS NULL",
    )
    .bind(id)
    .bind(thread_id)
    .execute(executor)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// What a run's prompt replays: the newest summary of the thread that covers only messages
/// before `user_message_id`, and the last `depth` completed messages after it, up to that
/// message, oldest first; and whether older messages than those follow the summary (the
/// backlog a new summary is to cover, [`backlog`]). One statement: it runs at every run's start.
pub async fn history(
    executor: impl PgExecutor<'_>,
    thread_id: ThreadId,
    user_message_id: MessageId,
    depth: i64,
) -> sqlx::Result<(Vec<HistoryMessage>, Option<Summary>, bool)> {
    let depth = depth.max(1);
    let rows: Vec<HistoryRow> = sqlx::query_as(
        "WITH summary AS (
             SELECT through_seq, content FROM thread_summaries
              WHERE thread_id = $1
                AND through_seq < (SELECT seq FROM messages WHERE id = $2)
              ORDER BY through_seq DESC
              LIMIT 1)
         SELECT role, content, parts, seq,
                (SELECT through_seq FROM summary) AS summary_through,
                (SELECT content FROM summary) AS summary
           FROM (SELECT role, content, parts, seq FROM messages
                  WHERE thread_id = $1
                    AND seq <= (SELECT seq FROM messages WHERE id = $2)
                    AND seq > COALESCE((SELECT through_seq FROM summary), 0)
                    AND status = 'completed' AND content <> '' AND depth = 0
                    AND deleted_at IS NULL
                  ORDER BY seq DESC
                  LIMIT $3) recent
          ORDER BY seq",
    )
    .bind(thread_id)
    .bind(user_message_id)
    // One more than the window: its presence says a backlog exists.
    .bind(depth + 1)
    .fetch_all(executor)
    .await?;
    let summary = rows.first().and_then(|row| {
        Some(Summary {
            through_seq: row.summary_through?,
            content: row.summary.clone()?,
        })
    });
    let mut messages = rows
        .into_iter()
        .map(|row| HistoryMessage {
            role: row.role,
            content: row.content,
            parts: row.parts,
            seq: row.seq,
        })
        .collect::<Vec<_>>();
    let extra = messages
        .len()
        .saturating_sub(usize::try_from(depth).unwrap_or(usize::MAX));
    let messages = messages.split_off(extra);
    Ok((messages, summary, extra > 0))
}

/// The thread's completed messages after `after_seq` and before `before_seq` (the backlog
/// between a summary and the replayed window), oldest first, at most `limit`.
pub async fn backlog(
    executor: impl PgExecutor<'_>,
    thread_id: ThreadId,
    after_seq: i64,
    before_seq: i64,
    limit: i64,
) -> sqlx::Result<Vec<HistoryMessage>> {
    let rows: Vec<(Role, String, Json<Vec<MessagePart>>, i64)> = sqlx::query_as(
        "SELECT role, content, parts, seq FROM messages
          WHERE thread_id = $1 AND seq > $2 AND seq < $3
            AND status = 'completed' AND content <> '' AND depth = 0
            AND deleted_at IS NULL
          ORDER BY seq
          LIMIT $4",
    )
    .bind(thread_id)
    .bind(after_seq)
    .bind(before_seq)
    .bind(limit)
    .fetch_all(executor)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(role, content, parts, seq)| HistoryMessage {
            role,
            content,
            parts,
            seq,
        })
        .collect())
}

/// A row of [`history`]: a message, and the summary beside every row.
#[derive(sqlx::FromRow)]
struct HistoryRow {
    role: Role,
    content: String,
    parts: Json<Vec<MessagePart>>,
    seq: i64,
    summary_through: Option<i64>,
    summary: Option<String>,
}

/// A message as a run's prompt replays it.
#[derive(Clone, Debug)]
pub struct HistoryMessage {
    /// Who wrote it.
    pub role: Role,
    /// Its text.
    pub content: String,
    /// Its parts (an assistant's tool calls and results among them).
    pub parts: Json<Vec<MessagePart>>,
    /// Its place in the thread.
    pub seq: i64,
}

/// A summary of a thread's messages up to `through_seq`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The last message it covers.
    pub through_seq: i64,
    /// The summary.
    pub content: String,
}

/// Stores a summary of the thread's messages through `through_seq`, written by attempt
/// `attempt` of run `run` (on the run's thread), fenced like the run's own writes: only while
/// that attempt still holds the run. Erasing the thread deletes its runs, so a summary
/// computed while the thread was being erased is not stored after it (the run's row is locked
/// `FOR SHARE` here: an erasure that deletes it waits for this statement's commit and then
/// deletes the summary with the thread's others). A concurrent writer of the same summary wins;
/// either is a summary of the same messages. Returns whether the attempt held the run.
pub async fn save_summary(
    executor: impl PgExecutor<'_>,
    run: WorkflowId,
    attempt: i32,
    through_seq: i64,
    content: &str,
    model: &str,
) -> sqlx::Result<bool> {
    let (held,): (bool,) = sqlx::query_as(
        "WITH held AS (
             SELECT thread_id FROM runs
              WHERE id = $1 AND attempt = $2 AND status = 'running' FOR SHARE),
         saved AS (
             INSERT INTO thread_summaries (thread_id, through_seq, content, model)
             SELECT thread_id, $3, $4, $5 FROM held
             ON CONFLICT (thread_id, through_seq) DO NOTHING)
         SELECT EXISTS (SELECT 1 FROM held)",
    )
    .bind(run)
    .bind(attempt)
    .bind(through_seq)
    .bind(super::storable_text(content))
    .bind(model)
    .fetch_one(executor)
    .await?;
    Ok(held)
}
