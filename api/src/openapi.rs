//! The OpenAPI 3.1 document of the API, generated from the handlers' `#[utoipa::path]`
//! attributes (each router registers its handlers with `utoipa_axum::routes!`, which adds
//! them to the router and the document at once) and the types' `ToSchema` derives, and
//! `GET /openapi.json` (no auth) that serves it.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use axum::Json;
use utoipa::OpenApi as _;
use utoipa::openapi::schema::{AdditionalProperties, Schema};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Object, ObjectBuilder, OpenApi, RefOr, Type};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use spool_shared::{AgentId, MessageId, ThreadId, WorkflowId};

use crate::app::AppState;

/// `GET /openapi.json`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(openapi_json))
}

/// The OpenAPI document of every route, with the bearer scheme and every error body: the
/// paths come from the routers themselves (`crate::app::routes`), so a route cannot be served
/// undocumented or documented unserved.
pub fn document() -> OpenApi {
    static DOCUMENT: LazyLock<OpenApi> = LazyLock::new(|| {
        let mut document = crate::app::routes().into_openapi();
        // serde's `flatten` (an agent's spec in `AgentResponse`) and internally tagged enums
        // of structs (`ToolSpec`) come out as `allOf` of a closed object
        // (`deny_unknown_fields`) and the other fields, which no value satisfies; merge them
        // into one object.
        merge_all_of(&mut document);
        document
    });
    DOCUMENT.clone()
}

/// The document's info, tags, security schemes and the schemas no path names; the routers
/// add the paths.
pub(crate) fn base() -> OpenApi {
    ApiDoc::openapi()
}

/// One Server-Sent Event of `GET /v1/threads/{thread_id}/stream` (the schema of each event).
#[derive(Debug, utoipa::ToSchema)]
pub struct StreamEvent {
    /// The stream entry id, the cursor to resume after (absent on gateway events such as
    /// `stream_reset` and `message_not_streaming`).
    pub id: Option<String>,
    /// The event type: `message_start`, `text_delta`, `done`, `stream_reset`, ...
    pub event: Option<String>,
    /// The JSON envelope `{v, type, thread_id, workflow_id, message_id, attempt, data}` (the
    /// `StreamEnvelope` schema: one per event type), or a gateway event's JSON object
    /// (`stream_reset`: `{last_entry_id}`; `message_not_streaming`: `{thread_id, message_id}` or
    /// `{workflow_id}`).
    pub data: Option<String>,
    /// The reconnection delay suggested to clients, in milliseconds.
    pub retry: Option<u64>,
}

/// The schema of `ThreadResponse.status`.
pub(crate) fn thread_status() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some("`busy` while a run is active, else `idle`."))
        .enum_values(Some(["idle", "busy"]))
        .build()
}

/// The schema of `UserMessageResponse.status`.
pub(crate) fn queued_status() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some("Always `queued`."))
        .enum_values(Some(["queued"]))
        .build()
}

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Spool",
        description = "A durable agent runtime: post a user message, get `202` with a \
            `workflow_id` at once, stream the run's events over SSE, read the messages over REST. \
            Errors are `{\"error\": {\"code\", \"message\"}}`; another tenant's or user's ids are \
            404, exactly as ids that do not exist."
    ),
    components(schemas(
        crate::error::ErrorBody,
        crate::error::ErrorDetail,
        ThreadId,
        WorkflowId,
        MessageId,
        AgentId,
        spool_shared::ids::WebhookId,
        spool_shared::ids::ApiKeyId,
        crate::auth::Permission,
        crate::routes::workflows::CancelRequest,
        spool_shared::event::Event,
    )),
    modifiers(&Security),
    tags(
        (name = "threads", description = "Threads (list, rename, erase), their messages, the enqueue and the stream."),
        (name = "workflows", description = "Runs: lists, status (and waiting for it), the durable timeline, cancel, tool outputs and approvals."),
        (name = "agents", description = "Stored agent configurations (`agents:read`; writes `agents:write`)."),
        (name = "tools", description = "The tenant's tools as resources, which agents reference with `tool_ids` (`agents:read`; writes `tools:write`)."),
        (name = "providers", description = "The tenant's model providers with their own keys, which agents name in `provider` before the operator's (`providers:write`)."),
        (name = "webhooks", description = "Signed notifications of run events (`webhooks:admin`)."),
        (name = "usage", description = "Tokens and runs by user, agent or model (`usage:read`)."),
        (name = "api_keys", description = "The tenant's API keys for servers (`api_keys:admin`): `Authorization: Bearer spk_...`, shown once, revoked at once."),
        (name = "openai", description = "The OpenAI-compatible surface: the Responses API (background mode, `starting_after` resume), Chat Completions and models, for the official SDKs. Errors here are OpenAI's shape: `{\"error\": {\"message\", \"type\", \"code\", \"param\"}}`."),
        (name = "page", description = "The chat page at `/` and its two files (no auth: the page signs in with a token)."),
        (name = "identity", description = "The public keys that verify `X-Spool-Identity`, the token tools, MCP servers and hooks receive."),
        (name = "health", description = "Liveness, readiness, metrics and this document."),
    )
)]
struct ApiDoc;

/// Adds the security schemes the operations name.
struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, openapi: &mut OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "An HS256 JWT with `sub`, `tenant` and `exp`, and optionally `admin: \
                         true` or `permissions: [...]`, e.g. from `spool-api token`; with \
                         `SPOOL_AUTH_JWKS_URL` set, an RS256, ES256 or EdDSA token of that \
                         identity provider; or an API key (`spk_...`, `POST /v1/api_keys`). \
                         Each operation's security requirement lists the permission it needs \
                         (several requirements: any one of them); `admin` holds them all, and a \
                         token with neither `admin` nor a permissions claim holds `agents:read` \
                         and `runs:create`. A missing one is 403 `forbidden` naming it. A token \
                         typed `spool-identity+jwt` is refused (401 `identity_token_refused`).",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "access_token",
            SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::with_description(
                "access_token",
                "The same bearer token as a query parameter, for `EventSource` (the stream \
                 only).",
            ))),
        );
    }
}

/// The document itself.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "health",
    responses((status = 200, description = "This OpenAPI document.", body = Object))
)]
async fn openapi_json() -> Json<OpenApi> {
    Json(document())
}

/// Replaces each `allOf` of objects (inline or referenced), as a component schema or as a
/// `oneOf` variant of one, by a single object with their properties and required fields,
/// closed (`additionalProperties: false`) if any part was.
fn merge_all_of(document: &mut OpenApi) {
    let Some(components) = document.components.as_mut() else {
        return;
    };
    let originals = components.schemas.clone();
    for schema in components.schemas.values_mut() {
        match schema {
            RefOr::T(Schema::AllOf(_)) => merge(schema, &originals),
            RefOr::T(Schema::OneOf(one_of)) => {
                for variant in &mut one_of.items {
                    merge(variant, &originals);
                }
            }
            _ => {}
        }
    }
}

fn merge(schema: &mut RefOr<Schema>, components: &BTreeMap<String, RefOr<Schema>>) {
    let RefOr::T(Schema::AllOf(all_of)) = &*schema else {
        return;
    };
    let mut parts = Vec::new();
    for part in &all_of.items {
        let part = match part {
            RefOr::Ref(reference) => reference
                .ref_location
                .strip_prefix("#/components/schemas/")
                .and_then(|name| components.get(name)),
            inline => Some(inline),
        };
        match part {
            Some(RefOr::T(Schema::Object(object))) => parts.push(object),
            _ => return,
        }
    }
    let Some((first, rest)) = parts.split_first() else {
        return;
    };
    let mut merged: Object = (*first).clone();
    for part in rest {
        merged
            .properties
            .extend(part.properties.iter().map(|(k, v)| (k.clone(), v.clone())));
        for field in &part.required {
            if !merged.required.contains(field) {
                merged.required.push(field.clone());
            }
        }
        if matches!(
            part.additional_properties.as_deref(),
            Some(AdditionalProperties::FreeForm(false))
        ) {
            merged.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
        }
    }
    merged.title = all_of.title.clone();
    merged.description = all_of.description.clone();
    *schema = RefOr::T(Schema::Object(merged));
}
