//! Citations from the answer (DESIGN section 9).
//!
//! A tool result that is a retrieval result, `{"chunks": [{id, title?, url?, text}]}` or
//! `{"citations": [{title?, url?, snippet?}]}` in JSON, has each chunk numbered for the model
//! ([`number`]): the numbers follow on from the chunks of the run's earlier results, so `[n]`
//! names one chunk of the whole run. The numbered chunks ([`Source`]) are saved with the step,
//! and the final answer's markers, `[n]` and `[^chunk_id]`, are resolved against them
//! ([`resolve`]) into citations with spans: everything comes from saved data, so a restarted
//! attempt finds the same numbers and the same citations.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::run::{Citation, Span};

/// The longest snippet a citation quotes from its chunk's text, in characters.
pub const MAX_SNIPPET_CHARS: usize = 500;

/// The longest `[^chunk_id]` marker's id, in characters.
const MAX_ID_CHARS: usize = 200;

/// A chunk of a retrieval result, numbered for the model, as its step saves it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Source {
    /// Its number in the run (`[n]`), from 1.
    pub number: u32,
    /// The chunk's own id, if the result gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_id: Option<String>,
    /// Its title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Its text (a `citations` item's `snippet`).
    #[serde(default)]
    pub text: String,
}

/// A retrieval result numbered for the model: what the model sees instead of the JSON, and the
/// chunks, numbered from `first`. `None` for any other result (not JSON, no chunks).
pub fn number(output: &str, first: u32) -> Option<(String, Vec<Source>)> {
    let Ok(Value::Object(mut object)) = serde_json::from_str::<Value>(output) else {
        return None;
    };
    let (key, items) =
        ["chunks", "citations"]
            .into_iter()
            .find_map(|key| match object.get(key) {
                Some(Value::Array(items)) => Some((key, items.clone())),
                _ => None,
            })?;
    let mut sources = Vec::new();
    for item in &items {
        let Some(item) = item.as_object() else {
            continue;
        };
        let Some(number) = first.checked_add(u32::try_from(sources.len()).ok()?) else {
            break;
        };
        if let Some(source) = source(key, item, number) {
            sources.push(source);
        }
    }
    if sources.is_empty() {
        return None;
    }
    object.remove(key);
    let mut text = String::new();
    if !object.is_empty() {
        text.push_str(&Value::Object(object).to_string());
        text.push_str("\n\n");
    }
    text.push_str("Sources (cite one by its number in square brackets after what it supports):");
    for source in &sources {
        text.push_str(&format!("\n\n[{}]", source.number));
        if let Some(title) = &source.title {
            text.push(' ');
            text.push_str(title);
        }
        if let Some(url) = &source.url {
            text.push_str(&format!(" <{url}>"));
        }
        if !source.text.is_empty() {
            text.push('\n');
            text.push_str(&source.text);
        }
    }
    Some((text, sources))
}

/// One item of a retrieval result: a chunk needs its text, a `citations` item a title or an
/// address.
fn source(key: &str, item: &Map<String, Value>, number: u32) -> Option<Source> {
    let string = |field: &str| match item.get(field) {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
        _ => None,
    };
    let chunk_id = match item.get("id") {
        Some(Value::String(id)) if !id.is_empty() => Some(id.clone()),
        Some(Value::Number(id)) => Some(id.to_string()),
        _ => None,
    };
    let (title, url) = (string("title"), string("url"));
    let text = if key == "chunks" {
        string("text")?
    } else {
        if title.is_none() && url.is_none() {
            return None;
        }
        string("snippet")
            .or_else(|| string("text"))
            .unwrap_or_default()
    };
    Some(Source {
        number,
        chunk_id,
        title,
        url,
        text,
    })
}

/// A marker in the answer: `[n]` or `[^chunk_id]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker<'a> {
    Number(u32),
    Id(&'a str),
}

/// The markers of `text`, each with its span in characters.
fn markers(text: &str) -> Vec<(Marker<'_>, Span)> {
    let mut found = Vec::new();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].1 != '[' {
            i += 1;
            continue;
        }
        let close = chars[i + 1..]
            .iter()
            .take(MAX_ID_CHARS + 2)
            .position(|&(_, c)| c == ']' || c == '[')
            .map(|k| i + 1 + k);
        let Some(close) = close.filter(|&k| chars[k].1 == ']') else {
            i += 1;
            continue;
        };
        let inner = &text[chars[i].0 + 1..chars[close].0];
        let marker = if let Some(id) = inner.strip_prefix('^') {
            (!id.is_empty() && !id.contains(char::is_whitespace)).then_some(Marker::Id(id))
        } else if !inner.is_empty() && inner.len() <= 6 && inner.bytes().all(|b| b.is_ascii_digit())
        {
            inner.parse().ok().map(Marker::Number)
        } else {
            None
        };
        match marker {
            Some(marker) => {
                found.push((
                    marker,
                    Span {
                        start: i,
                        end: close + 1,
                    },
                ));
                i = close + 1;
            }
            None => i += 1,
        }
    }
    found
}

/// The citations of `text` (the stored answer): its markers resolved against the run's
/// `sources`, in order of first appearance (`index` from 1), one per chunk with a span per
/// marker. A marker that names no chunk stays text and cites nothing.
pub fn resolve(text: &str, sources: &[Source]) -> Vec<Citation> {
    let mut citations: Vec<(usize, Citation)> = Vec::new();
    for (marker, span) in markers(text) {
        let found = sources.iter().position(|s| match marker {
            Marker::Number(n) => s.number == n,
            Marker::Id(id) => s.chunk_id.as_deref() == Some(id),
        });
        let Some(at) = found else {
            continue;
        };
        // The same chunk given twice (the same id) is one source.
        let at = sources[at]
            .chunk_id
            .as_ref()
            .and_then(|id| sources.iter().position(|s| s.chunk_id.as_ref() == Some(id)))
            .unwrap_or(at);
        if let Some((_, citation)) = citations.iter_mut().find(|(k, _)| *k == at) {
            citation.spans.push(span);
            continue;
        }
        let source = &sources[at];
        let index = u32::try_from(citations.len() + 1).unwrap_or(u32::MAX);
        citations.push((
            at,
            Citation {
                index,
                chunk_id: source.chunk_id.clone(),
                title: source.title.clone().map_or(Value::Null, Value::String),
                url: source.url.clone().map_or(Value::Null, Value::String),
                snippet: Value::String(snippet(&source.text)),
                spans: vec![span],
            },
        ));
    }
    citations.into_iter().map(|(_, c)| c).collect()
}

/// The start of a chunk's text, cut at [`MAX_SNIPPET_CHARS`].
fn snippet(text: &str) -> String {
    match text.char_indices().nth(MAX_SNIPPET_CHARS) {
        None => text.to_owned(),
        Some((end, _)) => format!("{}…", &text[..end]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chunks() -> String {
        json!({"query": "rust", "chunks": [
            {"id": "a", "title": "Alpha", "url": "https://a.example", "text": "Alpha text"},
            {"id": 7, "url": "https://b.example", "text": "Beta text"},
            {"title": "no text"},
            "not an object",
        ]})
        .to_string()
    }

    #[test]
    fn chunks_are_numbered_from_where_the_run_is_and_shown_with_the_rest() {
        let (text, sources) = number(&chunks(), 3).expect("a retrieval result");
        assert_eq!(sources.iter().map(|s| s.number).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(sources[1].chunk_id.as_deref(), Some("7"));
        assert_eq!(sources[1].title, None);
        assert!(text.starts_with(r#"{"query":"rust"}"#), "{text}");
        assert!(
            text.contains("[3] Alpha <https://a.example>\nAlpha text"),
            "{text}"
        );
        assert!(
            text.contains("[4] <https://b.example>\nBeta text"),
            "{text}"
        );
        assert!(!text.contains("[5]"), "{text}");
    }

    #[test]
    fn citations_items_are_sources_and_other_results_are_not() {
        let output = json!({"forecast": "sunny", "citations": [
            {"title": "Weather", "url": "https://w.example", "snippet": "Sunny"},
            {"snippet": "no title, no url"}]})
        .to_string();
        let (text, sources) = number(&output, 1).expect("citations");
        assert_eq!(sources.len(), 1);
        assert_eq!(sources[0].text, "Sunny");
        assert!(text.contains("\"forecast\""), "{text}");
        assert_eq!(number("plain text", 1), None);
        assert_eq!(number(r#"{"chunks": []}"#, 1), None);
        assert_eq!(number(r#"{"chunks": "x"}"#, 1), None);
        assert_eq!(number("[1, 2]", 1), None);
        // Numbered once: what the model sees is not a retrieval result again.
        assert_eq!(number(&number(&output, 1).expect("once").0, 1), None);
    }

    #[test]
    fn markers_resolve_in_order_of_first_appearance_with_spans_in_characters() {
        let (_, sources) = number(&chunks(), 1).expect("sources");
        let text = "Ünïcode first [2], then [1] and [2] again; [9] and [x] cite nothing; [^a].";
        let citations = resolve(text, &sources);
        assert_eq!(citations.len(), 2);
        let chars: Vec<char> = text.chars().collect();
        let at = |span: &Span| chars[span.start..span.end].iter().collect::<String>();
        assert_eq!(citations[0].index, 1);
        assert_eq!(citations[0].chunk_id.as_deref(), Some("7"));
        assert_eq!(citations[0].url, json!("https://b.example"));
        assert_eq!(citations[0].title, Value::Null);
        let spans: Vec<String> = citations[0].spans.iter().map(at).collect();
        assert_eq!(spans, ["[2]", "[2]"]);
        assert_eq!(citations[1].index, 2);
        assert_eq!(citations[1].snippet, json!("Alpha text"));
        let spans: Vec<String> = citations[1].spans.iter().map(at).collect();
        assert_eq!(spans, ["[1]", "[^a]"]);
        assert_eq!(citations[0].spans[0].start, 14);
        assert!(resolve("nothing cited [3]", &sources).is_empty());
        assert!(resolve("[1]", &[]).is_empty());
    }

    #[test]
    fn the_same_chunk_retrieved_twice_is_one_citation_and_snippets_are_cut() {
        let long = "x".repeat(MAX_SNIPPET_CHARS + 10);
        let output = json!({"chunks": [{"id": "a", "text": long}]}).to_string();
        let (_, mut sources) = number(&output, 1).expect("first");
        sources.extend(number(&output, 2).expect("second").1);
        let citations = resolve("[2] and [1] [[1]] [1", &sources);
        assert_eq!(citations.len(), 1);
        assert_eq!(citations[0].spans.len(), 3);
        let snippet = citations[0].snippet.as_str().expect("snippet");
        assert_eq!(snippet.chars().count(), MAX_SNIPPET_CHARS + 1);
    }
}
