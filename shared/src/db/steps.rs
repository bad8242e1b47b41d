//! Checkpoints: the completed steps of a run, each saved before the next model call.

use serde_json::Value;
use sqlx::PgExecutor;
use sqlx::types::Json;

use crate::ids::WorkflowId;

/// A saved step.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Step {
    /// Its number (1-based).
    pub step: i32,
    /// Model output, tool calls and results, usage, citations.
    pub data: Json<Value>,
}

/// The run's saved steps, in order.
pub async fn load(
    executor: impl PgExecutor<'_>,
    workflow_id: WorkflowId,
) -> sqlx::Result<Vec<Step>> {
    sqlx::query_as("SELECT step, data FROM run_steps WHERE workflow_id = $1 ORDER BY step")
        .bind(workflow_id)
        .fetch_all(executor)
        .await
}

/// Saves a step, fenced on the attempt: `false` (nothing saved) if this attempt no longer holds
/// the run. A step is saved twice: with its tool calls (before they run), then with their
/// results; the second save replaces the first. The run row is locked `FOR SHARE`, so a
/// concurrent reclaim either happens before (and the write sees the new attempt) or waits.
pub async fn save(
    executor: impl PgExecutor<'_>,
    workflow_id: WorkflowId,
    attempt: i32,
    step: i32,
    data: &Value,
) -> sqlx::Result<bool> {
    let saved: Option<(i32,)> = sqlx::query_as(
        "WITH held AS (
             SELECT id FROM runs WHERE id = $1 AND attempt = $2 AND status = 'running' FOR SHARE)
         INSERT INTO run_steps (workflow_id, step, attempt, data)
         SELECT held.id, $3, $2, $4 FROM held
         ON CONFLICT (workflow_id, step)
         DO UPDATE SET data = EXCLUDED.data, attempt = EXCLUDED.attempt
         RETURNING step",
    )
    .bind(workflow_id)
    .bind(attempt)
    .bind(step)
    .bind(Json(data))
    .fetch_optional(executor)
    .await?;
    Ok(saved.is_some())
}

/// The run's last saved step, locked for an update.
pub async fn last_for_update(
    executor: impl PgExecutor<'_>,
    workflow_id: WorkflowId,
) -> sqlx::Result<Option<Step>> {
    sqlx::query_as(
        "SELECT step, data FROM run_steps WHERE workflow_id = $1
          ORDER BY step DESC LIMIT 1 FOR UPDATE",
    )
    .bind(workflow_id)
    .fetch_optional(executor)
    .await
}

/// Replaces a step's data without a fence: for the API answering a pause, which holds the
/// run row's lock instead.
pub async fn replace(
    executor: impl PgExecutor<'_>,
    workflow_id: WorkflowId,
    step: i32,
    data: &Value,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE run_steps SET data = $3 WHERE workflow_id = $1 AND step = $2")
        .bind(workflow_id)
        .bind(step)
        .bind(Json(data))
        .execute(executor)
        .await?;
    Ok(())
}
