//! The OpenAPI schemas of the stream's events, generated from [`Data`](super::Data)'s payload
//! types: one envelope schema per event type (`MessageStartEvent`, `TextDeltaEvent`, ...), each
//! with the envelope's fields, its `type` and the `data` of that type, and `StreamEnvelope`,
//! one of them. The API's document names [`Event`] as a component, which brings
//! them all.

use std::borrow::Cow;

use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use super::{Event, EventType};
use crate::ids::{MessageId, ThreadId, WorkflowId};

/// What the event list knows of each type's payload (implemented by `events!`).
pub(crate) trait Payloads {
    /// The payload's component name and schema.
    fn payload_schema(self) -> (String, RefOr<Schema>);
    /// Every schema the payloads refer to.
    fn payload_schemas(schemas: &mut Vec<(String, RefOr<Schema>)>);
    /// The type's documentation.
    fn description(self) -> &'static str;
}

/// The component name of `kind`'s envelope: `TextDeltaEvent` for `text_delta`.
pub fn envelope_name(kind: EventType) -> String {
    let mut name: String = kind
        .as_str()
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect();
    name.push_str("Event");
    name
}

fn reference(name: &str) -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(name))
}

/// The envelope of one event type.
fn envelope(kind: EventType, payload: &str) -> Schema {
    let integer = |description: &str| {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(0))
            .description(Some(description.to_owned()))
    };
    ObjectBuilder::new()
        .description(Some(kind.description()))
        .property(
            "v",
            integer("The envelope's version (1).").enum_values(Some([super::VERSION])),
        )
        .required("v")
        .property(
            "type",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([kind.as_str()]))
                .description(Some("The event type.")),
        )
        .required("type")
        .property("thread_id", reference(&ThreadId::name()))
        .required("thread_id")
        .property("workflow_id", reference(&WorkflowId::name()))
        .required("workflow_id")
        .property("message_id", reference(&MessageId::name()))
        .required("message_id")
        .property("attempt", integer("The attempt that wrote it."))
        .required("attempt")
        .property(
            "depth",
            integer(
                "How deep its run is in a tree of agent calls: absent for the thread's own run, \
                 1 for a run its agent tool call started, and so on.",
            ),
        )
        .property("data", reference(payload))
        .required("data")
        .into()
}

impl PartialSchema for Event {
    fn schema() -> RefOr<Schema> {
        let mut one_of = OneOfBuilder::new().description(Some(
            "The `data:` of a stored stream event: its envelope, typed by its `type`.",
        ));
        for kind in EventType::ALL {
            one_of = one_of.item(reference(&envelope_name(*kind)));
        }
        one_of.into()
    }
}

impl ToSchema for Event {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("StreamEnvelope")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((ThreadId::name().into_owned(), ThreadId::schema()));
        schemas.push((WorkflowId::name().into_owned(), WorkflowId::schema()));
        schemas.push((MessageId::name().into_owned(), MessageId::schema()));
        for kind in EventType::ALL {
            let (payload, schema) = kind.payload_schema();
            schemas.push((envelope_name(*kind), envelope(*kind, &payload).into()));
            schemas.push((payload, schema));
        }
        EventType::payload_schemas(schemas);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_has_an_envelope_named_after_it() {
        assert_eq!(envelope_name(EventType::TextDelta), "TextDeltaEvent");
        assert_eq!(
            envelope_name(EventType::AttemptRestarted),
            "AttemptRestartedEvent"
        );
        let mut schemas = Vec::new();
        Event::schemas(&mut schemas);
        for kind in EventType::ALL {
            let name = envelope_name(*kind);
            assert!(schemas.iter().any(|(n, _)| *n == name), "{name}");
        }
        assert!(schemas.iter().any(|(n, _)| n == "StepCallData"));
        assert!(schemas.iter().any(|(n, _)| n == "Citation"));
    }
}
