//! A real local webhook receiver: it records every delivery (the Standard Webhooks headers and
//! the body) and answers as scripted: a status code per request in order, or a hang (it holds
//! the request until the sender gives up or dies), then 204 once the script is used up (after a
//! delay, for [`Receiver::slow`]), counting how many requests it holds at once.
//! [`Received::verify`] checks a signature the way a receiver following the spec would.
//! [`blackhole`] is an endpoint that accepts connections and never answers.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::Engine as _;
use hmac::{KeyInit as _, Mac as _};

/// How the receiver answers one request.
#[derive(Clone, Copy, Debug)]
pub enum Reply {
    /// This status, at once.
    Status(u16),
    /// No answer, ever.
    Hang,
    /// `303 See Other` to `/landing` on the same server, which answers a GET with 200.
    SeeOther,
}

/// One delivery as it arrived.
#[derive(Clone, Debug)]
pub struct Received {
    /// `webhook-id`.
    pub id: String,
    /// `webhook-timestamp`.
    pub timestamp: String,
    /// `webhook-signature`.
    pub signature: String,
    /// The body, as sent.
    pub body: String,
}

impl Received {
    /// Whether the signature is `v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}`
    /// keyed with the secret's bytes (the base64 after `whsec_`).
    pub fn verify(&self, secret: &str) -> bool {
        let b64 = base64::engine::general_purpose::STANDARD;
        let Some(key) = secret
            .strip_prefix("whsec_")
            .and_then(|k| b64.decode(k).ok())
        else {
            return false;
        };
        let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key) else {
            return false;
        };
        mac.update(format!("{}.{}.{}", self.id, self.timestamp, self.body).as_bytes());
        let expected = format!("v1,{}", b64.encode(mac.finalize().into_bytes()));
        self.signature.split(' ').any(|s| s == expected)
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_default()
    }
}

/// A receiver on a loopback port.
#[derive(Clone, Default)]
pub struct Receiver {
    received: Arc<Mutex<Vec<Received>>>,
    script: Arc<Mutex<VecDeque<Reply>>>,
    landed: Arc<AtomicUsize>,
    delay: Duration,
    in_flight: Arc<AtomicUsize>,
    most_in_flight: Arc<AtomicUsize>,
}

impl Receiver {
    /// Starts it with its `script`; returns it and its URL.
    pub async fn start(script: &[Reply]) -> (Self, String) {
        Self::start_with(script, Duration::ZERO).await
    }

    /// Starts one that answers every request 204 after `delay`.
    pub async fn slow(delay: Duration) -> (Self, String) {
        Self::start_with(&[], delay).await
    }

    async fn start_with(script: &[Reply], delay: Duration) -> (Self, String) {
        let receiver = Self {
            script: Arc::new(Mutex::new(script.iter().copied().collect())),
            delay,
            ..Self::default()
        };
        let landed = Arc::clone(&receiver.landed);
        let app = axum::Router::new()
            .route(
                "/landing",
                axum::routing::get(move || async move {
                    landed.fetch_add(1, Ordering::SeqCst);
                    "welcome"
                }),
            )
            .route("/hook", post(receive))
            .with_state(receiver.clone());
        let base = crate::serve(app).await;
        (receiver, format!("{base}/hook"))
    }

    /// How many GETs reached `/landing` (a redirect followed).
    pub fn landed(&self) -> usize {
        self.landed.load(Ordering::SeqCst)
    }

    /// Every delivery so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }

    /// How many deliveries have arrived.
    pub fn count(&self) -> usize {
        self.received.lock().expect("lock").len()
    }

    /// The most requests it held at once (arrived, not yet answered).
    pub fn most_in_flight(&self) -> usize {
        self.most_in_flight.load(Ordering::SeqCst)
    }
}

/// Decrements the in-flight count when a request ends, however it ends (the sender may drop it).
struct Holding(Arc<AtomicUsize>);

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A loopback endpoint that accepts every connection and never answers (nor reads): the URL
/// of a receiver that hangs, as a blackholed host does once connected. It stops with the
/// runtime.
pub async fn blackhole() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("http://{addr}/hook")
}

async fn receive(
    State(receiver): State<Receiver>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let now = receiver.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _holding = Holding(Arc::clone(&receiver.in_flight));
    receiver.most_in_flight.fetch_max(now, Ordering::SeqCst);
    receiver.received.lock().expect("lock").push(Received {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    let reply = receiver.script.lock().expect("lock").pop_front();
    match reply {
        Some(Reply::Status(code)) => StatusCode::from_u16(code)
            .unwrap_or(StatusCode::OK)
            .into_response(),
        Some(Reply::Hang) => std::future::pending().await,
        Some(Reply::SeeOther) => {
            (StatusCode::SEE_OTHER, [("location", "/landing")]).into_response()
        }
        None => {
            tokio::time::sleep(receiver.delay).await;
            StatusCode::NO_CONTENT.into_response()
        }
    }
}
