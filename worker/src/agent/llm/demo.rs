//! The built-in `demo` model as a [`ChatModel`]: the deterministic reply of [`crate::demo`],
//! streamed delta by delta at `SPOOL_DEMO_DELAY_MS`. It never calls tools.

use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt as _, StreamExt as _};

use spool_shared::run::Usage;

use super::{
    ChatChunk, ChatMessage, ChatModel, ChatRequest, ChatResponse, ChatStream, FinishReason,
    LlmError,
};

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
        let deltas = crate::demo::reply(input, self.tokens);
        let usage = Usage {
            input_tokens: input.split_whitespace().count() as u64,
            output_tokens: deltas.len() as u64,
        };
        let text = deltas.concat();
        let delay = self.delay;
        let chunks = futures::stream::iter(deltas).then(move |delta| async move {
            if !delay.is_zero() {
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
            }))
        });
        async move { Ok(chunks.chain(done).boxed()) }.boxed()
    }
}
