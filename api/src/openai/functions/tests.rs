use super::*;

#[test]
fn response_ids_name_a_run_and_its_segment() {
    let run = WorkflowId::new();
    let first = ResponseRef::parse(&run.to_string()).expect("first");
    assert_eq!(first.segment, 0);
    let second = ResponseRef::parse(&format!("{run}_2")).expect("second");
    assert_eq!((second.workflow_id, second.segment), (run, 2));
    assert_eq!(segment_id(run, 2), format!("{run}_2"));
    for bad in [
        format!("{run}_0"),
        format!("{run}_02"),
        format!("{run}_x"),
        "x".into(),
    ] {
        assert!(ResponseRef::parse(&bad).is_err(), "{bad}");
    }
}

#[test]
fn function_tools_of_both_apis_become_client_tools() {
    let responses = json!({"tools": [{"type": "function", "name": "get_weather",
            "parameters": {"type": "object"}}], "tool_choice": {"type": "function",
            "name": "get_weather"}, "parallel_tool_calls": false});
    let functions = Functions::parse(&responses, Api::Responses).expect("responses");
    assert_eq!(functions.tools[0].name, "get_weather");
    assert_eq!(
        functions.tool_choice,
        Some(ToolChoice::Tool("get_weather".into()))
    );
    assert_eq!(functions.parallel_tool_calls, Some(false));
    let chat = json!({"tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "required"});
    let functions = Functions::parse(&chat, Api::Chat).expect("chat");
    assert_eq!(functions.tools[0].name, "f");
    let overrides = functions.overrides().expect("overrides");
    let rules = overrides.step_rules.expect("rules");
    assert_eq!(
        (rules[0].step, rules[0].tool_choice.clone()),
        (1, Some(ToolChoice::Required))
    );
}

#[test]
fn hosted_tools_and_unknown_choices_are_refused_naming_the_parameter() {
    let hosted = json!({"tools": [{"type": "web_search"}]});
    let err = Functions::parse(&hosted, Api::Responses).expect_err("hosted");
    assert!(format!("{err:?}").contains("tools[0].type"), "{err:?}");
    let choice = json!({"tools": [{"type": "function", "name": "f"}],
            "tool_choice": {"type": "function", "name": "g"}});
    let err = Functions::parse(&choice, Api::Responses).expect_err("choice");
    assert!(format!("{err:?}").contains("tool_choice"), "{err:?}");
}
