//! Write-only header values: tool, MCP and hook `headers` often carry credentials, so every
//! read of an agent shows them as [`REDACTED`], and a write that sends [`REDACTED`] back keeps
//! the stored value.
//!
//! A kept value is bound to its destination (DESIGN section 12): it is put back only for a tool
//! of the same name and kind, or a hook of the same event and matcher, whose URL has the same
//! origin (scheme, host and port) as the stored one. Otherwise one write could send a secret it
//! cannot read to a host of its choosing (`"url": "https://attacker.example"` with the headers
//! as read), or, with hooks matched by position, move one hook's credential to another's URL.
//! Such a write must resend the value (`secret_needs_reentry`).
//!
//! An MCP server's `auth` secrets (`token`, `client_secret`) are write-only the same way, and
//! bound the same way: kept only for the same server destination (and, for an OAuth client
//! secret, the same token endpoint origin, where it is sent). A secret sent as [`REDACTED`] or
//! left out is the stored one there, and a problem anywhere else.

use std::collections::BTreeMap;

use reqwest::Url;

use super::{AgentSpec, FieldError, HookKind, HookSpec, McpAuth, ToolSpec};

/// What a header's value reads as on every read of an agent: header values are write-only
/// (they are often credentials).
pub const REDACTED: &str = "<redacted>";

/// Where a tool or hook sends its headers: the kind of thing it is and its URL's origin.
#[derive(PartialEq, Eq)]
struct Destination {
    kind: &'static str,
    origin: Option<String>,
}

impl Destination {
    fn new(kind: &'static str, url: &str) -> Self {
        // An unparsable URL has no origin, and so matches nothing (validation refuses it).
        let origin = Url::parse(url)
            .ok()
            .map(|u| u.origin())
            .filter(|o| o.is_tuple())
            .map(|o| o.ascii_serialization());
        Self { kind, origin }
    }

    fn same_as(&self, other: &Self) -> bool {
        self.origin.is_some() && self == other
    }
}

impl AgentSpec {
    /// The spec as any reader sees it: every header value (tools, MCP servers, hooks) replaced
    /// by [`REDACTED`].
    pub fn redacted(mut self) -> Self {
        let redact = |headers: &mut BTreeMap<String, String>| {
            headers
                .values_mut()
                .for_each(|value| *value = REDACTED.to_owned());
        };
        self.tools
            .iter_mut()
            .filter_map(ToolSpec::headers_mut)
            .for_each(redact);
        self.tools
            .iter_mut()
            .filter_map(ToolSpec::auth_mut)
            .for_each(McpAuth::redact);
        self.hooks
            .iter_mut()
            .filter_map(HookSpec::headers_mut)
            .for_each(redact);
        if let Some(graph) = &mut self.graph_spec {
            graph
                .tools
                .functions
                .iter_mut()
                .filter_map(ToolSpec::headers_mut)
                .for_each(redact);
        }
        self
    }

    /// Puts back, for every header sent as [`REDACTED`], the value `stored` holds for it at the
    /// same destination: the same header of the tool of the same name and kind, or of the hook
    /// with the same event and matcher, whose URL has the same origin. A client that read an
    /// agent and writes it back keeps its secrets; one that points a tool or hook elsewhere must
    /// resend them. Every header sent as [`REDACTED`] with no value kept for it is a problem, by
    /// field path (the API answers them `secret_needs_reentry`).
    pub fn keep_redacted(&mut self, stored: Option<&AgentSpec>) -> Vec<FieldError> {
        let mut problems = Vec::new();
        let mut keep = |field: String,
                        headers: &mut BTreeMap<String, String>,
                        old: Option<&BTreeMap<String, String>>| {
            for (name, value) in headers.iter_mut().filter(|(_, v)| *v == REDACTED) {
                match old.and_then(|old| old.get(name)) {
                    Some(kept) => value.clone_from(kept),
                    None => problems.push(FieldError {
                        field: format!("{field}.{name}"),
                        message: format!(
                            "`{REDACTED}` stands for a value stored for this same destination \
                             (kind and URL origin); there is none, so send the value again"
                        ),
                    }),
                }
            }
        };
        let mut auth_problems = Vec::new();
        for (i, tool) in self.tools.iter_mut().enumerate() {
            let same = stored.and_then(|s| stored_same_tool(s, tool));
            let old = same.and_then(ToolSpec::headers);
            let old_auth = same.and_then(ToolSpec::auth);
            if let Some(headers) = tool.headers_mut() {
                keep(format!("tools[{i}].headers"), headers, old);
            }
            if let Some(auth) = tool.auth_mut() {
                auth_problems.extend(auth.keep_redacted(&format!("tools[{i}].auth"), old_auth));
            }
        }
        for (i, hook) in self.hooks.iter_mut().enumerate() {
            let old = stored.and_then(|s| stored_hook(s, hook));
            if let Some(headers) = hook.headers_mut() {
                keep(format!("hooks[{i}].headers"), headers, old);
            }
        }
        let stored_functions = stored
            .and_then(|s| s.graph_spec.as_ref())
            .map_or(&[][..], |g| &g.tools.functions[..]);
        if let Some(graph) = &mut self.graph_spec {
            for (i, tool) in graph.tools.functions.iter_mut().enumerate() {
                let old = stored_among(stored_functions, tool).and_then(ToolSpec::headers);
                if let Some(headers) = tool.headers_mut() {
                    keep(
                        format!("graph_spec.tools.functions[{i}].headers"),
                        headers,
                        old,
                    );
                }
            }
        }
        problems.extend(auth_problems);
        problems
    }
}

/// The stored tool `tool` replaces, if its secrets may be kept: the same name, kind and origin.
fn stored_same_tool<'a>(stored: &'a AgentSpec, tool: &ToolSpec) -> Option<&'a ToolSpec> {
    stored_among(&stored.tools, tool)
}

/// The tool among `stored` that `tool` replaces, if its secrets may be kept: the same name,
/// kind and origin.
fn stored_among<'a>(stored: &'a [ToolSpec], tool: &ToolSpec) -> Option<&'a ToolSpec> {
    let to = tool.destination()?;
    stored
        .iter()
        .find(|t| t.name() == tool.name())
        .filter(|t| t.destination().is_some_and(|d| d.same_as(&to)))
}

/// The stored headers of the hook `hook` replaces. A hook has no name: its identity is its
/// event, its matcher and its destination. The stored hook with the same URL wins; otherwise
/// the one with the same origin, if it is the only one (two would make the choice a guess).
fn stored_hook<'a>(stored: &'a AgentSpec, hook: &HookSpec) -> Option<&'a BTreeMap<String, String>> {
    let (HookKind::Http { url, .. }, Some(to)) = (&hook.kind, hook.destination()) else {
        return None;
    };
    let same = |h: &&HookSpec| {
        h.event == hook.event
            && h.matcher == hook.matcher
            && h.destination().is_some_and(|d| d.same_as(&to))
    };
    let exact = stored
        .hooks
        .iter()
        .filter(same)
        .find(|h| matches!(&h.kind, HookKind::Http { url: u, .. } if u == url));
    let only = || {
        let mut candidates = stored.hooks.iter().filter(same);
        candidates.next().filter(|_| candidates.next().is_none())
    };
    exact.or_else(only).and_then(HookSpec::headers)
}

impl ToolSpec {
    /// Its configured headers (HTTP and MCP tools).
    pub fn headers(&self) -> Option<&BTreeMap<String, String>> {
        match self {
            Self::Http(t) => Some(&t.headers),
            Self::Mcp(t) => Some(&t.headers),
            Self::Client(_) | Self::Agent(_) | Self::Builtin(_) => None,
        }
    }

    fn headers_mut(&mut self) -> Option<&mut BTreeMap<String, String>> {
        match self {
            Self::Http(t) => Some(&mut t.headers),
            Self::Mcp(t) => Some(&mut t.headers),
            Self::Client(_) | Self::Agent(_) | Self::Builtin(_) => None,
        }
    }

    /// Its MCP `auth`, if it is an MCP server that has one.
    pub fn auth(&self) -> Option<&McpAuth> {
        self.as_mcp().and_then(|t| t.auth.as_ref())
    }

    fn auth_mut(&mut self) -> Option<&mut McpAuth> {
        match self {
            Self::Mcp(t) => t.auth.as_mut(),
            _ => None,
        }
    }

    fn destination(&self) -> Option<Destination> {
        match self {
            Self::Http(t) => Some(Destination::new("http", &t.url)),
            Self::Mcp(t) => Some(Destination::new("mcp", &t.url)),
            Self::Client(_) | Self::Agent(_) | Self::Builtin(_) => None,
        }
    }

    /// The tool as any reader sees it: every header value and `auth` secret replaced by
    /// [`REDACTED`].
    pub fn redacted(mut self) -> Self {
        if let Some(headers) = self.headers_mut() {
            headers
                .values_mut()
                .for_each(|value| *value = REDACTED.to_owned());
        }
        if let Some(auth) = self.auth_mut() {
            auth.redact();
        }
        self
    }

    /// A tool resource's [`AgentSpec::keep_redacted`]: puts back, for every header sent as
    /// [`REDACTED`], the value of the same header of `stored` (the same resource, so its name
    /// may change) if it is of the same kind and its URL has the same origin. Every header sent
    /// as [`REDACTED`] with no value kept for it is a problem (`headers.{name}`).
    pub fn keep_redacted(&mut self, stored: Option<&ToolSpec>) -> Vec<FieldError> {
        let same = match (self.destination(), stored) {
            (Some(to), Some(stored)) if stored.destination().is_some_and(|d| d.same_as(&to)) => {
                Some(stored)
            }
            _ => None,
        };
        let old = same.and_then(ToolSpec::headers).cloned();
        let old_auth = same.and_then(ToolSpec::auth).cloned();
        let mut problems = Vec::new();
        if let Some(auth) = self.auth_mut() {
            problems.extend(auth.keep_redacted("auth", old_auth.as_ref()));
        }
        let Some(headers) = self.headers_mut() else {
            return problems;
        };
        for (name, value) in headers.iter_mut().filter(|(_, v)| *v == REDACTED) {
            match old.as_ref().and_then(|old| old.get(name)) {
                Some(kept) => value.clone_from(kept),
                None => problems.push(FieldError {
                    field: format!("headers.{name}"),
                    message: format!(
                        "`{REDACTED}` stands for a value stored for this same destination \
                         (kind and URL origin); there is none, so send the value again"
                    ),
                }),
            }
        }
        problems
    }
}

impl McpAuth {
    /// Replaces its secret by [`REDACTED`].
    fn redact(&mut self) {
        match self {
            Self::Bearer { token } => *token = REDACTED.to_owned(),
            Self::OauthClientCredentials { client_secret, .. } => {
                *client_secret = REDACTED.to_owned();
            }
        }
    }

    /// Puts back its secret if it is sent as [`REDACTED`] or left out (empty): the secret of
    /// `stored` (the auth of the same server destination, if any), when that is of the same type
    /// and, for client credentials, has a token endpoint of the same origin. Otherwise a problem
    /// on `{field}.token` or `{field}.client_secret`.
    fn keep_redacted(&mut self, field: &str, stored: Option<&McpAuth>) -> Option<FieldError> {
        let (secret, name, old) = match self {
            Self::Bearer { token } => {
                let old = match stored {
                    Some(Self::Bearer { token }) => Some(token),
                    _ => None,
                };
                (token, "token", old)
            }
            Self::OauthClientCredentials {
                token_url,
                client_secret,
                ..
            } => {
                let to = Destination::new("oauth", token_url);
                let old = match stored {
                    Some(Self::OauthClientCredentials {
                        token_url: u,
                        client_secret: s,
                        ..
                    }) if Destination::new("oauth", u).same_as(&to) => Some(s),
                    _ => None,
                };
                (client_secret, "client_secret", old)
            }
        };
        if !secret.is_empty() && secret != REDACTED {
            return None;
        }
        match old.filter(|old| !old.is_empty() && *old != REDACTED) {
            Some(kept) => {
                secret.clone_from(kept);
                None
            }
            None => Some(FieldError {
                field: format!("{field}.{name}"),
                message: format!(
                    "a secret sent as `{REDACTED}` or left out stands for one stored for this \
                     same destination (the server's and the token endpoint's origins); there is \
                     none, so send the value again"
                ),
            }),
        }
    }
}

impl HookSpec {
    /// Its configured headers (HTTP hooks).
    pub fn headers(&self) -> Option<&BTreeMap<String, String>> {
        match &self.kind {
            HookKind::Http { headers, .. } => Some(headers),
            _ => None,
        }
    }

    fn headers_mut(&mut self) -> Option<&mut BTreeMap<String, String>> {
        match &mut self.kind {
            HookKind::Http { headers, .. } => Some(headers),
            _ => None,
        }
    }

    fn destination(&self) -> Option<Destination> {
        match &self.kind {
            HookKind::Http { url, .. } => Some(Destination::new("http", url)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::spec;
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn header_values_read_as_redacted_and_writing_that_back_keeps_them() {
        let stored = spec(json!({"name": "a", "model": "demo", "tools": [
            {"type": "http", "name": "t", "url": "https://x.example", "headers": {"X-Key": "k1"}},
            {"type": "mcp", "name": "m", "url": "https://m.example", "headers": {"Authorization": "Bearer s"}}],
            "hooks": [{"event": "on_run_start", "type": "http", "url": "https://h.example",
                       "headers": {"X-Hook": "h1"}}]}));
        let read = stored.clone().redacted();
        let shown = serde_json::to_string(&read).expect("json");
        for secret in ["k1", "Bearer s", "h1"] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }
        assert_eq!(
            read.tools[0]
                .headers()
                .and_then(|h| h.get("X-Key"))
                .map(String::as_str),
            Some(REDACTED)
        );
        // Written back as read, with the tools in another order and one header changed.
        let mut written = read.clone();
        written.tools.reverse();
        if let Some(headers) = written.tools[1].headers_mut() {
            headers.insert("X-Key".into(), "k2".into());
        }
        assert_eq!(written.keep_redacted(Some(&stored)), []);
        assert_eq!(
            written.tools[0]
                .headers()
                .and_then(|h| h.get("Authorization"))
                .map(String::as_str),
            Some("Bearer s")
        );
        assert_eq!(
            written.tools[1]
                .headers()
                .and_then(|h| h.get("X-Key"))
                .map(String::as_str),
            Some("k2")
        );
        assert_eq!(
            written.hooks[0]
                .headers()
                .and_then(|h| h.get("X-Hook"))
                .map(String::as_str),
            Some("h1")
        );
        // `<redacted>` for a header nothing stored: refused, by field.
        let mut fresh = read.clone();
        let fields: Vec<String> = fresh
            .keep_redacted(None)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "tools[0].headers.X-Key",
                "tools[1].headers.Authorization",
                "hooks[0].headers.X-Hook"
            ]
        );
    }

    fn kept(written: &AgentSpec, tool: Option<usize>, hook: Option<usize>) -> Option<String> {
        let headers = match (tool, hook) {
            (Some(i), _) => written.tools[i].headers(),
            (_, Some(i)) => written.hooks[i].headers(),
            _ => None,
        };
        headers.and_then(|h| h.values().next().cloned())
    }

    #[test]
    fn a_kept_secret_is_bound_to_the_kind_and_origin_of_its_destination() {
        let stored = spec(json!({"name": "a", "model": "demo", "tools": [
            {"type": "http", "name": "t", "url": "https://x.example/a", "headers": {"X-Key": "k1"}}],
            "hooks": [
                {"event": "on_run_start", "type": "http", "url": "https://h1.example",
                 "headers": {"X-Hook": "h1"}},
                {"event": "on_run_start", "type": "http", "url": "https://h2.example",
                 "headers": {"X-Hook": "h2"}}]}));
        let read = stored.clone().redacted();
        let refused = |edit: &dyn Fn(&mut Value)| {
            let mut value = serde_json::to_value(&read).expect("json");
            edit(&mut value);
            let mut written = spec(value);
            let fields: Vec<String> = written
                .keep_redacted(Some(&stored))
                .into_iter()
                .map(|e| e.field)
                .collect();
            (fields, written)
        };
        // Same origin, another path: kept.
        let (fields, written) = refused(&|v| v["tools"][0]["url"] = json!("https://x.example/b"));
        assert_eq!(fields, Vec::<String>::new());
        assert_eq!(kept(&written, Some(0), None).as_deref(), Some("k1"));
        // Another host, scheme or port, or another kind: refused, never sent there.
        for (kind, url) in [
            ("http", "https://attacker.example/a"),
            ("http", "http://x.example/a"),
            ("http", "https://x.example:8443/a"),
            ("mcp", "https://x.example/a"),
        ] {
            let (fields, written) = refused(&|v| {
                v["tools"][0] = json!({"type": kind, "name": "t", "url": url,
                                       "headers": {"X-Key": REDACTED}});
            });
            assert_eq!(fields, ["tools[0].headers.X-Key"], "{kind}: {url}");
            assert_ne!(kept(&written, Some(0), None).as_deref(), Some("k1"));
        }
        // Hooks reordered: each keeps its own secret, not the one of the hook in its place.
        let (fields, written) = refused(&|v| {
            v["hooks"].as_array_mut().expect("hooks").reverse();
        });
        assert_eq!(fields, Vec::<String>::new());
        assert_eq!(kept(&written, None, Some(0)).as_deref(), Some("h2"));
        assert_eq!(kept(&written, None, Some(1)).as_deref(), Some("h1"));
        // A hook pointed elsewhere, or moved to another event: refused.
        let (fields, _) = refused(&|v| v["hooks"][0]["url"] = json!("https://attacker.example"));
        assert_eq!(fields, ["hooks[0].headers.X-Hook"]);
        let (fields, _) = refused(&|v| v["hooks"][1]["event"] = json!("pre_response"));
        assert_eq!(fields, ["hooks[1].headers.X-Hook"]);
    }

    #[test]
    fn an_mcp_server_s_auth_secret_is_write_only_and_bound_to_its_destinations() {
        let tool = |value: Value| -> ToolSpec { serde_json::from_value(value).expect("tool") };
        let stored = tool(
            json!({"type": "mcp", "name": "m", "url": "https://m.example/mcp",
            "auth": {"type": "oauth_client_credentials", "token_url": "https://auth.example/token",
                     "client_id": "c", "client_secret": "cs1"}}),
        );
        let read = stored.clone().redacted();
        assert!(!serde_json::to_string(&read).expect("json").contains("cs1"));
        let secret = |t: &ToolSpec| match t.auth() {
            Some(McpAuth::OauthClientCredentials { client_secret, .. }) => client_secret.clone(),
            _ => String::new(),
        };
        assert_eq!(secret(&read), REDACTED);
        // As read, or with the secret left out: kept.
        let mut written = read.clone();
        assert_eq!(written.keep_redacted(Some(&stored)), []);
        assert_eq!(secret(&written), "cs1");
        let mut omitted = tool(
            json!({"type": "mcp", "name": "m", "url": "https://m.example/other",
            "auth": {"type": "oauth_client_credentials", "token_url": "https://auth.example/t2",
                     "client_id": "c"}}),
        );
        assert_eq!(omitted.keep_redacted(Some(&stored)), []);
        assert_eq!(secret(&omitted), "cs1");
        // Another server origin, another token endpoint origin, or a bearer token: refused.
        for (url, token_url) in [
            ("https://attacker.example/mcp", "https://auth.example/token"),
            ("https://m.example/mcp", "https://attacker.example/token"),
        ] {
            let mut moved = tool(json!({"type": "mcp", "name": "m", "url": url,
                "auth": {"type": "oauth_client_credentials", "token_url": token_url,
                         "client_id": "c", "client_secret": REDACTED}}));
            let fields: Vec<String> = moved
                .keep_redacted(Some(&stored))
                .into_iter()
                .map(|e| e.field)
                .collect();
            assert_eq!(fields, ["auth.client_secret"], "{url} {token_url}");
            assert_ne!(secret(&moved), "cs1");
        }
        let mut bearer = tool(
            json!({"type": "mcp", "name": "m", "url": "https://m.example/mcp",
            "auth": {"type": "bearer", "token": REDACTED}}),
        );
        let fields: Vec<String> = bearer
            .keep_redacted(Some(&stored))
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(fields, ["auth.token"]);
        // Inline in an agent: redacted on every read, kept when written back.
        let agent = spec(json!({"name": "a", "model": "demo", "tools": [
            {"type": "mcp", "name": "m", "url": "https://m.example/mcp",
             "auth": {"type": "bearer", "token": "tok-1"}}]}));
        let read = agent.clone().redacted();
        assert!(
            !serde_json::to_string(&read)
                .expect("json")
                .contains("tok-1")
        );
        let mut written = read.clone();
        assert_eq!(written.keep_redacted(Some(&agent)), []);
        assert_eq!(written, agent);
        assert_eq!(
            read.clone()
                .keep_redacted(None)
                .into_iter()
                .map(|e| e.field)
                .collect::<Vec<_>>(),
            ["tools[0].auth.token"]
        );
    }
}
