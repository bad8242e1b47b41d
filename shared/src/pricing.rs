//! Prices of models (DESIGN sections 9 and 12): `{model: {input_per_mtok, output_per_mtok,
//! cached_input_per_mtok?}}`, US dollars per million tokens, as a provider of
//! `SPOOL_PROVIDERS` (`prices`) or the unnamed provider (`SPOOL_LLM_PRICES`) carries them. A
//! model call's cost is computed once, when it answered, from the price of the model that
//! answered; a model with no price is unpriced: its cost is unknown (`cost_usd: null`), never 0.
//!
//! The table is a type of its own so that every place that holds prices (the operator's
//! providers today, a tenant's provider resource later) validates and prices the same way.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::run::Usage;

/// An amount of US dollars: always a finite number (prices and budgets are validated, and a
/// cost is a sum of their products with token counts), so it compares as equal to itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Usd(pub f64);

impl Eq for Usd {}

impl std::fmt::Display for Usd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "${}", self.0)
    }
}

/// The price of one model, in US dollars per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// Prompt tokens not read from the provider's cache.
    #[schema(value_type = f64, minimum = 0)]
    pub input_per_mtok: Usd,
    /// Generated tokens (reasoning included).
    #[schema(value_type = f64, minimum = 0)]
    pub output_per_mtok: Usd,
    /// Prompt tokens read from the provider's cache (`input_per_mtok` when not given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<f64>, minimum = 0)]
    pub cached_input_per_mtok: Option<Usd>,
}

impl ModelPrice {
    /// What `usage` costs at this price: uncached prompt tokens at `input_per_mtok`, cached
    /// ones at `cached_input_per_mtok`, generated ones at `output_per_mtok`.
    pub fn cost(&self, usage: &Usage) -> Usd {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let uncached = usage.input_tokens - cached;
        let cached_price = self.cached_input_per_mtok.unwrap_or(self.input_per_mtok);
        // Token counts are far below 2^53: exact as f64.
        let dollars = (uncached as f64 * self.input_per_mtok.0
            + cached as f64 * cached_price.0
            + usage.output_tokens as f64 * self.output_per_mtok.0)
            / 1_000_000.0;
        Usd(dollars)
    }
}

/// Prices by model name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(transparent)]
pub struct Prices(pub BTreeMap<String, ModelPrice>);

/// The highest price per million tokens a table may hold (far above any real model's).
pub const MAX_PRICE_PER_MTOK: f64 = 1_000_000.0;

impl Prices {
    /// Parses a JSON price table (`SPOOL_LLM_PRICES`); the error names `var` and what is wrong.
    pub fn parse(var: &str, json: &str) -> Result<Self, String> {
        if json.trim().is_empty() {
            return Ok(Self::default());
        }
        let prices: Self = serde_json::from_str(json).map_err(|e| {
            format!(
                "{var}: not a JSON object of {{model: {{input_per_mtok, output_per_mtok, \
                 cached_input_per_mtok?}}}}: {e}"
            )
        })?;
        match prices.problems().into_iter().next() {
            Some((field, message)) => Err(format!("{var}: {field} {message}")),
            None => Ok(prices),
        }
    }

    /// The problems of the table, by field (`gpt-4o.input_per_mtok`): every price a number
    /// from 0 to [`MAX_PRICE_PER_MTOK`], every model named.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        for (model, price) in &self.0 {
            if model.trim().is_empty() || model.len() > 200 {
                problems.push((
                    format!("{model:?}"),
                    "must be a model name of 1 to 200 characters".to_owned(),
                ));
            }
            let fields = [
                ("input_per_mtok", Some(price.input_per_mtok)),
                ("output_per_mtok", Some(price.output_per_mtok)),
                ("cached_input_per_mtok", price.cached_input_per_mtok),
            ];
            for (field, value) in fields {
                if let Some(Usd(value)) = value
                    && !(0.0..=MAX_PRICE_PER_MTOK).contains(&value)
                {
                    problems.push((
                        format!("{model}.{field}"),
                        format!("must be a number from 0 to {MAX_PRICE_PER_MTOK}"),
                    ));
                }
            }
        }
        problems
    }

    /// The price of `model`, if the table has one.
    pub fn get(&self, model: &str) -> Option<&ModelPrice> {
        self.0.get(model)
    }

    /// What `usage` of `model` costs; `None` when the model has no price (unpriced).
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<Usd> {
        self.get(model).map(|price| price.cost(usage))
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_costs_its_tokens_at_their_prices_and_an_unpriced_model_costs_nothing_known() {
        let prices = Prices::parse(
            "SPOOL_LLM_PRICES",
            r#"{"m": {"input_per_mtok": 2, "output_per_mtok": 8, "cached_input_per_mtok": 0.5},
                "n": {"input_per_mtok": 1, "output_per_mtok": 4}}"#,
        )
        .expect("valid");
        let usage = Usage {
            input_tokens: 1_000,
            output_tokens: 500,
            cached_input_tokens: 400,
            ..Usage::default()
        };
        // 600 uncached at $2, 400 cached at $0.5, 500 out at $8 per million.
        assert_eq!(prices.cost("m", &usage), Some(Usd(0.0012 + 0.0002 + 0.004)));
        // No cached price: cached tokens at the input price.
        assert_eq!(prices.cost("n", &usage), Some(Usd(0.001 + 0.002)));
        assert_eq!(prices.cost("other", &usage), None);
    }

    #[test]
    fn bad_tables_name_the_variable_and_the_field() {
        for (bad, says) in [
            ("[]", "not a JSON object"),
            (r#"{"m": {"input_per_mtok": 1}}"#, "not a JSON object"),
            (
                r#"{"m": {"input_per_mtok": 1, "output_per_mtok": 1, "extra": 1}}"#,
                "not a JSON object",
            ),
            (
                r#"{"m": {"input_per_mtok": -1, "output_per_mtok": 1}}"#,
                "m.input_per_mtok must be",
            ),
            (
                r#"{"m": {"input_per_mtok": 1, "output_per_mtok": 1, "cached_input_per_mtok": 1e9}}"#,
                "m.cached_input_per_mtok must be",
            ),
            (
                r#"{"": {"input_per_mtok": 1, "output_per_mtok": 1}}"#,
                "must be a model name",
            ),
        ] {
            let err = Prices::parse("SPOOL_LLM_PRICES", bad).expect_err(bad);
            assert!(
                err.starts_with("SPOOL_LLM_PRICES: ") && err.contains(says),
                "{bad}: {err}"
            );
        }
        assert_eq!(
            Prices::parse("SPOOL_LLM_PRICES", " ").expect("empty"),
            Prices::default()
        );
    }
}
