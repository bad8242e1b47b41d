//! Quotas (docs/operations.md): what one user and one tenant may start and spend.
//!
//! Four limits, each optional: `runs_per_hour`, `max_concurrent_runs` (queued, running or
//! paused runs), `daily_token_budget` (prompt + generated tokens of the UTC day) and
//! `daily_budget_usd` (what the model calls of the UTC day cost, [`crate::pricing`]). They
//! apply per user and per tenant, from configuration (`SPOOL_QUOTA_*`, [`Quotas`] of the API)
//! for every run, and from an agent's `governance` for that agent's own runs (counted apart, so
//! an agent can be held to less than the server allows). [`counters`] resolves which counters a
//! new run is checked against; [`admission`] counts them in Redis, exact across any number of
//! API processes and before the enqueue writes anything, and `db::quota` keeps their truth in
//! Postgres.

use serde::{Deserialize, Serialize};

use crate::ids::AgentId;
use crate::pricing::Usd;

pub mod admission;

/// The limits of one counter (all optional; unset is unlimited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimits {
    /// Runs started per hour at most (1 to 1,000,000): a fixed window from the first run
    /// after the previous one ended; past it, 429 `rate_limited` until the window ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub runs_per_hour: Option<u32>,
    /// Active (queued, running or paused) runs at once at most (1 to 100,000); past it, 429
    /// `concurrency_limited`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 100_000)]
    pub max_concurrent_runs: Option<u32>,
    /// Tokens (prompt + generated) per UTC day (1 to 10^12): once spent, new runs get 429
    /// `budget_exceeded` and running runs fail with `budget_exceeded` at their next step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000_000_000_i64)]
    pub daily_token_budget: Option<u64>,
    /// US dollars per UTC day (more than 0, at most 10^9), what the model calls cost at their
    /// providers' `prices`: once spent, new runs get 429 `budget_exceeded` and running runs
    /// fail with `budget_exceeded` at their next step. Calls of unpriced models cost nothing
    /// known, so they are not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<f64>, exclusive_minimum = 0, maximum = 1_000_000_000)]
    pub daily_budget_usd: Option<Usd>,
}

/// Bounds of each limit, for validation.
pub const RUNS_PER_HOUR_RANGE: std::ops::RangeInclusive<u64> = 1..=1_000_000;
/// Bounds of `max_concurrent_runs`.
pub const CONCURRENT_RUNS_RANGE: std::ops::RangeInclusive<u64> = 1..=100_000;
/// Bounds of `daily_token_budget`.
pub const DAILY_TOKENS_RANGE: std::ops::RangeInclusive<u64> = 1..=1_000_000_000_000;
/// The largest `daily_budget_usd` (it must also be more than 0).
pub const MAX_DAILY_BUDGET_USD: f64 = 1_000_000_000.0;

impl QuotaLimits {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Each set limit with its field name, as a number.
    pub fn set(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("runs_per_hour", self.runs_per_hour.map(u64::from)),
            (
                "max_concurrent_runs",
                self.max_concurrent_runs.map(u64::from),
            ),
            ("daily_token_budget", self.daily_token_budget),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
    }

    /// Whether a daily budget (tokens or dollars) is set.
    pub fn has_budget(&self) -> bool {
        self.daily_token_budget.is_some() || self.daily_budget_usd.is_some()
    }

    /// The problems of the set limits, by field name.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let usd = self.daily_budget_usd.and_then(|Usd(usd)| {
            (!(usd > 0.0 && usd <= MAX_DAILY_BUDGET_USD)).then(|| {
                (
                    "daily_budget_usd",
                    format!("must be more than 0 and at most {MAX_DAILY_BUDGET_USD}"),
                )
            })
        });
        self.set()
            .filter_map(|(name, value)| {
                let range = match name {
                    "runs_per_hour" => RUNS_PER_HOUR_RANGE,
                    "max_concurrent_runs" => CONCURRENT_RUNS_RANGE,
                    _ => DAILY_TOKENS_RANGE,
                };
                (!range.contains(&value)).then(|| {
                    let (low, high) = (range.start(), range.end());
                    (name, format!("must be between {low} and {high}"))
                })
            })
            .chain(usd)
            .collect()
    }
}

/// Quotas per user and per tenant: the server's defaults, or an agent's `governance`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    /// Each user's limits.
    #[serde(default, skip_serializing_if = "QuotaLimits::is_empty")]
    pub user: QuotaLimits,
    /// The whole tenant's limits.
    #[serde(default, skip_serializing_if = "QuotaLimits::is_empty")]
    pub tenant: QuotaLimits,
    /// In an agent's `governance` only: the limits of each client address over the runs of
    /// the agent's public sessions (`runs_per_hour`, which also bounds how many sessions one
    /// address opens an hour, and `max_concurrent_runs`).
    #[serde(default, skip_serializing_if = "QuotaLimits::is_empty")]
    pub ip: QuotaLimits,
}

impl Quotas {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self.user.is_empty() && self.tenant.is_empty() && self.ip.is_empty()
    }
}

/// The prefix of a counter's `owner_id` that counts a client address (`ip:203.0.113.9`).
pub const IP_OWNER_PREFIX: &str = "ip:";

/// `quota` with the counter of a public session's client address added (its agent's
/// `governance.ip`), in lock order.
pub fn with_client(
    quota: Option<RunQuota>,
    agent: AgentId,
    limits: QuotaLimits,
    client: &str,
) -> Option<RunQuota> {
    if limits.is_empty() {
        return quota;
    }
    let mut quota = quota.unwrap_or_default();
    quota.counters.push(Counter {
        owner_id: format!("{IP_OWNER_PREFIX}{client}"),
        agent_id: agent.to_string(),
        limits: QuotaLimits {
            daily_token_budget: None,
            daily_budget_usd: None,
            ..limits
        },
    });
    quota
        .counters
        .sort_by(|a, b| (&a.owner_id, &a.agent_id).cmp(&(&b.owner_id, &b.agent_id)));
    Some(quota)
}

/// Who a counter counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaScope {
    /// One user's runs.
    User,
    /// The whole tenant's runs.
    Tenant,
    /// One client address's runs of an agent's public sessions.
    Ip,
}

impl QuotaScope {
    /// The scope's name in errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Tenant => "tenant",
            Self::Ip => "ip",
        }
    }
}

/// One counter a run is checked against and counted in (a `quota_counters` row of its
/// tenant), with the limits that applied at enqueue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    /// The user, or `""` for the whole tenant.
    pub owner_id: String,
    /// The agent whose runs it counts, or `""` for every agent.
    pub agent_id: String,
    /// Its limits.
    pub limits: QuotaLimits,
}

impl Counter {
    /// Whom it counts.
    pub fn scope(&self) -> QuotaScope {
        if self.owner_id.is_empty() {
            QuotaScope::Tenant
        } else if self.owner_id.starts_with(IP_OWNER_PREFIX) {
            QuotaScope::Ip
        } else {
            QuotaScope::User
        }
    }

    /// The agent whose runs it counts, if only one's.
    pub fn agent(&self) -> Option<&str> {
        (!self.agent_id.is_empty()).then_some(self.agent_id.as_str())
    }
}

/// The counters of a run (`runs.quota`), in lock order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunQuota {
    /// The counters.
    pub counters: Vec<Counter>,
}

impl RunQuota {
    /// What a child run (an agent called as a tool) of a run under these counters carries:
    /// the same counters (its root's) with their concurrency limits and token budgets, not
    /// their hourly rates. It takes room among the root's active runs (admitted by the worker
    /// that starts it, given back when it ends), is charged to the budgets and stops when one
    /// is spent; it is not counted in the hour (its root was, and `limits.max_tree_runs`
    /// bounds how many runs a root may start).
    pub fn for_child(&self) -> Self {
        Self {
            counters: self
                .counters
                .iter()
                .filter(|c| c.limits.max_concurrent_runs.is_some() || c.limits.has_budget())
                .map(|c| Counter {
                    owner_id: c.owner_id.clone(),
                    agent_id: c.agent_id.clone(),
                    limits: QuotaLimits {
                        runs_per_hour: None,
                        ..c.limits
                    },
                })
                .collect(),
        }
    }

    /// The counters with a daily budget (tokens or dollars).
    pub fn budgets(&self) -> impl Iterator<Item = &Counter> {
        self.counters.iter().filter(|c| c.limits.has_budget())
    }
}

/// The counters a new run of `user_id` with `agent_id` is checked against: the server's
/// `defaults` over all the user's (tenant's) runs, and the agent's `governance` over its own;
/// `None` if no limit applies. Sorted in lock order (owner, then agent; `""` first).
pub fn counters(
    defaults: &Quotas,
    agent: Option<(AgentId, &Quotas)>,
    user_id: &str,
) -> Option<RunQuota> {
    let mut counters = Vec::new();
    let mut add = |quotas: &Quotas, agent_id: String| {
        for (owner_id, limits) in [("", quotas.tenant), (user_id, quotas.user)] {
            if !limits.is_empty() {
                counters.push(Counter {
                    owner_id: owner_id.to_owned(),
                    agent_id: agent_id.clone(),
                    limits,
                });
            }
        }
    };
    add(defaults, String::new());
    if let Some((id, governance)) = agent {
        add(governance, id.to_string());
    }
    if counters.is_empty() {
        return None;
    }
    counters.sort_by(|a, b| (&a.owner_id, &a.agent_id).cmp(&(&b.owner_id, &b.agent_id)));
    Some(RunQuota { counters })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_hour: u32) -> QuotaLimits {
        QuotaLimits {
            runs_per_hour: Some(per_hour),
            ..QuotaLimits::default()
        }
    }

    #[test]
    fn no_limit_means_no_counter() {
        assert_eq!(counters(&Quotas::default(), None, "alice"), None);
        let agent = AgentId::new();
        assert_eq!(
            counters(
                &Quotas::default(),
                Some((agent, &Quotas::default())),
                "alice"
            ),
            None
        );
    }

    #[test]
    fn counters_come_in_lock_order_with_the_agents_apart() {
        let agent = AgentId::new();
        let defaults = Quotas {
            user: limits(10),
            tenant: limits(100),
            ip: QuotaLimits::default(),
        };
        let governance = Quotas {
            user: limits(2),
            tenant: QuotaLimits::default(),
            ip: QuotaLimits::default(),
        };
        let quota = counters(&defaults, Some((agent, &governance)), "alice").expect("some");
        let keys: Vec<_> = quota
            .counters
            .iter()
            .map(|c| (c.scope(), c.agent().map(str::to_owned)))
            .collect();
        assert_eq!(
            keys,
            [
                (QuotaScope::Tenant, None),
                (QuotaScope::User, None),
                (QuotaScope::User, Some(agent.to_string())),
            ]
        );
        assert_eq!(quota.counters[2].limits, limits(2));
    }

    #[test]
    fn a_child_carries_its_roots_concurrency_limits_and_budgets_not_its_rates() {
        let both = QuotaLimits {
            runs_per_hour: Some(10),
            max_concurrent_runs: Some(2),
            daily_token_budget: Some(1_000),
            daily_budget_usd: Some(Usd(2.5)),
        };
        let quota = RunQuota {
            counters: vec![
                Counter {
                    owner_id: String::new(),
                    agent_id: String::new(),
                    limits: limits(100),
                },
                Counter {
                    owner_id: "alice".into(),
                    agent_id: String::new(),
                    limits: both,
                },
            ],
        };
        let child = quota.for_child();
        assert_eq!(child.counters.len(), 1, "a rate-only counter is left out");
        assert_eq!(child.counters[0].owner_id, "alice");
        assert_eq!(
            child.counters[0].limits,
            QuotaLimits {
                runs_per_hour: None,
                ..both
            }
        );
    }

    #[test]
    fn limits_out_of_range_are_named() {
        let bad = QuotaLimits {
            runs_per_hour: Some(0),
            max_concurrent_runs: Some(100_001),
            daily_token_budget: Some(1),
            daily_budget_usd: Some(Usd(0.0)),
        };
        let names: Vec<_> = bad.problems().into_iter().map(|(name, _)| name).collect();
        assert_eq!(
            names,
            ["runs_per_hour", "max_concurrent_runs", "daily_budget_usd"]
        );
    }
}
