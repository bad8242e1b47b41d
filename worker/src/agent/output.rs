//! The final answer: held back while it is decided, checked against the agent's
//! `response_format` (with one repair round), and screened by `pre_response` hooks.
//!
//! The loop calls [`Loop::final_answer`] when the model answers without tool calls. The text
//! reaches the stream only once it is decided when the agent has a `response_format` or
//! `pre_response` hooks (the loop's `buffer`): a client never sees an answer that is then
//! repaired, rewritten or denied.
//!
//! What must stay true: an answer the run completes with validates against the agent's
//! `response_format`, whoever wrote it last (the model, its repair, or a hook's rewrite),
//! or the run fails with `invalid_output`; a hook's denial answers with the hook's text,
//! marked `blocked`, and with no structured output.

use serde_json::Value;

use spool_shared::agent::ResponseFormat;
use spool_shared::run::FailureCode;

use super::Loop;
use super::answer::{Exit, LoopEnd};
use super::context::Attempt;
use super::llm::{ChatMessage, Choice};
use super::model_call::call_model;

impl Loop<'_> {
    /// The final answer. Held back (not streamed) while it is decided: validated against the
    /// agent's `response_format` (one repair round), then screened by `pre_response` hooks.
    pub(super) async fn final_answer(&mut self, a: &Attempt<'_>, step: u32, text: String) -> Exit {
        let (mut text, mut output) = (text, None);
        if let Some(format) = self.spec.response_format.clone() {
            match self.validated(a, step, &format, text).await {
                Ok((valid, value)) => (text, output) = (valid, Some(value)),
                Err(exit) => return exit,
            }
        }
        if self.screened {
            match self.screen(step, text, output).await {
                Ok(screened) => (text, output) = screened,
                Err(exit) => return exit,
            }
        }
        if self.buffer {
            a.emit_text(step, &text);
        }
        self.answer.add_text(&text);
        self.answer.output = output.map(Box::new);
        LoopEnd::Completed(std::mem::take(&mut self.answer)).into()
    }

    /// The answer (`text`, and its JSON `output`) as `pre_response` hooks leave it: unchanged;
    /// rewritten (a rewrite must validate against `response_format` too, else the run fails
    /// with `invalid_output`); or, denied, the hook's text, `blocked`, with no output.
    async fn screen(
        &mut self,
        step: u32,
        text: String,
        output: Option<Value>,
    ) -> Result<(String, Option<Value>), Exit> {
        match self.hooks.pre_response(step, &text).await {
            Ok(rewritten) if rewritten == text => Ok((text, output)),
            Ok(rewritten) => {
                let checked = self
                    .spec
                    .response_format
                    .as_ref()
                    .map(|f| f.check(&rewritten));
                match checked {
                    None => Ok((rewritten, output)),
                    Some(Ok(value)) => Ok((rewritten, Some(value))),
                    Some(Err(problems)) => {
                        let message = format!(
                            "a pre_response hook's rewrite of the answer does not validate \
                             against response_format: {problems}"
                        );
                        Err(self.failed(FailureCode::InvalidOutput, message))
                    }
                }
            }
            Err(instead) => {
                self.answer.blocked = true;
                Ok((instead, None))
            }
        }
    }

    /// `text` as JSON valid against `format`; else one repair round: the model sees its answer
    /// and what is wrong with it, with no tools, and answers again (that call's text stands).
    /// An answer that still does not validate fails the run with `invalid_output`.
    async fn validated(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        format: &ResponseFormat,
        text: String,
    ) -> Result<(String, Value), Exit> {
        let problems = match format.check(&text) {
            Ok(value) => return Ok((text, value)),
            Err(problems) => problems,
        };
        tracing::info!(%problems, "the answer does not validate against response_format; repairing");
        let mut request = self.request(step);
        request.tools.clear();
        request.tool_choice = Choice::None;
        request.messages.push(ChatMessage::Assistant {
            content: Some(text),
            tool_calls: Vec::new(),
        });
        request.messages.push(ChatMessage::User {
            content: format!(
                "Your answer does not match the required JSON Schema: {problems}. Answer again \
                 with only the JSON value, nothing else."
            ),
        });
        let repaired = match call_model(a, &self.models, request, step, true).await {
            Ok(output) => output,
            Err(end) => return Err(self.model_failed(end)),
        };
        self.spend(a, repaired.usage).await?;
        let value = format.check(&repaired.text).map_err(|problems| {
            let message = format!(
                "the answer does not validate against response_format, even after a repair \
                 round: {problems}"
            );
            self.failed(FailureCode::InvalidOutput, message)
        })?;
        self.answer.final_step = Some(Box::new((step, repaired.saved(Vec::new(), Vec::new()))));
        Ok((repaired.text, value))
    }
}
