//! The answer's citations in OpenAI's formats: a `url_citation` annotation per span of a cited
//! source with an address, on the `output_text` part that holds the span (Responses:
//! `{type, start_index, end_index, url, title}`, the indices in that part's text) or on the
//! message (Chat Completions: `{type, url_citation: {start_index, end_index, url, title}}`, in
//! the message's content). Sources without an address have no OpenAI form: the stored
//! message's `citations` part keeps them.

use serde_json::{Value, json};

use spool_shared::run::{Citation, MessagePart};

/// The citations of a stored message (its `citations` part), none if it has none.
pub(crate) fn of_parts(parts: &[MessagePart]) -> &[Citation] {
    parts
        .iter()
        .find_map(|part| match part {
            MessagePart::Citations { citations } => Some(citations.as_slice()),
            _ => None,
        })
        .unwrap_or_default()
}

/// The Responses annotations of the text that starts at character `from` of the stored answer
/// and is `len` characters long, in the order of their spans.
pub(crate) fn url_citations(citations: &[Citation], from: usize, len: usize) -> Vec<Value> {
    let mut found: Vec<(usize, Value)> = Vec::new();
    for citation in citations {
        let Some(url) = citation.url.as_str() else {
            continue;
        };
        let title = citation.title.as_str().unwrap_or(url);
        for span in &citation.spans {
            if span.start < from || span.end > from + len {
                continue;
            }
            let (start, end) = (span.start - from, span.end - from);
            found.push((
                start,
                json!({"type": "url_citation", "start_index": start, "end_index": end,
                    "url": url, "title": title}),
            ));
        }
    }
    found.sort_by_key(|(start, _)| *start);
    found
        .into_iter()
        .map(|(_, annotation)| annotation)
        .collect()
}

/// Where each text part of a stored message starts in its content (the parts' texts joined by
/// a blank line, as the worker writes them), with its length, both in characters.
pub(crate) fn text_offsets(parts: &[MessagePart]) -> Vec<(usize, usize)> {
    let mut offsets = Vec::new();
    let mut at = 0;
    for part in parts {
        if let MessagePart::Text { text } = part {
            if !offsets.is_empty() {
                at += 2;
            }
            let len = text.chars().count();
            offsets.push((at, len));
            at += len;
        }
    }
    offsets
}

/// A Responses annotation in Chat Completions' shape, moved `by` characters on.
fn chat(annotation: &Value, by: usize) -> Value {
    let index = |key: &str| annotation[key].as_u64().unwrap_or_default() + by as u64;
    json!({"type": "url_citation", "url_citation": {
        "start_index": index("start_index"), "end_index": index("end_index"),
        "url": annotation["url"], "title": annotation["title"]}})
}

/// The Chat Completions annotations of a stored message's whole content.
pub(crate) fn chat_annotations(citations: &[Citation]) -> Vec<Value> {
    url_citations(citations, 0, usize::MAX / 2)
        .iter()
        .map(|a| chat(a, 0))
        .collect()
}

/// The Chat Completions annotations of output items whose texts are joined as they are (a
/// segment of a run that paused at function calls), from their `output_text` annotations.
pub(crate) fn chat_annotations_of(items: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    let mut at = 0;
    let texts = items
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default());
    for part in texts {
        let Some(text) = part["text"].as_str() else {
            continue;
        };
        for annotation in part["annotations"].as_array().into_iter().flatten() {
            out.push(chat(annotation, at));
        }
        at += text.chars().count();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use spool_shared::run::Span;

    fn citation(url: Option<&str>, spans: &[(usize, usize)]) -> Citation {
        Citation {
            index: 1,
            chunk_id: None,
            title: Value::Null,
            url: url.map_or(Value::Null, |u| json!(u)),
            snippet: json!("s"),
            spans: spans
                .iter()
                .map(|&(start, end)| Span { start, end })
                .collect(),
        }
    }

    #[test]
    fn spans_land_on_the_text_part_that_holds_them_in_its_own_characters() {
        let parts = [
            MessagePart::Text {
                text: "é [1]".into(),
            },
            MessagePart::Text {
                text: "then [2] [1]".into(),
            },
        ];
        let offsets = text_offsets(&parts);
        assert_eq!(offsets, [(0, 5), (7, 12)]);
        let citations = [
            citation(Some("https://a"), &[(2, 5), (16, 19)]),
            citation(Some("https://b"), &[(12, 15)]),
            citation(None, &[(12, 15)]),
        ];
        let first = url_citations(&citations, 0, 5);
        assert_eq!(first.len(), 1);
        assert_eq!(
            (first[0]["start_index"].clone(), first[0]["title"].clone()),
            (json!(2), json!("https://a"))
        );
        let second = url_citations(&citations, 7, 12);
        let starts: Vec<u64> = second
            .iter()
            .filter_map(|a| a["start_index"].as_u64())
            .collect();
        assert_eq!(starts, [5, 9]);
        assert_eq!(second[0]["url"], "https://b");
        let chat = chat_annotations(&citations);
        assert_eq!(chat.len(), 3);
        assert_eq!(chat[0]["url_citation"]["start_index"], 2);
        assert_eq!(chat[2]["url_citation"]["end_index"], 19);
    }
}
