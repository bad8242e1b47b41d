//! The built-in `demo` model: a deterministic reply streamed delta by delta, so the whole
//! pipeline runs with no provider. Its length and pace come from `SPOOL_DEMO_TOKENS` and
//! `SPOOL_DEMO_DELAY_MS`, so tests and benchmarks can make runs short, long, fast or slow. It
//! never calls tools.

use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt as _, StreamExt as _};

use spool_shared::run::Usage;

use super::{
    ChatChunk, ChatMessage, ChatModel, ChatRequest, ChatResponse, ChatStream, FinishReason,
    LlmError,
};

/// The model name under which the demo answers.
pub const MODEL_NAME: &str = "demo";

const WORDS: &[&str] = &[
    "This",
    "is",
    "Spool's",
    "built-in",
    "demo",
    "model,",
    "streaming",
    "a",
    "deterministic",
    "reply",
    "so",
    "the",
    "whole",
    "pipeline",
    "runs",
    "without",
    "a",
    "provider.",
];

/// The reply to `input`, as exactly `tokens` deltas (at least one). The first delta echoes the
/// start of the input, so each thread's reply is recognisably its own.
pub fn reply(input: &str, tokens: usize) -> Vec<String> {
    let echo: String = input.chars().take(40).collect();
    let mut deltas = Vec::with_capacity(tokens.max(1));
    deltas.push(format!("[demo] You said \"{echo}\". "));
    for i in 0..tokens.saturating_sub(1) {
        let word = WORDS[i % WORDS.len()];
        deltas.push(if i + 2 == tokens {
            word.to_owned()
        } else {
            format!("{word} ")
        });
    }
    deltas
}

/// The demo model.
#[derive(Clone, Debug)]
pub struct DemoModel {
    /// Deltas per reply.
    pub tokens: usize,
    /// Pause between deltas.
    pub delay: Duration,
}

impl ChatModel for DemoModel {
    fn system(&self) -> &'static str {
        "spool.demo"
    }

    fn stream(&self, request: ChatRequest) -> BoxFuture<'_, Result<ChatStream, LlmError>> {
        let input = request
            .messages
            .iter()
            .rev()
            .find_map(|m| match m {
                ChatMessage::User { content } => Some(content.as_str()),
                _ => None,
            })
            .unwrap_or_default();
        let deltas = reply(input, self.tokens);
        let usage = Usage {
            input_tokens: input.split_whitespace().count() as u64,
            output_tokens: deltas.len() as u64,
            ..Usage::default()
        };
        let text = deltas.concat();
        let delay = self.delay;
        let chunks = futures::stream::iter(deltas).then(move |delta| async move {
            if delay.is_zero() {
                // As a provider's socket would: every delta spends the task's cooperative
                // budget, so a reply with no pause still yields now and then. Otherwise the
                // run's task never gives way, and the publisher it wakes (which waits behind
                // it on the same worker thread) sends nothing until the whole reply is made.
                tokio::task::coop::consume_budget().await;
            } else {
                tokio::time::sleep(delay).await;
            }
            Ok(ChatChunk::Text(delta))
        });
        let done = futures::stream::once(async move {
            Ok(ChatChunk::Done(ChatResponse {
                text,
                tool_calls: Vec::new(),
                finish_reason: FinishReason::Stop,
                usage,
                model: Some(MODEL_NAME.to_owned()),
                id: None,
            }))
        });
        async move { Ok(chunks.chain(done).boxed()) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_has_exactly_the_configured_number_of_deltas() {
        for n in [1, 2, 5, 100] {
            assert_eq!(reply("hi", n).len(), n);
        }
        assert_eq!(reply("hi", 0).len(), 1);
    }

    // One thread, whose tasks run in the order they were spawned: the observer runs only when
    // the consumer gives way (on several threads it would run at once, fix or not).
    #[tokio::test(flavor = "current_thread")]
    async fn a_reply_with_no_pause_lets_other_tasks_run_while_it_streams() {
        let tokens = 10_000;
        let model = DemoModel {
            tokens,
            delay: Duration::ZERO,
        };
        let request = ChatRequest {
            model: MODEL_NAME.into(),
            messages: vec![ChatMessage::User {
                content: "hi".into(),
            }],
            tools: Vec::new(),
            tool_choice: super::super::Choice::Auto,
            temperature: None,
            max_output_tokens: None,
            response_format: None,
            parallel_tool_calls: None,
            top_p: None,
            reasoning_effort: None,
        };
        let streamed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = streamed.clone();
        let consumer = tokio::spawn(async move {
            let mut chunks = model.stream(request).await.expect("stream");
            while chunks.next().await.is_some() {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let seen = streamed.clone();
        let observer = tokio::spawn(async move { seen.load(std::sync::atomic::Ordering::Relaxed) });
        consumer.await.expect("consumer");
        let at_first_run = observer.await.expect("observer");
        assert_eq!(
            streamed.load(std::sync::atomic::Ordering::Relaxed),
            tokens + 1
        );
        assert!(
            at_first_run < tokens,
            "another task first ran after {at_first_run} of {} chunks",
            tokens + 1
        );
    }

    #[test]
    fn the_reply_is_deterministic_and_echoes_the_input() {
        assert_eq!(reply("hello there", 4), reply("hello there", 4));
        assert_eq!(
            reply("hello", 4).concat(),
            "[demo] You said \"hello\". This is Spool's"
        );
    }
}
