//! Citations from the answer: a retrieval tool on a local server answers chunks, the model sees
//! them numbered, and the markers of its answer become citations with spans (in the stream and
//! on the stored message), the same after a crashed attempt; a marker naming no chunk cites
//! nothing.

use std::time::Duration;

use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm, search_then_answer, tool_results_in};
use spool_tests::tools::{SEARCH_CHUNKS, Tools, http_tool};

use crate::harness::Harness;

/// Cites the second chunk first, then the first, the second again, and a number no chunk has.
const ANSWER: &str = "Ships leave before dusk [2]; the tide peaks at 06:12 [1]. Plan ahead [2], \
                      not by [7].";

/// The characters of `text` in `span` (`{start, end}`, in characters).
fn spanned(text: &str, span: &Value) -> String {
    let at = |key: &str| usize::try_from(span[key].as_u64().expect("index")).expect("usize");
    text.chars()
        .skip(at("start"))
        .take(at("end") - at("start"))
        .collect()
}

/// The citations ANSWER must give: the harbour chunk (`[2]`, cited first) twice, then the tides.
fn check_citations(citations: &Value) {
    let citations = citations.as_array().expect("citations");
    assert_eq!(citations.len(), 2, "[7] names no chunk: {citations:?}");
    let (tides, harbour) = (SEARCH_CHUNKS[0], SEARCH_CHUNKS[1]);
    assert_eq!(citations[0]["index"], 1);
    assert_eq!(citations[0]["chunk_id"], harbour.0);
    assert_eq!(citations[0]["title"], harbour.1);
    assert_eq!(citations[0]["url"], harbour.2);
    assert_eq!(citations[0]["snippet"], harbour.3);
    let spans: Vec<String> = citations[0]["spans"]
        .as_array()
        .expect("spans")
        .iter()
        .map(|s| spanned(ANSWER, s))
        .collect();
    assert_eq!(spans, ["[2]", "[2]"]);
    assert_eq!(citations[0]["spans"][0], json!({"start": 24, "end": 27}));
    assert_eq!(citations[1]["index"], 2);
    assert_eq!(citations[1]["chunk_id"], tides.0);
    assert_eq!(citations[1]["url"], tides.2);
    assert_eq!(spanned(ANSWER, &citations[1]["spans"][0]), "[1]");
    assert_eq!(citations[1]["spans"].as_array().map(Vec::len), Some(1));
}

async fn search_agent(app: &Harness, base: &str) -> String {
    app.create_agent(&json!({"name": "librarian", "model": "gpt-4o-mini",
        "tools": [http_tool("search", format!("{base}/search"))]}))
        .await
}

#[tokio::test]
async fn the_answer_s_markers_become_citations_in_the_stream_and_on_the_message() {
    let fake = FakeLlm::start(search_then_answer(ANSWER)).await;
    let (_tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = search_agent(&app, &base).await;
    let (thread, accepted) = app.ask(&agent, "When can I sail?").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");

    // The model saw the chunks numbered, with the rest of the result.
    let requests = fake.requests();
    let seen = requests[1]["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool"))
        .and_then(|m| m["content"].as_str())
        .expect("the tool result")
        .to_owned();
    assert!(seen.starts_with(r#"{"query":"harbour"}"#), "{seen}");
    for (n, (_, title, url, text)) in SEARCH_CHUNKS.iter().enumerate() {
        let numbered = format!("[{}] {title} <{url}>\n{text}", n + 1);
        assert!(seen.contains(&numbered), "{numbered} in {seen}");
    }

    let frames = app.events(thread).await;
    let kinds: Vec<&str> = frames
        .iter()
        .map(|f| f.event.as_str())
        .filter(|k| *k != "heartbeat")
        .collect();
    assert_eq!(
        &kinds[kinds.len() - 4..],
        ["step_end", "citations", "message_end", "done"]
    );
    let result = frames
        .iter()
        .find(|f| f.event == "step" && f.json()["data"]["phase"] == "result")
        .expect("the result");
    assert_eq!(
        result.json()["data"]["output"],
        json!(seen),
        "what the model saw"
    );
    let event = frames
        .iter()
        .find(|f| f.event == "citations")
        .expect("citations");
    check_citations(&event.json()["data"]["citations"]);

    let page = app.messages(thread).await;
    let message = &page["messages"][1];
    assert_eq!(message["content"], ANSWER, "the markers stay in the text");
    let parts = message["parts"].as_array().expect("parts");
    let last = parts.last().expect("a part");
    assert_eq!(last["type"], "citations");
    check_citations(&last["citations"]);
    assert_eq!(last["citations"], event.json()["data"]["citations"]);
}

#[tokio::test]
async fn markers_that_name_no_chunk_stay_text_and_cite_nothing() {
    let answer = "Nothing matches [3], [0] or [^nope]; [harbour] is not a marker.";
    let fake = FakeLlm::start(search_then_answer(answer)).await;
    let (_tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = search_agent(&app, &base).await;
    let (thread, accepted) = app.ask(&agent, "When can I sail?").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    let frames = app.events(thread).await;
    assert!(
        !frames.iter().any(|f| f.event == "citations"),
        "no citations event"
    );
    let page = app.messages(thread).await;
    let message = &page["messages"][1];
    assert_eq!(message["content"], answer);
    assert!(
        !message["parts"]
            .as_array()
            .expect("parts")
            .iter()
            .any(|p| p["type"] == "citations"),
        "{message}"
    );
}

#[tokio::test]
async fn a_restarted_attempt_yields_the_same_citations_from_the_saved_step() {
    // The first final answer streams slowly: the worker dies in the middle of it.
    let fake = FakeLlm::start(|request, n| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_s", "search", r#"{"query": "harbour"}"#)]),
        _ if n == 1 => fake_llm::paced_text(ANSWER, 4, Duration::from_secs(60)),
        _ => fake_llm::text(ANSWER, 3),
    })
    .await;
    let (tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = search_agent(&app, &base).await;
    let (thread, accepted) = app.ask(&agent, "When can I sail?").await;
    let workflow: uuid::Uuid = accepted["workflow_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("id");
    tokio::select! {
        executed = app.attempt() => panic!("the attempt should hang in its answer: {executed:?}"),
        () = spool_tests::poll_until("the answer's model call", Duration::from_secs(10), || async {
            (fake.requests().len() == 2).then_some(())
        }) => {}
    }
    // The dead worker's lease runs out; the next attempt resumes after the saved search step.
    sqlx::query("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(workflow)
        .execute(&app.db.pool)
        .await
        .expect("expire");
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["attempt"], 2);
    assert_eq!(tools.calls().len(), 1, "the search is not made again");
    assert_eq!(fake.requests().len(), 3);
    let frames = app.events(thread).await;
    let cited: Vec<Value> = frames
        .iter()
        .filter(|f| f.event == "citations")
        .map(|f| f.json())
        .collect();
    assert_eq!(cited.len(), 1, "once, from the attempt that completed");
    assert_eq!(cited[0]["attempt"], 2);
    check_citations(&cited[0]["data"]["citations"]);
    let page = app.messages(thread).await;
    let message = &page["messages"][1];
    assert_eq!(message["content"], ANSWER);
    let last = message["parts"]
        .as_array()
        .and_then(|p| p.last())
        .expect("a part");
    check_citations(&last["citations"]);
}
