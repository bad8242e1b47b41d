//! The Conversations API: `POST /v1/conversations`, `GET`/`POST`/`DELETE
//! /v1/conversations/{id}`, `GET`/`POST /v1/conversations/{id}/items`, `GET`/`DELETE
//! /v1/conversations/{id}/items/{item_id}`, mapped onto threads.
//!
//! A conversation is a thread: its id is `conv_` and the thread id's 32 hex digits, and the
//! bare thread id is accepted wherever a conversation is named (here, and as a response's
//! `conversation`). Its `metadata` is the thread's; its items are the thread's top-level
//! messages, as `message` items (`msg_` and the message id's hex). Adding items stores them as
//! completed turns and starts no run (a conversation with a run in progress refuses them: 409
//! `thread_busy`); deleting an item takes its message out of the thread (later runs no longer
//! replay it; the run that wrote it keeps it as its response's output); deleting a
//! conversation erases the thread as `DELETE /v1/threads/{id}` does.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use spool_shared::db::messages::{self, Message};
use spool_shared::db::threads::{self, Thread, ThreadPatch};
use spool_shared::status::{MessageStatus, Role};
use spool_shared::{MessageId, ThreadId};

use crate::app::AppState;
use crate::auth::{Caller, Permission};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::openai::responses::turns;
use crate::runs::erase::erase_thread;
use utoipa_axum::{router::OpenApiRouter, routes};

/// `/v1/conversations...`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_conversation))
        .routes(routes!(
            get_conversation,
            update_conversation,
            delete_conversation
        ))
        .routes(routes!(list_items, create_items))
        .routes(routes!(get_item, delete_item))
}

/// The most items one request adds.
const MAX_ITEMS: usize = 20;

/// A conversation's id: `conv_` and the thread id's hex.
pub(crate) fn conversation_id(thread: ThreadId) -> String {
    format!("conv_{}", thread.0.simple())
}

/// The thread a conversation id names (`conv_` and hex, or the bare thread id).
pub(crate) fn parse_conversation(id: &str) -> Option<ThreadId> {
    let bare = id.strip_prefix("conv_").unwrap_or(id);
    uuid::Uuid::parse_str(bare).ok().map(ThreadId)
}

/// 404 `conversation_not_found`.
fn conversation_not_found() -> ApiError {
    ApiError::not_found("conversation_not_found", "no such conversation")
}

/// 404 `item_not_found`.
fn item_not_found() -> ApiError {
    ApiError::not_found("item_not_found", "no such item in this conversation")
}

fn item_id(message: MessageId) -> String {
    format!("msg_{}", message.0.simple())
}

fn parse_item(id: &str) -> Option<MessageId> {
    let bare = id.strip_prefix("msg_").unwrap_or(id);
    uuid::Uuid::parse_str(bare).ok().map(MessageId)
}

/// A conversation object.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Conversation {
    /// `conv_` and the thread id's hex.
    pub id: String,
    /// `conversation`.
    pub object: String,
    /// When it was created (Unix seconds).
    pub created_at: i64,
    /// The thread's metadata.
    #[schema(value_type = Object)]
    pub metadata: Value,
}

fn conversation(thread: &Thread) -> Value {
    json!({"id": conversation_id(thread.id), "object": "conversation",
        "created_at": thread.created_at.timestamp(), "metadata": thread.metadata.0})
}

/// A deleted conversation.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeletedConversation {
    /// The conversation's id.
    pub id: String,
    /// `conversation.deleted`.
    pub object: String,
    /// `true`.
    pub deleted: bool,
}

/// A `message` item of a conversation.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConversationItem {
    /// `message`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `msg_` and the message id's hex.
    pub id: String,
    /// `completed`, `in_progress` (its run is answering) or `incomplete` (failed, cancelled).
    pub status: String,
    /// `user` or `assistant`.
    pub role: String,
    /// One part: `input_text` (user) or `output_text` (assistant).
    #[schema(value_type = Vec<Object>)]
    pub content: Vec<Value>,
}

fn item(message: &Message) -> Value {
    let status = match message.status {
        MessageStatus::Completed => "completed",
        MessageStatus::Queued | MessageStatus::Streaming => "in_progress",
        MessageStatus::Failed | MessageStatus::Cancelled => "incomplete",
    };
    let (role, part) = match message.role {
        Role::User => (
            "user",
            json!({"type": "input_text", "text": message.content}),
        ),
        Role::Assistant => (
            "assistant",
            json!({"type": "output_text", "text": message.content,
                "annotations": super::citations::url_citations(
                    super::citations::of_parts(&message.parts.0), 0, usize::MAX / 2),
                "logprobs": []}),
        ),
    };
    json!({"type": "message", "id": item_id(message.id), "status": status, "role": role,
        "content": [part]})
}

/// A list of items.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConversationItemList {
    /// `list`.
    pub object: String,
    /// The items.
    pub data: Vec<ConversationItem>,
    /// Whether more follow (`after` = `last_id` gets them).
    pub has_more: bool,
    /// The first item's id (`""` for an empty list).
    pub first_id: String,
    /// The last item's id (`""` for an empty list).
    pub last_id: String,
}

fn item_list(data: Vec<Value>, has_more: bool) -> Value {
    let first = data.first().map_or(json!(""), |item| item["id"].clone());
    let last = data.last().map_or(json!(""), |item| item["id"].clone());
    json!({"object": "list", "data": data, "has_more": has_more, "first_id": first,
        "last_id": last})
}

/// The body of `POST /v1/conversations`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateConversation {
    /// Messages to start it with (`{type?: "message", role: "user"|"assistant", content}`;
    /// at most 20), stored as earlier turns; no run starts.
    #[serde(default)]
    #[schema(value_type = Option<Vec<crate::openai::schema::InputMessage>>)]
    pub items: Option<Vec<Value>>,
    /// The thread's metadata.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

/// The body of `POST /v1/conversations/{id}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateConversation {
    /// Merged into the thread's metadata (a `null` value removes its key).
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
}

/// The body of `POST /v1/conversations/{id}/items`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateItems {
    /// Messages to add (at most 20), as on create.
    #[schema(value_type = Vec<crate::openai::schema::InputMessage>)]
    pub items: Vec<Value>,
}

/// The messages `items` hold, checked (user and assistant text only).
fn parse_items(items: &[Value]) -> Result<Vec<(Role, String)>, ApiError> {
    if items.len() > MAX_ITEMS {
        return Err(ApiError::bad_request(
            "invalid_input",
            format!("at most {MAX_ITEMS} items at once"),
        )
        .with("param", "items"));
    }
    let mut out = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        // One item at a time, so that any role may come last.
        let turns = turns(std::slice::from_ref(item), "items").map_err(|_| {
            ApiError::bad_request(
                "unsupported_input",
                format!(
                    "items[{index}]: a conversation holds text messages of the roles user and \
                     assistant"
                ),
            )
            .with("param", format!("items[{index}]"))
        });
        let assistant = item["role"] == "assistant";
        match turns {
            Ok(turns) if turns.instructions.is_none() => out.push((Role::User, turns.input_text)),
            Err(_) if assistant => {
                let text = assistant_text(item).ok_or_else(|| {
                    ApiError::bad_request(
                        "unsupported_input",
                        format!("items[{index}]: content is not text"),
                    )
                    .with("param", format!("items[{index}]"))
                })?;
                out.push((Role::Assistant, text));
            }
            Ok(_) | Err(_) => {
                return Err(ApiError::bad_request(
                    "unsupported_input",
                    format!(
                        "items[{index}]: a conversation holds text messages of the roles user \
                         and assistant"
                    ),
                )
                .with("param", format!("items[{index}]")));
            }
        }
    }
    Ok(out)
}

/// The text of an assistant message item.
fn assistant_text(item: &Value) -> Option<String> {
    if !matches!(item["type"].as_str(), None | Some("message")) {
        return None;
    }
    match &item["content"] {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part["type"].as_str() {
                Some("output_text" | "input_text" | "text") => part["text"].as_str(),
                _ => None,
            })
            .collect::<Option<Vec<&str>>>()
            .map(|texts| texts.concat()),
        _ => None,
    }
}

/// Locks the caller's `thread` in `tx`: 404 `conversation_not_found` unless it is theirs, 409
/// `thread_busy` while a response of it is in progress.
async fn lock_idle(
    tx: &mut sqlx::PgConnection,
    caller: &Caller,
    thread: ThreadId,
    doing: &str,
) -> Result<(), ApiError> {
    // The thread's row, locked: an enqueue racing this waits, and sees the change.
    let row: Option<(Option<uuid::Uuid>,)> = sqlx::query_as(
        "SELECT (SELECT r.id FROM runs r
                  WHERE r.thread_id = t.id AND r.parent_workflow_id IS NULL
                    AND r.status IN ('queued', 'running', 'requires_action', 'awaiting_approval',
                                     'waiting'))
           FROM threads t
          WHERE t.id = $1 AND t.tenant_id = $2 AND t.owner_id = $3 AND t.erased_at IS NULL
            FOR UPDATE",
    )
    .bind(thread)
    .bind(&caller.owner.tenant_id)
    .bind(&caller.owner.user_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((active,)) = row else {
        return Err(conversation_not_found());
    };
    if let Some(active) = active {
        return Err(ApiError::conflict(
            "thread_busy",
            format!("the conversation has a response in progress: {doing} once it has ended"),
        )
        .with("active_workflow_id", active));
    }
    Ok(())
}

/// Stores `turns` on `thread` (locked, with no run in progress), returning them as messages.
async fn add_turns(
    state: &AppState,
    caller: &Caller,
    thread: ThreadId,
    turns: &[(Role, String)],
) -> Result<Vec<Message>, ApiError> {
    let mut tx = state.db.begin().await?;
    lock_idle(&mut tx, caller, thread, "add items").await?;
    let mut ids = Vec::with_capacity(turns.len());
    for (role, text) in turns {
        let id = MessageId::new();
        messages::insert_turn(&mut *tx, id, thread, *role, text).await?;
        ids.push(id);
    }
    let mut added = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(message) = messages::find_in_thread(&mut *tx, id, thread).await? {
            added.push(message);
        }
    }
    tx.commit().await?;
    Ok(added)
}

/// Creates a conversation: a new thread (no run starts), with its first items if given.
#[utoipa::path(
    post,
    path = "/v1/conversations",
    tag = "openai",
    security(("bearer" = ["runs:create"])),
    request_body = CreateConversation,
    responses(
        (status = 200, description = "The conversation.", body = Conversation),
        (status = 400, description = "`invalid_input`, `unsupported_input`", body = crate::openai::schema::OpenAiErrorBody),
        crate::openai::schema::OpenAiUnauthenticated,
        crate::openai::schema::OpenAiMissingPermission,
        (status = 422, description = "`invalid_body`", body = crate::openai::schema::OpenAiErrorBody),
    )
)]
pub(crate) async fn create_conversation(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<CreateConversation>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::RunsCreate)?;
    let turns = parse_items(body.items.as_deref().unwrap_or_default())?;
    let metadata = Value::Object(body.metadata.unwrap_or_default());
    let id = ThreadId::new();
    let thread = threads::create(&state.db, id, &caller.owner, None, &metadata)
        .await?
        .ok_or_else(|| anyhow::anyhow!("a new thread id was taken"))?;
    if !turns.is_empty() {
        add_turns(&state, &caller, id, &turns).await?;
    }
    Ok(Json(conversation(&thread)))
}

/// The caller's thread a conversation id names; 404 `conversation_not_found` otherwise.
async fn find(state: &AppState, caller: &Caller, id: &str) -> Result<Thread, ApiError> {
    let thread = parse_conversation(id).ok_or_else(conversation_not_found)?;
    threads::find(&state.db, thread, caller.scope())
        .await?
        .ok_or_else(conversation_not_found)
}

/// A conversation.
#[utoipa::path(
    get,
    path = "/v1/conversations/{conversation_id}",
    tag = "openai",
    security(("bearer" = ["runs:create"]), ("bearer" = ["runs:read:tenant"])),
    params(("conversation_id" = String, Path, description = "`conv_...`, or the thread id.")),
    responses(
        (status = 200, description = "The conversation.", body = Conversation),
        crate::openai::schema::OpenAiUnauthenticated,
        crate::openai::schema::OpenAiMissingPermission,
        (status = 404, description = "`conversation_not_found` (also another owner's)", body = crate::openai::schema::OpenAiErrorBody),
    )
)]
pub(crate) async fn get_conversation(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require_any(Permission::RUNS_READ)?;
    Ok(Json(conversation(&find(&state, &caller, &id).await?)))
}

/// Updates a conversation's metadata (merged; a `null` value removes its key).
#[utoipa::path(
    post,
    path = "/v1/conversations/{conversation_id}",
    tag = "openai",
    security(("bearer" = ["runs:create"])),
    params(("conversation_id" = String, Path, description = "`conv_...`, or the thread id.")),
    request_body = UpdateConversation,
    responses(
        (status = 200, description = "The conversation.", body = Conversation),
        crate::openai::schema::OpenAiUnauthenticated,
        crate::openai::schema::OpenAiMissingPermission,
        (status = 404, description = "`conversation_not_found`", body = crate::openai::schema::OpenAiErrorBody),
        (status = 422, description = "`invalid_body`", body = crate::openai::schema::OpenAiErrorBody),
    )
)]
pub(crate) async fn update_conversation(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<UpdateConversation>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::RunsCreate)?;
    let thread = parse_conversation(&id).ok_or_else(conversation_not_found)?;
    let patch = ThreadPatch {
        metadata: Some(body.metadata),
        ..ThreadPatch::default()
    };
    let thread = threads::update(&state.db, thread, caller.write_scope(), &patch)
        .await?
        .ok_or_else(conversation_not_found)?;
    Ok(Json(conversation(&thread)))
}

/// Deletes a conversation: erases its thread (its messages, runs and stream).
#[utoipa::path(
    delete,
    path = "/v1/conversations/{conversation_id}",
    tag = "openai",
    security(("bearer" = ["runs:create"])),
    params(("conversation_id" = String, Path, description = "`conv_...`, or the thread id.")),
    responses(
        (status = 200, description = "Deleted.", body = DeletedConversation),
        crate::openai::schema::OpenAiUnauthenticated,
        crate::openai::schema::OpenAiMissingPermission,
        (status = 404, description = "`conversation_not_found`", body = crate::openai::schema::OpenAiErrorBody),
        (status = 503, description = "`erasure_timed_out`, `redis_unavailable` (nothing was erased; try again)", body = crate::openai::schema::OpenAiErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait."))),
    )
)]
pub(crate) async fn delete_conversation(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::RunsCreate)?;
    let thread = find(&state, &caller, &id).await?;
    erase_thread(&state, &caller, thread.id).await?;
    Ok(Json(
        json!({"id": conversation_id(thread.id), "object": "conversation.deleted", "deleted": true}),
    ))
}

/// Query of `GET /v1/conversations/{id}/items`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ItemsQuery {
    /// 1 to 100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<i64>,
    /// `desc` (newest first, the default) or `asc`.
    #[param(pattern = "^(asc|desc)$")]
    order: Option<String>,
    /// Only the items after this one (in `order`).
    after: Option<String>,
}

/// A conversation's items (its thread's messages): newest first by default.
#[utoipa::path(
    get,
    path = "/v1/conversations/{conversation_id}/items",
    tag = "openai",
    security(("bearer" = ["runs:create"]), ("bearer" = ["runs:read:tenant"])),
    params(("conversation_id" = String, Path, description = "`conv_...`, or the thread id."), ItemsQuery),
    responses(
        (status = 200, description = "The items.", body = ConversationItemList),
        (status = 400, description = "`invalid_query`", body = crate::openai::schema::OpenAiErrorBody),
        crate::openai::schema::OpenAiUnauthenticated,
        crate::openai::schema::OpenAiMissingPermission,
        (status = 404, description = "`conversation_not_found`", body = crate::openai::schema::OpenAiErrorBody),
    )
)]
pub(crate) async fn list_items(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ItemsQuery>,
) -> Result<Json<Value>, ApiError> {
    caller.require_any(Permission::RUNS_READ)?;
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(
            ApiError::bad_request("invalid_query", "limit is 1 to 100").with("param", "limit")
        );
    }
    let ascending = match query.order.as_deref() {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(_) => {
            return Err(
                ApiError::bad_request("invalid_query", "order is asc or desc")
                    .with("param", "order"),
            );
        }
    };
    let after = query
        .after
        .as_deref()
        .map(|after| {
            parse_item(after).ok_or_else(|| {
                ApiError::bad_request("invalid_query", "after is an item id").with("param", "after")
            })
        })
        .transpose()?;
    let thread = find(&state, &caller, &id).await?;
    let mut rows = messages::page(&state.db, thread.id, limit + 1, after, ascending).await?;
    let has_more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    Ok(Json(item_list(rows.iter().map(item).collect(), has_more)))
}

/// Adds items (messages) to a conversation; no run starts.
#[utoipa::path(
    post,
    path = "/v1/conversations/{conversation_id}/items",
    tag = "openai",
    security(("bearer" = ["runs:create"])),
    params(("conversation_id" = String, Path, description = "`conv_...`, or the thread id.")),
    request_body = CreateItems,
    responses(
        (status = 200, description = "The items added.", body = ConversationItemList),
        (status = 400, description = "`invalid_input`, `unsupported_input`", body = crate::openai::schema::OpenAiErrorBody),
        crate::openai::schema::OpenAiUnauthenticated,
        crate::openai::schema::OpenAiMissingPermission,
        (status = 404, description = "`conversation_not_found`", body = crate::openai::schema::OpenAiErrorBody),
        (status = 409, description = "`thread_busy` (a response is in progress)", body = crate::openai::schema::OpenAiErrorBody),
        (status = 422, description = "`invalid_body`", body = crate::openai::schema::OpenAiErrorBody),
    )
)]
pub(crate) async fn create_items(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<CreateItems>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::RunsCreate)?;
    let thread = parse_conversation(&id).ok_or_else(conversation_not_found)?;
    let turns = parse_items(&body.items)?;
    let added = add_turns(&state, &caller, thread, &turns).await?;
    Ok(Json(item_list(added.iter().map(item).collect(), false)))
}

/// One item of a conversation.
#[utoipa::path(
    get,
    path = "/v1/conversations/{conversation_id}/items/{item_id}",
    tag = "openai",
    security(("bearer" = ["runs:create"]), ("bearer" = ["runs:read:tenant"])),
    params(
        ("conversation_id" = String, Path, description = "`conv_...`, or the thread id."),
        ("item_id" = String, Path, description = "`msg_...`, or the message id."),
    ),
    responses(
        (status = 200, description = "The item.", body = ConversationItem),
        crate::openai::schema::OpenAiUnauthenticated,
        crate::openai::schema::OpenAiMissingPermission,
        (status = 404, description = "`conversation_not_found` (also another owner's), `item_not_found` (also a deleted one)", body = crate::openai::schema::OpenAiErrorBody),
    )
)]
pub(crate) async fn get_item(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((id, item_id)): ApiPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    caller.require_any(Permission::RUNS_READ)?;
    let thread = find(&state, &caller, &id).await?;
    let message = parse_item(&item_id).ok_or_else(item_not_found)?;
    let message = messages::find_item(&state.db, message, thread.id)
        .await?
        .ok_or_else(item_not_found)?;
    Ok(Json(item(&message)))
}

/// Deletes an item from a conversation: later responses no longer see it, and the item lists
/// leave it out (the response that wrote it keeps it in its `output`). Answers the
/// conversation, as OpenAI's API does.
#[utoipa::path(
    delete,
    path = "/v1/conversations/{conversation_id}/items/{item_id}",
    tag = "openai",
    security(("bearer" = ["runs:create"])),
    params(
        ("conversation_id" = String, Path, description = "`conv_...`, or the thread id."),
        ("item_id" = String, Path, description = "`msg_...`, or the message id."),
    ),
    responses(
        (status = 200, description = "The conversation.", body = Conversation),
        crate::openai::schema::OpenAiUnauthenticated,
        crate::openai::schema::OpenAiMissingPermission,
        (status = 404, description = "`conversation_not_found` (also another owner's), `item_not_found` (also one deleted before)", body = crate::openai::schema::OpenAiErrorBody),
        (status = 409, description = "`thread_busy` (a response is in progress)", body = crate::openai::schema::OpenAiErrorBody),
    )
)]
pub(crate) async fn delete_item(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((id, item_id)): ApiPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::RunsCreate)?;
    let thread = parse_conversation(&id).ok_or_else(conversation_not_found)?;
    let message = parse_item(&item_id).ok_or_else(item_not_found)?;
    let mut tx = state.db.begin().await?;
    lock_idle(&mut tx, &caller, thread, "delete items").await?;
    if !messages::delete_item(&mut *tx, message, thread).await? {
        return Err(item_not_found());
    }
    tx.commit().await?;
    Ok(Json(conversation(&find(&state, &caller, &id).await?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_id_and_the_bare_thread_id_name_the_same_thread() {
        let thread = ThreadId::new();
        let id = conversation_id(thread);
        assert!(id.starts_with("conv_") && !id.contains('-'), "{id}");
        assert_eq!(parse_conversation(&id), Some(thread));
        assert_eq!(parse_conversation(&thread.to_string()), Some(thread));
        assert_eq!(parse_conversation("conv_nope"), None);
    }

    #[test]
    fn items_are_user_and_assistant_text() {
        let items = [
            json!({"type": "message", "role": "user", "content": "Hi"}),
            json!({"role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]}),
        ];
        assert_eq!(
            parse_items(&items).expect("items"),
            [
                (Role::User, "Hi".to_owned()),
                (Role::Assistant, "Hello".to_owned())
            ]
        );
        assert!(parse_items(&[json!({"role": "system", "content": "x"})]).is_err());
        assert!(parse_items(&[json!({"type": "function_call_output", "output": "1"})]).is_err());
    }
}
