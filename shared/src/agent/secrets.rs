//! Write-only header values: tool, MCP and hook `headers` often carry credentials, so every
//! read of an agent shows them as [`REDACTED`], and a write that sends [`REDACTED`] back keeps
//! the stored value.

use std::collections::BTreeMap;

use super::{AgentSpec, FieldError, HookKind, HookSpec, ToolSpec};

/// What a header's value reads as on every read of an agent: header values are write-only
/// (they are often credentials).
pub const REDACTED: &str = "<redacted>";

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
        self
    }

    /// Puts back, for every header sent as [`REDACTED`], the value `stored` holds for it: the
    /// same header of the tool of the same name, or of the hook at the same place. A client
    /// that read an agent and writes it back keeps its secrets. Every such header `stored` has
    /// no value for is a problem, by field path.
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
                        message: format!("`{REDACTED}` stands for a stored value; there is none"),
                    }),
                }
            }
        };
        for (i, tool) in self.tools.iter_mut().enumerate() {
            let old = stored
                .and_then(|s| s.tools.iter().find(|t| t.name() == tool.name()))
                .and_then(ToolSpec::headers);
            if let Some(headers) = tool.headers_mut() {
                keep(format!("tools[{i}].headers"), headers, old);
            }
        }
        for (i, hook) in self.hooks.iter_mut().enumerate() {
            let old = stored
                .and_then(|s| s.hooks.get(i))
                .and_then(HookSpec::headers);
            if let Some(headers) = hook.headers_mut() {
                keep(format!("hooks[{i}].headers"), headers, old);
            }
        }
        problems
    }
}

impl ToolSpec {
    /// Its configured headers (HTTP and MCP tools).
    pub fn headers(&self) -> Option<&BTreeMap<String, String>> {
        match self {
            Self::Http(t) => Some(&t.headers),
            Self::Mcp(t) => Some(&t.headers),
            Self::Client(_) | Self::Agent(_) => None,
        }
    }

    fn headers_mut(&mut self) -> Option<&mut BTreeMap<String, String>> {
        match self {
            Self::Http(t) => Some(&mut t.headers),
            Self::Mcp(t) => Some(&mut t.headers),
            Self::Client(_) | Self::Agent(_) => None,
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
}

#[cfg(test)]
mod tests {
    use super::super::test_support::spec;
    use super::*;
    use serde_json::json;

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
}
