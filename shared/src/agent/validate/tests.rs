use super::super::test_support::{overrides, spec};
use super::*;
use serde_json::json;

#[test]
fn the_contract_s_example_agent_is_valid_and_gets_defaults() {
    let agent = spec(
        json!({"name": "support", "instructions": "You are ...", "model": "gpt-4o-mini",
            "temperature": 0.2, "max_steps": 25, "history_depth": 10, "tool_choice": "auto",
            "tools": [
              {"type": "http", "name": "get_weather", "description": "...", "parameters": {"type": "object"},
               "url": "https://tools.example.com/weather", "method": "POST", "headers": {}, "read_only": true},
              {"type": "mcp", "name": "github", "url": "https://mcp.example.com/mcp", "headers": {}},
              {"type": "client", "name": "read_local_file", "description": "...", "parameters": {"type": "object"},
               "requires_approval": false}],
            "stop_conditions": [{"type": "has_tool_call", "tool_name": "get_weather"}]}),
    );
    assert_eq!(agent.validate(), []);
    let minimal = spec(json!({"name": "m", "model": "demo"}));
    assert_eq!((minimal.max_steps, minimal.history_depth), (25, 10));
    assert_eq!(minimal.tool_choice, ToolChoice::Auto);
}

#[test]
fn a_response_format_needs_a_valid_schema_and_name() {
    let good = spec(json!({"name": "m", "model": "demo", "response_format":
            {"type": "json_schema", "schema": {"type": "object", "required": ["city"]}}}));
    assert_eq!(good.validate(), []);
    let format = good.response_format.expect("set");
    assert_eq!(format.name(), "response");
    assert_eq!(
        format.check("```json\n{\"city\": \"Oslo\"}\n```"),
        Ok(json!({"city": "Oslo"}))
    );
    let missing = format.check("{}").expect_err("city is required");
    assert!(missing.contains("city"), "{missing}");
    let prose = format.check("Oslo").expect_err("not JSON");
    assert!(prose.starts_with("the answer is not JSON"), "{prose}");
    let bad = spec(json!({"name": "m", "model": "demo", "response_format":
            {"type": "json_schema", "name": "a b", "schema": {"type": "banana"}}}));
    let fields: Vec<String> = bad.validate().into_iter().map(|e| e.field).collect();
    assert_eq!(fields, ["response_format.name", "response_format.schema"]);
    let not_object = spec(json!({"name": "m", "model": "demo", "response_format":
            {"type": "json_schema", "schema": true}}));
    assert_eq!(not_object.validate()[0].field, "response_format.schema");
}

#[test]
fn mcp_servers_whose_names_make_the_same_tool_names_are_refused_at_save() {
    let agent = spec(json!({"name": "m", "model": "demo",
            "tools": [{"type": "mcp", "name": "gh", "url": "https://a.example/mcp"},
                      {"type": "mcp", "name": "gh_admin", "url": "https://b.example/mcp"},
                      {"type": "mcp", "name": "ghx", "url": "https://c.example/mcp"}]}));
    let fields: Vec<String> = agent.validate().into_iter().map(|e| e.field).collect();
    assert_eq!(fields, ["tools[1].name"]);
    let fine = spec(json!({"name": "m", "model": "demo",
            "tools": [{"type": "mcp", "name": "gh_admin", "url": "https://b.example/mcp"},
                      {"type": "mcp", "name": "ghx", "url": "https://c.example/mcp"}]}));
    assert_eq!(fine.validate(), []);
}

#[test]
fn the_fan_out_limits_are_checked_at_save() {
    let agent = spec(json!({"name": "m", "model": "demo",
            "limits": {"max_agent_calls_per_step": 0, "max_tree_runs": 1001}}));
    let fields: Vec<String> = agent.validate().into_iter().map(|e| e.field).collect();
    assert_eq!(
        fields,
        ["limits.max_agent_calls_per_step", "limits.max_tree_runs"]
    );
    let fine = spec(json!({"name": "m", "model": "demo",
            "limits": {"max_agent_calls_per_step": 64, "max_tree_runs": 1}}));
    assert_eq!(fine.validate(), []);
}

#[test]
fn only_http_guard_hooks_may_fail_closed() {
    let agent = spec(json!({"name": "m", "model": "demo", "hooks": [
            {"event": "pre_tool_use", "type": "http", "url": "https://h.example", "fail": "closed"},
            {"event": "pre_response", "type": "http", "url": "https://h.example", "fail": "open"},
            {"event": "post_tool_use", "type": "http", "url": "https://h.example", "fail": "closed"},
            {"event": "pre_tool_use", "type": "approval", "fail": "closed"}]}));
    let fields: Vec<String> = agent.validate().into_iter().map(|e| e.field).collect();
    assert_eq!(fields, ["hooks[2].fail", "hooks[3].fail"]);
    assert_eq!(agent.hooks[0].fail, super::super::HookFailure::Closed);
    assert!(
            serde_json::from_value::<AgentSpec>(json!({"name": "m", "model": "demo", "hooks": [
                {"event": "pre_tool_use", "type": "http", "url": "https://h.example", "fail": "shut"}]}))
            .is_err(),
            "an unknown value is refused"
        );
}

#[test]
fn every_problem_is_reported_by_field_path() {
    let agent = spec(
        json!({"name": "", "model": "demo", "max_steps": 0, "temperature": 3.0,
            "tool_choice": "nope",
            "tools": [
              {"type": "http", "name": "a", "url": "ftp://x", "parameters": {"type": "banana"}},
              {"type": "client", "name": "a"},
              {"type": "mcp", "name": "gh", "url": "not a url"},
              {"type": "client", "name": "gh_issues"}],
            "stop_conditions": [{"type": "has_tool_call", "tool_name": "missing"}],
            "step_rules": [{"step": 9, "active_tools": ["ghost"]},
                           {"step": 1, "tool_choice": "a", "active_tools": ["gh_issues"]}]}),
    );
    let fields: Vec<String> = agent.validate().into_iter().map(|e| e.field).collect();
    for expected in [
        "name",
        "temperature",
        "max_steps",
        "tools[0].parameters",
        "tools[0].url",
        "tools[1].name",
        "tools[2].url",
        "tools[3].name",
        "tool_choice",
        "stop_conditions[0].tool_name",
        "step_rules[0].step",
        "step_rules[0].active_tools[0]",
        "step_rules[1].tool_choice",
    ] {
        assert!(
            fields.contains(&expected.to_owned()),
            "{expected} missing from {fields:?}"
        );
    }
}

#[test]
fn overrides_may_name_the_agent_s_tools_and_mcp_tools_but_not_the_server_itself() {
    let agent = spec(
        json!({"name": "a", "model": "demo", "max_steps": 4, "tools": [
            {"type": "client", "name": "read"},
            {"type": "mcp", "name": "gh", "url": "https://mcp.example.com/mcp"}]}),
    );
    let good = overrides(
        json!({"tool_choice": "read", "active_tools": ["read", "gh_issues"],
            "step_rules": [{"step": 3, "tool_choice": "gh_pulls"}, {"step": 4}],
            "defaults": {"tool_choice": "none"}}),
    );
    assert_eq!(good.validate(&agent, 3), []);
    let bad = overrides(
        json!({"tool_choice": "gh", "active_tools": ["ghost", "read"],
            "step_rules": [{"step": 2}, {"step": 5, "active_tools": ["gh_"]},
                           {"step": 3, "tool_choice": "read", "active_tools": ["gh_issues"]}],
            "defaults": {"tool_choice": "reader"}}),
    );
    let fields: Vec<String> = bad
        .validate(&agent, 3)
        .into_iter()
        .map(|e| e.field)
        .collect();
    assert_eq!(
        fields,
        [
            "tool_choice",
            "defaults.tool_choice",
            "active_tools[0]",
            "tool_choice",
            "step_rules[2].tool_choice",
            "step_rules[0].step",
            "step_rules[1].step",
        ]
    );
}
