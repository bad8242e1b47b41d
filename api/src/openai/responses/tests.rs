use super::*;

#[test]
fn input_items_split_into_history_input_and_instructions() {
    let items = [
        json!({"role": "developer", "content": "Be brief."}),
        json!({"role": "user", "content": "Hi"}),
        json!({"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": "Hello"}]}),
        json!({"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}),
    ];
    let turns = turns(&items, "input").expect("turns");
    assert_eq!(turns.input_text, "Weather?");
    assert_eq!(
        turns.history,
        [
            (Role::User, "Hi".to_owned()),
            (Role::Assistant, "Hello".to_owned())
        ]
    );
    assert_eq!(turns.instructions.as_deref(), Some("Be brief."));
}

#[test]
fn input_that_is_not_text_or_ends_with_the_assistant_is_refused() {
    let tool_output = [json!({"type": "function_call_output", "call_id": "c", "output": "1"})];
    assert!(turns(&tool_output, "input").is_err());
    let image = [json!({"role": "user", "content": [{"type": "input_image"}]})];
    assert!(turns(&image, "input").is_err());
    let ends = [
        json!({"role": "user", "content": "a"}),
        json!({"role": "assistant", "content": "b"}),
    ];
    assert!(turns(&ends, "input").is_err());
}
