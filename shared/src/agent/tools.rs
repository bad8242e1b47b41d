//! The tools an agent offers the model, by kind (`http`, `mcp`, `client`, `agent`), and the
//! tool choice. Names the model sees are unique per agent ([`super::validate`] refuses
//! collisions at save).
//!
//! A tool is either inline in an agent (`tools`) or a tenant's resource ([`ToolResource`],
//! `/v1/tools`) that agents reference by id ([`ToolRef`], `tool_ids`). A run never sees a
//! reference: its spec is snapshot at enqueue with the referenced tools that are enabled
//! resolved into `tools` ([`super::AgentSpec::resolve_tools`]), so a tool changed, disabled or
//! deleted later does not change the run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{AgentId, ToolId};

/// `auto`, `required`, `none`, or the name of one tool the model must call; also read in the
/// object form `{"type": "tool", "tool_name": "..."}` (or `{"type": "auto"}`, ...), and always
/// written as a string.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ToolChoiceForm", into = "String")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must call some tool.
    Required,
    /// The model must not call tools.
    None,
    /// The model must call this tool.
    Tool(String),
}

/// The forms a tool choice is read in: a string, or an object naming its type.
#[derive(Deserialize)]
#[serde(untagged)]
enum ToolChoiceForm {
    Name(String),
    Object(ToolChoiceObject),
}

/// `{"type": "tool", "tool_name": "..."}`, or `{"type": "auto" | "required" | "none"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolChoiceObject {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    tool_name: Option<String>,
}

impl TryFrom<ToolChoiceForm> for ToolChoice {
    type Error = String;

    fn try_from(form: ToolChoiceForm) -> Result<Self, String> {
        let ToolChoiceObject { kind, tool_name } = match form {
            ToolChoiceForm::Name(name) => return Ok(name.into()),
            ToolChoiceForm::Object(object) => object,
        };
        match (kind.as_str(), tool_name) {
            ("tool", Some(name)) => Ok(Self::Tool(name)),
            ("tool", None) => Err("`{\"type\": \"tool\"}` needs a `tool_name`".into()),
            ("auto" | "required" | "none", None) => Ok(kind.into()),
            ("auto" | "required" | "none", Some(_)) => {
                Err(format!("`{{\"type\": \"{kind}\"}}` takes no `tool_name`"))
            }
            _ => Err(format!(
                "unknown tool choice type `{kind}`: `tool` (with `tool_name`), `auto`, \
                 `required` or `none`"
            )),
        }
    }
}

impl utoipa::PartialSchema for ToolChoice {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Type};
        // Written as one string (`into` String); read as a string or an object.
        let name = ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "`auto`, `required`, `none`, or the name of one tool the model must call.",
            ))
            .examples(["auto", "required", "none"]);
        let object = ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "The object form: `{\"type\": \"tool\", \"tool_name\": \"search\"}` (the model \
                 must call that tool), or `{\"type\": \"auto\" | \"required\" | \"none\"}`. \
                 Read only: a stored choice is shown as a string.",
            ))
            .property(
                "type",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["tool", "auto", "required", "none"])),
            )
            .required("type")
            .property("tool_name", ObjectBuilder::new().schema_type(Type::String))
            .additional_properties(Some(AdditionalProperties::FreeForm(false)));
        OneOfBuilder::new()
            .item(name)
            .item(object)
            .description(Some(
                "`auto`, `required`, `none`, or the name of one tool the model must call (a \
                 string, or the object form `{\"type\": \"tool\", \"tool_name\"}`).",
            ))
            .into()
    }
}

impl utoipa::ToSchema for ToolChoice {}

impl From<String> for ToolChoice {
    fn from(value: String) -> Self {
        match value.as_str() {
            "auto" => Self::Auto,
            "required" => Self::Required,
            "none" => Self::None,
            _ => Self::Tool(value),
        }
    }
}

impl From<ToolChoice> for String {
    fn from(choice: ToolChoice) -> Self {
        match choice {
            ToolChoice::Auto => "auto".into(),
            ToolChoice::Required => "required".into(),
            ToolChoice::None => "none".into(),
            ToolChoice::Tool(name) => name,
        }
    }
}

/// One tool of an agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolSpec {
    /// An HTTP endpoint that receives the arguments as JSON.
    Http(HttpToolSpec),
    /// An MCP server whose tools are discovered at run start.
    Mcp(McpToolSpec),
    /// A tool the client executes (the run waits for its output).
    Client(ClientToolSpec),
    /// Another agent of the tenant: a call starts a child run of it with the call's `input`,
    /// and the run waits (without a worker) for the child's final text as the call's result.
    Agent(AgentToolSpec),
    /// A tool built into Spool (`http_request`, `knowledge_search`), offered when the operator
    /// enables it (`SPOOL_BUILTIN_TOOLS`).
    Builtin(BuiltinToolSpec),
}

impl ToolSpec {
    /// The name (for MCP: the prefix of its tools' names).
    pub fn name(&self) -> &str {
        match self {
            Self::Http(t) => &t.name,
            Self::Mcp(t) => &t.name,
            Self::Client(t) => &t.name,
            Self::Agent(t) => &t.name,
            Self::Builtin(t) => t.name.as_str(),
        }
    }

    /// The MCP server, if this is one.
    pub fn as_mcp(&self) -> Option<&McpToolSpec> {
        match self {
            Self::Mcp(t) => Some(t),
            _ => None,
        }
    }

    /// The kind, as the `type` field names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Http(_) => "http",
            Self::Mcp(_) => "mcp",
            Self::Client(_) => "client",
            Self::Agent(_) => "agent",
            Self::Builtin(_) => "builtin",
        }
    }

    /// The tool as an agent that references it with `reference` offers it: the reference's
    /// `read_only` and `requires_approval`, where set, replace the tool's own.
    pub fn referenced_as(mut self, reference: &ToolRef) -> Self {
        if let Some(approval) = reference.requires_approval {
            match &mut self {
                Self::Http(t) => t.requires_approval = approval,
                Self::Mcp(t) => t.requires_approval = approval,
                Self::Client(t) => t.requires_approval = approval,
                Self::Agent(t) => t.requires_approval = approval,
                Self::Builtin(t) => t.requires_approval = approval,
            }
        }
        if let (Some(read_only), Self::Http(t)) = (reference.read_only, &mut self) {
            t.read_only = read_only;
        }
        self
    }
}

/// A tenant's tool resource as posted to `POST /v1/tools`: a tool of any kind, and whether
/// agents offer it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolResource {
    /// The tool (`type` and the fields of its kind).
    #[serde(flatten)]
    pub tool: ToolSpec,
    /// Whether agents that reference it offer it to the model (default `true`); a disabled
    /// tool is never offered, and runs enqueued while it is disabled do without it.
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
}

fn enabled_by_default() -> bool {
    true
}

/// An agent's reference to a tool resource, with what the agent changes of it. Posted as the
/// tool's id alone, or as `{tool_id, read_only?, requires_approval?}`; read back as the latter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(from = "ToolRefInput")]
pub struct ToolRef {
    /// The tool (of the same tenant).
    pub tool_id: ToolId,
    /// Replaces an HTTP tool's `read_only` for this agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Replaces the tool's `requires_approval` for this agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_approval: Option<bool>,
}

/// The two forms a reference is posted in.
#[derive(Deserialize)]
#[serde(untagged)]
enum ToolRefInput {
    Id(ToolId),
    Full {
        tool_id: ToolId,
        #[serde(default)]
        read_only: Option<bool>,
        #[serde(default)]
        requires_approval: Option<bool>,
    },
}

impl From<ToolRefInput> for ToolRef {
    fn from(input: ToolRefInput) -> Self {
        match input {
            ToolRefInput::Id(tool_id) => Self {
                tool_id,
                read_only: None,
                requires_approval: None,
            },
            ToolRefInput::Full {
                tool_id,
                read_only,
                requires_approval,
            } => Self {
                tool_id,
                read_only,
                requires_approval,
            },
        }
    }
}

/// An HTTP tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpToolSpec {
    /// The name the model sees.
    #[schema(pattern = "^[a-zA-Z0-9_-]{1,64}$")]
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of its arguments.
    #[serde(default = "empty_object_schema")]
    #[schema(value_type = Object)]
    pub parameters: Value,
    /// Where to send the arguments.
    pub url: String,
    /// The HTTP method (default POST).
    #[serde(default = "default_method")]
    pub method: String,
    /// Extra request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Whether it only reads (read-only calls of one step run concurrently).
    #[serde(default)]
    pub read_only: bool,
    /// Whether a person must approve each call.
    #[serde(default)]
    pub requires_approval: bool,
}

/// An MCP server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct McpToolSpec {
    /// The prefix of its tools' names (`{name}_{tool}`).
    #[schema(pattern = "^[a-zA-Z0-9_-]{1,64}$")]
    pub name: String,
    /// Its endpoint: the Streamable HTTP endpoint (`.../mcp`), or with `transport: "sse"` the
    /// legacy transport's event stream (`.../sse`).
    pub url: String,
    /// How to speak to it (default `streamable_http`).
    #[serde(default, skip_serializing_if = "McpTransport::is_default")]
    pub transport: McpTransport,
    /// Headers sent on every request (write-only values).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// If set, only these of the server's tools (by their names on the server) are offered to
    /// the model; the others are never offered, whatever the server lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    /// How requests authenticate (its secrets are write-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<McpAuth>,
    /// Whether a person must approve each call.
    #[serde(default)]
    pub requires_approval: bool,
}

impl McpToolSpec {
    /// Whether the server's tool `remote` (its name on the server) may be offered.
    pub fn allows(&self, remote: &str) -> bool {
        self.allowed_tools
            .as_ref()
            .is_none_or(|allowed| allowed.iter().any(|name| name == remote))
    }
}

/// The transport an MCP server speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum McpTransport {
    /// Streamable HTTP (MCP 2025-03-26 and later): one endpoint for POSTs and the event stream.
    #[default]
    StreamableHttp,
    /// The legacy HTTP+SSE transport (MCP 2024-11-05): an event stream whose first `endpoint`
    /// event names where to POST messages.
    Sse,
}

impl McpTransport {
    fn is_default(&self) -> bool {
        *self == Self::StreamableHttp
    }
}

/// How an MCP server's requests authenticate: an `Authorization: Bearer` token, given or
/// fetched with OAuth 2.0 client credentials. Every secret (`token`, `client_secret`) is
/// write-only: reads show `"<redacted>"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum McpAuth {
    /// A fixed bearer token.
    Bearer {
        /// The token (write-only).
        #[serde(default)]
        token: String,
    },
    /// OAuth 2.0 client credentials (RFC 6749 section 4.4): a token fetched from `token_url`
    /// (the client authenticating with HTTP Basic), kept until it expires, then fetched again.
    OauthClientCredentials {
        /// The authorization server's token endpoint.
        token_url: String,
        /// The client's id.
        client_id: String,
        /// The client's secret (write-only).
        #[serde(default)]
        client_secret: String,
        /// The scope to ask for, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
    },
}

/// A client tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientToolSpec {
    /// The name the model sees.
    #[schema(pattern = "^[a-zA-Z0-9_-]{1,64}$")]
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of its arguments.
    #[serde(default = "empty_object_schema")]
    #[schema(value_type = Object)]
    pub parameters: Value,
    /// Whether a person must approve each call.
    #[serde(default)]
    pub requires_approval: bool,
}

/// An agent called as a tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentToolSpec {
    /// The name the model sees.
    #[schema(pattern = "^[a-zA-Z0-9_-]{1,64}$")]
    pub name: String,
    /// What the agent does, for the model.
    #[serde(default)]
    pub description: String,
    /// The agent (of the same tenant) that answers a call.
    pub agent_id: AgentId,
    /// Whether a person must approve each call.
    #[serde(default)]
    pub requires_approval: bool,
}

impl AgentToolSpec {
    /// The arguments the model gives: the child run's input.
    pub fn parameters() -> Value {
        serde_json::json!({
            "type": "object",
            "properties": {"input": {"type": "string", "description": "The request for the agent."}},
            "required": ["input"],
        })
    }
}

/// A built-in tool: its name is the name the model sees.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuiltinToolSpec {
    /// Which built-in tool.
    pub name: Builtin,
    /// Whether a person must approve each call.
    #[serde(default)]
    pub requires_approval: bool,
}

/// The tools built into Spool (DESIGN section 12). Both only read: calls of one step run
/// concurrently.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Builtin {
    /// Fetches a URL (`GET`) through the network policy: the response's text, at most
    /// 10,000 characters, within 30 s.
    HttpRequest,
    /// Searches the tenant's knowledge bases (`/v1/knowledge_bases`): the chunks they answer,
    /// which the answer cites.
    KnowledgeSearch,
}

impl Builtin {
    /// Every built-in tool.
    pub const ALL: [Self; 2] = [Self::HttpRequest, Self::KnowledgeSearch];

    /// The name the model sees (and `SPOOL_BUILTIN_TOOLS` lists).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HttpRequest => "http_request",
            Self::KnowledgeSearch => "knowledge_search",
        }
    }

    /// The one of this name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.as_str() == name)
    }

    /// What it does, for the model.
    pub fn description(self) -> &'static str {
        match self {
            Self::HttpRequest => {
                "Fetches a web page or API with an HTTP GET and returns the response's text \
                 (at most 10,000 characters)."
            }
            Self::KnowledgeSearch => {
                "Searches the knowledge bases for passages relevant to a query; cite what you \
                 use by the numbers the result gives."
            }
        }
    }

    /// JSON Schema of its arguments.
    pub fn parameters(self) -> Value {
        match self {
            Self::HttpRequest => serde_json::json!({
                "type": "object",
                "properties": {
                    "url": {"type": "string", "description": "The http(s) URL to fetch."},
                },
                "required": ["url"],
            }),
            Self::KnowledgeSearch => serde_json::json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to search for."},
                    "knowledge_base": {
                        "type": "string",
                        "description": "The name of one knowledge base to search (all when omitted).",
                    },
                    "top_k": {
                        "type": "integer", "minimum": 1, "maximum": 20,
                        "description": "How many chunks each knowledge base returns (default 5).",
                    },
                },
                "required": ["query"],
            }),
        }
    }
}

/// How deep agents may call agents when `limits.max_call_depth` is unset.
pub const DEFAULT_MAX_CALL_DEPTH: u32 = 3;

fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object"})
}
fn default_method() -> String {
    "POST".into()
}
