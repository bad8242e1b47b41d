//! A run's events (the thread stream's envelopes) as Responses API streaming events.
//!
//! The translation is a pure function of the run's entries from its `message_start`: the same
//! entries always give the same events with the same `sequence_number`s. That is what makes a
//! `starting_after=N` resume exact, on any API process and after any crash: the route replays
//! the run's entries from its start, translates them again, and sends only the events after N.
//!
//! | run event | Responses events |
//! |---|---|
//! | (before any) | `response.created` (sequence 0) |
//! | `message_start` | `response.in_progress` |
//! | `text_start` | `response.output_item.added` (a `message` item), `response.content_part.added` |
//! | `text_delta` | `response.output_text.delta` |
//! | `text_end` | `response.output_text.done`, `response.content_part.done`, `response.output_item.done` |
//! | `step` (call) | `response.output_item.added` (a `function_call` item), `response.function_call_arguments.delta`, `response.function_call_arguments.done` |
//! | `step` (result) | `response.output_item.done` (the call, `completed`, with the result in `output`) |
//! | `message_end` | `response.output_item.done` for items still open |
//! | `done` | `response.completed`, `response.failed` or `response.cancelled` (built by the route from Postgres) |
//!
//! `attempt_restarted` (a new attempt after a crash) has no event of its own: the Responses
//! stream cannot take text back. What the client has been shown since the last tool result is
//! remembered, and the new attempt's text is compared with it: text the client already has is
//! not sent again, text beyond it is sent as more deltas of the same item. Only if the new
//! attempt writes something else (a model need not repeat itself) is the shown item closed as
//! `incomplete` and the new text sent as a new item; the terminal event's `response` (from
//! Postgres) then holds the answer as it was stored. Pauses, heartbeats and citations are not
//! translated.

use serde_json::{Value, json};

use spool_shared::event::{Event, EventType};

/// One output item as the client has been shown it.
#[derive(Debug)]
enum Item {
    Message {
        id: String,
        /// The run's text block (`b{step}`).
        block: String,
        /// The text sent.
        shown: String,
        /// A new attempt's text of this block so far, while it repeats the shown text.
        replayed: Option<String>,
        /// Whether its `output_item.done` was sent.
        done: bool,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        done: bool,
    },
}

/// The translation of one run's events (see the module doc).
#[derive(Debug)]
pub struct Translator {
    /// The response object as created (status `queued`, no output): the lifecycle events'.
    head: Value,
    /// The message id the item ids derive from.
    prefix: String,
    next: u64,
    items: Vec<Item>,
    /// Items from here on were shown after the last tool result: a new attempt redoes them.
    tentative_from: usize,
    /// The message item text deltas go to.
    current: Option<usize>,
    /// Whether a new attempt has started (its text is compared with what was shown).
    restarted: bool,
    started: bool,
    /// The run's `done` has been translated: the terminal event is next.
    pub ended: bool,
}

impl Translator {
    /// A translator for the response `head` (the object as created: `queued`, no output).
    pub fn new(head: Value) -> Self {
        let prefix = head["id"].as_str().unwrap_or_default().replace('-', "");
        Self {
            head,
            prefix,
            next: 0,
            items: Vec::new(),
            tentative_from: 0,
            current: None,
            restarted: false,
            started: false,
            ended: false,
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

    /// The events of one run event, in order.
    pub fn push(&mut self, event: &Event) -> Vec<Value> {
        let mut out = Vec::new();
        let data = &event.data;
        match event.kind {
            EventType::MessageStart if !self.started => {
                self.started = true;
                let mut response = self.head.clone();
                response["status"] = json!("in_progress");
                out.push(self.event(json!({"type": "response.in_progress", "response": response})));
            }
            EventType::TextStart => self.text_start(str_of(data, "block_id"), &mut out),
            EventType::TextDelta => {
                let block = str_of(data, "block_id");
                if self.current.is_none() {
                    self.text_start(block, &mut out);
                }
                self.text_delta(block, str_of(data, "delta"), &mut out);
            }
            EventType::TextEnd => self.text_end(&mut out),
            EventType::Step if data["phase"] == "call" => self.call(data, &mut out),
            EventType::Step if data["phase"] == "result" => {
                self.result(str_of(data, "tool_call_id"), &mut out);
            }
            EventType::AttemptRestarted => {
                // Another attempt (after one that crashed mid-replay, too): compare from the
                // start of what was shown since the last tool result.
                self.restarted = true;
                self.current = None;
                for item in &mut self.items[self.tentative_from..] {
                    if let Item::Message { replayed, .. } = item {
                        *replayed = None;
                    }
                }
            }
            EventType::MessageEnd => self.close_all(&mut out),
            EventType::Done => {
                self.close_all(&mut out);
                self.ended = true;
            }
            _ => {}
        }
        out
    }

    /// The terminal event for the stored `response` (its `status` picks the type).
    pub fn terminal(&mut self, response: Value) -> Value {
        self.ended = true;
        let kind = match response["status"].as_str() {
            Some("completed") => "response.completed",
            Some("cancelled") => "response.cancelled",
            Some("incomplete") => "response.incomplete",
            _ => "response.failed",
        };
        self.event(json!({"type": kind, "response": response}))
    }

    /// An `error` event (`code`, `message`).
    pub fn error(&mut self, code: &str, message: &str) -> Value {
        self.event(json!({"type": "error", "code": code, "message": message, "param": null}))
    }

    fn event(&mut self, mut event: Value) -> Value {
        event["sequence_number"] = json!(self.next);
        self.next += 1;
        event
    }

    fn text_start(&mut self, block: &str, out: &mut Vec<Value>) {
        if self.restarted {
            // The new attempt redoes a block the client has seen: compare, do not repeat.
            let again = (self.tentative_from..self.items.len()).find(|&i| {
                matches!(&self.items[i], Item::Message { block: b, replayed: None, .. }
                    if b == block)
            });
            if let Some(index) = again {
                if let Item::Message { replayed, .. } = &mut self.items[index] {
                    *replayed = Some(String::new());
                }
                self.current = Some(index);
                return;
            }
        }
        self.open_message(block, String::new(), out);
    }

    fn open_message(&mut self, block: &str, text: String, out: &mut Vec<Value>) {
        let index = self.items.len();
        let id = format!("msg_{}_{index}", self.prefix);
        out.push(self.event(json!({
            "type": "response.output_item.added", "output_index": index,
            "item": message_item(&id, "", "in_progress"),
        })));
        out.push(self.event(json!({
            "type": "response.content_part.added", "item_id": id, "output_index": index,
            "content_index": 0, "part": text_part(""),
        })));
        self.items.push(Item::Message {
            id,
            block: block.to_owned(),
            shown: String::new(),
            replayed: None,
            done: false,
        });
        self.current = Some(index);
        if !text.is_empty() {
            self.send_delta(index, &text, out);
        }
    }

    fn send_delta(&mut self, index: usize, delta: &str, out: &mut Vec<Value>) {
        let Item::Message { id, shown, .. } = &mut self.items[index] else {
            return;
        };
        shown.push_str(delta);
        let id = id.clone();
        out.push(self.event(json!({
            "type": "response.output_text.delta", "item_id": id, "output_index": index,
            "content_index": 0, "delta": delta, "logprobs": [],
        })));
    }

    fn text_delta(&mut self, block: &str, delta: &str, out: &mut Vec<Value>) {
        let Some(index) = self.current else {
            return;
        };
        let Item::Message {
            shown,
            replayed,
            done,
            ..
        } = &mut self.items[index]
        else {
            return;
        };
        let Some(replayed) = replayed else {
            self.send_delta(index, delta, out);
            return;
        };
        replayed.push_str(delta);
        if shown.starts_with(replayed.as_str()) {
            // The client has this text already.
            return;
        }
        if !*done && replayed.starts_with(shown.as_str()) {
            // The new attempt has caught up and goes on: send only what is new.
            let new = replayed[shown.len()..].to_owned();
            self.send_delta(index, &new, out);
            if let Item::Message { replayed, .. } = &mut self.items[index] {
                *replayed = None;
            }
            return;
        }
        // The new attempt writes something else: close what was shown, start a new item.
        let text = replayed.clone();
        self.abandon(index, out);
        self.open_message(block, text, out);
    }

    fn text_end(&mut self, out: &mut Vec<Value>) {
        let Some(index) = self.current.take() else {
            return;
        };
        if let Item::Message {
            shown,
            replayed: Some(replayed),
            block,
            ..
        } = &self.items[index]
            && replayed != shown
        {
            // The new attempt ended its text short of what was shown.
            let (text, block) = (replayed.clone(), block.clone());
            self.abandon(index, out);
            self.open_message(&block, text, out);
            self.finish_message(self.items.len() - 1, "completed", out);
            return;
        }
        self.finish_message(index, "completed", out);
    }

    /// Marks a shown item as left behind by a new attempt: closed `incomplete` (again, if it
    /// had been closed: an `output_item.done` for the same index replaces the earlier one).
    fn abandon(&mut self, index: usize, out: &mut Vec<Value>) {
        let mut reclose = None;
        if let Item::Message {
            replayed,
            done,
            id,
            shown,
            ..
        } = &mut self.items[index]
        {
            *replayed = None;
            if *done {
                reclose = Some(message_item(id, shown, "incomplete"));
            }
        }
        if let Some(item) = reclose {
            out.push(self.event(json!({
                "type": "response.output_item.done", "output_index": index, "item": item,
            })));
        }
        self.finish_message(index, "incomplete", out);
        if let Item::Message { block, .. } = &mut self.items[index] {
            // Never matched again.
            block.clear();
        }
    }

    fn finish_message(&mut self, index: usize, status: &str, out: &mut Vec<Value>) {
        let Item::Message {
            id,
            shown,
            done,
            replayed,
            ..
        } = &mut self.items[index]
        else {
            return;
        };
        *replayed = None;
        if *done {
            return;
        }
        *done = true;
        let (id, text) = (id.clone(), shown.clone());
        out.push(self.event(json!({
            "type": "response.output_text.done", "item_id": id, "output_index": index,
            "content_index": 0, "text": text, "logprobs": [],
        })));
        out.push(self.event(json!({
            "type": "response.content_part.done", "item_id": id, "output_index": index,
            "content_index": 0, "part": text_part(&text),
        })));
        out.push(self.event(json!({
            "type": "response.output_item.done", "output_index": index,
            "item": message_item(&id, &text, status),
        })));
    }

    fn call(&mut self, data: &Value, out: &mut Vec<Value>) {
        let call_id = str_of(data, "tool_call_id");
        if self.call_index(call_id).is_some() {
            // A new attempt announces a call the client has seen.
            return;
        }
        if let Some(index) = self.current.take() {
            self.finish_message(index, "completed", out);
        }
        let name = str_of(data, "tool_name");
        let arguments = match &data["arguments"] {
            Value::String(text) => text.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        let index = self.items.len();
        let id = format!("fc_{call_id}");
        out.push(self.event(json!({
            "type": "response.output_item.added", "output_index": index,
            "item": call_item(&id, call_id, name, "", "in_progress", None),
        })));
        out.push(self.event(json!({
            "type": "response.function_call_arguments.delta", "item_id": id,
            "output_index": index, "delta": arguments,
        })));
        out.push(self.event(json!({
            "type": "response.function_call_arguments.done", "item_id": id,
            "output_index": index, "name": name, "arguments": arguments,
        })));
        self.items.push(Item::Call {
            id,
            call_id: call_id.to_owned(),
            name: name.to_owned(),
            arguments,
            done: false,
        });
    }

    fn call_index(&self, call_id: &str) -> Option<usize> {
        self.items
            .iter()
            .position(|item| matches!(item, Item::Call { call_id: c, .. } if c == call_id))
    }

    fn result(&mut self, call_id: &str, out: &mut Vec<Value>) {
        if let Some(index) = self.call_index(call_id) {
            self.finish_call(index, "completed", out);
        }
        // What the client has seen so far stays: a new attempt continues after this result.
        self.tentative_from = self.items.len();
        self.restarted = false;
    }

    fn finish_call(&mut self, index: usize, status: &str, out: &mut Vec<Value>) {
        let Item::Call {
            id,
            call_id,
            name,
            arguments,
            done,
        } = &mut self.items[index]
        else {
            return;
        };
        if *done {
            return;
        }
        *done = true;
        let item = call_item(id, call_id, name, arguments, status, None);
        out.push(self.event(json!({
            "type": "response.output_item.done", "output_index": index, "item": item,
        })));
    }

    /// Closes every item still open (the message has ended).
    fn close_all(&mut self, out: &mut Vec<Value>) {
        self.current = None;
        for index in 0..self.items.len() {
            match &self.items[index] {
                Item::Message { replayed, .. } => {
                    // A new attempt that had not caught up with the shown text left it short.
                    let status = if replayed.is_some() {
                        "incomplete"
                    } else {
                        "completed"
                    };
                    self.finish_message(index, status, out);
                }
                Item::Call { .. } => self.finish_call(index, "incomplete", out),
            }
        }
    }
}

fn str_of<'a>(data: &'a Value, key: &str) -> &'a str {
    data[key].as_str().unwrap_or_default()
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
    use spool_shared::event::Origin;
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

    fn run(events: &[(i32, EventType, Value)]) -> Vec<Value> {
        let mut t = Translator::new(json!({"id": "r-1", "status": "queued", "output": []}));
        let mut out = vec![t.created()];
        for (attempt, kind, data) in events {
            out.extend(t.push(&origin(*attempt).event(*kind, data.clone())));
        }
        out
    }

    fn delta(block: &str, text: &str) -> Value {
        json!({"block_id": block, "delta": text})
    }

    #[test]
    fn sequence_numbers_count_from_zero_without_gaps() {
        let out = run(&[
            (1, EventType::MessageStart, json!({})),
            (1, EventType::TextStart, json!({"block_id": "b1"})),
            (1, EventType::TextDelta, delta("b1", "Hel")),
            (1, EventType::TextDelta, delta("b1", "lo")),
            (1, EventType::TextEnd, json!({"block_id": "b1"})),
            (1, EventType::MessageEnd, json!({"status": "completed"})),
            (1, EventType::Done, json!({"status": "completed"})),
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
            (1, EventType::MessageStart, json!({})),
            (1, EventType::TextStart, json!({"block_id": "b1"})),
            (1, EventType::TextDelta, delta("b1", "The answer ")),
            (2, EventType::AttemptRestarted, json!({"attempt": 2})),
            (2, EventType::TextStart, json!({"block_id": "b1"})),
            (2, EventType::TextDelta, delta("b1", "The ans")),
            (2, EventType::TextDelta, delta("b1", "wer is 42")),
            (2, EventType::TextEnd, json!({"block_id": "b1"})),
            (2, EventType::MessageEnd, json!({})),
            (2, EventType::Done, json!({})),
        ]);
        assert_eq!(text(&out), "The answer is 42");
        let added = count(&out, "response.output_item.added");
        assert_eq!(added, 1, "{out:#?}");
    }

    #[test]
    fn a_restart_that_writes_something_else_closes_the_shown_item() {
        let out = run(&[
            (1, EventType::MessageStart, json!({})),
            (1, EventType::TextDelta, delta("b1", "Maybe")),
            (2, EventType::AttemptRestarted, json!({"attempt": 2})),
            (2, EventType::TextDelta, delta("b1", "Surely")),
            (2, EventType::TextEnd, json!({"block_id": "b1"})),
            (2, EventType::Done, json!({})),
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
        let call = json!({"phase": "call", "tool_call_id": "c1", "tool_name": "lookup",
            "arguments": {"q": "x"}});
        let result =
            json!({"phase": "result", "tool_call_id": "c1", "tool_name": "lookup", "output": "1"});
        let out = run(&[
            (1, EventType::MessageStart, json!({})),
            (1, EventType::TextDelta, delta("b1", "Looking")),
            (1, EventType::TextEnd, json!({"block_id": "b1"})),
            (1, EventType::Step, call.clone()),
            (1, EventType::Step, result),
            (1, EventType::TextDelta, delta("b2", "Found")),
            (2, EventType::AttemptRestarted, json!({"attempt": 2})),
            (2, EventType::TextDelta, delta("b2", "Found it")),
            (2, EventType::TextEnd, json!({"block_id": "b2"})),
            (2, EventType::Done, json!({})),
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
            (1, EventType::MessageStart, json!({})),
            (1, EventType::TextDelta, delta("b1", "The answer ")),
            (2, EventType::AttemptRestarted, json!({"attempt": 2})),
            (2, EventType::TextDelta, delta("b1", "The ans")),
            (3, EventType::AttemptRestarted, json!({"attempt": 3})),
            (3, EventType::TextDelta, delta("b1", "The answer is 42")),
            (3, EventType::TextEnd, json!({"block_id": "b1"})),
            (3, EventType::Done, json!({})),
        ]);
        assert_eq!(text(&out), "The answer is 42");
        let added = count(&out, "response.output_item.added");
        assert_eq!(added, 1, "{out:#?}");
    }

    #[test]
    fn text_that_ended_before_a_crash_and_is_written_anew_is_closed_again_as_incomplete() {
        let call =
            json!({"phase": "call", "tool_call_id": "c1", "tool_name": "t", "arguments": {}});
        let out = run(&[
            (1, EventType::MessageStart, json!({})),
            (1, EventType::TextDelta, delta("b1", "Let me check")),
            (1, EventType::TextEnd, json!({"block_id": "b1"})),
            (1, EventType::Step, call.clone()),
            (2, EventType::AttemptRestarted, json!({"attempt": 2})),
            (2, EventType::TextDelta, delta("b1", "I will look")),
            (2, EventType::TextEnd, json!({"block_id": "b1"})),
            (2, EventType::Step, call),
            (2, EventType::Done, json!({})),
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
            (1, EventType::MessageStart, json!({})),
            (1, EventType::TextDelta, delta("b1", "a")),
            (2, EventType::AttemptRestarted, json!({})),
            (2, EventType::TextDelta, delta("b1", "ab")),
            (2, EventType::Done, json!({})),
        ];
        assert_eq!(run(&events), run(&events));
    }
}
