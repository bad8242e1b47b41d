use super::*;
use serde_json::json;

fn graph(value: Value) -> GraphSpec {
    serde_json::from_value(value).expect("parses")
}

fn fields(spec: &GraphSpec) -> Vec<String> {
    spec.validate(&[]).into_iter().map(|e| e.field).collect()
}

/// The documented example: rephrase, retrieve, answer.
pub(crate) fn rag() -> Value {
    json!({
        "spec_version": "1",
        "entry": "rephrase",
        "nodes": {
            "rephrase": {"type": "llm", "system_prompt": "Rewrite the question as a search query.",
                         "input_template": "{{input}}", "output_key": "query"},
            "retrieve": {"type": "tool", "tool_ref": {"source": "function", "name": "search"},
                         "args_template": {"q": "{{query}}"}, "output_key": "docs"},
            "answer": {"type": "llm", "system_prompt": "Answer from the documents.",
                       "input_template": "Question: {{input}}\nDocuments: {{docs}}",
                       "output_key": "answer"},
            "end": {"type": "end", "output_template": "{{answer}}"}
        },
        "edges": [{"from": "rephrase", "to": "retrieve"}, {"from": "retrieve", "to": "answer"},
                  {"from": "answer", "to": "end"}],
        "tools": {"functions": [{"type": "http", "name": "search",
            "url": "https://search.example.com/q", "parameters": {"type": "object"}}]},
        "limits": {"max_steps": 10}
    })
}

#[test]
fn the_documented_example_is_valid() {
    assert_eq!(graph(rag()).validate(&[]), []);
}

#[test]
fn every_problem_of_a_graph_is_reported_by_field_path() {
    let spec = graph(json!({
        "spec_version": "2",
        "entry": "start",
        "nodes": {
            "start": {"type": "llm", "input_template": "{{input}} {{later}}", "output_key": "a",
                      "temperature": 5, "tools": [{"source": "builtin", "name": "http_request"}]},
            "loop": {"type": "tool", "tool_ref": {"source": "function", "name": "ghost"},
                     "args_template": {"q": 3}, "output_key": "later"},
            "weird": {"type": "router"},
            "lonely": {"type": "end", "output_template": "{{a}}"},
            "end": {"type": "end", "output_template": "{{nobody}}"}
        },
        "edges": [{"from": "start", "to": "loop"}, {"from": "loop", "to": "start"},
                  {"from": "loop", "to": "nowhere", "when": {"key": "missing", "contains": "x"}},
                  {"from": "start", "to": "end"}],
        "limits": {"max_parallel_tools": 99}
    }));
    let fields = fields(&spec);
    for expected in [
        "graph_spec.spec_version",
        "graph_spec.nodes.start.temperature",
        "graph_spec.nodes.start.tools[0]",
        "graph_spec.nodes.loop.tool_ref",
        "graph_spec.nodes.loop.args_template.q",
        "graph_spec.nodes.weird.type",
        "graph_spec.nodes.lonely",
        "graph_spec.nodes.end.output_template",
        "graph_spec.edges[2].to",
        "graph_spec.edges[2].when.key",
        "graph_spec.limits.max_parallel_tools",
        "graph_spec.limits.max_steps",
    ] {
        assert!(
            fields.contains(&expected.to_owned()),
            "{expected} missing from {fields:?}"
        );
    }
    // `later` is set by `loop`, which runs before `start` on its second visit.
    assert!(!fields.contains(&"graph_spec.nodes.start.input_template".to_owned()));
}

#[test]
fn a_template_may_name_only_keys_set_before_it() {
    let mut value = rag();
    value["nodes"]["rephrase"]["input_template"] = json!("{{input}} {{answer}}");
    let problems = graph(value).validate(&[]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(
        problems[0].field,
        "graph_spec.nodes.rephrase.input_template"
    );
    assert!(
        problems[0].message.contains("{{answer}}"),
        "{}",
        problems[0].message
    );
}

#[test]
fn a_cycle_needs_max_steps() {
    let mut value = rag();
    value["edges"][2] =
        json!({"from": "answer", "to": "end", "when": {"key": "answer", "contains": "DONE"}});
    value["edges"]
        .as_array_mut()
        .expect("edges")
        .push(json!({"from": "answer", "to": "rephrase"}));
    assert_eq!(graph(value.clone()).validate(&[]), []);
    value["limits"] = json!({});
    assert_eq!(fields(&graph(value)), ["graph_spec.limits.max_steps"]);
}

#[test]
fn templates_render_text_as_it_is_and_json_as_json() {
    let values = BTreeMap::from([
        ("input".to_owned(), json!("hi")),
        ("docs".to_owned(), json!({"n": 1})),
    ]);
    assert_eq!(
        render("{{input}} / {{ docs }} / {{none}}", &values),
        "hi / {\"n\":1} / "
    );
    let spec = graph(rag());
    assert_eq!(spec.next("rephrase", &values), Some("retrieve"));
    assert!(holds(
        Some(&EdgeCondition {
            key: "docs".into(),
            contains: "\"n\"".into()
        }),
        &values
    ));
}
