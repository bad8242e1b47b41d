//! A run's transcript as Responses API streaming events.
//!
//! The events are a pure function of the run's [`Transcript`] items, numbered in order: the
//! same entries always give the same events with the same `sequence_number`s. That is what
//! makes a `starting_after=N` resume exact, on any API process and after any crash: the route
//! replays the run's entries from its start, maps them again, and sends only the events after N.
//!
//! | transcript item | Responses events |
//! |---|---|
//! | (before any) | `response.created` (sequence 0) |
//! | started | `response.in_progress` |
//! | text part opened | `response.output_item.added` (a `message` item), `response.content_part.added` |
//! | more text | `response.output_text.delta` |
//! | text part ended | `response.output_text.done`, `response.content_part.done`, `response.output_item.done` (`incomplete` if superseded; only the last, again, for a part superseded after it ended) |
//! | call made | `response.output_item.added` (a `function_call` item), `response.function_call_arguments.delta`, `response.function_call_arguments.done` |
//! | call ended | `response.output_item.done` (the call, `completed` once answered, else `incomplete`) |
//! | ended | nothing: `response.completed`, `response.failed` (also for a cancelled response: OpenAI's document has no `response.cancelled`) or `response.incomplete` follows, built by the route from Postgres ([`ResponseEvents::terminal`]) |
//!
//! A new attempt after a crash has no event of its own: the transcript shows only what goes
//! beyond what the client had, or supersedes a part (closed `incomplete`) and opens a new one;
//! the terminal event's `response` (from Postgres) then holds the answer as it was stored.
//! Pauses, heartbeats, citations and errors are not translated.

use serde_json::{Value, json};

use spool_shared::event::StepCall;
use spool_shared::event::transcript::Shown;

#[cfg(doc)]
use spool_shared::event::transcript::Transcript;

/// The Responses events of one run, numbered (see the module doc).
#[derive(Debug)]
pub struct ResponseEvents {
    /// The response object as created (status `queued`, no output): the lifecycle events'.
    head: Value,
    /// The response id the item ids derive from.
    prefix: String,
    next: u64,
}

impl ResponseEvents {
    /// The events of the response `head` (the object as created: `queued`, no output).
    pub fn new(head: Value) -> Self {
        let prefix = head["id"].as_str().unwrap_or_default().replace('-', "");
        Self {
            head,
            prefix,
            next: 0,
        }
    }

    /// The sequence number the next event gets.
    pub fn next_sequence(&self) -> u64 {
        self.next
    }

    /// The first event: `response.created`.
    pub fn created(&mut self) -> Value {
        let response = self.head.clone();
        self.event(json!({"type": "response.created", "response": response}))
    }

    /// The events of one transcript item, in order.
    pub fn shown(&mut self, shown: &Shown) -> Vec<Value> {
        match shown {
            Shown::Started => {
                let mut response = self.head.clone();
                response["status"] = json!("in_progress");
                vec![self.event(json!({"type": "response.in_progress", "response": response}))]
            }
            Shown::TextStarted { index } => self.text_started(*index),
            Shown::TextDelta { index, delta } => {
                let id = self.message_id(*index);
                vec![self.event(json!({
                    "type": "response.output_text.delta", "item_id": id, "output_index": index,
                    "content_index": 0, "delta": delta, "logprobs": [],
                }))]
            }
            Shown::TextEnded {
                index,
                text,
                superseded,
                again,
            } => self.text_ended(*index, text, *superseded, *again),
            Shown::CallMade { index, call } => self.call_made(*index, call),
            Shown::CallEnded {
                index,
                call,
                completed,
            } => {
                let status = if *completed {
                    "completed"
                } else {
                    "incomplete"
                };
                let item = call_item(
                    &format!("fc_{}", call.tool_call_id),
                    &call.tool_call_id,
                    &call.tool_name,
                    &call.arguments_text(),
                    status,
                    None,
                );
                vec![self.event(json!({
                    "type": "response.output_item.done", "output_index": index, "item": item,
                }))]
            }
            Shown::CallAnswered { .. }
            | Shown::StepStarted(_)
            | Shown::StepEnded(_)
            | Shown::Citations(_)
            | Shown::Paused(_)
            | Shown::Failed(_)
            | Shown::Ended(_) => Vec::new(),
        }
    }

    fn text_started(&mut self, index: usize) -> Vec<Value> {
        let id = self.message_id(index);
        vec![
            self.event(json!({
                "type": "response.output_item.added", "output_index": index,
                "item": message_item(&id, "", "in_progress"),
            })),
            self.event(json!({
                "type": "response.content_part.added", "item_id": id,
                "output_index": index, "content_index": 0, "part": text_part(""),
            })),
        ]
    }

    fn text_ended(
        &mut self,
        index: usize,
        text: &str,
        superseded: bool,
        again: bool,
    ) -> Vec<Value> {
        let id = self.message_id(index);
        if again {
            // Closed before: only the item is replaced, now `incomplete`.
            let item = message_item(&id, text, "incomplete");
            return vec![self.event(json!({
                "type": "response.output_item.done", "output_index": index, "item": item,
            }))];
        }
        let status = if superseded {
            "incomplete"
        } else {
            "completed"
        };
        vec![
            self.event(json!({
                "type": "response.output_text.done", "item_id": id,
                "output_index": index, "content_index": 0, "text": text, "logprobs": [],
            })),
            self.event(json!({
                "type": "response.content_part.done", "item_id": id,
                "output_index": index, "content_index": 0, "part": text_part(text),
            })),
            self.event(json!({
                "type": "response.output_item.done", "output_index": index,
                "item": message_item(&id, text, status),
            })),
        ]
    }

    fn call_made(&mut self, index: usize, call: &StepCall) -> Vec<Value> {
        let id = format!("fc_{}", call.tool_call_id);
        let arguments = call.arguments_text();
        let (call_id, name) = (&call.tool_call_id, &call.tool_name);
        vec![
            self.event(json!({
                "type": "response.output_item.added", "output_index": index,
                "item": call_item(&id, call_id, name, "", "in_progress", None),
            })),
            self.event(json!({
                "type": "response.function_call_arguments.delta", "item_id": id,
                "output_index": index, "delta": arguments,
            })),
            self.event(json!({
                "type": "response.function_call_arguments.done", "item_id": id,
                "output_index": index, "name": name, "arguments": arguments,
            })),
        ]
    }

    /// The terminal event for the stored `response` (its `status` picks the type).
    pub fn terminal(&mut self, response: Value) -> Value {
        let kind = match response["status"].as_str() {
            Some("completed") => "response.completed",
            // OpenAI's document defines no event for a cancelled response (OpenAI ends its
            // stream without one): `response.failed`, whose `response.status` says
            // `cancelled`, is the terminal event a client already handles.
            Some("incomplete") => "response.incomplete",
            _ => "response.failed",
        };
        self.event(json!({"type": kind, "response": response}))
    }

    /// `response.output_item.done` for `item` at `output_index` (a function call the response
    /// ends with, while the run waits for its output).
    pub fn item_done(&mut self, output_index: usize, item: Value) -> Value {
        self.event(json!({
            "type": "response.output_item.done", "output_index": output_index, "item": item,
        }))
    }

    /// An `error` event (`code`, `message`).
    pub fn error(&mut self, code: &str, message: &str) -> Value {
        self.event(json!({"type": "error", "code": code, "message": message, "param": null}))
    }

    fn message_id(&self, index: usize) -> String {
        format!("msg_{}_{index}", self.prefix)
    }

    fn event(&mut self, mut event: Value) -> Value {
        event["sequence_number"] = json!(self.next);
        self.next += 1;
        event
    }
}

/// A `message` output item with one `output_text` part.
pub(crate) fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" && text.is_empty() {
        json!([])
    } else {
        json!([text_part(text)])
    };
    json!({"type": "message", "id": id, "role": "assistant", "status": status,
        "content": content})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A `function_call` output item (`output`: the result the tool gave, a Spool addition).
pub(crate) fn call_item(
    id: &str,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
    output: Option<&str>,
) -> Value {
    let mut item = json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
        "arguments": arguments, "status": status});
    if let Some(output) = output {
        item["output"] = json!(output);
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;
    use spool_shared::event::transcript::Transcript;
    use spool_shared::event::{
        AttemptRestarted, BlockId, Data, Done, MessageEnd, MessageStart, Origin, StepCall,
        StepResult, TextDelta, TextEnd, TextStart,
    };
    use spool_shared::run::Usage;
    use spool_shared::status::RunStatus;
    use spool_shared::{MessageId, ThreadId, WorkflowId};

    fn origin(attempt: i32) -> Origin {
        Origin {
            thread_id: ThreadId(uuid::Uuid::nil()),
            workflow_id: WorkflowId(uuid::Uuid::nil()),
            message_id: MessageId(uuid::Uuid::nil()),
            attempt,
            depth: 0,
        }
    }

    /// How many of `events` are of `kind`.
    fn count(events: &[Value], kind: &str) -> usize {
        events.iter().filter(|e| e["type"] == kind).count()
    }

    fn text(events: &[Value]) -> String {
        events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap_or_default())
            .collect()
    }

    fn run(events: &[(i32, Data)]) -> Vec<Value> {
        let mut t = ResponseEvents::new(json!({"id": "r-1", "status": "queued", "output": []}));
        let mut transcript = Transcript::new();
        let mut out = vec![t.created()];
        for (attempt, data) in events {
            for shown in transcript.push(&origin(*attempt).event(data.clone())) {
                out.extend(t.shown(&shown));
            }
        }
        out
    }

    fn start() -> Data {
        MessageStart::new(None).into()
    }

    fn text_start(block: &str) -> Data {
        TextStart {
            block_id: BlockId(block.into()),
        }
        .into()
    }

    fn delta(block: &str, text: &str) -> Data {
        TextDelta {
            block_id: BlockId(block.into()),
            delta: text.into(),
        }
        .into()
    }

    fn text_end(block: &str) -> Data {
        TextEnd {
            block_id: BlockId(block.into()),
        }
        .into()
    }

    fn restarted(attempt: i32) -> Data {
        AttemptRestarted { attempt }.into()
    }

    fn message_end() -> Data {
        MessageEnd {
            status: RunStatus::Completed,
            usage: Usage::default(),
            blocked: false,
            output: None,
        }
        .into()
    }

    fn done() -> Data {
        Done {
            status: RunStatus::Completed,
        }
        .into()
    }

    fn call(name: &str, arguments: Value) -> Data {
        StepCall {
            step: 1,
            tool_call_id: "c1".into(),
            tool_name: name.into(),
            arguments,
        }
        .into()
    }

    #[test]
    fn sequence_numbers_count_from_zero_without_gaps() {
        let out = run(&[
            (1, start()),
            (1, text_start("b1")),
            (1, delta("b1", "Hel")),
            (1, delta("b1", "lo")),
            (1, text_end("b1")),
            (1, message_end()),
            (1, done()),
        ]);
        let numbers: Vec<u64> = out
            .iter()
            .filter_map(|e| e["sequence_number"].as_u64())
            .collect();
        assert_eq!(numbers, (0..out.len() as u64).collect::<Vec<_>>());
        assert_eq!(out[0]["type"], "response.created");
        assert_eq!(out[1]["type"], "response.in_progress");
        assert_eq!(text(&out), "Hello");
        let done: Vec<&Value> = out
            .iter()
            .filter(|e| e["type"] == "response.output_item.done")
            .collect();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0]["item"]["content"][0]["text"], "Hello");
    }

    #[test]
    fn a_restart_that_repeats_itself_sends_no_text_twice() {
        let out = run(&[
            (1, start()),
            (1, text_start("b1")),
            (1, delta("b1", "The answer ")),
            (2, restarted(2)),
            (2, text_start("b1")),
            (2, delta("b1", "The ans")),
            (2, delta("b1", "wer is 42")),
            (2, text_end("b1")),
            (2, message_end()),
            (2, done()),
        ]);
        assert_eq!(text(&out), "The answer is 42");
        let added = count(&out, "response.output_item.added");
        assert_eq!(added, 1, "{out:#?}");
    }

    #[test]
    fn a_restart_that_writes_something_else_closes_the_shown_item() {
        let out = run(&[
            (1, start()),
            (1, delta("b1", "Maybe")),
            (2, restarted(2)),
            (2, delta("b1", "Surely")),
            (2, text_end("b1")),
            (2, done()),
        ]);
        let done: Vec<&Value> = out
            .iter()
            .filter(|e| e["type"] == "response.output_item.done")
            .collect();
        assert_eq!(done.len(), 2);
        assert_eq!(done[0]["item"]["status"], "incomplete");
        assert_eq!(done[0]["item"]["content"][0]["text"], "Maybe");
        assert_eq!(done[1]["item"]["status"], "completed");
        assert_eq!(done[1]["item"]["content"][0]["text"], "Surely");
        assert_ne!(done[0]["item"]["id"], done[1]["item"]["id"]);
    }

    #[test]
    fn tool_steps_are_function_call_items_and_survive_a_restart() {
        let result = StepResult {
            step: 1,
            tool_call_id: "c1".into(),
            tool_name: "lookup".into(),
            output: "1".into(),
            is_error: false,
        };
        let out = run(&[
            (1, start()),
            (1, delta("b1", "Looking")),
            (1, text_end("b1")),
            (1, call("lookup", json!({"q": "x"}))),
            (1, result.into()),
            (1, delta("b2", "Found")),
            (2, restarted(2)),
            (2, delta("b2", "Found it")),
            (2, text_end("b2")),
            (2, done()),
        ]);
        assert_eq!(text(&out), "LookingFound it");
        let args = out
            .iter()
            .find(|e| e["type"] == "response.function_call_arguments.done")
            .expect("arguments");
        assert_eq!(args["arguments"], r#"{"q":"x"}"#);
        let items: Vec<(u64, String)> = out
            .iter()
            .filter(|e| e["type"] == "response.output_item.done")
            .map(|e| {
                let index = e["output_index"].as_u64().unwrap_or(99);
                (index, e["item"]["type"].as_str().unwrap_or("").to_owned())
            })
            .collect();
        assert_eq!(
            items,
            [
                (0, "message".to_owned()),
                (1, "function_call".to_owned()),
                (2, "message".to_owned())
            ]
        );
    }

    #[test]
    fn a_second_crash_in_the_same_step_sends_no_text_twice() {
        let out = run(&[
            (1, start()),
            (1, delta("b1", "The answer ")),
            (2, restarted(2)),
            (2, delta("b1", "The ans")),
            (3, restarted(3)),
            (3, delta("b1", "The answer is 42")),
            (3, text_end("b1")),
            (3, done()),
        ]);
        assert_eq!(text(&out), "The answer is 42");
        let added = count(&out, "response.output_item.added");
        assert_eq!(added, 1, "{out:#?}");
    }

    #[test]
    fn text_that_ended_before_a_crash_and_is_written_anew_is_closed_again_as_incomplete() {
        let out = run(&[
            (1, start()),
            (1, delta("b1", "Let me check")),
            (1, text_end("b1")),
            (1, call("t", json!({}))),
            (2, restarted(2)),
            (2, delta("b1", "I will look")),
            (2, text_end("b1")),
            (2, call("t", json!({}))),
            (2, done()),
        ]);
        let done: Vec<(u64, String)> = out
            .iter()
            .filter(|e| e["type"] == "response.output_item.done" && e["item"]["type"] == "message")
            .map(|e| {
                let index = e["output_index"].as_u64().unwrap_or(99);
                (index, e["item"]["status"].as_str().unwrap_or("").to_owned())
            })
            .collect();
        assert_eq!(
            done,
            [
                (0, "completed".to_owned()),
                (0, "incomplete".to_owned()),
                (2, "completed".to_owned())
            ],
            "{out:#?}"
        );
    }

    #[test]
    fn the_same_entries_give_the_same_events() {
        let events = [
            (1, start()),
            (1, delta("b1", "a")),
            (2, restarted(2)),
            (2, delta("b1", "ab")),
            (2, done()),
        ];
        assert_eq!(run(&events), run(&events));
    }
}
