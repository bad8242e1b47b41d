//! The provider clients against providers that misbehave, each a real HTTP server on loopback:
//! one that redirects (the key must not follow), one that keeps a stream open with SSE comments
//! only, one that streams data past the call's deadline, one whose event or response is too
//! large, one whose error is a novel. Every call must end, by a bounded time, with a clear
//! error that shows no more of the provider's text than it may.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, Response, StatusCode};
use axum::routing::post;
use futures::StreamExt as _;
use serde_json::json;

use spool_worker::agent::llm::anthropic::AnthropicClient;
use spool_worker::agent::llm::openai::OpenAiClient;
use spool_worker::agent::llm::{
    ChatChunk, ChatMessage, ChatModel, ChatRequest, ChatResponse, Choice, LlmError,
    MAX_RESPONSE_BYTES, Timeouts,
};

/// A server on loopback whose every POST is answered by `answer`; its base URL (`…/v1`).
async fn serve(
    answer: impl Fn(HeaderMap) -> Response<Body> + Clone + Send + Sync + 'static,
) -> String {
    let handler = move |headers: HeaderMap| {
        let answer = answer.clone();
        async move { answer(headers) }
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(handler.clone()))
        .route("/v1/messages", post(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}/v1", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    base
}

/// A streamed answer whose pieces are `next(n)` for n = 0, 1, … sent `gap` apart, forever.
fn endless(gap: Duration, next: fn(u64) -> String) -> Response<Body> {
    let pieces = futures::stream::iter(0..).then(move |n| async move {
        tokio::time::sleep(gap).await;
        Ok::<_, std::convert::Infallible>(bytes::Bytes::from(next(n)))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(pieces))
        .expect("response")
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "m".into(),
        messages: vec![ChatMessage::User {
            content: "hi".into(),
        }],
        tools: Vec::new(),
        tool_choice: Choice::Auto,
        temperature: None,
        top_p: None,
        reasoning_effort: None,
        max_output_tokens: None,
        response_format: None,
        parallel_tool_calls: None,
    }
}

/// One call to an OpenAI-compatible `base` with these timeouts, to its end.
async fn call(base: &str, timeouts: Timeouts) -> Result<ChatResponse, LlmError> {
    let client =
        OpenAiClient::with_timeouts(base, Some("sk-test".into()), timeouts).expect("client");
    drain(&client).await
}

async fn drain(client: &dyn ChatModel) -> Result<ChatResponse, LlmError> {
    let mut stream = client.stream(request()).await?;
    while let Some(chunk) = stream.next().await {
        if let ChatChunk::Done(response) = chunk? {
            return Ok(response);
        }
    }
    Err(LlmError::Incomplete)
}

fn timeouts(idle_ms: u64, call_ms: u64) -> Timeouts {
    Timeouts {
        idle: Duration::from_millis(idle_ms),
        call: Duration::from_millis(call_ms),
    }
}

/// A text delta chunk in the OpenAI wire format.
fn delta(text: &str) -> String {
    let chunk = json!({"choices": [{"index": 0, "delta": {"content": text}}]});
    format!("data: {chunk}\n\n")
}

#[tokio::test]
async fn a_redirect_is_not_followed_so_neither_key_nor_conversation_leaves() {
    // Where the redirect points: it records every request it gets.
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let elsewhere = serve({
        let seen = seen.clone();
        move |headers| {
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(headers);
            Response::new(Body::from("{}"))
        }
    })
    .await;
    let provider = serve(move |_| {
        Response::builder()
            .status(StatusCode::TEMPORARY_REDIRECT)
            .header("location", format!("{elsewhere}/messages"))
            .body(Body::empty())
            .expect("response")
    })
    .await;
    let anthropic =
        AnthropicClient::new(&provider, Some("sk-ant-key".into()), Duration::from_secs(5))
            .expect("client");
    let openai = OpenAiClient::new(&provider, Some("sk-key".into()), Duration::from_secs(5))
        .expect("client");
    for client in [&anthropic as &dyn ChatModel, &openai] {
        let err = drain(client).await.expect_err("a redirect is an error");
        assert!(
            matches!(err, LlmError::Status { status: 307, .. }),
            "{err:?}"
        );
        assert!(!err.is_retryable(), "{err}");
    }
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    assert!(seen.is_empty(), "the redirect was followed: {seen:?}");
}

#[tokio::test]
async fn a_stream_kept_open_by_comments_alone_ends_at_the_idle_timeout() {
    // A gateway's keep-alive: a comment every 50 ms, never a data event.
    let base = serve(|_| endless(Duration::from_millis(50), |_| ": PROCESSING\n\n".into())).await;
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(20), call(&base, timeouts(500, 60_000)))
        .await
        .expect("the call ends by itself");
    let err = result.expect_err("no data: an error");
    assert!(matches!(err, LlmError::Idle(_)), "{err:?}");
    assert!(err.is_retryable(), "a stalled stream may be retried: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_stream_that_never_ends_ends_at_the_call_s_deadline() {
    // Data every 50 ms (so the idle timeout never fires), and no end.
    let base = serve(|_| endless(Duration::from_millis(50), |_| delta("more "))).await;
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(20), call(&base, timeouts(5_000, 800)))
        .await
        .expect("the call ends by itself");
    let err = result.expect_err("past its deadline");
    assert!(matches!(err, LlmError::Deadline(_)), "{err:?}");
    assert!(!err.is_retryable(), "{err}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_provider_that_never_answers_or_never_ends_its_error_ends_at_the_deadline() {
    // Accepts the connection and never answers: the send itself is bounded.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}/v1", silent.local_addr().expect("addr"));
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let started = Instant::now();
    let err = call(&base, timeouts(60_000, 500))
        .await
        .expect_err("past its deadline");
    assert!(matches!(err, LlmError::Deadline(_)), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    held.abort();
    // An error whose body never ends: reading it is bounded too.
    let base = serve(|_| {
        let late = futures::stream::once(async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok::<_, std::convert::Infallible>(bytes::Bytes::from("{}"))
        });
        Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .body(Body::from_stream(late))
            .expect("response")
    })
    .await;
    let started = Instant::now();
    let err = call(&base, timeouts(60_000, 500))
        .await
        .expect_err("past its deadline");
    assert!(matches!(err, LlmError::Deadline(_)), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn an_event_larger_than_the_cap_is_refused_before_it_is_buffered_whole() {
    // One data line of 2 MiB and more, never ended: without a cap the parser would buffer it
    // for as long as the provider sends.
    let base = serve(|_| {
        endless(Duration::from_millis(1), |n| {
            if n == 0 {
                "data: \"".to_owned()
            } else {
                "a".repeat(64 << 10)
            }
        })
    })
    .await;
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        call(&base, timeouts(10_000, 60_000)),
    )
    .await
    .expect("the call ends by itself");
    let err = result.expect_err("too large");
    assert!(
        matches!(&err, LlmError::Protocol(m) if m.contains("larger than")),
        "{err:?}"
    );
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn a_response_larger_than_the_cap_is_refused() {
    // Deltas of 64 KiB, each a fine event, adding up past the response's cap.
    let base = serve(|_| endless(Duration::ZERO, |_| delta(&"b".repeat(64 << 10)))).await;
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        call(&base, timeouts(10_000, 120_000)),
    )
    .await
    .expect("the call ends by itself");
    let err = result.expect_err("too large");
    assert!(
        matches!(&err, LlmError::Protocol(m) if m.contains(&MAX_RESPONSE_BYTES.to_string())),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_provider_s_long_error_reaches_the_run_cut() {
    let novel = format!(
        "upstream https://internal.example/deploy-7 said: {}",
        "z".repeat(20_000)
    );
    let base = serve(move |_| {
        let body = json!({"error": {"message": novel, "type": "server_error"}}).to_string();
        Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("response")
    })
    .await;
    let err = call(&base, timeouts(5_000, 10_000)).await.expect_err("400");
    let LlmError::Status {
        status, message, ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(*status, 400);
    assert!(
        message.chars().count() <= 501,
        "{} chars",
        message.chars().count()
    );
    // A body that is not JSON is cut the same way, and read only so far.
    let base = serve(|_| {
        Response::builder()
            .status(StatusCode::BAD_GATEWAY)
            .body(Body::from("<html>".repeat(100_000)))
            .expect("response")
    })
    .await;
    let err = call(&base, timeouts(5_000, 10_000)).await.expect_err("502");
    assert!(err.to_string().chars().count() < 600, "{err}");
}
