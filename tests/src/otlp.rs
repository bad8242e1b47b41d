//! A loopback OTLP/HTTP collector: it answers `POST /v1/traces` (protobuf, as Spool's exporter
//! sends it) and keeps every span it is sent, flattened for assertions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use prost::Message as _;
use serde_json::Value;

/// One span as exported.
#[derive(Clone, Debug)]
pub struct Span {
    /// The resource's `service.name`.
    pub service: String,
    /// Its name.
    pub name: String,
    /// Its kind (OTLP numbering: 1 internal, 2 server, 3 client).
    pub kind: i32,
    /// Its trace, span and parent span ids, in hex (the parent empty for a root).
    pub trace_id: String,
    /// Its id.
    pub span_id: String,
    /// Its parent's id.
    pub parent_span_id: String,
    /// Its status code (OTLP numbering: 0 unset, 1 ok, 2 error).
    pub status: i32,
    /// Its attributes, as JSON values (arrays as arrays).
    pub attributes: HashMap<String, Value>,
}

impl Span {
    /// The attribute `key`, if set.
    pub fn attribute(&self, key: &str) -> Option<&Value> {
        self.attributes.get(key)
    }

    /// The string attribute `key`, if set (and a string).
    pub fn str(&self, key: &str) -> Option<&str> {
        self.attribute(key).and_then(Value::as_str)
    }
}

/// The collector: its base URL (for `OTEL_EXPORTER_OTLP_ENDPOINT`) and the spans received.
#[derive(Clone)]
pub struct Collector {
    /// `http://127.0.0.1:port`.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Collector {
    /// Starts one on a free loopback port.
    pub async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans.clone());
        let endpoint = crate::serve(app).await;
        Self { endpoint, spans }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().expect("lock").clone()
    }
}

async fn receive(State(spans): State<Arc<Mutex<Vec<Span>>>>, body: Bytes) -> Vec<u8> {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return Vec::new();
    };
    let mut received = Vec::new();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref())
            .map(json)
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
            received.push(Span {
                service: service.clone(),
                name: span.name,
                kind: span.kind,
                trace_id: hex::encode(&span.trace_id),
                span_id: hex::encode(&span.span_id),
                parent_span_id: hex::encode(&span.parent_span_id),
                status: span.status.map_or(0, |s| s.code),
                attributes: attributes(&span.attributes),
            });
        }
    }
    spans.lock().expect("lock").extend(received);
    // An empty ExportTraceServiceResponse.
    Vec::new()
}

fn attributes(attributes: &[KeyValue]) -> HashMap<String, Value> {
    attributes
        .iter()
        .filter_map(|kv| Some((kv.key.clone(), json(kv.value.as_ref()?))))
        .collect()
}

fn json(value: &AnyValue) -> Value {
    match &value.value {
        Some(Any::StringValue(s)) => Value::from(s.clone()),
        Some(Any::BoolValue(b)) => Value::from(*b),
        Some(Any::IntValue(i)) => Value::from(*i),
        Some(Any::DoubleValue(d)) => Value::from(*d),
        Some(Any::ArrayValue(array)) => array.values.iter().map(json).collect(),
        Some(Any::KvlistValue(list)) => Value::Object(
            list.values
                .iter()
                .filter_map(|kv| Some((kv.key.clone(), json(kv.value.as_ref()?))))
                .collect(),
        ),
        Some(Any::BytesValue(bytes)) => Value::from(hex::encode(bytes)),
        _ => Value::Null,
    }
}
