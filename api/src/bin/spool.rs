//! `spool`: a terminal client of a Spool server (docs/clients.md), configured by `SPOOL_URL`
//! (default `http://127.0.0.1:8080`) and `SPOOL_TOKEN`.
//!
//! - `spool chat [THREAD]`: sends each line you type (or each line of stdin, when it is not a
//!   terminal) as a message and streams the reply to stdout; progress (queued, tool steps,
//!   pauses, reconnects) goes to stderr. A dropped connection is resumed with `Last-Event-ID`,
//!   and a crashed worker's new attempt does not print text twice (the reply is followed
//!   through the same transcript as every other client format). Exits 0 at end of input.
//! - `spool threads list|show ID`, `spool runs list [--thread ID]|show ID`,
//!   `spool agents list|get ID|apply -f FILE [--patch] [--dry-run]|validate -f FILE|delete ID`,
//!   `spool tools list|get ID|apply -f FILE|delete ID|probe ID`: JSON on stdout.
//!
//! Errors are one line on stderr: a server's error (its status, code and message) exits 1; an
//! unreachable server or a missing `SPOOL_TOKEN` exits 2.
//!
//! Over 800 lines: one small function per subcommand, each a request and its printing, in one
//! binary's root (a `mod` file beside it would be taken by cargo for another binary); the
//! streaming of `spool chat` is the library's transcript, not here.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;

use spool_shared::event::transcript::{Shown, Transcript};
use spool_shared::event::{Data, Event, Step};

/// A terminal client of a Spool server.
#[derive(Debug, Parser)]
#[command(name = "spool", version)]
struct Cli {
    /// The server's base URL.
    #[arg(long, env = "SPOOL_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// A bearer token (`spool-api token --sub U --tenant T`); required.
    #[arg(long, env = "SPOOL_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Chat on a thread (a new one if none is given): each line is a message.
    Chat {
        /// The thread (any UUID: created on first use).
        thread: Option<uuid::Uuid>,
        /// The agent that answers (else the thread's, else the default).
        #[arg(long)]
        agent: Option<uuid::Uuid>,
    },
    /// Threads: `list`, `show ID` (with its messages).
    Threads {
        #[command(subcommand)]
        action: ListShow,
    },
    /// Runs: `list [--thread ID]`, `show ID`.
    Runs {
        #[command(subcommand)]
        action: RunsAction,
    },
    /// Agents: `list`, `get ID`, `apply -f FILE` (create, or replace the one its `id` names),
    /// `delete ID`.
    Agents {
        #[command(subcommand)]
        action: AgentsAction,
    },
    /// Tools (resources agents reference with `tool_ids`): `list`, `get ID`, `apply -f FILE`
    /// (create, or replace the one its `id` names), `delete ID`, `probe ID` (an MCP server).
    Tools {
        #[command(subcommand)]
        action: ToolsAction,
    },
    /// The tenant's model providers and keys (`providers:write`): `list`, `get ID`,
    /// `apply -f FILE` (create, or change the one its `id` names), `delete ID`.
    Providers {
        #[command(subcommand)]
        action: ProvidersAction,
    },
}

#[derive(Debug, Subcommand)]
enum ProvidersAction {
    /// All of the tenant's, newest first.
    List,
    /// One, by id (its key shows as `"<redacted>"`).
    Get { id: uuid::Uuid },
    /// Creates the provider in FILE (JSON), or changes the one its `id` field names (what
    /// `get` prints applies as it is: the key read as `"<redacted>"` is kept while `base_url`
    /// keeps its destination).
    Apply {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Deletes one.
    Delete { id: uuid::Uuid },
}

#[derive(Debug, Subcommand)]
enum ToolsAction {
    /// All of the tenant's, newest first.
    List,
    /// One, by id.
    Get { id: uuid::Uuid },
    /// Creates the tool in FILE (JSON), or replaces the one its `id` field names (what `get`
    /// prints applies as it is: header values read as `"<redacted>"` are kept).
    Apply {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Deletes one (refused while an agent references it).
    Delete { id: uuid::Uuid },
    /// Probes an MCP server now (initialize and `tools/list`, at most 30 s) and prints it with
    /// its `status`, `error` and `discovered_tools`.
    Probe { id: uuid::Uuid },
}

#[derive(Debug, Subcommand)]
enum ListShow {
    /// The newest first.
    List,
    /// One, by id.
    Show { id: uuid::Uuid },
}

#[derive(Debug, Subcommand)]
enum RunsAction {
    /// The newest first.
    List {
        /// Only this thread's.
        #[arg(long)]
        thread: Option<uuid::Uuid>,
    },
    /// One, by id.
    Show { id: uuid::Uuid },
}

#[derive(Debug, Subcommand)]
enum AgentsAction {
    /// All of the tenant's.
    List,
    /// One, by id.
    Get { id: uuid::Uuid },
    /// Creates the agent in FILE (JSON), or replaces the one its `id` field names.
    Apply {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// For an existing `id`: change only the top-level fields FILE has (PATCH), not the
        /// whole agent.
        #[arg(long)]
        patch: bool,
        /// Validate only; store nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Validates the agent in FILE (JSON) and stores nothing: prints `{valid, errors}` and
    /// exits 1 if it is not valid.
    Validate {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Deletes one.
    Delete { id: uuid::Uuid },
}

/// The server, with the token.
struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = response.status();
        let body: Value = if status == reqwest::StatusCode::NO_CONTENT {
            Value::Null
        } else {
            response.json().await.unwrap_or(Value::Null)
        };
        if !status.is_success() {
            let error = &body["error"];
            // Problems by field (an invalid agent's, say), one per line after the message.
            let problems: String = error["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    format!(
                        "\n  {}: {}",
                        e["field"].as_str().unwrap_or(""),
                        e["message"].as_str().unwrap_or("")
                    )
                })
                .collect();
            bail!(
                "{} {}: {}{problems}",
                status.as_u16(),
                error["code"].as_str().unwrap_or("error"),
                error["message"].as_str().unwrap_or("")
            );
        }
        Ok(body)
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(reqwest::Method::GET, path, None).await
    }
}

/// `text` without what a terminal would act on: escape sequences (CSI, OSC such as the clipboard
/// write OSC 52 or hyperlinks, and the rest) and every other control character but newline and
/// tab. Model and tool output reach the terminal through this: a prompt injection in a fetched
/// page must not rewrite the screen, the window title or the clipboard. (JSON output needs
/// none of it: serde_json escapes control characters.)
fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let keep = |c: char| c == '\n' || c == '\t' || !c.is_control();
    if text.chars().all(keep) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            // ESC, or the 8-bit CSI and OSC introducers.
            '\u{1b}' | '\u{9b}' | '\u{9d}' => {
                let kind = if c == '\u{1b}' { chars.next() } else { Some(c) };
                match kind {
                    // CSI: parameters and intermediates, then one final byte.
                    Some('[' | '\u{9b}') => {
                        for c in chars.by_ref() {
                            if ('\u{40}'..='\u{7e}').contains(&c) {
                                break;
                            }
                        }
                    }
                    // OSC, DCS, SOS, PM, APC: a string up to BEL or ST (ESC \\).
                    Some(']' | 'P' | 'X' | '^' | '_' | '\u{9d}') => {
                        while let Some(c) = chars.next() {
                            if c == '\u{7}' || c == '\u{9c}' {
                                break;
                            }
                            if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                                chars.next();
                                break;
                            }
                        }
                    }
                    // A two-character sequence (ESC c, ESC 7, ...): both go.
                    _ => {}
                }
            }
            c if keep(c) => out.push(c),
            _ => {}
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The JSON in `file`.
fn read_json(file: &std::path::Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))
}

fn print(value: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Checked here rather than by clap, whose missing-argument error is a usage block: a
    // missing token is one line, like every other misuse.
    let Some(token) = cli.token.filter(|token| !token.trim().is_empty()) else {
        eprintln!(
            "spool: no token: set SPOOL_TOKEN or pass --token (an operator makes one with \
             `spool-api token --sub USER --tenant TENANT`)"
        );
        return std::process::ExitCode::from(2);
    };
    let client = Client {
        http: reqwest::Client::new(),
        base: cli.url.trim_end_matches('/').to_owned(),
        token,
    };
    match run(&client, cli.command).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // Unreachable (exit 2, like a usage error such as a missing token), or answered with
        // an error (exit 1): one line either way.
        Err(err) if err.chain().any(|cause| cause.is::<reqwest::Error>()) => {
            eprintln!("spool: {}", printable(&format!("{err:#}")));
            std::process::ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("spool: {}", printable(&format!("{err:#}")));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(client: &Client, command: Command) -> anyhow::Result<()> {
    use reqwest::Method;
    match command {
        Command::Chat { thread, agent } => chat(client, thread, agent).await,
        Command::Threads { action } => match action {
            ListShow::List => print(&client.get("/v1/threads").await?),
            ListShow::Show { id } => {
                let mut thread = client.get(&format!("/v1/threads/{id}")).await?;
                let messages = client.get(&format!("/v1/threads/{id}/messages")).await?;
                thread["messages"] = messages["messages"].clone();
                print(&thread)
            }
        },
        Command::Runs { action } => match action {
            RunsAction::List { thread } => {
                let query = thread.map_or_else(String::new, |t| format!("?thread_id={t}"));
                print(&client.get(&format!("/v1/workflows{query}")).await?)
            }
            RunsAction::Show { id } => print(&client.get(&format!("/v1/workflows/{id}")).await?),
        },
        Command::Agents { action } => match action {
            AgentsAction::List => print(&client.get("/v1/agents").await?),
            AgentsAction::Get { id } => print(&client.get(&format!("/v1/agents/{id}")).await?),
            AgentsAction::Apply {
                file,
                patch,
                dry_run,
            } => {
                let mut spec = read_json(&file)?;
                let id = spec
                    .as_object_mut()
                    .and_then(|spec| spec.remove("id"))
                    .and_then(|id| id.as_str().map(str::to_owned));
                let query = if dry_run { "?dry_run=true" } else { "" };
                let agent = match id {
                    Some(id) => {
                        let method = if patch { Method::PATCH } else { Method::PUT };
                        let path = format!("/v1/agents/{id}{query}");
                        client.call(method, &path, Some(&spec)).await?
                    }
                    None => {
                        let path = format!("/v1/agents{query}");
                        client.call(Method::POST, &path, Some(&spec)).await?
                    }
                };
                print(&agent)
            }
            AgentsAction::Validate { file } => {
                let spec = read_json(&file)?;
                let report = client
                    .call(Method::POST, "/v1/agents/validate", Some(&spec))
                    .await?;
                print(&report)?;
                if report["valid"] != Value::Bool(true) {
                    bail!("{} is not a valid agent", file.display());
                }
                Ok(())
            }
            AgentsAction::Delete { id } => {
                client
                    .call(Method::DELETE, &format!("/v1/agents/{id}"), None)
                    .await?;
                Ok(())
            }
        },
        Command::Tools { action } => tools(client, action).await,
        Command::Providers { action } => providers(client, action).await,
    }
}

/// `spool tools ...`.
async fn tools(client: &Client, action: ToolsAction) -> anyhow::Result<()> {
    use reqwest::Method;
    match action {
        ToolsAction::List => {
            // Every page, so the output is the whole list as `agents list` prints its.
            let mut data = Vec::new();
            let mut path = "/v1/tools?limit=100".to_owned();
            loop {
                let page = client.get(&path).await?;
                data.extend(page["data"].as_array().cloned().unwrap_or_default());
                match page["next_cursor"].as_str() {
                    Some(cursor) => path = format!("/v1/tools?limit=100&cursor={cursor}"),
                    None => break,
                }
            }
            print(&json!({ "data": data }))
        }
        ToolsAction::Get { id } => print(&client.get(&format!("/v1/tools/{id}")).await?),
        ToolsAction::Apply { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let mut spec: Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", file.display()))?;
            let fields = spec
                .as_object_mut()
                .with_context(|| format!("{} is not a JSON object", file.display()))?;
            // What the server adds to a tool it shows, so the output of `get` applies as is.
            for added in [
                "created_at",
                "updated_at",
                "status",
                "last_probed_at",
                "error",
                "discovered_tools",
            ] {
                fields.remove(added);
            }
            let id = fields
                .remove("id")
                .and_then(|id| id.as_str().map(str::to_owned));
            let tool = match id {
                Some(id) => {
                    client
                        .call(Method::PUT, &format!("/v1/tools/{id}"), Some(&spec))
                        .await?
                }
                None => client.call(Method::POST, "/v1/tools", Some(&spec)).await?,
            };
            print(&tool)
        }
        ToolsAction::Delete { id } => {
            client
                .call(Method::DELETE, &format!("/v1/tools/{id}"), None)
                .await?;
            Ok(())
        }
        ToolsAction::Probe { id } => print(
            &client
                .call(Method::POST, &format!("/v1/tools/{id}/probe"), None)
                .await?,
        ),
    }
}

/// `spool providers ...`.
async fn providers(client: &Client, action: ProvidersAction) -> anyhow::Result<()> {
    use reqwest::Method;
    match action {
        ProvidersAction::List => {
            let mut data = Vec::new();
            let mut path = "/v1/providers?limit=100".to_owned();
            loop {
                let page = client.get(&path).await?;
                data.extend(page["data"].as_array().cloned().unwrap_or_default());
                match page["next_cursor"].as_str() {
                    Some(cursor) => path = format!("/v1/providers?limit=100&cursor={cursor}"),
                    None => break,
                }
            }
            print(&json!({ "data": data }))
        }
        ProvidersAction::Get { id } => print(&client.get(&format!("/v1/providers/{id}")).await?),
        ProvidersAction::Apply { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let mut spec: Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", file.display()))?;
            let fields = spec
                .as_object_mut()
                .with_context(|| format!("{} is not a JSON object", file.display()))?;
            for added in ["created_at", "updated_at"] {
                fields.remove(added);
            }
            let id = fields
                .remove("id")
                .and_then(|id| id.as_str().map(str::to_owned));
            let provider = match id {
                // A merge patch of every field the file has.
                Some(id) => {
                    client
                        .call(Method::PATCH, &format!("/v1/providers/{id}"), Some(&spec))
                        .await?
                }
                None => {
                    client
                        .call(Method::POST, "/v1/providers", Some(&spec))
                        .await?
                }
            };
            print(&provider)
        }
        ProvidersAction::Delete { id } => {
            client
                .call(Method::DELETE, &format!("/v1/providers/{id}"), None)
                .await?;
            Ok(())
        }
    }
}

/// The chat loop (see the module doc).
async fn chat(
    client: &Client,
    thread: Option<uuid::Uuid>,
    agent: Option<uuid::Uuid>,
) -> anyhow::Result<()> {
    let thread = thread.unwrap_or_else(uuid::Uuid::new_v4);
    let interactive = std::io::stdin().is_terminal();
    eprintln!("spool: thread {thread}");
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next_line().await? else {
            return Ok(());
        };
        if line.trim().is_empty() {
            continue;
        }
        let mut body = json!({"input_text": line});
        if let Some(agent) = agent {
            body["agent_id"] = json!(agent);
        }
        let accepted = send(client, thread, &body).await?;
        let message = accepted["message_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        follow(client, thread, &message).await?;
    }
}

/// Posts a message, retrying a connection failure with the same `Idempotency-Key` (a retry
/// after a lost answer is the same run, not a second one).
async fn send(client: &Client, thread: uuid::Uuid, body: &Value) -> anyhow::Result<Value> {
    let key = uuid::Uuid::new_v4().to_string();
    let mut tries = 0;
    loop {
        let response = client
            .http
            .post(format!("{}/v1/threads/{thread}/user_message", client.base))
            .bearer_auth(&client.token)
            .header("Idempotency-Key", &key)
            .json(body)
            .send()
            .await;
        match response {
            Ok(response) => {
                let status = response.status();
                let answer: Value = response.json().await.unwrap_or(Value::Null);
                if status.is_success() {
                    return Ok(answer);
                }
                bail!(
                    "{} {}: {}",
                    status.as_u16(),
                    answer["error"]["code"].as_str().unwrap_or("error"),
                    answer["error"]["message"].as_str().unwrap_or("")
                );
            }
            Err(err) if tries < 10 => {
                tries += 1;
                eprintln!("spool: {err}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// How a followed reply ended.
enum Followed {
    /// Its `done` came.
    Done,
    /// The connection ended first: resume.
    Cut,
    /// The gateway says it no longer streams: the stored message is the answer.
    Stored,
    /// The stream lost events after the cursor: follow the reply again from its start.
    Reset,
}

/// Streams the reply `message` to stdout until its `done`, resuming dropped connections.
async fn follow(client: &Client, thread: uuid::Uuid, message: &str) -> anyhow::Result<()> {
    let mut reply = Reply {
        transcript: Transcript::new(),
        message: message.to_owned(),
        cursor: None,
        printed: false,
        text: String::new(),
        replay: None,
    };
    let mut failures = 0;
    loop {
        match reply.session(client, thread).await {
            Ok(Followed::Done) => break,
            Ok(Followed::Stored) => {
                let messages = client
                    .get(&format!("/v1/threads/{thread}/messages"))
                    .await?;
                let stored = messages["messages"]
                    .as_array()
                    .and_then(|all| all.iter().find(|m| m["id"] == message))
                    .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                    .unwrap_or_default();
                if reply.printed {
                    eprintln!("\nspool: the stream was lost; the stored reply:");
                }
                print!("{}", printable(&stored));
                break;
            }
            Ok(Followed::Cut) => {
                failures = 0;
                eprintln!("\nspool: the connection dropped; resuming");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(Followed::Reset) => {
                eprintln!("\nspool: the stream lost events; following the reply from its start");
                reply.restart();
            }
            Err(err) if failures < 30 => {
                failures += 1;
                eprintln!("\nspool: {err:#}; resuming");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(err) => return Err(err),
        }
    }
    println!();
    std::io::stdout().flush()?;
    Ok(())
}

/// A reply being followed: its transcript and the last entry id seen.
struct Reply {
    transcript: Transcript,
    message: String,
    cursor: Option<String>,
    printed: bool,
    /// Every piece of text printed so far.
    text: String,
    /// After a reset: the text the new transcript has produced, while it repeats `text`.
    replay: Option<String>,
}

impl Reply {
    /// Follows the reply again from its `message_start`, printing only what goes beyond the
    /// text already printed.
    fn restart(&mut self) {
        self.transcript = Transcript::new();
        self.cursor = None;
        self.replay = Some(String::new());
    }

    /// Prints a delta (after a reset, only what was not printed yet).
    fn print(&mut self, delta: &str) {
        let fresh = match &mut self.replay {
            None => delta.to_owned(),
            Some(replay) => {
                replay.push_str(delta);
                if self.text.starts_with(replay.as_str()) {
                    return;
                }
                let fresh = match replay.strip_prefix(self.text.as_str()) {
                    Some(rest) => rest.to_owned(),
                    // Written anew: start a new line.
                    None => format!("\n{replay}"),
                };
                self.replay = None;
                fresh
            }
        };
        print!("{}", printable(&fresh));
        self.text.push_str(&fresh);
        self.printed = true;
        let _ = std::io::stdout().flush();
    }

    /// One connection to the stream: from the cursor, or the message's start.
    async fn session(&mut self, client: &Client, thread: uuid::Uuid) -> anyhow::Result<Followed> {
        let url = format!("{}/v1/threads/{thread}/stream", client.base);
        let request = match &self.cursor {
            Some(cursor) => client.http.get(url).header("Last-Event-ID", cursor),
            // A message id is a UUID: nothing to escape.
            None => client
                .http
                .get(format!("{url}?last_message_id={}", self.message)),
        };
        let request = request.bearer_auth(&client.token);
        let response = request.send().await?;
        if !response.status().is_success() {
            bail!("the stream answered {}", response.status());
        }
        let mut events = sse_stream::SseStream::from_bytes_stream(response.bytes_stream());
        let mut announced = false;
        loop {
            let next = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
            let sse = match next {
                Err(_) => {
                    if !announced && self.cursor.is_none() {
                        announced = true;
                        eprintln!("spool: (queued)");
                    }
                    continue;
                }
                Ok(None) => return Ok(Followed::Cut),
                Ok(Some(Err(err))) => bail!("the stream failed: {err}"),
                Ok(Some(Ok(sse))) => sse,
            };
            let kind = sse.event.as_deref().unwrap_or("message");
            match kind {
                "message_not_streaming" => return Ok(Followed::Stored),
                "stream_reset" => return Ok(Followed::Reset),
                _ => {}
            }
            let Some(data) = sse.data.as_deref() else {
                continue;
            };
            let Ok(event) = serde_json::from_str::<Event>(data) else {
                continue;
            };
            if let Some(id) = sse.id {
                self.cursor = Some(id);
            }
            if event.depth > 0 {
                show_nested(&event);
                continue;
            }
            if event.message_id.to_string() != self.message {
                continue;
            }
            if self.show(&event) {
                return Ok(Followed::Done);
            }
        }
    }

    /// Prints what the event adds; `true` at the reply's `done`. (An agent run the reply
    /// started: see [`show_nested`].)
    fn show(&mut self, event: &Event) -> bool {
        for shown in self.transcript.push(event) {
            match shown {
                Shown::TextDelta { delta, .. } => self.print(&delta),
                Shown::TextEnded {
                    superseded: true, ..
                } => eprintln!("\nspool: (the worker restarted and wrote this part anew)"),
                _ => {}
            }
        }
        match &event.data {
            Data::Step(Step::Call(call)) => {
                eprintln!("spool: (tool {})", printable(&call.tool_name));
            }
            Data::RequiresAction(_) => {
                eprintln!(
                    "spool: (paused: the run waits for client tool outputs: POST /v1/workflows/{}/tool_outputs)",
                    event.workflow_id
                );
            }
            Data::InputRequested(input) => {
                eprintln!(
                    "spool: (paused: the agent asks: {}\n  answer with POST /v1/workflows/{}/input {{\"text\": ...}})",
                    printable(&input.prompt),
                    event.workflow_id
                );
            }
            Data::ApprovalRequested(approval) => {
                eprintln!(
                    "spool: (paused: tool {} waits for an approval: POST /v1/workflows/{}/approvals/{})",
                    printable(&approval.tool_name),
                    event.workflow_id,
                    printable(&approval.tool_call_id)
                );
            }
            Data::Error(failure) => {
                eprintln!(
                    "\nspool: error {}: {}",
                    failure.code.as_str(),
                    printable(&failure.message)
                );
            }
            Data::Done(_) => return true,
            _ => {}
        }
        false
    }
}

/// Tells what an agent run the reply started is doing (its text becomes the agent tool's
/// result, which the model answers from): that it works, its tool calls, what it waits for.
fn show_nested(event: &Event) {
    let indent = "  ".repeat(event.depth as usize);
    match &event.data {
        Data::MessageStart(_) => {
            eprintln!("spool: {indent}(agent run {} working)", event.workflow_id);
        }
        Data::Step(Step::Call(call)) => {
            eprintln!("spool: {indent}(tool {})", printable(&call.tool_name));
        }
        Data::RequiresAction(_) | Data::ApprovalRequested(_) | Data::InputRequested(_) => {
            eprintln!(
                "spool: {indent}(paused: agent run {} waits: GET /v1/workflows/{})",
                event.workflow_id, event.workflow_id
            );
        }
        Data::Done(done) => {
            eprintln!(
                "spool: {indent}(agent run {} {})",
                event.workflow_id,
                done.status.as_str()
            );
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn escape_sequences_and_control_characters_never_reach_the_terminal() {
        let hostile = "Done.\u{1b}]52;c;cm0gLXJmIH4=\u{7} \u{1b}[2J\u{1b}[1;1HApproved\u{1b}]8;;https://evil\u{1b}\\link\u{1b}]8;;\u{1b}\\ \u{9b}31mred\u{7}\u{8}\r!";
        assert_eq!(printable(hostile), "Done. Approvedlink red!");
        let plain = "line one\n\tline two, üñí 日本";
        assert!(matches!(printable(plain), std::borrow::Cow::Borrowed(_)));
        assert_eq!(printable(plain), plain);
    }
}
