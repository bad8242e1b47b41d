//! The application: shared state, the router, and `serve`.

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::trace::TraceLayer;
use utoipa_axum::router::OpenApiRouter;

use crate::auth::JwtKeys;
use crate::routes;

/// Limits and settings the handlers read.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// Largest `input_text` accepted, in bytes.
    pub max_input_bytes: usize,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Streams one user may hold open on this process (0: no limit).
    pub max_streams_per_user: usize,
    /// Streams this process holds open in all (0: no limit).
    pub max_streams: usize,
    /// How long a write to a client may wait for the client to read (`None`: forever).
    pub write_timeout: Option<std::time::Duration>,
    /// The slowest a client may take what the API writes to it, in bytes a second, when it is
    /// the one holding the writes up (0: no minimum; see [`crate::drain`]).
    pub min_drain_bytes_per_sec: u64,
    /// Origins allowed by CORS (`*` for any); empty: no CORS headers.
    pub cors_origins: Vec<String>,
    /// Proxies whose `X-Forwarded-For` is believed (`SPOOL_TRUSTED_PROXIES`).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// How long events stay replayable after a run ends (for events the API publishes).
    pub stream_retention: std::time::Duration,
    /// The server's quotas (`SPOOL_QUOTA_*`).
    pub quotas: spool_shared::quota::Quotas,
    /// The named model providers (`SPOOL_PROVIDERS`), for agents' `provider`.
    pub providers: spool_shared::provider::Providers,
    /// The built-in tools the operator enables (`SPOOL_BUILTIN_TOOLS`), for agents' tools.
    pub builtin_tools: spool_worker::config::Builtins,
    /// The keys that seal tenants' provider keys (`SPOOL_SECRETS_KEY`); `None`: provider
    /// writes answer 503 `secrets_not_configured`.
    pub secrets: Option<Arc<spool_shared::secrets_key::SecretsKeys>>,
    /// The network policy webhook URLs must pass (as tools' URLs do in the worker).
    pub network_policy: Arc<spool_shared::egress::NetworkPolicy>,
    /// The retention windows (`SPOOL_RETENTION_*`): idempotency keys, usage detail.
    pub retention: spool_shared::config::RetentionArgs,
    /// Webhook endpoints one tenant may have (`SPOOL_WEBHOOKS_MAX_PER_TENANT`).
    pub max_webhooks_per_tenant: u32,
    /// The bearer token `/metrics` requires (`SPOOL_METRICS_TOKEN`); `None`: open.
    pub metrics_token: Option<secrecy::SecretString>,
    /// The public identity keys `GET /.well-known/jwks.json` serves.
    pub identity_jwks: spool_shared::identity::Jwks,
}

/// Everything a handler needs, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Postgres.
    pub db: PgPool,
    /// Redis streams and the live fan-out.
    pub streams: crate::gateway::Hub,
    /// Fires on shutdown: open streams end.
    pub shutdown: CancellationToken,
    /// Token verification.
    pub jwt: Arc<JwtKeys>,
    /// Limits and settings.
    pub config: Arc<ApiConfig>,
    /// Run status changes, for `?wait=`.
    pub runs: crate::watch::RunWatch,
    /// Wakes the workers after an enqueue commits.
    pub wake: crate::wake::Wake,
    /// The quota counters (Redis), which admit runs.
    pub admission: spool_shared::quota::admission::Admission,
}

/// Every route, each registered with its documentation (see [`crate::openapi`]).
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(crate::openapi::base())
        .merge(routes::health::router())
        .merge(routes::identity::router())
        .merge(routes::threads::router())
        .merge(crate::auth::stream_token::router())
        .merge(crate::auth::public::router())
        .merge(routes::workflows::router())
        .merge(routes::agents::router())
        .merge(routes::tools::router())
        .merge(routes::knowledge_bases::router())
        .merge(routes::providers::router())
        .merge(routes::webhooks::router())
        .merge(routes::usage::router())
        .merge(routes::api_keys::router())
        .merge(crate::gateway::router())
        .merge(crate::openai::router())
        .merge(crate::page::router())
        .merge(crate::openapi::router())
        .merge(crate::metrics::router())
}

/// The full router with its middleware.
pub fn router(state: AppState) -> Router {
    let body_limit = state.config.max_body_bytes;
    let (router, _) = routes().split_for_parts();
    router
        .fallback(|| async {
            crate::error::ApiError::not_found("route_not_found", "no such route")
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn(crate::metrics::track))
        .layer(cors(&state.config.cors_origins))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::public::cors,
        ))
        .layer(
            TraceLayer::new_for_http()
                .on_response(
                    |response: &axum::http::Response<axum::body::Body>,
                     _latency: std::time::Duration,
                     span: &tracing::Span| {
                        // As i64: OpenTelemetry has no unsigned integers.
                        span.record(
                            "http.response.status_code",
                            i64::from(response.status().as_u16()),
                        );
                    },
                )
                .make_span_with(|request: &axum::http::Request<axum::body::Body>| {
                    // The path only: the query may carry `access_token`, which is never logged.
                    // Named as the HTTP semantic conventions name them (`http.route` is the
                    // matched template, so spans of one route group together).
                    let route = request
                        .extensions()
                        .get::<axum::extract::MatchedPath>()
                        .map_or("", |path| path.as_str())
                        .to_owned();
                    let span = tracing::info_span!("http",
                    otel.name = %format!("{} {route}", request.method()).trim_end(),
                    otel.kind = "server",
                    http.request.method = %request.method(),
                    http.route = %route,
                    url.path = %request.uri().path(),
                    http.response.status_code = tracing::field::Empty);
                    // A caller's `traceparent` makes this request (and the run it enqueues) part of
                    // the caller's trace.
                    if let Some(traceparent) = request
                        .headers()
                        .get("traceparent")
                        .and_then(|value| value.to_str().ok())
                    {
                        spool_shared::telemetry::set_parent_from_traceparent(&span, traceparent);
                    }
                    span
                }),
        )
        // Outermost, so it sees every answer, the fallback's and the middleware's included.
        .layer(axum::middleware::from_fn(crate::unread::close_when_unread))
        .with_state(state)
}

fn cors(origins: &[String]) -> CorsLayer {
    use axum::http::{HeaderName, Method, header};
    if origins.is_empty() {
        return CorsLayer::new();
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| o.parse().ok()))
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
        ])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("last-event-id"),
            HeaderName::from_static("idempotency-key"),
        ])
        .expose_headers([header::LOCATION])
}

/// The API's listener: accepted connections get TCP_NODELAY and a write timeout.
///
/// - Without TCP_NODELAY, a small SSE event written right after another waits for the
///   client's delayed ACK (Nagle): 40 ms added to a live event's delivery, measured by P2 of
///   spool-bench (BENCHMARKS.md).
/// - The write timeout (`SPOOL_WRITE_TIMEOUT_SECS`) closes a connection whose client has not
///   taken a byte for that long while the server had bytes for it (review M10): a stream
///   whose client stopped reading (a frozen tab, a stuck proxy) would otherwise hold its socket,
///   the kernel's send buffer and its session forever, since such a client still answers TCP.
///   An idle stream writes nothing but a keep-alive comment every 15 s, which never waits.
///   `tokio-io-timeout` times each pending write; hyper has no such option.
///
/// - The minimum drain rate (`SPOOL_MIN_DRAIN_BYTES_PER_SEC`, [`crate::drain`]) closes one whose
///   client takes its bytes, but too slowly for the write timeout to notice (review B-M3).
pub(crate) struct Connections {
    listener: TcpListener,
    write_timeout: Option<std::time::Duration>,
    min_drain: u64,
}

impl axum::serve::Listener for Connections {
    type Io = crate::drain::Drain<
        std::pin::Pin<Box<tokio_io_timeout::TimeoutStream<tokio::net::TcpStream>>>,
    >;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (tcp, addr) = axum::serve::Listener::accept(&mut self.listener).await;
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(error = %err, "TCP_NODELAY not set");
        }
        let mut io = tokio_io_timeout::TimeoutStream::new(tcp);
        io.set_write_timeout(self.write_timeout);
        (crate::drain::Drain::new(Box::pin(io), self.min_drain), addr)
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// The address of a connection's peer (`ConnectInfo<Peer>` in a request's extensions): a public
/// session's client, unless it is a trusted proxy (`crate::auth::public::client_address`).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Connections>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Connections>) -> Self {
        Self(*stream.remote_addr())
    }
}

/// Serves the API on `listener` until `shutdown` fires, then lets open requests finish.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = Connections {
        listener,
        write_timeout: state.config.write_timeout,
        min_drain: state.config.min_drain_bytes_per_sec,
    };
    // `into_make_service_with_connect_info`: each connection gets a clone of the router (an
    // `Arc`), and its peer's address (a public session's client, `crate::auth::public`). Serving the
    // `Router` itself rebuilds every route per connection (`with_state`), about 30 KiB that an
    // idle SSE subscriber holds for as long as it is connected (spool-bench P4, massif).
    axum::serve(
        listener,
        router(state).into_make_service_with_connect_info::<Peer>(),
    )
    .with_graceful_shutdown(async move { shutdown.cancelled().await })
    .await
}
