//! What a client has been shown of one run's message, whatever format it reads: the run's
//! events, attempts and all, as one linear transcript of text parts and tool calls.
//!
//! Every client format (the AI SDK's UI message stream, the Responses and Chat Completions
//! streams, the `spool` CLI) maps the [`Shown`] items of a [`Transcript`] once, so the rules
//! below live here and nowhere else:
//!
//! - Parts are numbered in the order they were first shown (`index`); a format names them from
//!   it (`msg_<id>_<index>`).
//! - `attempt_restarted` (a new attempt after a crash) cannot take text back from a client.
//!   What was shown since the last tool result is remembered, and the new attempt's text is
//!   compared with it: text the client has is not shown again, text beyond it is shown as more
//!   of the same part. Only if the new attempt writes something else (a model need not repeat
//!   itself) is the shown part ended as superseded and the new text shown as a new part.
//! - A tool call, and a call's result, is shown once, whatever the attempts; so are a step's
//!   start and end (a new attempt that redoes a step starts it again).
//! - The transcript is a pure function of the events: the same events always give the same
//!   items, which is what lets a format resume exactly by rebuilding a run's transcript from its
//!   `message_start` and skipping what the client had.

use std::collections::HashSet;

use super::{
    ApprovalRequested, BlockId, Data, Event, Failure, InputRequested, RequiresAction, Step,
    StepCall,
};
use super::{StepEnd, StepResult, StepStart, TextDelta};
use crate::run::Citation;
use crate::status::RunStatus;

/// What a paused run waits for, as its event said.
#[derive(Clone, Debug, PartialEq)]
pub enum Pause {
    /// Client tool outputs.
    RequiresAction(RequiresAction),
    /// A person's decision on a call.
    ApprovalRequested(ApprovalRequested),
    /// The user's answer to a graph agent's `human_input` node.
    InputRequested(InputRequested),
}

/// One thing to show, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Shown {
    /// The message began (its first `message_start`).
    Started,
    /// A text part opens.
    TextStarted {
        /// Its place in the message.
        index: usize,
    },
    /// More text of a part.
    TextDelta {
        /// The part.
        index: usize,
        /// The text to add.
        delta: String,
    },
    /// A text part is done.
    TextEnded {
        /// The part.
        index: usize,
        /// Its whole text as shown.
        text: String,
        /// A new attempt wrote something else instead: the part is not part of the answer.
        superseded: bool,
        /// The part had been ended already (only a superseded part is ended again).
        again: bool,
    },
    /// The model called a tool (once per call).
    CallMade {
        /// The call's part.
        index: usize,
        /// The call.
        call: StepCall,
    },
    /// A call's part is done.
    CallEnded {
        /// The part.
        index: usize,
        /// The call.
        call: StepCall,
        /// With its result; `false`: the message ended first.
        completed: bool,
    },
    /// A call's result (once per call).
    CallAnswered {
        /// The call's part, if the call was shown.
        index: Option<usize>,
        /// The result.
        result: StepResult,
    },
    /// A step begins (once per step).
    StepStarted(StepStart),
    /// A step is over (once per step).
    StepEnded(StepEnd),
    /// The sources the answer cites.
    Citations(Vec<Citation>),
    /// The run paused for the client or a person.
    Paused(Pause),
    /// The run failed.
    Failed(Failure),
    /// The run is over (its `done`).
    Ended(RunStatus),
}

/// One part as the client has been shown it.
#[derive(Debug)]
enum Part {
    Text {
        /// The run's text block; `None` once superseded (never matched again).
        block: Option<BlockId>,
        /// The text shown.
        shown: String,
        /// A new attempt's text of this block so far, while it repeats the shown text.
        replayed: Option<String>,
        done: bool,
    },
    Call {
        call: StepCall,
        done: bool,
    },
}

/// The transcript of one run's message (see the module doc).
#[derive(Debug, Default)]
pub struct Transcript {
    parts: Vec<Part>,
    /// Parts from here on were shown after the last tool result: a new attempt redoes them.
    tentative_from: usize,
    /// The text part deltas go to.
    current: Option<usize>,
    /// Whether a new attempt has started (its text is compared with what was shown).
    restarted: bool,
    started: bool,
    answered: HashSet<String>,
    /// The steps whose start, and whose end, were shown.
    steps_started: HashSet<u32>,
    steps_ended: HashSet<u32>,
    ended: bool,
}

impl Transcript {
    /// An empty transcript.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the run's `done` has been seen.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// What one event of the run adds, in order.
    pub fn push(&mut self, event: &Event) -> Vec<Shown> {
        let mut out = Vec::new();
        match &event.data {
            Data::MessageStart(_) if !self.started => {
                self.started = true;
                out.push(Shown::Started);
            }
            Data::TextStart(start) => self.text_start(&start.block_id, &mut out),
            Data::TextDelta(TextDelta { block_id, delta }) => {
                if self.current.is_none() {
                    self.text_start(block_id, &mut out);
                }
                self.text_delta(block_id, delta, &mut out);
            }
            Data::TextEnd(_) => self.text_end(&mut out),
            Data::Step(Step::Call(call)) => self.call(call, &mut out),
            Data::Step(Step::Result(result)) => self.result(result, &mut out),
            Data::AttemptRestarted(_) => {
                // Another attempt (after one that crashed mid-replay, too): compare from the
                // start of what was shown since the last tool result.
                self.restarted = true;
                self.current = None;
                for part in &mut self.parts[self.tentative_from..] {
                    if let Part::Text { replayed, .. } = part {
                        *replayed = None;
                    }
                }
            }
            Data::StepStart(start) => {
                if self.steps_started.insert(start.step) {
                    out.push(Shown::StepStarted(start.clone()));
                }
            }
            Data::StepEnd(end) => {
                if self.steps_ended.insert(end.step) {
                    out.push(Shown::StepEnded(end.clone()));
                }
            }
            Data::Citations(citations) => out.push(Shown::Citations(citations.citations.clone())),
            Data::RequiresAction(action) => {
                out.push(Shown::Paused(Pause::RequiresAction(action.clone())));
            }
            Data::ApprovalRequested(approval) => {
                out.push(Shown::Paused(Pause::ApprovalRequested(approval.clone())));
            }
            Data::InputRequested(input) => {
                out.push(Shown::Paused(Pause::InputRequested(input.clone())));
            }
            Data::Error(failure) => out.push(Shown::Failed(failure.clone())),
            Data::MessageEnd(_) => self.close_all(&mut out),
            Data::Done(done) => {
                self.close_all(&mut out);
                self.ended = true;
                out.push(Shown::Ended(done.status));
            }
            Data::MessageStart(_) | Data::Heartbeat(_) => {}
        }
        out
    }

    fn text_start(&mut self, block: &BlockId, out: &mut Vec<Shown>) {
        if self.restarted {
            // The new attempt redoes a block the client has seen: compare, do not repeat.
            let again = (self.tentative_from..self.parts.len()).find(|&i| {
                matches!(&self.parts[i], Part::Text { block: Some(b), replayed: None, .. }
                    if b == block)
            });
            if let Some(index) = again {
                if let Part::Text { replayed, .. } = &mut self.parts[index] {
                    *replayed = Some(String::new());
                }
                self.current = Some(index);
                return;
            }
        }
        self.open_text(block, String::new(), out);
    }

    fn open_text(&mut self, block: &BlockId, text: String, out: &mut Vec<Shown>) {
        let index = self.parts.len();
        out.push(Shown::TextStarted { index });
        self.parts.push(Part::Text {
            block: Some(block.clone()),
            shown: String::new(),
            replayed: None,
            done: false,
        });
        self.current = Some(index);
        if !text.is_empty() {
            self.send_delta(index, &text, out);
        }
    }

    fn send_delta(&mut self, index: usize, delta: &str, out: &mut Vec<Shown>) {
        let Part::Text { shown, .. } = &mut self.parts[index] else {
            return;
        };
        shown.push_str(delta);
        out.push(Shown::TextDelta {
            index,
            delta: delta.to_owned(),
        });
    }

    fn text_delta(&mut self, block: &BlockId, delta: &str, out: &mut Vec<Shown>) {
        let Some(index) = self.current else {
            return;
        };
        let Part::Text {
            shown,
            replayed,
            done,
            ..
        } = &mut self.parts[index]
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
            // The new attempt has caught up and goes on: show only what is new.
            let new = replayed[shown.len()..].to_owned();
            self.send_delta(index, &new, out);
            if let Part::Text { replayed, .. } = &mut self.parts[index] {
                *replayed = None;
            }
            return;
        }
        // The new attempt writes something else: end what was shown, open a new part.
        let text = replayed.clone();
        self.supersede(index, out);
        self.open_text(block, text, out);
    }

    fn text_end(&mut self, out: &mut Vec<Shown>) {
        let Some(index) = self.current.take() else {
            return;
        };
        if let Part::Text {
            shown,
            replayed: Some(replayed),
            block: Some(block),
            ..
        } = &self.parts[index]
            && replayed != shown
        {
            // The new attempt ended its text short of what was shown.
            let (text, block) = (replayed.clone(), block.clone());
            self.supersede(index, out);
            self.open_text(&block, text, out);
            self.finish_text(self.parts.len() - 1, false, out);
            return;
        }
        self.finish_text(index, false, out);
    }

    /// Marks a shown part as left behind by a new attempt: ended as superseded (again, if it
    /// had ended).
    fn supersede(&mut self, index: usize, out: &mut Vec<Shown>) {
        if let Part::Text {
            replayed,
            done,
            shown,
            ..
        } = &mut self.parts[index]
        {
            *replayed = None;
            if *done {
                out.push(Shown::TextEnded {
                    index,
                    text: shown.clone(),
                    superseded: true,
                    again: true,
                });
            }
        }
        self.finish_text(index, true, out);
        if let Part::Text { block, .. } = &mut self.parts[index] {
            *block = None;
        }
    }

    fn finish_text(&mut self, index: usize, superseded: bool, out: &mut Vec<Shown>) {
        let Part::Text {
            shown,
            done,
            replayed,
            ..
        } = &mut self.parts[index]
        else {
            return;
        };
        *replayed = None;
        if *done {
            return;
        }
        *done = true;
        out.push(Shown::TextEnded {
            index,
            text: shown.clone(),
            superseded,
            again: false,
        });
    }

    fn call(&mut self, call: &StepCall, out: &mut Vec<Shown>) {
        if self.call_index(&call.tool_call_id).is_some() {
            // A new attempt announces a call the client has seen.
            return;
        }
        if let Some(index) = self.current.take() {
            self.finish_text(index, false, out);
        }
        let index = self.parts.len();
        out.push(Shown::CallMade {
            index,
            call: call.clone(),
        });
        self.parts.push(Part::Call {
            call: call.clone(),
            done: false,
        });
    }

    fn call_index(&self, call_id: &str) -> Option<usize> {
        self.parts.iter().position(
            |part| matches!(part, Part::Call { call, .. } if call.tool_call_id == call_id),
        )
    }

    fn result(&mut self, result: &StepResult, out: &mut Vec<Shown>) {
        let index = self.call_index(&result.tool_call_id);
        if let Some(index) = index {
            self.finish_call(index, true, out);
        }
        if self.answered.insert(result.tool_call_id.clone()) {
            out.push(Shown::CallAnswered {
                index,
                result: result.clone(),
            });
        }
        // What the client has seen so far stays: a new attempt continues after this result.
        self.tentative_from = self.parts.len();
        self.restarted = false;
    }

    fn finish_call(&mut self, index: usize, completed: bool, out: &mut Vec<Shown>) {
        let Part::Call { call, done } = &mut self.parts[index] else {
            return;
        };
        if *done {
            return;
        }
        *done = true;
        out.push(Shown::CallEnded {
            index,
            call: call.clone(),
            completed,
        });
    }

    /// Ends every part still open (the message has ended).
    fn close_all(&mut self, out: &mut Vec<Shown>) {
        self.current = None;
        for index in 0..self.parts.len() {
            match &self.parts[index] {
                Part::Text { replayed, .. } => {
                    // A new attempt that had not caught up with the shown text left it short.
                    let superseded = replayed.is_some();
                    self.finish_text(index, superseded, out);
                }
                Part::Call { .. } => self.finish_call(index, false, out),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{
        AttemptRestarted, Done, MessageEnd, MessageStart, Origin, TextEnd, TextStart,
    };
    use crate::run::Usage;
    use crate::{MessageId, ThreadId, WorkflowId};

    fn origin(attempt: i32) -> Origin {
        Origin {
            thread_id: ThreadId(uuid::Uuid::nil()),
            workflow_id: WorkflowId(uuid::Uuid::nil()),
            message_id: MessageId(uuid::Uuid::nil()),
            attempt,
            depth: 0,
        }
    }

    fn block(id: &str) -> BlockId {
        BlockId(id.to_owned())
    }

    fn delta(id: &str, text: &str) -> Data {
        TextDelta {
            block_id: block(id),
            delta: text.to_owned(),
        }
        .into()
    }

    fn start(id: &str) -> Data {
        TextStart {
            block_id: block(id),
        }
        .into()
    }

    fn end(id: &str) -> Data {
        TextEnd {
            block_id: block(id),
        }
        .into()
    }

    fn restarted(attempt: i32) -> Data {
        AttemptRestarted { attempt }.into()
    }

    fn done() -> Data {
        Done {
            status: RunStatus::Completed,
        }
        .into()
    }

    fn call(id: &str) -> StepCall {
        StepCall {
            step: 1,
            tool_call_id: id.to_owned(),
            tool_name: "read".to_owned(),
            arguments: serde_json::json!({"path": "/a"}),
        }
    }

    fn result(id: &str) -> StepResult {
        StepResult {
            step: 1,
            tool_call_id: id.to_owned(),
            tool_name: "read".to_owned(),
            output: "42".to_owned(),
            is_error: false,
        }
    }

    fn shown(events: Vec<(i32, Data)>) -> Vec<Shown> {
        let mut transcript = Transcript::new();
        events
            .into_iter()
            .flat_map(|(attempt, data)| transcript.push(&origin(attempt).event(data)))
            .collect()
    }

    /// The text a client ends up with: every part's deltas, superseded parts left out.
    fn text_of(shown: &[Shown]) -> String {
        let superseded: HashSet<usize> = shown
            .iter()
            .filter_map(|s| match s {
                Shown::TextEnded {
                    index,
                    superseded: true,
                    ..
                } => Some(*index),
                _ => None,
            })
            .collect();
        shown
            .iter()
            .filter_map(|s| match s {
                Shown::TextDelta { index, delta } if !superseded.contains(index) => {
                    Some(delta.as_str())
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_plain_answer_is_one_part_opened_filled_and_ended() {
        let out = shown(vec![
            (1, MessageStart::new(None).into()),
            (1, start("s1")),
            (1, delta("s1", "Hel")),
            (1, delta("s1", "lo")),
            (1, end("s1")),
            (
                1,
                MessageEnd {
                    status: RunStatus::Completed,
                    usage: Usage::default(),
                    blocked: false,
                    output: None,
                }
                .into(),
            ),
            (1, done()),
        ]);
        assert_eq!(
            out,
            [
                Shown::Started,
                Shown::TextStarted { index: 0 },
                Shown::TextDelta {
                    index: 0,
                    delta: "Hel".into()
                },
                Shown::TextDelta {
                    index: 0,
                    delta: "lo".into()
                },
                Shown::TextEnded {
                    index: 0,
                    text: "Hello".into(),
                    superseded: false,
                    again: false
                },
                Shown::Ended(RunStatus::Completed),
            ]
        );
    }

    #[test]
    fn a_new_attempt_that_repeats_the_shown_text_adds_only_what_is_new() {
        let out = shown(vec![
            (1, start("s1")),
            (1, delta("s1", "The answer ")),
            (2, restarted(2)),
            (2, start("s1")),
            (2, delta("s1", "The ans")),
            (2, delta("s1", "wer is 42")),
            (2, end("s1")),
            (2, done()),
        ]);
        assert_eq!(text_of(&out), "The answer is 42");
        let opened = out
            .iter()
            .filter(|s| matches!(s, Shown::TextStarted { .. }))
            .count();
        assert_eq!(opened, 1, "one part: {out:?}");
    }

    #[test]
    fn a_new_attempt_that_writes_something_else_supersedes_the_shown_part() {
        let out = shown(vec![
            (1, delta("s1", "Maybe")),
            (2, restarted(2)),
            (2, delta("s1", "Surely")),
            (2, end("s1")),
            (2, done()),
        ]);
        assert_eq!(text_of(&out), "Surely");
        assert!(out.contains(&Shown::TextEnded {
            index: 0,
            text: "Maybe".into(),
            superseded: true,
            again: false
        }));
    }

    #[test]
    fn what_was_shown_up_to_a_tool_result_stays_and_calls_show_once() {
        let out = shown(vec![
            (1, delta("s1", "Looking")),
            (1, end("s1")),
            (1, call("c1").into()),
            (1, result("c1").into()),
            (1, delta("s2", "Found")),
            (2, restarted(2)),
            (2, delta("s2", "Found it")),
            // A repeated call or result (a takeover's re-show) is not shown again.
            (2, call("c1").into()),
            (2, result("c1").into()),
            (2, end("s2")),
            (2, done()),
        ]);
        assert_eq!(text_of(&out), "LookingFound it");
        let calls = out
            .iter()
            .filter(|s| matches!(s, Shown::CallMade { .. }))
            .count();
        let answers = out
            .iter()
            .filter(|s| matches!(s, Shown::CallAnswered { .. }))
            .count();
        assert_eq!((calls, answers), (1, 1), "{out:?}");
        assert!(out.contains(&Shown::CallEnded {
            index: 1,
            call: call("c1"),
            completed: true
        }));
    }

    #[test]
    fn a_part_that_had_ended_is_ended_again_when_superseded() {
        let out = shown(vec![
            (1, delta("s1", "Let me check")),
            (1, end("s1")),
            (1, call("c1").into()),
            (2, restarted(2)),
            (2, delta("s1", "I will look")),
            (2, end("s1")),
            (2, call("c1").into()),
            (2, done()),
        ]);
        assert!(out.contains(&Shown::TextEnded {
            index: 0,
            text: "Let me check".into(),
            superseded: true,
            again: true
        }));
        assert_eq!(text_of(&out), "I will look");
        // The call the message ended before it was answered is ended incomplete.
        assert!(out.contains(&Shown::CallEnded {
            index: 1,
            call: call("c1"),
            completed: false
        }));
    }
}
