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

use std::collections::BTreeMap;

use reqwest::Url;

use super::{AgentSpec, FieldError, HookKind, HookSpec, ToolSpec};

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
        for (i, tool) in self.tools.iter_mut().enumerate() {
            let old = stored.and_then(|s| stored_tool(s, tool));
            if let Some(headers) = tool.headers_mut() {
                keep(format!("tools[{i}].headers"), headers, old);
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
                let old = stored_among(stored_functions, tool);
                if let Some(headers) = tool.headers_mut() {
                    keep(
                        format!("graph_spec.tools.functions[{i}].headers"),
                        headers,
                        old,
                    );
                }
            }
        }
        problems
    }
}

/// The stored headers of the tool `tool` replaces: the same name, kind and origin.
fn stored_tool<'a>(stored: &'a AgentSpec, tool: &ToolSpec) -> Option<&'a BTreeMap<String, String>> {
    stored_among(&stored.tools, tool)
}

/// The stored headers, among `stored`, of the tool `tool` replaces: the same name, kind and
/// origin.
fn stored_among<'a>(
    stored: &'a [ToolSpec],
    tool: &ToolSpec,
) -> Option<&'a BTreeMap<String, String>> {
    let to = tool.destination()?;
    stored
        .iter()
        .find(|t| t.name() == tool.name())
        .filter(|t| t.destination().is_some_and(|d| d.same_as(&to)))
        .and_then(ToolSpec::headers)
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

    fn destination(&self) -> Option<Destination> {
        match self {
            Self::Http(t) => Some(Destination::new("http", &t.url)),
            Self::Mcp(t) => Some(Destination::new("mcp", &t.url)),
            Self::Client(_) | Self::Agent(_) | Self::Builtin(_) => None,
        }
    }

    /// The tool as any reader sees it: every header value replaced by [`REDACTED`].
    pub fn redacted(mut self) -> Self {
        if let Some(headers) = self.headers_mut() {
            headers
                .values_mut()
                .for_each(|value| *value = REDACTED.to_owned());
        }
        self
    }

    /// A tool resource's [`AgentSpec::keep_redacted`]: puts back, for every header sent as
    /// [`REDACTED`], the value of the same header of `stored` (the same resource, so its name
    /// may change) if it is of the same kind and its URL has the same origin. Every header sent
    /// as [`REDACTED`] with no value kept for it is a problem (`headers.{name}`).
    pub fn keep_redacted(&mut self, stored: Option<&ToolSpec>) -> Vec<FieldError> {
        let old = match (self.destination(), stored) {
            (Some(to), Some(stored)) if stored.destination().is_some_and(|d| d.same_as(&to)) => {
                stored.headers().cloned()
            }
            _ => None,
        };
        let mut problems = Vec::new();
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
}
