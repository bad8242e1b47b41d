//! Function calling on the OpenAI-compatible routes (DESIGN section 11, issue 39 item 1): the
//! official SDKs run OpenAI's function-calling loop against Spool; a worker killed between a
//! call and its output, and again while the run answers, loses nothing; outputs that do not fit
//! change nothing.

use std::time::Duration;

use serde_json::{Value, json};
use spool_tests::fake_llm::{self, FakeLlm, Reply};
use spool_tests::sse::SseReader;
use spool_tests::{token, token_with};

use crate::stack::{Stack, TIMEOUT};

/// A scripted upstream for function calling: a conversation that ends with tool results is
/// answered `Answer: <the results, in order>` (in `pieces` deltas `gap` apart); otherwise the
/// model calls every offered function it may (`get_weather`, `get_time`, in that order; one
/// when `parallel_tool_calls` is false; the named one under a forced `tool_choice`) with the
/// city the user named (the last word), and says hello when it may call none.
fn functions_model(
    pieces: usize,
    gap: Duration,
) -> impl Fn(&Value, usize) -> Reply + Send + Sync + 'static {
    move |request, n| {
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        if messages.last().is_some_and(|m| m["role"] == "tool") {
            let mut outputs: Vec<String> = messages
                .iter()
                .rev()
                .take_while(|m| m["role"] == "tool")
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .collect();
            outputs.reverse();
            return fake_llm::paced_text(&format!("Answer: {}", outputs.join("; ")), pieces, gap);
        }
        let mut names: Vec<String> = request["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
            .filter(|name| name == "get_weather" || name == "get_time")
            .collect();
        if let Some(name) = request["tool_choice"]["function"]["name"].as_str() {
            names.retain(|n| n == name);
        }
        if request["tool_choice"] == "none" {
            names.clear();
        }
        if request["parallel_tool_calls"] == false {
            names.truncate(1);
        }
        if names.is_empty() {
            return fake_llm::text("Hello there.", 2);
        }
        let question = messages
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default();
        let city = question
            .trim_end_matches('?')
            .rsplit(' ')
            .next()
            .unwrap_or("nowhere")
            .to_owned();
        let arguments = json!({"city": city}).to_string();
        let calls: Vec<(String, String)> = names
            .iter()
            .map(|name| (format!("call_{n}_{name}"), name.clone()))
            .collect();
        let calls: Vec<(&str, &str, &str)> = calls
            .iter()
            .map(|(id, name)| (id.as_str(), name.as_str(), arguments.as_str()))
            .collect();
        fake_llm::tool_calls(&calls)
    }
}

/// The two functions, as `POST /v1/responses` takes them.
fn tools() -> Value {
    let parameters = json!({"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"]});
    json!([
        {"type": "function", "name": "get_weather", "description": "The weather.",
            "parameters": parameters},
        {"type": "function", "name": "get_time", "description": "The time.",
            "parameters": parameters},
    ])
}

/// The `function_call` items of a response's output.
fn calls(response: &Value) -> Vec<Value> {
    response["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "function_call")
        .cloned()
        .collect()
}

/// The `function_call_output` items that answer `calls` as the test's functions would.
fn outputs(calls: &[Value]) -> Value {
    calls
        .iter()
        .map(|call| {
            let arguments: Value =
                serde_json::from_str(call["arguments"].as_str().unwrap_or("{}")).expect("json");
            let city = arguments["city"].as_str().unwrap_or_default();
            let output = match call["name"].as_str() {
                Some("get_weather") => format!("sunny in {city}"),
                _ => format!("noon in {city}"),
            };
            json!({"type": "function_call_output", "call_id": call["call_id"], "output": output})
        })
        .collect()
}

async fn run_script(stack: &Stack, mut command: tokio::process::Command) {
    let output = command
        .env("SPOOL_URL", &stack.base)
        .env("TOKEN", token("alice", "acme"))
        .env("MODEL", "spool-default")
        .output()
        .await
        .expect("the SDK script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(
        output.status.success() && stdout.contains("all passed"),
        "the SDK script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn the_python_sdk_runs_openais_function_calling_loop() {
    let python = spool_tests::peers::python().expect("the openai SDK (pip)");
    let fake = FakeLlm::start(functions_model(3, Duration::ZERO)).await;
    let mut stack = Stack::start().await;
    let conform = crate::openai::conforming(&mut stack).await;
    let _worker = stack
        .worker(&[("SPOOL_LLM_BASE_URL", fake.base_url.as_str())])
        .await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/peers/openai_functions.py");
    let mut command = tokio::process::Command::new(python);
    command.arg(script);
    run_script(&stack, command).await;
    conform.check();
}

#[tokio::test]
async fn the_node_sdk_runs_openais_function_calling_loop() {
    let dir = spool_tests::peers::node_peers().expect("npm peers");
    let fake = FakeLlm::start(functions_model(3, Duration::ZERO)).await;
    let mut stack = Stack::start().await;
    let conform = crate::openai::conforming(&mut stack).await;
    let _worker = stack
        .worker(&[("SPOOL_LLM_BASE_URL", fake.base_url.as_str())])
        .await;
    let mut command = tokio::process::Command::new("node");
    command
        .arg(dir.join("openai_functions.mjs"))
        .current_dir(&dir);
    run_script(&stack, command).await;
    conform.check();
}

fn text(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect()
}

#[tokio::test]
async fn a_worker_killed_between_the_call_and_the_output_loses_nothing() {
    let fake = FakeLlm::start(functions_model(30, Duration::from_millis(100))).await;
    let mut stack = Stack::start().await;
    let conform = crate::openai::conforming(&mut stack).await;
    let llm = [("SPOOL_LLM_BASE_URL", fake.base_url.as_str())];
    let mut a = stack.worker(&llm).await;
    let alice = token("alice", "acme");
    let (status, first) = stack
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "spool-default", "input": "Weather and time in Paris?",
                "tools": tools()}),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["status"], "completed", "{first}");
    let made = calls(&first);
    assert_eq!(made.len(), 2, "{first}");
    let id = first["id"].as_str().expect("id").to_owned();
    // The run waits in Postgres; the worker that made the calls dies.
    a.kill9().await;
    let mut b = stack.worker(&llm).await;

    // The outputs, streamed: the same run goes on, as a new response.
    let response = stack
        .http
        .post(format!("{}/v1/responses", stack.base))
        .bearer_auth(&alice)
        .json(
            &json!({"model": "spool-default", "previous_response_id": id,
            "input": outputs(&made), "stream": true, "tools": tools()}),
        )
        .send()
        .await
        .expect("follow-up");
    assert_eq!(response.status(), 200);
    let mut reader = SseReader::new(response);
    let mut seen = Vec::new();
    while text(&seen).len() < 12 {
        let frame = reader
            .next(TIMEOUT)
            .await
            .expect("an event before the crash");
        seen.push(frame.json());
    }
    drop(reader);
    let follow = seen[0]["response"]["id"].as_str().expect("id").to_owned();
    assert_eq!(follow, format!("{id}_1"));
    assert_eq!(seen[0]["response"]["previous_response_id"], json!(id));
    // The worker answering dies mid-answer too.
    b.kill9().await;
    let _c = stack.worker(&llm).await;
    let last = seen
        .iter()
        .filter_map(|e| e["sequence_number"].as_u64())
        .max()
        .expect("numbered");
    let resumed = stack
        .http
        .get(format!(
            "{}/v1/responses/{follow}?stream=true&starting_after={last}",
            stack.base
        ))
        .bearer_auth(&alice)
        .send()
        .await
        .expect("resume");
    let mut reader = SseReader::new(resumed);
    let rest: Vec<Value> = reader
        .collect(TIMEOUT)
        .await
        .iter()
        .map(spool_tests::sse::Frame::json)
        .collect();
    assert_eq!(
        rest.last().map(|e| e["type"].clone()),
        Some(json!("response.completed")),
        "{rest:#?}"
    );
    let numbers: Vec<u64> = rest
        .iter()
        .filter_map(|e| e["sequence_number"].as_u64())
        .collect();
    assert_eq!(
        numbers,
        (last + 1..last + 1 + rest.len() as u64).collect::<Vec<_>>()
    );

    let (_, stored) = stack
        .get_with(&alice, &format!("/v1/responses/{follow}"))
        .await;
    let answer = "Answer: sunny in Paris; noon in Paris";
    assert_eq!(stored["status"], "completed", "{stored}");
    assert_eq!(
        stored["output"][0]["content"][0]["text"], answer,
        "{stored}"
    );
    assert_eq!(
        format!("{}{}", text(&seen), text(&rest)),
        answer,
        "the client shows the answer once"
    );
    // The first response stays as it was.
    let (_, again) = stack.get_with(&alice, &format!("/v1/responses/{id}")).await;
    assert_eq!(calls(&again).len(), 2, "{again}");
    assert_eq!(again["status"], "completed");
    // The model call that chose the calls was made once; every output reached the model.
    let requests = fake.requests();
    let choosing = requests
        .iter()
        .filter(|r| fake_llm::tool_results_in(r) == 0)
        .count();
    assert_eq!(choosing, 1, "the calls were chosen once");
    assert!(
        requests
            .iter()
            .all(|r| { fake_llm::tool_results_in(r) == 0 || fake_llm::tool_results_in(r) == 2 })
    );
    conform.check();
}

#[tokio::test]
async fn function_call_outputs_that_do_not_fit_change_nothing() {
    let fake = FakeLlm::start(functions_model(2, Duration::ZERO)).await;
    let mut stack = Stack::start().await;
    let conform = crate::openai::conforming(&mut stack).await;
    let _worker = stack
        .worker(&[("SPOOL_LLM_BASE_URL", fake.base_url.as_str())])
        .await;
    let alice = token("alice", "acme");
    let (_, first) = stack
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "spool-default", "input": "Weather and time in Riga?",
                "tools": tools()}),
        )
        .await;
    let made = calls(&first);
    assert_eq!(made.len(), 2, "{first}");
    let id = first["id"].as_str().expect("id").to_owned();
    let answers = outputs(&made);
    let refusals = [
        // Another tenant's response does not exist for them.
        (
            token_with("mallory", "evil", false, 3600, spool_tests::JWT_SECRET),
            json!({"model": "spool-default", "previous_response_id": id, "input": answers}),
            404,
            "response_not_found",
        ),
        (
            alice.clone(),
            json!({"model": "spool-default", "previous_response_id": format!("{id}_7"),
                "input": answers}),
            404,
            "response_not_found",
        ),
        (
            alice.clone(),
            json!({"model": "spool-default", "previous_response_id": id,
                "input": [{"type": "function_call_output", "output": "x"}]}),
            400,
            "invalid_input",
        ),
        (
            alice.clone(),
            json!({"model": "spool-default", "previous_response_id": id,
                "input": [answers[0].clone()]}),
            400,
            "missing_function_call_outputs",
        ),
        (
            alice.clone(),
            json!({"model": "spool-default", "previous_response_id": id,
                "input": [answers[0].clone(), answers[1].clone(),
                    {"type": "function_call_output", "call_id": "call_other", "output": "x"}]}),
            400,
            "unknown_call_id",
        ),
        (
            alice.clone(),
            json!({"model": "spool-default", "previous_response_id": id, "input": answers,
                "tools": [{"type": "function", "name": "get_weather"}]}),
            400,
            "invalid_tools",
        ),
        (
            alice.clone(),
            json!({"model": "spool-default",
                "input": [{"type": "function_call_output", "call_id": "call_nobody",
                    "output": "x"}]}),
            400,
            "no_pending_call",
        ),
    ];
    for (who, body, status, code) in refusals {
        let (got, error) = stack.post(&who, "/v1/responses", &body).await;
        assert_eq!(
            (got.as_u16(), error["error"]["code"].clone()),
            (status, json!(code)),
            "{body}: {error}"
        );
        assert!(error["error"]["message"].is_string() && error["error"]["type"].is_string());
        // Nothing changed: the run still waits for both calls.
        let (_, run) = stack.get_with(&alice, &format!("/v1/workflows/{id}")).await;
        assert_eq!(run["status"], "requires_action", "{body}: {run}");
    }
    let (status, missing) = stack
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "spool-default", "previous_response_id": id,
                "input": [answers[0].clone()]}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(missing["error"]["param"], "input");
    assert_eq!(missing["error"]["missing"], json!([made[1]["call_id"]]));
    // The right outputs still answer, once; a second time there is nothing to answer.
    let (status, done) = stack
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "spool-default", "previous_response_id": id, "input": answers}),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        done["output"][0]["content"][0]["text"],
        "Answer: sunny in Riga; noon in Riga"
    );
    let (status, again) = stack
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "spool-default", "previous_response_id": id, "input": answers}),
        )
        .await;
    assert_eq!(
        (status.as_u16(), again["error"]["code"].clone()),
        (400, json!("no_pending_call"))
    );
    conform.check();
}
