//! Named model providers (`SPOOL_PROVIDERS`): a JSON list of `{"name", "kind": "openai" |
//! "anthropic", "base_url", "api_key_env"?, "models"?, "prices"?}`. The workers build a client for each;
//! the API checks at save that an agent's `provider` is one of them (and, when the provider
//! lists its `models`, that the agent's model and fallbacks are among them). Both read the same
//! variable.

use serde::{Deserialize, Serialize};

use crate::agent::{AgentSpec, FieldError};
use crate::pricing::Prices;

/// The wire format a provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// OpenAI Chat Completions (OpenAI, vLLM, Ollama, LiteLLM, ...).
    Openai,
    /// The Anthropic Messages API.
    Anthropic,
}

/// One named provider.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSpec {
    /// The name agents use (`provider`).
    pub name: String,
    /// Its wire format.
    pub kind: ProviderKind,
    /// The API's base URL, version included (`https://api.openai.com/v1`,
    /// `https://api.anthropic.com/v1`).
    pub base_url: String,
    /// The environment variable that holds its API key (read by the workers).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The models it serves, if it says (agents naming it may use only these; an agent that
    /// names no provider is served by the first provider listing its model).
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// The prices of its models (`{model: {input_per_mtok, output_per_mtok,
    /// cached_input_per_mtok?}}`, US dollars per million tokens); a model it serves without a
    /// price is unpriced (its calls' `cost_usd` is null).
    #[serde(default, skip_serializing_if = "Prices::is_empty")]
    pub prices: Prices,
}

/// The configured providers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Providers(pub Vec<ProviderSpec>);

impl Providers {
    /// Parses `SPOOL_PROVIDERS`; the error names the variable and what is wrong.
    pub fn parse(json: &str) -> Result<Self, String> {
        let fail = |what: String| format!("SPOOL_PROVIDERS: {what}");
        if json.trim().is_empty() {
            return Ok(Self::default());
        }
        let list: Vec<ProviderSpec> = serde_json::from_str(json).map_err(|e| {
            fail(format!(
                "not a JSON list of {{name, kind, base_url, api_key_env?, models?, prices?}}: {e}"
            ))
        })?;
        let mut names = std::collections::HashSet::new();
        for (i, provider) in list.iter().enumerate() {
            let name = &provider.name;
            let valid = (1..=64).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !valid {
                return Err(fail(format!(
                    "[{i}].name must be 1 to 64 characters of a-z, A-Z, 0-9, _ or -"
                )));
            }
            if !names.insert(name.clone()) {
                return Err(fail(format!("[{i}].name `{name}` is listed twice")));
            }
            let url = provider.base_url.as_str();
            if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 9 {
                return Err(fail(format!("[{i}].base_url must be an http or https URL")));
            }
            if provider.models.as_ref().is_some_and(Vec::is_empty) {
                return Err(fail(format!("[{i}].models must not be empty when given")));
            }
            if let Some((field, message)) = provider.prices.problems().into_iter().next() {
                return Err(fail(format!("[{i}].prices.{field} {message}")));
            }
        }
        Ok(Self(list))
    }

    /// The provider named `name`.
    pub fn find(&self, name: &str) -> Option<&ProviderSpec> {
        self.0.iter().find(|p| p.name == name)
    }

    /// The first provider that lists `model`.
    pub fn listing(&self, model: &str) -> Option<&ProviderSpec> {
        self.0
            .iter()
            .find(|p| p.models.iter().flatten().any(|m| m == model))
    }

    /// What an agent's `provider`, `model` and `fallback_models` get wrong against these
    /// providers (by field); empty when they fit.
    pub fn problems(&self, agent: &AgentSpec) -> Vec<FieldError> {
        let Some(name) = agent.provider.as_deref() else {
            return Vec::new();
        };
        let Some(provider) = self.find(name) else {
            let known: Vec<&str> = self.0.iter().map(|p| p.name.as_str()).collect();
            return vec![FieldError {
                field: "provider".into(),
                message: format!(
                    "no provider `{name}` is configured (SPOOL_PROVIDERS has {known:?})"
                ),
            }];
        };
        if agent.model.trim().is_empty() {
            return vec![FieldError {
                field: "model".into(),
                message: format!("must be given: provider `{name}` has no `default_model`"),
            }];
        }
        let Some(models) = &provider.models else {
            return Vec::new();
        };
        let named = std::iter::once(("model".to_owned(), &agent.model)).chain(
            agent
                .fallback_models
                .iter()
                .enumerate()
                .map(|(i, m)| (format!("fallback_models[{i}]"), m)),
        );
        named
            .filter(|(_, model)| !models.contains(model))
            .map(|(field, model)| FieldError {
                field,
                message: format!(
                    "provider `{name}` does not serve `{model}` (it lists {models:?})"
                ),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_parse_strictly_and_check_agents() {
        let providers = Providers::parse(
            r#"[{"name": "claude", "kind": "anthropic", "base_url": "https://api.anthropic.com/v1",
                 "api_key_env": "ANTHROPIC_API_KEY", "models": ["claude-sonnet-4-5"],
                 "prices": {"claude-sonnet-4-5": {"input_per_mtok": 3, "output_per_mtok": 15,
                                                  "cached_input_per_mtok": 0.3}}},
                {"name": "oai", "kind": "openai", "base_url": "https://api.openai.com/v1"}]"#,
        )
        .expect("valid");
        assert_eq!(
            providers.find("claude").map(|p| p.kind),
            Some(ProviderKind::Anthropic)
        );
        assert_eq!(
            providers
                .listing("claude-sonnet-4-5")
                .map(|p| p.name.as_str()),
            Some("claude")
        );
        assert_eq!(Providers::parse("").expect("empty"), Providers::default());
        let price = providers
            .find("claude")
            .and_then(|p| p.prices.get("claude-sonnet-4-5"));
        assert_eq!(price.map(|p| p.output_per_mtok.0), Some(15.0));
        for (bad, says) in [
            ("{", "not a JSON list"),
            (
                r#"[{"name": "a", "kind": "cohere", "base_url": "https://x.io"}]"#,
                "not a JSON list",
            ),
            (
                r#"[{"name": "a b", "kind": "openai", "base_url": "https://x.io"}]"#,
                "[0].name",
            ),
            (
                r#"[{"name": "a", "kind": "openai", "base_url": "ftp://x.io"}]"#,
                "[0].base_url",
            ),
            (
                r#"[{"name": "a", "kind": "openai", "base_url": "https://x.io"},
                 {"name": "a", "kind": "openai", "base_url": "https://y.io"}]"#,
                "listed twice",
            ),
            (
                r#"[{"name": "a", "kind": "openai", "base_url": "https://x.io", "models": []}]"#,
                "[0].models",
            ),
            (
                r#"[{"name": "a", "kind": "openai", "base_url": "https://x.io",
                     "prices": {"m": {"input_per_mtok": -2, "output_per_mtok": 1}}}]"#,
                "[0].prices.m.input_per_mtok must be a number from 0",
            ),
            (
                r#"[{"name": "a", "kind": "openai", "base_url": "https://x.io",
                     "prices": {"m": {"input_per_mtok": 1}}}]"#,
                "not a JSON list",
            ),
        ] {
            let err = Providers::parse(bad).expect_err(bad);
            assert!(
                err.starts_with("SPOOL_PROVIDERS: ") && err.contains(says),
                "{bad}: {err}"
            );
        }
        let mut agent = AgentSpec::default_agent("claude-sonnet-4-5", "");
        assert_eq!(providers.problems(&agent), []);
        agent.provider = Some("claude".into());
        agent.fallback_models = vec!["claude-haiku-4-5".into()];
        let fields: Vec<String> = providers
            .problems(&agent)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(fields, ["fallback_models[0]"]);
        agent.provider = Some("ghost".into());
        assert_eq!(providers.problems(&agent)[0].field, "provider");
    }
}
