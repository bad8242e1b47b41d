//! One thread per Chat Completions conversation, without `metadata.thread_id` (DESIGN section
//! 11): Chat Completions clients resend the whole conversation with every request, so a request
//! that resends an earlier one's messages, that request's answer and a new user message
//! continues the earlier request's thread (only the new message is sent to it), instead of
//! seeding a new thread with the whole conversation again.
//!
//! Matched by content: each completion records the hash of the conversation it was sent (the
//! roles and texts of its messages; function-calling turns left out) for its caller and thread
//! (`chat_histories`); a request whose messages, less the last answer and the new message, hash
//! to a recorded conversation continues that thread if the resent answer is the thread's last
//! answer (a thread that has gone on since, elsewhere, is not continued).

use serde_json::Value;

use spool_shared::ThreadId;
use spool_shared::db::{chat_histories, idempotency};

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::openai::responses::content_text;

/// The roles and texts of a conversation, without function-calling turns (`tool` messages,
/// assistant messages that only call).
fn turns(messages: &[Value]) -> Vec<(String, String)> {
    messages
        .iter()
        .filter_map(|message| {
            let role = message["role"].as_str()?;
            if role == "tool" {
                return None;
            }
            let text = content_text(&message["content"])?;
            Some((role.to_owned(), text))
        })
        .collect()
}

/// The hash a conversation is recorded under.
fn hash(turns: &[(String, String)]) -> String {
    let parts: Vec<&[u8]> = turns
        .iter()
        .flat_map(|(role, text)| [role.as_bytes(), text.as_bytes()])
        .collect();
    idempotency::request_hash(&parts)
}

/// The thread `messages` continue: that of the earlier request they resend, if its last answer
/// is the one they resend.
pub(crate) async fn continued(
    state: &AppState,
    caller: &Caller,
    messages: &[Value],
) -> Result<Option<ThreadId>, ApiError> {
    let turns = turns(messages);
    let n = turns.len();
    if n < 3 || turns[n - 1].0 != "user" || turns[n - 2].0 != "assistant" {
        return Ok(None);
    }
    let Some(thread) =
        chat_histories::find(&state.db, &caller.owner, &hash(&turns[..n - 2])).await?
    else {
        return Ok(None);
    };
    let answer = chat_histories::last_answer(&state.db, thread).await?;
    let resent = turns[n - 2].1.trim_end();
    let same =
        answer.is_some_and(|answer| !resent.is_empty() && answer.trim_end().ends_with(resent));
    Ok(same.then_some(thread))
}

/// Records that `messages` were sent to `thread_id`, for the request that resends them.
pub(crate) async fn remember(
    state: &AppState,
    caller: &Caller,
    messages: &[Value],
    thread_id: ThreadId,
) -> Result<(), ApiError> {
    chat_histories::record(&state.db, &caller.owner, &hash(&turns(messages)), thread_id).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_conversation_resent_with_its_answer_hashes_as_it_was_sent() {
        let first = [json!({"role": "user", "content": "Hi"})];
        let second = [
            json!({"role": "user", "content": [{"type": "text", "text": "Hi"}]}),
            json!({"role": "assistant", "content": null, "tool_calls": []}),
            json!({"role": "tool", "tool_call_id": "c", "content": "1"}),
            json!({"role": "assistant", "content": "Hello"}),
            json!({"role": "user", "content": "How are you?"}),
        ];
        let resent = turns(&second);
        assert_eq!(resent.len(), 3);
        assert_eq!(hash(&turns(&first)), hash(&resent[..1]));
        assert_ne!(hash(&turns(&first)), hash(&resent));
    }
}
