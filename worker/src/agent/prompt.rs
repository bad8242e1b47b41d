//! The prompt: the agent's instructions and the thread's recent messages, kept within the
//! agent's context budget.
//!
//! The conversation starts from the instructions and the last `history_depth` completed
//! messages of the thread, ending with the run's user message; the loop appends each step's
//! model output and tool results. Before each model call, [`prune`] keeps the estimated prompt
//! (4 characters a token) within `context_budget_tokens`: old tool results become placeholders
//! first, then messages before the last 3 user turns.

use sqlx::PgPool;

use spool_shared::agent::AgentSpec;
use spool_shared::db::messages;
use spool_shared::db::runs::Run;
use spool_shared::status::Role;

use super::llm::ChatMessage;

/// What replaces a tool result pruned to fit the context window.
pub(crate) const PRUNED: &str = "[earlier tool result omitted to fit the context window]";

/// The conversation a run starts from, and its user's input (the last message).
pub(crate) async fn start(
    db: &PgPool,
    run: &Run,
    spec: &AgentSpec,
) -> sqlx::Result<(Vec<ChatMessage>, String)> {
    let mut conversation = Vec::new();
    if !spec.instructions.is_empty() {
        conversation.push(ChatMessage::System {
            content: spec.instructions.clone(),
        });
    }
    let history = messages::history(
        db,
        run.thread_id,
        run.user_message_id,
        i64::from(spec.history_depth),
    )
    .await?;
    let input = history
        .last()
        .map(|(_, content)| content.clone())
        .unwrap_or_default();
    for (role, content) in history {
        conversation.push(match role {
            Role::User => ChatMessage::User { content },
            Role::Assistant => ChatMessage::Assistant {
                content: Some(content),
                tool_calls: Vec::new(),
            },
        });
    }
    Ok((conversation, input))
}

/// Estimated tokens of the conversation (4 characters a token).
fn estimate_tokens(conversation: &[ChatMessage]) -> usize {
    conversation
        .iter()
        .map(|m| match m {
            ChatMessage::System { content }
            | ChatMessage::User { content }
            | ChatMessage::Tool { content, .. } => content.len(),
            ChatMessage::Assistant {
                content,
                tool_calls,
            } => {
                content.as_ref().map_or(0, String::len)
                    + tool_calls
                        .iter()
                        .map(|c| c.arguments.len() + c.name.len())
                        .sum::<usize>()
            }
        })
        .sum::<usize>()
        / 4
}

/// Over budget: replaces old tool results by placeholders (all but the latest step's), then
/// messages before the last 3 user turns.
pub(crate) fn prune(conversation: &mut [ChatMessage], budget: u32) {
    let budget = budget as usize;
    if estimate_tokens(conversation) <= budget {
        return;
    }
    let last_assistant = conversation
        .iter()
        .rposition(|m| matches!(m, ChatMessage::Assistant { .. }))
        .unwrap_or(0);
    for message in conversation[..last_assistant].iter_mut() {
        if let ChatMessage::Tool { content, .. } = message {
            *content = PRUNED.to_owned();
        }
    }
    if estimate_tokens(conversation) <= budget {
        return;
    }
    let user_turns: Vec<usize> = conversation
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, ChatMessage::User { .. }))
        .map(|(i, _)| i)
        .collect();
    if user_turns.len() > 3 {
        let keep_from = user_turns[user_turns.len() - 3];
        for message in conversation[..keep_from].iter_mut() {
            match message {
                ChatMessage::User { content } | ChatMessage::Tool { content, .. } => {
                    *content = "[omitted]".to_owned()
                }
                ChatMessage::Assistant { content, .. } => *content = Some("[omitted]".to_owned()),
                ChatMessage::System { .. } => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_budget_old_tool_results_become_placeholders_and_the_last_step_stays() {
        let big = "y".repeat(4000);
        let mut conversation = vec![
            ChatMessage::User {
                content: "q".into(),
            },
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![],
            },
            ChatMessage::Tool {
                tool_call_id: "1".into(),
                content: big.clone(),
            },
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![],
            },
            ChatMessage::Tool {
                tool_call_id: "2".into(),
                content: big.clone(),
            },
        ];
        prune(&mut conversation, 1500);
        assert_eq!(
            conversation[2],
            ChatMessage::Tool {
                tool_call_id: "1".into(),
                content: PRUNED.into()
            }
        );
        assert_eq!(
            conversation[4],
            ChatMessage::Tool {
                tool_call_id: "2".into(),
                content: big
            }
        );
    }
}
