//! Permissions (DESIGN section 13): what a caller may do, checked by every route with
//! [`Caller::require`](super::Caller::require) before it touches anything.
//!
//! What must stay true:
//! - `admin` holds every permission, those added later included.
//! - A token with neither `admin` nor a permissions claim has [`Permissions::DEFAULT`]
//!   (`agents:read` and `runs:create`): the tokens minted before permissions existed keep
//!   doing what they did. A token with a permissions claim has exactly the permissions it lists;
//!   names Spool does not know (an identity provider's `openid`, `profile`) are ignored.
//! - A missing permission is a 403 `forbidden` naming it (in the message and in `permission`);
//!   ids of other tenants and users stay 404, whatever the caller holds.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Map;
use utoipa::ToSchema;

use crate::error::ApiError;

/// One permission, named as tokens and API keys name it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
pub enum Permission {
    /// Every permission (and per-message `instructions`).
    #[serde(rename = "admin")]
    Admin,
    /// List and read agents (and the models of the OpenAI-compatible surface).
    #[serde(rename = "agents:read")]
    AgentsRead,
    /// Create, replace and delete agents.
    #[serde(rename = "agents:write")]
    AgentsWrite,
    /// Write tools and knowledge bases (DESIGN section 12).
    #[serde(rename = "tools:write")]
    ToolsWrite,
    /// Read and write the tenant's model providers (`/v1/providers`, DESIGN section 12).
    #[serde(rename = "providers:write")]
    ProvidersWrite,
    /// Send messages on one's own threads, and read, stream and cancel them.
    #[serde(rename = "runs:create")]
    RunsCreate,
    /// Read the tenant's threads and runs, every user's.
    #[serde(rename = "runs:read:tenant")]
    RunsReadTenant,
    /// Manage the tenant's webhooks.
    #[serde(rename = "webhooks:admin")]
    WebhooksAdmin,
    /// Read the tenant's usage.
    #[serde(rename = "usage:read")]
    UsageRead,
    /// Create, list and revoke the tenant's API keys.
    #[serde(rename = "api_keys:admin")]
    ApiKeysAdmin,
}

impl Permission {
    /// Every permission, in the order the docs list them.
    pub const ALL: [Self; 10] = [
        Self::Admin,
        Self::AgentsRead,
        Self::AgentsWrite,
        Self::ToolsWrite,
        Self::ProvidersWrite,
        Self::RunsCreate,
        Self::RunsReadTenant,
        Self::WebhooksAdmin,
        Self::UsageRead,
        Self::ApiKeysAdmin,
    ];

    /// What reading a thread or a run needs: one's own with `runs:create`, or the tenant's
    /// with `runs:read:tenant`.
    pub const RUNS_READ: &'static [Self] = &[Self::RunsCreate, Self::RunsReadTenant];

    /// Its name in tokens, API keys and errors (`runs:create`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::AgentsRead => "agents:read",
            Self::AgentsWrite => "agents:write",
            Self::ToolsWrite => "tools:write",
            Self::ProvidersWrite => "providers:write",
            Self::RunsCreate => "runs:create",
            Self::RunsReadTenant => "runs:read:tenant",
            Self::WebhooksAdmin => "webhooks:admin",
            Self::UsageRead => "usage:read",
            Self::ApiKeysAdmin => "api_keys:admin",
        }
    }

    /// The permission of that name, if there is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }

    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of permissions.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Permissions(u16);

impl Permissions {
    /// What a token with neither `admin` nor a permissions claim holds.
    pub const DEFAULT: Self = Self(Permission::AgentsRead.bit() | Permission::RunsCreate.bit());

    /// None.
    pub const NONE: Self = Self(0);

    /// The permissions a token grants: `admin: true` is `admin`; no claim is
    /// [`Permissions::DEFAULT`]; a claim is what it lists that Spool knows.
    pub fn of_token<S: AsRef<str>>(admin: bool, claim: Option<&[S]>) -> Self {
        let listed = match claim {
            None if !admin => Self::DEFAULT,
            None => Self::NONE,
            Some(names) => Self::known(names),
        };
        if admin {
            listed.with(Permission::Admin)
        } else {
            listed
        }
    }

    /// The known permissions among `names` (others are ignored).
    pub fn known<S: AsRef<str>>(names: &[S]) -> Self {
        names
            .iter()
            .filter_map(|name| Permission::parse(name.as_ref()))
            .fold(Self::NONE, Self::with)
    }

    /// The same set with `permission` added.
    #[must_use]
    pub const fn with(self, permission: Permission) -> Self {
        Self(self.0 | permission.bit())
    }

    /// Whether the set lists `permission` itself (`admin` not counted).
    pub const fn lists(self, permission: Permission) -> bool {
        self.0 & permission.bit() != 0
    }

    /// Whether the set grants `permission`: lists it, or lists `admin`.
    pub const fn grants(self, permission: Permission) -> bool {
        self.lists(Permission::Admin) || self.lists(permission)
    }

    /// The permissions listed, in [`Permission::ALL`]'s order.
    pub fn iter(self) -> impl Iterator<Item = Permission> {
        Permission::ALL.into_iter().filter(move |p| self.lists(*p))
    }

    /// Their names.
    pub fn names(self) -> Vec<String> {
        self.iter().map(|p| p.as_str().to_owned()).collect()
    }

    /// Passes if the set grants `permission`; else 403 `forbidden` naming it.
    pub fn require(self, permission: Permission) -> Result<(), ApiError> {
        self.require_any(&[permission])
    }

    /// Passes if the set grants one of `any`; else 403 `forbidden` naming the first (and the
    /// others in the message).
    pub fn require_any(self, any: &[Permission]) -> Result<(), ApiError> {
        if any.iter().any(|p| self.grants(*p)) {
            return Ok(());
        }
        let Some((first, rest)) = any.split_first() else {
            return Ok(());
        };
        let others: String = rest.iter().map(|p| format!(" or `{p}`")).collect();
        Err(forbidden(
            *first,
            format!("this needs the permission `{first}`{others}, which the token does not hold"),
        ))
    }
}

impl fmt::Debug for Permissions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// 403 `forbidden` naming `permission` (in `permission`) with `message`.
pub fn forbidden(permission: Permission, message: String) -> ApiError {
    let mut details = Map::new();
    details.insert("permission".into(), permission.as_str().into());
    ApiError::Forbidden {
        code: "forbidden",
        message,
        details,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_permission_round_trips_through_its_name() {
        for permission in Permission::ALL {
            assert_eq!(Permission::parse(permission.as_str()), Some(permission));
            assert_eq!(
                serde_json::to_value(permission).ok(),
                Some(serde_json::json!(permission.as_str()))
            );
        }
        assert_eq!(Permission::parse("runs:read"), None);
    }

    #[test]
    fn a_token_without_a_claim_has_the_defaults_and_one_with_a_claim_has_what_it_lists() {
        let none: Option<&[&str]> = None;
        let defaults = Permissions::of_token(false, none);
        assert!(defaults.grants(Permission::RunsCreate));
        assert!(defaults.grants(Permission::AgentsRead));
        assert!(!defaults.grants(Permission::AgentsWrite));
        let listed = Permissions::of_token(false, Some(&["openid", "usage:read"][..]));
        assert!(listed.grants(Permission::UsageRead));
        assert!(
            !listed.grants(Permission::RunsCreate),
            "a claim replaces the defaults"
        );
        let empty = Permissions::of_token(false, Some(&[] as &[&str]));
        assert_eq!(empty, Permissions::NONE);
    }

    #[test]
    fn admin_grants_everything() {
        let none: Option<&[&str]> = None;
        for admin in [
            Permissions::of_token(true, none),
            Permissions::of_token(false, Some(&["admin"][..])),
        ] {
            for permission in Permission::ALL {
                assert!(admin.grants(permission), "{permission}");
            }
        }
    }

    #[test]
    fn a_refusal_names_the_permission() {
        let refused = Permissions::DEFAULT.require_any(Permission::RUNS_READ);
        assert!(refused.is_ok());
        let Err(ApiError::Forbidden {
            code,
            message,
            details,
        }) = Permissions::DEFAULT.require(Permission::UsageRead)
        else {
            panic!("refused");
        };
        assert_eq!(code, "forbidden");
        assert!(message.contains("`usage:read`"), "{message}");
        assert_eq!(details["permission"], "usage:read");
    }
}
