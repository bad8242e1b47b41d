//! Typed identifiers. No function takes a bare `Uuid`: a `ThreadId` cannot be passed where a
//! `WorkflowId` is expected, and each prints and parses as the plain UUID clients see (and is
//! documented in the OpenAPI document as a `uuid` string).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
            sqlx::Type, utoipa::ToSchema,
        )]
        #[serde(transparent)]
        #[sqlx(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A new random id (UUID v7, so ids sort roughly by creation time).
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }
    };
}

id_type!(
    /// A conversation.
    ThreadId
);
id_type!(
    /// A run: the durable job that produces one assistant message.
    WorkflowId
);
id_type!(
    /// A user or assistant message.
    MessageId
);
id_type!(
    /// A stored agent configuration.
    AgentId
);
id_type!(
    /// An endpoint that receives a tenant's run events.
    WebhookId
);
id_type!(
    /// A tenant's API key (its id, never the key itself).
    ApiKeyId
);
id_type!(
    /// A tenant's tool resource (`/v1/tools`), which agents reference by id.
    ToolId
);
id_type!(
    /// A tenant's knowledge base (`/v1/knowledge_bases`): a retrieval endpoint the built-in
    /// `knowledge_search` tool asks.
    KnowledgeBaseId
);
id_type!(
    /// A tenant's model provider (`/v1/providers`), which agents name by its name.
    ProviderId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_round_trips_through_its_string_form() {
        let id = ThreadId::new();
        assert_eq!(id.to_string().parse::<ThreadId>().ok(), Some(id));
        assert!("not-a-uuid".parse::<ThreadId>().is_err());
    }
}
