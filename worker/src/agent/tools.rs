//! Tools the model may call: HTTP endpoints, MCP servers (discovered at run start) and client
//! tools (executed by the client while the run pauses).
//!
//! Every tool call ends as a [`ToolOutput`]: text the model sees, flagged as an error or not.
//! A tool failing is not the run failing: the model sees the error and can work around it.
//!
//! [`ToolSet`] holds one attempt's tools: what the model is offered at each step, and how the
//! calls of a step execute: read-only calls concurrently, the others in order, each within the
//! tool timeout, each result cut at [`MAX_RESULT_CHARS`] characters with a marker. Every
//! call carries the idempotency key `{workflow_id}:{step}:{tool_call_id}` ([`idempotency_key`]),
//! so a call repeated by a new attempt after a crash can be de-duplicated by the tool.
//!
//! MCP servers are discovered by a run's first attempt, all at once within one tool timeout
//! (a dead server only removes its own tools), and what they offered is kept with the run
//! ([`McpTools`]): later attempts (after a crash, a pause, a wait for agent runs) offer the same
//! tools at once and connect to a server only when one of its tools is called.
//!
//! What must stay true: the names the model sees are unique. The agent's own tools are
//! validated at save; a discovered tool whose name is not one a provider accepts, or is taken
//! (by one of the agent's tools or an earlier server's), is dropped and logged. Every lookup
//! by name ([`ToolSet::find`]: classification, approval, execution) goes through one index,
//! so a call is approved and executed as the same tool.

pub mod builtin;
pub mod http;
pub mod identity;
pub mod mcp;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tracing::Instrument as _;

use spool_shared::WorkflowId;
use spool_shared::agent::validate::valid_tool_name;
use spool_shared::agent::{AgentSpec, McpToolSpec, ToolChoice, ToolSpec};
use spool_shared::db::{runs, steps};

use super::answer::{Exit, LoopEnd};
use super::context::Attempt;
use super::engine::Engine;
use super::llm::{Choice, ToolCall, ToolDef};
use identity::Identity;
use mcp::{McpServer, McpSession, McpTool};

pub use spool_shared::db::steps::MAX_RESULT_CHARS;

/// What a tool call returned, as the model will see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutput {
    /// The text given to the model.
    pub content: String,
    /// Whether the call failed.
    pub is_error: bool,
}

/// A call's output and when it ran (by the worker's clock: for the timeline).
#[derive(Debug)]
pub(crate) struct Timed {
    /// What it returned.
    pub(crate) output: ToolOutput,
    /// When it started.
    pub(crate) started_at: DateTime<Utc>,
    /// When it ended.
    pub(crate) ended_at: DateTime<Utc>,
}

impl ToolOutput {
    /// A successful result.
    pub fn ok(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
        }
    }

    /// A failure the model should see.
    pub fn error(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
        }
    }
}

/// The `Idempotency-Key` of a tool call: the same for every attempt that repeats it.
pub fn idempotency_key(workflow: WorkflowId, step: u32, tool_call_id: &str) -> String {
    format!("{workflow}:{step}:{tool_call_id}")
}

/// The tools of one attempt.
pub(crate) struct ToolSet {
    tools: Vec<Tool>,
    /// Each tool's place in `tools`, by its name (unique): the one lookup of a tool by name.
    index: HashMap<String, usize>,
    /// Who the calls act for.
    identity: Identity,
}

pub(crate) struct Tool {
    pub(crate) def: ToolDef,
    read_only: bool,
    pub(crate) requires_approval: bool,
    pub(crate) kind: Kind,
}

pub(crate) enum Kind {
    /// Executed by the client: the run waits for its output.
    Client,
    /// Answered by a child run of an agent: the run waits for it.
    Agent(spool_shared::agent::AgentToolSpec),
    Http(spool_shared::agent::HttpToolSpec),
    Mcp {
        server: Arc<Server>,
        remote: String,
    },
    /// A built-in tool (`http_request`, `knowledge_search`).
    Builtin(spool_shared::agent::Builtin),
}

/// What each MCP server of a run offered when its first attempt discovered them, by the
/// server's name (its tools' prefix); a server that could not be reached offered nothing. Kept
/// with the run (`runs.mcp_tools`) for its later attempts.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct McpTools(BTreeMap<String, Vec<McpTool>>);

/// One MCP server of a run, and its session once one is open: from the discovery, or, in a
/// later attempt, from the first call of one of its tools.
pub(crate) struct Server {
    spec: McpToolSpec,
    session: tokio::sync::OnceCell<McpSession>,
}

impl Tool {
    /// One of the agent's own tools; none for an MCP server, whose tools it names itself
    /// ([`ToolSet::push_server`]).
    fn of_spec(tool: &ToolSpec) -> Option<Self> {
        let tool = match tool {
            ToolSpec::Mcp(_) => return None,
            ToolSpec::Http(http) => Tool {
                def: ToolDef {
                    name: http.name.clone(),
                    description: http.description.clone(),
                    parameters: http.parameters.clone(),
                },
                read_only: http.read_only,
                requires_approval: http.requires_approval,
                kind: Kind::Http(http.clone()),
            },
            ToolSpec::Client(client) => Tool {
                def: ToolDef {
                    name: client.name.clone(),
                    description: client.description.clone(),
                    parameters: client.parameters.clone(),
                },
                read_only: false,
                requires_approval: client.requires_approval,
                kind: Kind::Client,
            },
            ToolSpec::Agent(agent) => Tool {
                def: ToolDef {
                    name: agent.name.clone(),
                    description: agent.description.clone(),
                    parameters: spool_shared::agent::AgentToolSpec::parameters(),
                },
                read_only: false,
                requires_approval: agent.requires_approval,
                kind: Kind::Agent(agent.clone()),
            },
            // Both only read: a step's calls of them run together.
            ToolSpec::Builtin(builtin) => Tool {
                def: ToolDef {
                    name: builtin.name.as_str().to_owned(),
                    description: builtin.name.description().to_owned(),
                    parameters: builtin.name.parameters(),
                },
                read_only: true,
                requires_approval: builtin.requires_approval,
                kind: Kind::Builtin(builtin.name),
            },
        };
        Some(tool)
    }
}

impl Server {
    /// The server's session, connected now if none is open (an error says why it cannot be).
    async fn session(&self, engine: &Engine, identity: &Identity) -> anyhow::Result<&McpSession> {
        self.session
            .get_or_try_init(|| async {
                let (session, _) = McpSession::connect(
                    &self.address(),
                    &engine.http,
                    identity,
                    engine.tool_timeout,
                    engine.mcp_max_tools,
                )
                .await?;
                Ok(session)
            })
            .await
    }

    fn address(&self) -> McpServer<'_> {
        McpServer::of(&self.spec)
    }
}

impl ToolSet {
    /// The tools of this attempt of the run: the agent's own, and those of its MCP servers,
    /// as the run's first attempt discovered them (discovered now, and kept with the run, if
    /// this is that attempt). Ends the loop if the lease is lost.
    pub(crate) async fn for_attempt(a: &Attempt<'_>, spec: &AgentSpec) -> Result<Self, Exit> {
        let run = a.claimed.run();
        let identity = a.engine.identity(run);
        let servers: Vec<&McpToolSpec> = spec.tools.iter().filter_map(ToolSpec::as_mcp).collect();
        if servers.is_empty() {
            return Ok(Self::build(spec, identity, McpTools::default(), Vec::new()));
        }
        let kept = runs::mcp_tools(a.db, run.id).await?;
        let kept = kept.and_then(|tools| serde_json::from_value::<McpTools>(tools).ok());
        if let Some(kept) = kept {
            return Ok(Self::build(spec, identity, kept, Vec::new()));
        }
        let (found, sessions) = discover(a.engine, &servers, &identity).await;
        let value = serde_json::to_value(&found).map_err(anyhow::Error::from)?;
        if a.claimed.save_mcp_tools(a.db, &value).await?.is_lost() {
            return Err(LoopEnd::LeaseLost.into());
        }
        Ok(Self::build(spec, identity, found, sessions))
    }

    /// The agent's tools in its order, each MCP server's discovered tools in its place (with
    /// the session `sessions` holds for it, if any); a discovered tool whose name is invalid
    /// or taken is dropped (and logged), so every name is unique.
    fn build(
        spec: &AgentSpec,
        identity: Identity,
        mut found: McpTools,
        mut sessions: Vec<(String, McpSession)>,
    ) -> Self {
        // The agent's own tools keep their names, whatever a server discovers later.
        let own: HashSet<&str> = spec
            .tools
            .iter()
            .filter(|t| t.as_mcp().is_none())
            .map(ToolSpec::name)
            .collect();
        let mut set = Self {
            tools: Vec::new(),
            index: HashMap::new(),
            identity,
        };
        for tool in &spec.tools {
            if let ToolSpec::Mcp(mcp) = tool {
                let session = sessions
                    .iter()
                    .position(|(name, _)| *name == mcp.name)
                    .map(|i| sessions.swap_remove(i).1);
                let discovered = found.0.remove(&mcp.name).unwrap_or_default();
                set.push_server(mcp, session, discovered, &own);
            } else if let Some(tool) = Tool::of_spec(tool) {
                set.push(tool);
            }
        }
        set
    }

    /// An MCP server's discovered tools that it allows, each under its own name: one whose
    /// name is invalid, or taken (by one of the agent's `own` tools or an earlier server's),
    /// is dropped and logged.
    fn push_server(
        &mut self,
        mcp: &McpToolSpec,
        session: Option<McpSession>,
        discovered: Vec<McpTool>,
        own: &HashSet<&str>,
    ) {
        let server = Arc::new(Server {
            spec: mcp.clone(),
            session: tokio::sync::OnceCell::new_with(session),
        });
        // `allowed_tools`: the others are never offered, so never called.
        for found in discovered
            .into_iter()
            .filter(|t| mcp.allows(&t.remote_name))
        {
            let taken = own.contains(found.name.as_str()) || self.index.contains_key(&found.name);
            if !valid_tool_name(&found.name) || taken {
                let why = if taken {
                    "taken"
                } else {
                    "not a valid tool name"
                };
                let name: String = found.name.chars().take(100).collect();
                tracing::warn!(mcp.server = %mcp.name, tool.name = %name, why,
                    "an MCP server's tool is dropped: its name is {why}");
                continue;
            }
            self.push(Tool {
                def: ToolDef {
                    name: found.name,
                    description: found.description,
                    parameters: found.parameters,
                },
                read_only: found.read_only,
                requires_approval: mcp.requires_approval,
                kind: Kind::Mcp {
                    server: server.clone(),
                    remote: found.remote_name,
                },
            });
        }
    }

    /// Adds a tool whose name no other tool has.
    fn push(&mut self, tool: Tool) {
        self.index.insert(tool.def.name.clone(), self.tools.len());
        self.tools.push(tool);
    }

    /// The tools offered at `step` and the tool choice, as the step's rules resolve
    /// ([`AgentSpec::rules_for`]); none on the last step.
    pub(crate) fn offer(&self, spec: &AgentSpec, step: u32, last: bool) -> (Vec<ToolDef>, Choice) {
        if last || self.tools.is_empty() {
            return (Vec::new(), Choice::Auto);
        }
        let plan = spec.rules_for(step);
        let offered = self
            .tools
            .iter()
            .filter(|tool| {
                plan.active
                    .is_none_or(|names| names.contains(&tool.def.name))
            })
            .map(|tool| tool.def.clone())
            .collect();
        let choice = match plan.choice {
            ToolChoice::Auto => Choice::Auto,
            ToolChoice::Required => Choice::Required,
            ToolChoice::None => Choice::None,
            ToolChoice::Tool(name) => Choice::Tool(name.clone()),
        };
        (offered, choice)
    }

    /// The tool of this name, if the run has one: the one lookup by name, for classification,
    /// approval and execution alike.
    pub(crate) fn find(&self, name: &str) -> Option<&Tool> {
        self.index.get(name).map(|&i| &self.tools[i])
    }

    /// Executes calls of one step in the order the model gave them, consecutive read-only
    /// calls together; results come back in the calls' order.
    pub(crate) async fn execute(
        &self,
        a: &Attempt<'_>,
        step: u32,
        calls: &[&ToolCall],
        parallel: usize,
    ) -> Vec<Timed> {
        self.execute_keyed(a, step, calls, parallel, None).await
    }

    /// [`ToolSet::execute`], every call with the idempotency key `key` if one is given (a
    /// graph's tool node, keyed by its node and execution), else its own.
    pub(crate) async fn execute_keyed(
        &self,
        a: &Attempt<'_>,
        step: u32,
        calls: &[&ToolCall],
        parallel: usize,
        key: Option<&str>,
    ) -> Vec<Timed> {
        let tool_of = |call: &ToolCall| self.find(&call.name);
        let read_only = |call: &ToolCall| tool_of(call).is_some_and(|tool| tool.read_only);
        // Program order, except that a run of consecutive read-only calls goes at once: a read
        // never overtakes the write the model asked for before it.
        let mut outputs = Vec::with_capacity(calls.len());
        let mut rest = calls;
        while let Some(first) = rest.first() {
            let batch = if read_only(first) {
                rest.iter()
                    .take_while(|call| read_only(call))
                    .count()
                    .min(parallel.max(1))
            } else {
                1
            };
            let (now, later) = rest.split_at(batch);
            outputs.extend(
                futures::future::join_all(now.iter().map(|call| async move {
                    let started_at = Utc::now();
                    let key = key.map_or_else(
                        || idempotency_key(a.claimed.run().id, step, &call.id),
                        str::to_owned,
                    );
                    let output = self.call(a, (step, &key), call, tool_of(call)).await;
                    Timed {
                        output,
                        started_at,
                        ended_at: Utc::now(),
                    }
                }))
                .await,
            );
            rest = later;
        }
        outputs
    }

    async fn call(
        &self,
        a: &Attempt<'_>,
        (step, key): (u32, &str),
        call: &ToolCall,
        tool: Option<&Tool>,
    ) -> ToolOutput {
        let Some(tool) = tool else {
            return ToolOutput::error(format!("unknown tool `{}`", call.name));
        };
        let kind = match tool.kind {
            Kind::Http(_) => "http",
            Kind::Mcp { .. } => "mcp",
            Kind::Client => "client",
            Kind::Agent(_) => "agent",
            Kind::Builtin(_) => "builtin",
        };
        // GenAI semantic conventions (see `super::genai`); the arguments and the result only
        // when the operator opts in to content.
        let span = tracing::info_span!("tool",
            otel.name = %format!("execute_tool {}", call.name),
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = %call.name,
            gen_ai.tool.call.id = %call.id,
            gen_ai.tool.type = super::genai::tool_type(kind),
            gen_ai.tool.description = tracing::field::Empty,
            gen_ai.tool.call.arguments = tracing::field::Empty,
            gen_ai.tool.call.result = tracing::field::Empty,
            error.type = tracing::field::Empty,
            tool.kind = kind,
            tool.outcome = tracing::field::Empty,
            run.step = i64::from(step));
        if !tool.def.description.is_empty() {
            span.record("gen_ai.tool.description", tool.def.description.as_str());
        }
        let capture = a.engine.capture_content;
        if capture {
            span.record("gen_ai.tool.call.arguments", call.arguments.as_str());
        }
        let started = std::time::Instant::now();
        let output = self
            .run_tool(a, key, call, tool)
            .instrument(span.clone())
            .await;
        let outcome = if output.is_error { "error" } else { "ok" };
        span.record("tool.outcome", outcome);
        if output.is_error {
            span.record("otel.status_code", "error");
            span.record("error.type", "tool_error");
        } else if capture {
            span.record("gen_ai.tool.call.result", output.content.as_str());
        }
        metrics::counter!("spool_tool_calls_total", "kind" => kind, "outcome" => outcome)
            .increment(1);
        metrics::histogram!("spool_tool_call_duration_seconds", "kind" => kind)
            .record(started.elapsed().as_secs_f64());
        truncate(output)
    }

    /// Parses the arguments and executes one call of `tool`, within the tool timeout.
    async fn run_tool(
        &self,
        a: &Attempt<'_>,
        key: &str,
        call: &ToolCall,
        tool: &Tool,
    ) -> ToolOutput {
        let arguments: Value = if call.arguments.trim().is_empty() {
            json!({})
        } else {
            match serde_json::from_str(&call.arguments) {
                Ok(arguments) => arguments,
                Err(err) => {
                    return ToolOutput::error(format!("the arguments are not valid JSON: {err}"));
                }
            }
        };
        let engine = a.engine;
        let call = async {
            match &tool.kind {
                Kind::Http(http) => {
                    let target = http::HttpTool {
                        url: &http.url,
                        method: &http.method,
                        headers: &http.headers,
                    };
                    http::call(&engine.http, &self.identity, &target, &arguments, key).await
                }
                Kind::Builtin(builtin) => {
                    let cx = builtin::Context {
                        db: a.db,
                        http: &engine.http,
                        identity: &self.identity,
                        tenant: &a.claimed.run().tenant_id,
                        idempotency_key: key,
                        enabled: engine.builtin_tools.enabled(*builtin),
                    };
                    builtin::call(&cx, *builtin, &arguments).await
                }
                Kind::Client => ToolOutput::error("client tools are executed by the client"),
                Kind::Agent(_) => ToolOutput::error("agent tools are answered by child runs"),
                Kind::Mcp { server, remote } => {
                    match server.session(engine, &self.identity).await {
                        Ok(session) => {
                            session
                                .call(remote, arguments, key, engine.tool_timeout)
                                .await
                        }
                        Err(err) => {
                            let error = without_urls(&format!("{err:#}"), &server.spec.url);
                            tracing::warn!(mcp.server = %server.spec.name, error,
                                "MCP server unavailable for a call");
                            ToolOutput::error(format!(
                                "the MCP server `{}` cannot be reached now",
                                server.spec.name
                            ))
                        }
                    }
                }
            }
        };
        match tokio::time::timeout(engine.tool_timeout, call).await {
            Ok(output) => output,
            Err(_) => ToolOutput::error(format!(
                "the tool did not answer within {:?}",
                engine.tool_timeout
            )),
        }
    }
}

/// The tools each of `servers` offers, discovered now, all at once within one tool timeout,
/// with the sessions opened; a server that cannot be reached, answers wrongly or is refused by
/// the network policy offers nothing (logged: a dead server only removes its tools).
async fn discover(
    engine: &Engine,
    servers: &[&McpToolSpec],
    identity: &Identity,
) -> (McpTools, Vec<(String, McpSession)>) {
    let connects = servers.iter().map(|mcp| async move {
        let server = McpServer::of(mcp);
        let connected = McpSession::connect(
            &server,
            &engine.http,
            identity,
            engine.tool_timeout,
            engine.mcp_max_tools,
        )
        .await;
        (*mcp, connected)
    });
    let mut found = McpTools::default();
    let mut sessions = Vec::new();
    for (mcp, connected) in futures::future::join_all(connects).await {
        match connected {
            Ok((session, tools)) => {
                found.0.insert(mcp.name.clone(), tools);
                sessions.push((mcp.name.clone(), session));
            }
            Err(err) => {
                let error = without_urls(&format!("{err:#}"), &mcp.url);
                tracing::warn!(mcp.server = %mcp.name, error,
                    "MCP server unavailable; running without its tools");
                found.0.insert(mcp.name.clone(), Vec::new());
            }
        }
    }
    (found, sessions)
}

/// Cuts a result over [`MAX_RESULT_CHARS`] characters, saying how much was cut.
fn truncate(mut output: ToolOutput) -> ToolOutput {
    output.content = steps::truncate(output.content);
    output
}

/// `text` without `url` and without reqwest's `for url (...)` notes: a configured URL may
/// carry a credential, and logs are read by more people than agent specs.
pub fn without_urls(text: &str, url: &str) -> String {
    let mut text = text.replace(url, "<url>");
    while let Some(start) = text.find(" for url (") {
        let end = text[start..]
            .find(')')
            .map_or(text.len(), |end| start + end + 1);
        text.replace_range(start..end, "");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::without_urls;

    #[test]
    fn logged_errors_lose_their_urls() {
        let url = "https://mcp.example/mcp?token=s3cret";
        let chain = format!(
            "MCP server gh: initialize failed: error sending request for url ({url}): \
             connection refused; also {url}"
        );
        let clean = without_urls(&chain, url);
        assert!(!clean.contains("s3cret"), "{clean}");
        assert_eq!(
            clean,
            "MCP server gh: initialize failed: error sending request: connection refused; also <url>"
        );
    }
}
