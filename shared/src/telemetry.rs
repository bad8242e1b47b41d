//! Logging and tracing set-up: JSON lines by default (one object per event, stable dotted field
//! names such as `thread.id`, `workflow.id`, `run.attempt`), human-readable with
//! `--log-format pretty`. `RUST_LOG` selects what is logged (default `info`). The MCP client's
//! own logs (`rmcp`) are off unless `RUST_LOG` names `rmcp`: they print a failing server's URL,
//! credentials in its query included (review L7); Spool logs MCP failures itself, without it.
//!
//! When `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and
//! `OTEL_SDK_DISABLED` is not `true`), spans are also exported over OTLP/HTTP (protobuf) with
//! a batch processor, and the W3C TraceContext propagator is installed, so one run is one trace
//! from the API request through the queue (the `traceparent` stored on the run) to the
//! worker's attempt. The other `OTEL_EXPORTER_OTLP_*` variables (headers, timeout) are read by
//! the exporter itself. Without them nothing is exported and the propagation helpers here do
//! nothing.

use std::collections::HashMap;

use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The W3C header (and carrier key) of a span context.
const TRACEPARENT: &str = "traceparent";

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line.
    #[default]
    Json,
    /// Human-readable lines.
    Pretty,
}

/// Keeps the span exporter alive; dropping it flushes the spans still buffered and shuts it down.
#[must_use = "dropping the guard shuts the span exporter down"]
#[derive(Debug, Default)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        let Some(provider) = self.provider.take() else {
            return;
        };
        // The batch processor exports from a Tokio task, and shutting down waits for it: on a
        // multi-threaded runtime this thread must hand its tasks over while it blocks.
        let shutdown = move || provider.shutdown();
        let result = match tokio::runtime::Handle::try_current() {
            Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(shutdown)
            }
            _ => shutdown(),
        };
        if let Err(error) = result {
            eprintln!("spool: shutting the OpenTelemetry span exporter down failed: {error}");
        }
    }
}

/// The log filter for `RUST_LOG` (`info` when unset or invalid), with `rmcp=off` unless it
/// names `rmcp` (see the module doc).
fn log_filter(rust_log: Option<&str>) -> EnvFilter {
    let directives = rust_log.filter(|d| !d.trim().is_empty()).unwrap_or("info");
    let filter = EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new("info"));
    if directives.contains("rmcp") {
        return filter;
    }
    match "rmcp=off".parse() {
        Ok(off) => filter.add_directive(off),
        Err(_) => filter,
    }
}

/// Installs the global tracing subscriber, and the OTLP span exporter when `OTEL_*` asks for it.
///
/// Call once, first thing in `main`, from inside the Tokio runtime, and keep the guard until
/// the end of `main`. `service_name` is the default `service.name` (`OTEL_SERVICE_NAME` wins).
pub fn init(format: LogFormat, service_name: &str) -> TelemetryGuard {
    let filter = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Json => fmt
            .json()
            .event_format(WithTraceId(
                tracing_subscriber::fmt::format()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false),
            ))
            .boxed(),
        LogFormat::Pretty => fmt.boxed(),
    };
    let provider = match otlp_provider(service_name) {
        Ok(provider) => provider,
        Err(error) => {
            // Tracing is an aid: a bad OTLP setting must not keep the service from starting.
            eprintln!("spool: OpenTelemetry export disabled: {error:#}");
            None
        }
    };
    let otel = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("spool"))
            // The OS thread's `thread.id` would clash with Spool's own `thread.id` field.
            .with_threads(false)
    });
    // A second call (tests that start several components in one process) is harmless.
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()
        .is_ok();
    if installed && let Some(provider) = &provider {
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        opentelemetry::global::set_tracer_provider(provider.clone());
    }
    TelemetryGuard { provider }
}

/// A JSON line formatter that starts each line with the current trace's `trace_id` and
/// `span_id` when spans are exported (so a log line leads to its trace); lines outside any
/// traced span are the inner formatter's as they are.
struct WithTraceId<F>(F);

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for WithTraceId<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let cx = tracing::Span::current().context();
        let span = cx.span().span_context().clone();
        if !span.is_valid() {
            return self.0.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.0.format_event(
            ctx,
            tracing_subscriber::fmt::format::Writer::new(&mut line),
            event,
        )?;
        match line.strip_prefix('{') {
            Some(rest) => write!(
                writer,
                "{{\"trace_id\":\"{}\",\"span_id\":\"{}\",{rest}",
                span.trace_id(),
                span.span_id()
            ),
            None => writer.write_str(&line),
        }
    }
}

/// Builds the OTLP/HTTP tracer provider, or `None` when the `OTEL_*` variables do not ask for one.
fn otlp_provider(service_name: &str) -> anyhow::Result<Option<SdkTracerProvider>> {
    let set = |name: &str| std::env::var(name).is_ok_and(|value| !value.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED")
        .is_ok_and(|value| value.trim().eq_ignore_ascii_case("true"));
    if disabled
        || !(set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    {
        return Ok(None);
    }
    // The batch processor runs as a task on the caller's runtime (the async reqwest client
    // needs one); without a runtime there is nothing to run it on.
    if tokio::runtime::Handle::try_current().is_err() {
        anyhow::bail!("no Tokio runtime to run the span exporter on");
    }
    // Endpoint, headers and timeout come from the standard `OTEL_EXPORTER_OTLP_*` variables.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    // `Resource::builder` reads `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`; the binary's
    // name is only the fallback.
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !set("OTEL_SERVICE_NAME") {
        resource = resource.with_service_name(service_name.to_owned());
    }
    Ok(Some(
        SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource.build())
            .build(),
    ))
}

/// The current span's context as a W3C `traceparent`, or `None` when there is no valid one.
///
/// `None` without OpenTelemetry (no layer, no propagator): nothing to carry across the queue.
pub fn inject_traceparent() -> Option<String> {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&cx, &mut carrier);
    });
    carrier.remove(TRACEPARENT)
}

/// Makes the span context in `traceparent` the OpenTelemetry parent of `span`.
///
/// Call it before `span` is first entered. An invalid `traceparent`, or no OpenTelemetry set-up,
/// leaves `span` as it is.
pub fn set_parent_from_traceparent(span: &tracing::Span, traceparent: &str) {
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let cx =
        opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&carrier));
    if cx.span().span_context().is_valid() {
        // Err only when the span is disabled or has no OpenTelemetry layer: nothing to link.
        let _ = span.set_parent(cx);
    }
}

/// Renames `span` as exported (its `otel.name`), also once it has started: `tracing`'s
/// `otel.name` field is only read before. Nothing without OpenTelemetry.
pub fn rename(span: &tracing::Span, name: String) {
    span.context().span().update_name(name);
}

/// Sets the string-array attribute `key` of `span` (such as `gen_ai.response.finish_reasons`),
/// which a `tracing` field cannot carry. Nothing without OpenTelemetry.
pub fn set_string_array(span: &tracing::Span, key: &'static str, values: Vec<String>) {
    let values = values.into_iter().map(Into::into).collect();
    span.set_attribute(
        key,
        opentelemetry::Value::Array(opentelemetry::Array::String(values)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mcp_client_s_logs_are_off_unless_rust_log_names_them() {
        for unset in [
            None,
            Some(""),
            Some("debug"),
            Some("spool_worker=debug,info"),
        ] {
            let filter = log_filter(unset).to_string();
            assert!(filter.contains("rmcp=off"), "{unset:?}: {filter}");
        }
        let named = log_filter(Some("info,rmcp=debug")).to_string();
        assert!(
            !named.contains("rmcp=off") && named.contains("rmcp=debug"),
            "{named}"
        );
    }
}
