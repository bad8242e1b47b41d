//! The agent loop through the real worker, Postgres and Redis, against a fake upstream
//! speaking the OpenAI wire format and a real local HTTP tool server: tool steps, step rules,
//! stop conditions, doom loops, truncation, retries, continuations, concurrency, MCP fail-open.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::post;
use serde_json::json;

use spool_tests::fake_llm::{self, FakeLlm, Reply, tool_results_in};
use spool_tests::sse::Frame;
use spool_tests::tools::{Tools, http_tool};

use crate::harness::Harness;

#[tokio::test]
async fn a_two_step_tool_run_streams_calls_results_and_the_answer_end_to_end() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_1", "get_weather", r#"{"city": "Paris"}"#)]),
        _ => fake_llm::text("It is sunny in Paris [1].", 4),
    })
    .await;
    let (tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app.create_agent(&json!({"name": "weather", "model": "gpt-4o-mini",
        "instructions": "Answer with the weather.", "tools": [http_tool("get_weather", format!("{base}/weather"))]})).await;
    let (thread, accepted) = app.ask(&agent, "Weather in Paris?").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed");
    let frames: Vec<Frame> = app.events(thread).await;
    let kinds: Vec<&str> = frames
        .iter()
        .map(|f| f.event.as_str())
        .filter(|k| *k != "heartbeat")
        .collect();
    assert_eq!(kinds.first(), Some(&"message_start"));
    assert_eq!(&kinds[1..5], ["step_start", "step", "step", "step_end"]);
    assert_eq!(frames[2].json()["data"]["phase"], "call");
    assert_eq!(frames[2].json()["data"]["arguments"]["city"], "Paris");
    let result = frames
        .iter()
        .find(|f| f.event == "step" && f.json()["data"]["phase"] == "result")
        .expect("result");
    assert!(
        result.json()["data"]["output"]
            .as_str()
            .is_some_and(|o| o.contains("sunny in Paris"))
    );
    assert_eq!(
        &kinds[kinds.len() - 5..],
        ["text_end", "step_end", "citations", "message_end", "done"]
    );

    let page = app.messages(thread).await;
    let message = &page["messages"][1];
    assert_eq!(message["content"], "It is sunny in Paris [1].");
    let part_types: Vec<&str> = message["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .filter_map(|p| p["type"].as_str())
        .collect();
    assert_eq!(
        part_types,
        ["tool_call", "tool_result", "text", "citations"]
    );
    assert_eq!(
        message["parts"][3]["citations"][0]["url"],
        "https://weather.example/paris"
    );
    assert_eq!(
        message["parts"][3]["citations"][0]["spans"],
        json!([{"start": 21, "end": 24}])
    );
    assert_eq!(
        message["usage"]["input_tokens"], 30,
        "usage summed over both calls"
    );
    assert_eq!(message["usage"]["output_tokens"], 12);

    let calls = tools.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].1,
        format!("{}:1:call_1", accepted["workflow_id"].as_str().expect("id"))
    );
    assert_eq!(calls[0].2, json!({"city": "Paris"}));
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0]["messages"][0],
        json!({"role": "system", "content": "Answer with the weather."})
    );
    assert_eq!(requests[0]["messages"][1]["content"], "Weather in Paris?");
    assert_eq!(requests[1]["messages"][2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(requests[1]["messages"][3]["role"], "tool");
}

#[tokio::test]
async fn tool_choice_and_step_rules_reach_the_request_and_the_last_step_has_no_tools() {
    let fake = FakeLlm::start(|request, n| {
        if request.get("tools").is_none() {
            fake_llm::text("Done.", 1)
        } else {
            fake_llm::tool_calls(&[(
                &format!("c{n}"),
                "get_weather",
                &format!(r#"{{"city": "C{n}"}}"#),
            )])
        }
    })
    .await;
    let (_, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app.create_agent(&json!({"name": "rules", "model": "gpt-4o-mini", "max_steps": 3,
        "tool_choice": "required",
        "tools": [http_tool("get_weather", format!("{base}/weather")), http_tool("big", format!("{base}/big"))],
        "step_rules": [{"step": 2, "tool_choice": "get_weather", "active_tools": ["get_weather"]}]})).await;
    let (_, accepted) = app.ask(&agent, "go").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let requests = fake.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0]["tool_choice"], "required");
    assert_eq!(requests[0]["tools"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        requests[1]["tool_choice"],
        json!({"type": "function", "function": {"name": "get_weather"}})
    );
    assert_eq!(requests[1]["tools"].as_array().map(Vec::len), Some(1));
    assert!(
        requests[2].get("tools").is_none(),
        "tools are withheld on the last step"
    );
    assert!(requests[2].get("tool_choice").is_none());
}

#[tokio::test]
async fn a_stop_condition_ends_the_run_after_its_tool() {
    let fake = FakeLlm::start(|_, _| fake_llm::tool_calls(&[("c1", "finish", "{}")])).await;
    let (tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "stopper", "model": "gpt-4o-mini",
        "tools": [http_tool("finish", format!("{base}/finish"))],
        "stop_conditions": [{"type": "has_tool_call", "tool_name": "finish"}]}))
        .await;
    let (_, accepted) = app.ask(&agent, "stop").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    assert_eq!(
        fake.requests().len(),
        1,
        "no model call after the stop condition held"
    );
    assert_eq!(tools.calls().len(), 1);
}

#[tokio::test]
async fn the_same_call_three_times_in_a_row_fails_the_run_as_a_doom_loop() {
    let fake = FakeLlm::start(|_, n| {
        fake_llm::tool_calls(&[(&format!("c{n}"), "get_weather", r#"{"city": "Paris"}"#)])
    })
    .await;
    let (tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "loopy", "model": "gpt-4o-mini",
        "tools": [http_tool("get_weather", format!("{base}/weather"))]}))
        .await;
    let (_, accepted) = app.ask(&agent, "loop").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "doom_loop");
    assert!(
        run["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("get_weather"))
    );
    assert_eq!(
        tools.calls().len(),
        2,
        "the third identical call is not executed"
    );
}

#[tokio::test]
async fn a_huge_tool_result_is_truncated_with_a_marker_before_the_model_sees_it() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("c1", "big", "{}")]),
        _ => fake_llm::text("Read it.", 1),
    })
    .await;
    let (_, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "big", "model": "gpt-4o-mini",
        "tools": [http_tool("big", format!("{base}/big"))]}))
        .await;
    let (_, accepted) = app.ask(&agent, "read").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let seen = fake.requests()[1]["messages"][2]["content"]
        .as_str()
        .expect("tool result")
        .to_owned();
    assert!(
        seen.ends_with("[truncated: 10040 more characters]"),
        "{}",
        &seen[seen.len() - 60..]
    );
    assert_eq!(seen.chars().filter(|c| *c == 'z').count(), 49_960);
}

#[tokio::test]
async fn a_429_with_retry_after_is_retried_after_the_wait_and_succeeds() {
    let fake = FakeLlm::start(|_, n| match n {
        0 => Reply::Status(429, "rate limited".into(), Some("1".into())),
        _ => fake_llm::text("Hello after the wait.", 3),
    })
    .await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "patient", "model": "gpt-4o-mini"}))
        .await;
    let started = Instant::now();
    let (_, accepted) = app.ask(&agent, "hi").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After was honoured"
    );
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn a_provider_that_cannot_be_reached_fails_the_run_without_showing_its_address() {
    // Nothing listens there; the address (with what an operator may have put in its path)
    // must not reach the run's error, which end users read.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let app = Harness::start_at(&format!("http://{dead}/secret-route/v1")).await;
    let agent = app
        .create_agent(&json!({"name": "unreachable", "model": "gpt-4o-mini"}))
        .await;
    let (_, accepted) = app.ask(&agent, "hi").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["error"]["code"], "model_unavailable");
    let message = run["error"]["message"].as_str().expect("message");
    assert!(
        !message.contains("secret-route") && !message.contains(&dead.port().to_string()),
        "{message}"
    );
}

#[tokio::test]
async fn a_provider_that_keeps_failing_fails_the_run_with_its_message_after_three_retries() {
    let fake = FakeLlm::start(|_, _| Reply::Status(500, "upstream exploded".into(), None)).await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "doomed", "model": "gpt-4o-mini"}))
        .await;
    let (thread, accepted) = app.ask(&agent, "hi").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "model_unavailable");
    let message = run["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("500") && message.contains("upstream exploded"),
        "{message}"
    );
    assert_eq!(fake.requests().len(), 4, "one call and three retries");
    let frames = app.events(thread).await;
    let kinds: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    assert!(
        kinds.ends_with(&["error", "message_end", "done"]) || kinds == ["stream_reset"],
        "{kinds:?}"
    );
}

#[tokio::test]
async fn a_client_4xx_fails_at_once_with_the_provider_s_message() {
    let fake =
        FakeLlm::start(|_, _| Reply::Status(400, "Invalid value for 'model'".into(), None)).await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "typo", "model": "gpt-5-nope"}))
        .await;
    let (_, accepted) = app.ask(&agent, "hi").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["error"]["code"], "model_error");
    assert!(
        run["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("Invalid value for 'model'"))
    );
    assert_eq!(fake.requests().len(), 1, "no retry of a 400");
}

#[tokio::test]
async fn finish_reason_length_is_continued_up_to_three_times() {
    let fake = FakeLlm::start(|_, n| {
        if n < 3 {
            fake_llm::text_with_finish(&format!("part{n} "), 1, "length")
        } else {
            fake_llm::text("end.", 1)
        }
    })
    .await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "long", "model": "gpt-4o-mini"}))
        .await;
    let (thread, accepted) = app.ask(&agent, "write a lot").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let requests = fake.requests();
    assert_eq!(requests.len(), 4);
    let last = requests[3]["messages"].as_array().expect("messages");
    assert!(
        last.last()
            .and_then(|m| m["content"].as_str())
            .is_some_and(|c| c.starts_with("Continue"))
    );
    let page = app.messages(thread).await;
    assert_eq!(page["messages"][1]["content"], "part0 part1 part2 end.");
}

#[tokio::test]
async fn a_stream_cut_short_before_any_text_is_retried_and_after_text_fails_the_run() {
    let fake = FakeLlm::start(|_, n| match n {
        0 => Reply::Truncated(vec![
            json!({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
        ]),
        _ => fake_llm::text("Whole answer.", 2),
    })
    .await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "flaky", "model": "gpt-4o-mini"}))
        .await;
    let (_, accepted) = app.ask(&agent, "hi").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    assert_eq!(fake.requests().len(), 2);

    let cut = FakeLlm::start(|_, _| {
        Reply::Truncated(vec![
            json!({"choices": [{"index": 0, "delta": {"content": "Half an ans"}}]}),
        ])
    })
    .await;
    let app2 = Harness::start(&cut).await;
    let agent = app2
        .create_agent(&json!({"name": "cut", "model": "gpt-4o-mini"}))
        .await;
    let (_, accepted) = app2.ask(&agent, "hi").await;
    let run = app2.finished(&accepted).await;
    assert_eq!(run["status"], "failed");
    assert!(
        run["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("before it was complete"))
    );
    assert_eq!(
        cut.requests().len(),
        1,
        "text was already shown: no silent retry"
    );
}

#[tokio::test]
async fn read_only_calls_of_one_step_run_together_and_others_one_at_a_time() {
    // Each tool call waits (up to 2 s) for a second call to be in flight at the same time.
    #[derive(Clone, Default)]
    struct Gate {
        in_flight: Arc<std::sync::atomic::AtomicUsize>,
        seen: Arc<Mutex<Vec<usize>>>,
    }
    let gate = Gate::default();
    let handler = |State(gate): State<Gate>| async move {
        use std::sync::atomic::Ordering;
        gate.in_flight.fetch_add(1, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(2);
        while gate.in_flight.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let peak = gate.in_flight.load(Ordering::SeqCst);
        gate.seen.lock().expect("lock").push(peak);
        tokio::time::sleep(Duration::from_millis(50)).await;
        gate.in_flight.fetch_sub(1, Ordering::SeqCst);
        "ok"
    };
    let app_router = axum::Router::new()
        .route("/gate", post(handler))
        .with_state(gate.clone());
    let base = spool_tests::serve(app_router).await;
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[
            ("r1", "look", r#"{"city": "a"}"#),
            ("r2", "look", r#"{"city": "b"}"#),
        ]),
        2 => fake_llm::tool_calls(&[
            ("w1", "write", r#"{"city": "a"}"#),
            ("w2", "write", r#"{"city": "b"}"#),
        ]),
        _ => fake_llm::text("done", 1),
    })
    .await;
    let app = Harness::start(&fake).await;
    let mut look = http_tool("look", format!("{base}/gate"));
    look["read_only"] = json!(true);
    let agent = app
        .create_agent(&json!({"name": "gate", "model": "gpt-4o-mini",
        "tools": [look, http_tool("write", format!("{base}/gate"))]}))
        .await;
    let (_, accepted) = app.ask(&agent, "go").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let seen = gate.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 4);
    assert_eq!(&seen[..2], [2, 2], "the read-only calls overlapped");
    assert_eq!(&seen[2..], [1, 1], "the others ran one after the other");
}

#[tokio::test]
async fn a_read_never_overtakes_a_write_the_model_asked_for_before_it() {
    // create, then list what was created: the list must see the create.
    let (tools, base) = Tools::start().await;
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[
            ("c1", "create", r#"{"city": "a"}"#),
            ("l1", "list", r#"{"city": "a"}"#),
            ("l2", "list", r#"{"city": "b"}"#),
            ("c2", "create", r#"{"city": "b"}"#),
        ]),
        _ => fake_llm::text("done", 1),
    })
    .await;
    let app = Harness::start(&fake).await;
    let mut list = http_tool("list", format!("{base}/list"));
    list["read_only"] = json!(true);
    let agent = app
        .create_agent(&json!({"name": "ordered", "model": "gpt-4o-mini",
        "tools": [http_tool("create", format!("{base}/create")), list]}))
        .await;
    let (_, accepted) = app.ask(&agent, "go").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let order: Vec<String> = tools
        .calls()
        .iter()
        .map(|(path, _, body)| format!("{path} {}", body["city"].as_str().unwrap_or("?")))
        .collect();
    assert_eq!(order.len(), 4, "{order:?}");
    assert_eq!(
        order[0], "create a",
        "the first write went first: {order:?}"
    );
    let mut reads = order[1..3].to_vec();
    reads.sort();
    assert_eq!(reads, ["list a", "list b"], "then both reads: {order:?}");
    assert_eq!(order[3], "create b", "then the last write: {order:?}");
}

#[tokio::test]
async fn a_call_of_a_tool_the_step_did_not_offer_is_answered_with_an_error_and_not_made() {
    // Step 1 offers only `list`; the model calls `create` anyway, and then a tool it never had.
    let (tools, base) = Tools::start().await;
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[
            ("c1", "create", r#"{"city": "a"}"#),
            ("g1", "ghost", r#"{}"#),
            ("l1", "list", r#"{"city": "a"}"#),
        ]),
        _ => fake_llm::text("done", 1),
    })
    .await;
    let app = Harness::start(&fake).await;
    let agent = app.create_agent(&json!({"name": "narrow", "model": "gpt-4o-mini",
        "tools": [http_tool("create", format!("{base}/create")), http_tool("list", format!("{base}/list"))],
        "step_rules": [{"step": 1, "active_tools": ["list"]}]})).await;
    let (_, accepted) = app.ask(&agent, "go").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let made: Vec<String> = tools.calls().into_iter().map(|(path, _, _)| path).collect();
    assert_eq!(made, ["list"], "only the offered tool ran");
    let answered = &fake.requests()[1];
    let results: Vec<(String, String)> = answered["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let id = m["tool_call_id"].as_str().unwrap_or_default().to_owned();
            (id, m["content"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    assert_eq!(results.len(), 3, "{results:?}");
    assert!(
        results[0].1.contains("`create` is not available"),
        "{results:?}"
    );
    assert!(results[1].1.contains("unknown tool `ghost`"), "{results:?}");
    assert_eq!(results[2].1, "ok");
}

#[tokio::test]
async fn a_dead_mcp_server_only_removes_its_tools_and_a_thread_s_agent_answers() {
    let fake = FakeLlm::start(|_, _| fake_llm::text("Answered without MCP.", 2)).await;
    let app = Harness::start(&fake).await;
    // Nothing listens on this port: discovery fails, the run goes on without the server's tools.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let agent = app
        .create_agent(&json!({"name": "mcp", "model": "gpt-4o-mini",
        "tools": [{"type": "mcp", "name": "gh", "url": format!("http://{dead}/mcp")},
                  http_tool("get_weather", "http://127.0.0.1:9/weather".into())]}))
        .await;
    let thread = app.thread_with(&agent).await;
    let accepted = app.send(thread, None, "hi").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed");
    assert_eq!(
        run["agent_id"],
        agent.as_str(),
        "the thread's agent answered"
    );
    let requests = fake.requests();
    let offered: Vec<&str> = requests[0]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert_eq!(
        offered,
        ["get_weather"],
        "only the dead server's tools are gone"
    );
}

#[tokio::test]
async fn a_cancel_requested_just_before_a_pause_ends_the_run_cancelled_not_paused() {
    let fake = FakeLlm::start(|_, _| fake_llm::tool_calls(&[("c1", "read", "{}")])).await;
    let app = Harness::start(&fake).await;
    // The cancel request lands in the window between the step's save and the pause, where
    // the worker has already looked for one: as a request committed then would.
    sqlx::raw_sql(
        "CREATE FUNCTION cancel_on_save() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           UPDATE runs SET cancel_requested_at = now() WHERE id = NEW.workflow_id;
           RETURN NEW;
         END $$;
         CREATE TRIGGER cancel_on_save AFTER INSERT ON run_steps
           FOR EACH ROW EXECUTE FUNCTION cancel_on_save();",
    )
    .execute(&app.db.pool)
    .await
    .expect("trigger");
    let agent = app
        .create_agent(&json!({"name": "reader", "model": "gpt-4o-mini",
            "tools": [{"type": "client", "name": "read"}]}))
        .await;
    let (thread, accepted) = app.ask(&agent, "read it").await;
    let run = app
        .run_until(&accepted, |s| {
            matches!(s, "completed" | "failed" | "cancelled" | "requires_action")
        })
        .await;
    assert_eq!(run["status"], "cancelled", "{run}");
    let frames = app.events(thread).await;
    let kinds: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    assert!(!kinds.contains(&"requires_action"), "{kinds:?}");
    assert!(kinds.ends_with(&["message_end", "done"]), "{kinds:?}");
}

#[tokio::test]
async fn a_run_cancelled_after_its_worker_died_keeps_the_steps_it_completed() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("c1", "get_weather", r#"{"city": "Paris"}"#)]),
        _ => fake_llm::tool_calls(&[("c2", "hang", "{}")]),
    })
    .await;
    let (_, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "slow", "model": "gpt-4o-mini",
            "tools": [http_tool("get_weather", format!("{base}/weather")),
                      http_tool("hang", format!("{base}/hang"))]}))
        .await;
    let (thread, accepted) = app.ask(&agent, "weather, then wait").await;
    let workflow: uuid::Uuid = accepted["workflow_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("id");
    // The worker dies while step 2's tool hangs (its attempt is dropped mid-way).
    tokio::select! {
        executed = app.attempt() => panic!("the attempt should hang in step 2: {executed:?}"),
        () = spool_tests::poll_until("step 2 to be saved", Duration::from_secs(10), || async {
            let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM run_steps")
                .fetch_one(&app.db.pool)
                .await
                .ok()?;
            (n == 2).then_some(())
        }) => {}
    }
    // A cancel is requested, and the dead worker's lease runs out.
    sqlx::query(
        "UPDATE runs SET cancel_requested_at = now(), lease_expires_at = now() - interval '1 second'
          WHERE id = $1",
    )
    .bind(workflow)
    .execute(&app.db.pool)
    .await
    .expect("cancel");
    let run = app
        .run_until(&accepted, |s| {
            matches!(s, "cancelled" | "completed" | "failed")
        })
        .await;
    assert_eq!(run["status"], "cancelled", "{run}");
    let page = app.messages(thread).await;
    let message = &page["messages"][1];
    assert_eq!(message["status"], "cancelled");
    let parts: Vec<&str> = message["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .filter_map(|p| p["type"].as_str())
        .collect();
    assert_eq!(
        parts,
        ["tool_call", "tool_result"],
        "step 1 is kept: {message}"
    );
    assert!(
        message["parts"][1]["output"]
            .as_str()
            .is_some_and(|o| o.contains("sunny in Paris")),
        "{message}"
    );
}

#[tokio::test]
async fn nul_characters_from_the_model_or_a_tool_neither_crash_the_run_nor_repeat_its_tools() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        // Arguments whose JSON escapes a NUL, then a tool whose answer carries one.
        0 => fake_llm::tool_calls(&[("c1", "nul", r#"{"city": "a\u0000b"}"#)]),
        _ => fake_llm::text("done\u{0}", 1),
    })
    .await;
    let (tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "nul", "model": "gpt-4o-mini",
            "tools": [http_tool("nul", format!("{base}/nul"))]}))
        .await;
    let (thread, accepted) = app.ask(&agent, "break it").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["attempt"], 1, "no crash loop");
    assert_eq!(tools.calls().len(), 1, "the tool ran once");
    let page = app.messages(thread).await;
    let message = &page["messages"][1];
    assert_eq!(message["content"], "done\u{fffd}");
    assert_eq!(message["parts"][1]["output"], "zero\u{fffd}byte");
}
