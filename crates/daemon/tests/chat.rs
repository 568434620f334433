//! Issue 5 end to end: `chat_send`, the chat inbox `chat:<AGENT_NAME>` and specialist agents as
//! tools, through the real binary and a real redis-server.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};

use crate::support::{
    Daemon, RedisServer, answers_to, payloads, pending, request, settled, temp_dir, wait_for, xadd,
};

const WAIT: Duration = Duration::from_secs(10);

/// A chat envelope shaped exactly like contract section 4.
fn chat_message(conversation_id: &str, sender: &str, content: &str, metadata: Value) -> Value {
    json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "conversation_id": conversation_id,
        "sender": sender,
        "recipient": "agent:ToolHost",
        "type": "message",
        "content": content,
        "metadata": metadata,
        "created_at": chrono::Utc::now().to_rfc3339(),
    })
}

/// A request without `session_id`, so the call runs in no conversation unless `data` names one.
fn request_outside_conversations(event_type: &str, request_id: &str, data: Value) -> Value {
    let mut envelope = request(event_type, request_id, data);
    envelope.as_object_mut().unwrap().remove("session_id");
    envelope
}

/// Sends requests to `action-requests` and returns each one's `data` answer, in request order.
async fn call_all(connection: &mut MultiplexedConnection, requests: &[Value]) -> Vec<Value> {
    let before = payloads(connection, "action-results").await.len();
    for envelope in requests {
        xadd(connection, "action-requests", &envelope.to_string()).await;
    }
    let results = wait_for(connection, "action-results", before + requests.len(), WAIT).await;
    requests
        .iter()
        .map(|envelope| {
            let request_id = envelope["data"]["request_id"].as_str().unwrap();
            let answers = answers_to(&results, request_id);
            assert_eq!(answers.len(), 1, "answers to {request_id}: {results:#?}");
            answers[0]["data"].clone()
        })
        .collect()
}

/// The `data` of a failed call, as the contract spells it.
fn failure(request_id: &str, error: &str, code: &str) -> Value {
    json!({"request_id": request_id, "success": false, "error": error, "error_code": code})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_send_publishes_and_validates_word_for_word() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[("AGENT_NAME", "ToolHost")]);
    let mut connection = redis.connection().await;
    let send = |id: &str, data: Value| request_outside_conversations("chat_send.requested", id, data);
    let mut in_session =
        request("chat_send.requested", "r-session", json!({"recipient": "agent:DevAgent", "content": "hi"}));
    in_session["session_id"] = json!("conv-session");
    let answers = call_all(
        &mut connection,
        &[
            send(
                "r-chat",
                json!({"recipient": "chat:conv1", "content": "hello", "conversation_id": "ignored"}),
            ),
            send(
                "r-agent",
                json!({"recipient": "agent:DevAgent", "content": "build it", "conversation_id": "conv2"}),
            ),
            in_session,
            send("r-bad-recipient", json!({"recipient": "DevAgent", "content": "x"})),
            send("r-empty-suffix", json!({"recipient": "chat:", "content": "x"})),
            send("r-blank", json!({"recipient": "chat:conv1", "content": "  "})),
            send("r-no-conversation", json!({"recipient": "agent:DevAgent", "content": "x"})),
        ],
    )
    .await;

    let envelope_id = |answer: &Value| answer["result"]["envelope_id"].as_str().unwrap().to_owned();
    let expect = |request_id: &str, envelope_id: String, topics: Value| {
        json!({"request_id": request_id, "success": true,
               "result": {"ok": true, "envelope_id": envelope_id, "published_to": topics}})
    };
    assert_eq!(answers[0], expect("r-chat", envelope_id(&answers[0]), json!(["chat:conv1"])));
    assert_eq!(
        answers[1],
        expect("r-agent", envelope_id(&answers[1]), json!(["chat:conv2", "chat:DevAgent"]))
    );
    assert_eq!(
        answers[2],
        expect("r-session", envelope_id(&answers[2]), json!(["chat:conv-session", "chat:DevAgent"]))
    );
    let bad_recipient = "recipient must be 'chat:{conversation_id}' or 'agent:{Name}'";
    assert_eq!(answers[3], failure("r-bad-recipient", bad_recipient, "invalid_arguments"));
    assert_eq!(answers[4], failure("r-empty-suffix", bad_recipient, "invalid_arguments"));
    assert_eq!(answers[5], failure("r-blank", "content must be non-empty", "invalid_arguments"));
    let no_conversation = "conversation_id not available for agent recipient";
    assert_eq!(answers[6], failure("r-no-conversation", no_conversation, "invalid_arguments"));

    let sent = payloads(&mut connection, "chat:conv1").await;
    assert_eq!(sent.len(), 1);
    let sent = &sent[0];
    assert_eq!(sent["id"], envelope_id(&answers[0]));
    assert!(uuid::Uuid::parse_str(sent["id"].as_str().unwrap()).is_ok());
    assert!(chrono::DateTime::parse_from_rfc3339(sent["created_at"].as_str().unwrap()).is_ok());
    let mut expected = json!({"id": sent["id"], "conversation_id": "conv1", "sender": "agent:ToolHost",
        "recipient": "chat:conv1", "type": "message", "content": "hello", "metadata": {}, "created_at": sent["created_at"]});
    assert_eq!(sent, &expected);
    let to_agent = payloads(&mut connection, "chat:DevAgent").await;
    assert_eq!(to_agent.len(), 2);
    let to_dev = to_agent.iter().find(|sent| sent["id"] == envelope_id(&answers[1])).unwrap();
    assert_eq!(payloads(&mut connection, "chat:conv2").await, std::slice::from_ref(to_dev));
    expected = json!({"id": envelope_id(&answers[1]), "conversation_id": "conv2", "sender": "agent:ToolHost",
        "recipient": "agent:DevAgent", "type": "message", "content": "build it", "metadata": {},
        "created_at": to_dev["created_at"]});
    assert_eq!(to_dev, &expected);

    // Models in strict mode see conversation_id as a nullable required argument and send null for it.
    let listing = call_all(
        &mut connection,
        &[request_outside_conversations("tools.discover", "r-list", json!({"format": "openai"}))],
    )
    .await;
    let tools = listing[0]["result"]["tools"].as_array().unwrap();
    let chat_send = tools.iter().find(|tool| tool["function"]["name"] == "chat_send").unwrap();
    assert_eq!(chat_send["function"]["strict"], true);
    let parameters = &chat_send["function"]["parameters"];
    assert_eq!(parameters["required"], json!(["content", "conversation_id", "recipient"]));
    assert_eq!(parameters["properties"]["conversation_id"]["type"], json!(["string", "null"]));
    let strict_call =
        send("r-null", json!({"recipient": "chat:conv9", "content": "x", "conversation_id": null}));
    let answer = call_all(&mut connection, &[strict_call]).await;
    assert_eq!(answer[0]["result"]["published_to"], json!(["chat:conv9"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_by_chat_report_steps_output_and_reply_both_ways() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[("AGENT_NAME", "ToolHost")]);
    let mut connection = redis.connection().await;
    let by_metadata = chat_message(
        "conv1",
        "agent:Planner",
        "please echo",
        json!({"tool_call": {"name": "echo", "arguments": {"message": "hi"}, "id": "call-1"}}),
    );
    let by_content = chat_message(
        "conv2",
        "agent:Planner",
        r#"{"tool": "echo", "arguments": {"message": "there"}}"#,
        json!({}),
    );
    let failing = chat_message(
        "conv3",
        "user:alice",
        "",
        json!({"tool_call": {"name": "echo", "arguments": {}, "id": "call-3"}}),
    );
    for message in [&by_metadata, &by_content, &failing] {
        xadd(&mut connection, "chat:ToolHost", &message.to_string()).await;
    }

    let events = wait_for(&mut connection, "stream:conv1", 3, WAIT).await;
    assert_eq!(events.len(), 3, "{events:#?}");
    let [start, success, output] = &events[..] else { unreachable!() };
    for event in &events {
        assert_eq!(event["conversation_id"], "conv1");
        assert!(uuid::Uuid::parse_str(event["id"].as_str().unwrap()).is_ok());
        assert!(chrono::DateTime::parse_from_rfc3339(event["created_at"].as_str().unwrap()).is_ok());
    }
    let common = |event: &Value| json!({"id": event["id"], "conversation_id": "conv1", "created_at": event["created_at"]});
    let mut expected = common(start);
    expected.as_object_mut().unwrap().extend(
        json!({"event": "tool_step", "name": "echo", "args": {"message": "hi"}, "status": "start", "tool_call_id": "call-1"})
            .as_object()
            .unwrap()
            .clone(),
    );
    assert_eq!(start, &expected);
    assert_eq!(success["event"], "tool_step");
    assert_eq!(success["status"], "success");
    assert_eq!(success["tool_call_id"], "call-1");
    assert_eq!(success["result_summary"], r#"{"message":"hi"}"#);
    assert!(success["duration_ms"].is_u64());
    assert_eq!(output["event"], "output");
    assert_eq!(output["text"], r#"{"message":"hi"}"#);

    let replies = wait_for(&mut connection, "chat:Planner", 2, WAIT).await;
    assert_eq!(replies.len(), 2, "{replies:#?}");
    let reply = replies.iter().find(|reply| reply["conversation_id"] == "conv1").unwrap();
    assert_eq!(payloads(&mut connection, "chat:conv1").await, std::slice::from_ref(reply));
    let expected = json!({"id": reply["id"], "conversation_id": "conv1", "sender": "agent:ToolHost",
        "recipient": "agent:Planner", "type": "message", "content": r#"{"message":"hi"}"#,
        "metadata": {"tool_call_id": "call-1", "tool": "echo", "success": true, "result": {"message": "hi"},
                     "in_reply_to": by_metadata["id"], "traceparent": reply["metadata"]["traceparent"]},
        "created_at": reply["created_at"]});
    assert_eq!(reply, &expected);
    // The reply carries the call's trace context (a new trace: the message gave none).
    let traceparent = reply["metadata"]["traceparent"].as_str().unwrap();
    assert!(traceparent.starts_with("00-") && traceparent.len() == 55, "{traceparent}");

    let content_reply = replies.iter().find(|reply| reply["conversation_id"] == "conv2").unwrap();
    assert_eq!(content_reply["content"], r#"{"message":"there"}"#);
    assert_eq!(payloads(&mut connection, "chat:conv2").await, std::slice::from_ref(content_reply));
    let steps = wait_for(&mut connection, "stream:conv2", 3, WAIT).await;
    let call_id = &content_reply["metadata"]["tool_call_id"];
    assert!(uuid::Uuid::parse_str(call_id.as_str().unwrap()).is_ok());
    assert_eq!((&steps[0]["tool_call_id"], &steps[1]["tool_call_id"]), (call_id, call_id));

    let steps = wait_for(&mut connection, "stream:conv3", 3, WAIT).await;
    assert_eq!((&steps[0]["status"], &steps[1]["status"]), (&json!("start"), &json!("error")));
    assert_eq!(steps[1]["tool_call_id"], "call-3");
    assert!(steps[1]["error"].as_str().unwrap().contains("invalid arguments for tool 'echo'"), "{steps:#?}");
    let error_reply = wait_for(&mut connection, "chat:conv3", 1, WAIT).await;
    assert_eq!(error_reply[0]["recipient"], "chat:conv3");
    assert_eq!(error_reply[0]["metadata"]["success"], false);
    assert_eq!(error_reply[0]["metadata"]["error_code"], "invalid_arguments");
    assert_eq!(error_reply[0]["content"], steps[1]["error"]);

    // A re-sent copy of an answered message (same envelope id) is acked, not run or answered again.
    xadd(&mut connection, "chat:ToolHost", &by_metadata.to_string()).await;
    let marker = json!({"tool_call": {"name": "echo", "arguments": {"message": "m"}}});
    xadd(&mut connection, "chat:ToolHost", &chat_message("conv-marker", "user:bob", "", marker).to_string())
        .await;
    assert_eq!(wait_for(&mut connection, "chat:conv-marker", 1, WAIT).await.len(), 1);
    settled(&mut connection, "chat:ToolHost", "toolhost").await;
    assert_eq!(payloads(&mut connection, "chat:conv1").await.len(), 1);
    assert_eq!(payloads(&mut connection, "stream:conv1").await.len(), 3);
    assert_eq!(payloads(&mut connection, "chat:Planner").await.len(), 2);
    assert_eq!(pending(&mut connection, "chat:ToolHost", "toolhost").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_control_malformed_and_own_messages() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[("AGENT_NAME", "ToolHost")]);
    let mut connection = redis.connection().await;
    let question = chat_message("conv-help", "agent:Planner", "what can you do?", json!({}));
    let mut control = chat_message("conv-control", "agent:Planner", "pause", json!({}));
    control["type"] = json!("control");
    let own = chat_message(
        "conv-own",
        "agent:ToolHost",
        r#"{"tool": "echo", "arguments": {"message": "x"}}"#,
        json!({}),
    );
    let missing_fields = json!({"id": "m-9", "conversation_id": "conv-bad", "content": "no sender"});
    for payload in [
        question.to_string(),
        control.to_string(),
        own.to_string(),
        "not json".into(),
        missing_fields.to_string(),
    ] {
        xadd(&mut connection, "chat:ToolHost", &payload).await;
    }
    let after = chat_message(
        "conv-after",
        "agent:Planner",
        "",
        json!({"tool_call": {"name": "echo", "arguments": {"message": "ok"}}}),
    );
    xadd(&mut connection, "chat:ToolHost", &after.to_string()).await;

    let help = wait_for(&mut connection, "chat:conv-help", 1, WAIT).await;
    assert_eq!(help.len(), 1);
    assert_eq!(help[0]["recipient"], "agent:Planner");
    assert_eq!(help[0]["sender"], "agent:ToolHost");
    let text = help[0]["content"].as_str().unwrap();
    for needle in ["\"tool\"", "metadata.tool_call", "chat_send", "echo", "terminal_run"] {
        assert!(text.contains(needle), "{needle} missing from {text}");
    }
    assert_eq!(help[0]["metadata"]["in_reply_to"], question["id"]);

    let dead = wait_for(&mut connection, "dlq:ToolHost", 2, WAIT).await;
    assert_eq!(dead.len(), 2, "{dead:#?}");
    // Entries are handled concurrently, so the letters may come in either order.
    let not_json = dead.iter().find(|letter| letter["envelope"] == "not json").unwrap();
    assert!(not_json["error"].as_str().unwrap().starts_with("payload is not JSON"), "{dead:#?}");
    assert_eq!(
        not_json,
        &json!({"event": "dead_letter", "agent": "ToolHost", "conversation_id": null, "envelope": "not json",
                "error": not_json["error"]})
    );
    let incomplete = dead.iter().find(|letter| letter["envelope"] == missing_fields).unwrap();
    assert_eq!(
        incomplete,
        &json!({"event": "dead_letter", "agent": "ToolHost", "conversation_id": "conv-bad", "envelope": missing_fields,
                "error": incomplete["error"]})
    );
    assert!(incomplete["error"].as_str().unwrap().contains("missing field"), "{dead:#?}");

    let answered = wait_for(&mut connection, "chat:conv-after", 1, WAIT).await;
    assert_eq!(answered[0]["content"], r#"{"message":"ok"}"#);
    assert_eq!(pending(&mut connection, "chat:ToolHost", "toolhost").await, 0);
    // Control and own messages got nothing: no reply, no events, no second help.
    settled(&mut connection, "chat:ToolHost", "toolhost").await;
    for topic in ["chat:conv-control", "stream:conv-control", "chat:conv-own", "stream:conv-own"] {
        assert!(payloads(&mut connection, topic).await.is_empty(), "{topic}");
    }
    assert_eq!(payloads(&mut connection, "chat:Planner").await.len(), 2);
}

/// A specialist agent written like a real worker: plain XREAD on `chat:<name>`, then an `output`
/// event on the conversation's stream.
async fn specialist(redis_url: String, name: &'static str) {
    let client = redis::Client::open(redis_url).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let mut cursor = "0-0".to_owned();
    loop {
        let reply: redis::streams::StreamReadReply = redis::cmd("XREAD")
            // Short blocks: the test connection has a response timeout shorter than a long block.
            .arg("BLOCK")
            .arg(100)
            .arg("STREAMS")
            .arg(format!("chat:{name}"))
            .arg(&cursor)
            .query_async(&mut connection)
            .await
            .unwrap();
        for entry in reply.keys.into_iter().flat_map(|key| key.ids) {
            cursor.clone_from(&entry.id);
            let payload: String = entry.get("payload").unwrap();
            let message: Value = serde_json::from_str(&payload).unwrap();
            let conversation_id = message["conversation_id"].as_str().unwrap();
            let event = json!({"id": uuid::Uuid::new_v4().to_string(), "conversation_id": conversation_id,
                "created_at": chrono::Utc::now().to_rfc3339(), "event": "output",
                "text": format!("{name} did: {}", message["content"].as_str().unwrap())});
            xadd(&mut connection, &format!("stream:{conversation_id}"), &event.to_string()).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specialist_agents_answer_through_their_tools() {
    let redis = RedisServer::start();
    let dir = temp_dir("agents");
    let config = dir.join("toolhost.toml");
    std::fs::write(
        &config,
        "[[agents]]\nname = \"coder\"\ndescription = \"Writes code.\"\nparameter = \"task\"\ntimeout_s = 5\n\n\
         [[agents]]\nname = \"silent\"\ndescription = \"Never answers.\"\ntimeout_s = 1\n",
    )
    .unwrap();
    let env = [("AGENT_NAME", "ToolHost"), ("CHAT_TOOL_CONVERSATION_ID", "fallback")];
    let daemon = Daemon::start_args(&redis, &env, &["--config", config.to_str().unwrap()]);
    assert!(daemon.log().contains("coder,echo,silent,terminal_run"), "{}", daemon.log());
    let worker = tokio::spawn(specialist(redis.url(), "coder"));
    let mut connection = redis.connection().await;

    let answers = call_all(
        &mut connection,
        &[
            request_outside_conversations("coder.requested", "r-fresh", json!({"task": "write hello"})),
            request("coder.requested", "r-continued", json!({"task": "add tests"})),
            request_outside_conversations("silent.requested", "r-silent", json!({"message": "anyone?"})),
            request_outside_conversations("echo.requested", "r-meanwhile", json!({"message": "not blocked"})),
            request_outside_conversations(
                "chat_send.requested",
                "r-fallback",
                json!({"recipient": "agent:DevAgent", "content": "x"}),
            ),
            request_outside_conversations(
                "coder.requested",
                "r-explicit",
                json!({"task": "review", "conversation_id": "conv-x"}),
            ),
        ],
    )
    .await;
    let fresh_conversation = answers[0]["result"]["conversation_id"].as_str().unwrap();
    assert!(uuid::Uuid::parse_str(fresh_conversation).is_ok());
    assert_eq!(
        answers[0]["result"],
        json!({"response": "coder did: write hello", "conversation_id": fresh_conversation})
    );
    assert_eq!(answers[1]["result"], json!({"response": "coder did: add tests", "conversation_id": "s-1"}));
    let silent = &answers[2];
    assert_eq!(silent["error_code"], "timeout");
    assert!(
        silent["error"].as_str().unwrap().starts_with("agent 'silent' did not answer within 1 s"),
        "{silent}"
    );
    assert_eq!(answers[3]["result"], json!({"message": "not blocked"}));
    assert_eq!(answers[4]["result"]["published_to"], json!(["chat:fallback", "chat:DevAgent"]));
    assert_eq!(answers[5]["result"], json!({"response": "coder did: review", "conversation_id": "conv-x"}));

    // The echo sent after the silent call was answered while the silent call still waited.
    let results = payloads(&mut connection, "action-results").await;
    let position = |id: &str| results.iter().position(|result| result["data"]["request_id"] == id).unwrap();
    assert!(position("r-meanwhile") < position("r-silent"));
    let asked = payloads(&mut connection, "chat:coder").await;
    assert_eq!(asked.len(), 3);
    let fresh = asked.iter().find(|sent| sent["content"] == "write hello").unwrap();
    assert_eq!(
        fresh,
        &json!({"id": fresh["id"], "conversation_id": fresh_conversation, "sender": "agent:ToolHost",
               "recipient": "agent:coder", "type": "message", "content": "write hello",
               "metadata": {"traceparent": fresh["metadata"]["traceparent"]},
               "created_at": fresh["created_at"]})
    );
    // The specialist is told the call's trace context (the agent tool's run).
    assert_eq!(fresh["metadata"]["traceparent"].as_str().map(str::len), Some(55), "{fresh}");
    let in_conversation = payloads(&mut connection, &format!("chat:{fresh_conversation}")).await;
    assert_eq!(in_conversation, std::slice::from_ref(fresh));
    assert_eq!(payloads(&mut connection, "chat:silent").await.len(), 1);
    worker.abort();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn agent_names_must_be_tool_names() {
    let dir = temp_dir("bad-agents");
    let config = dir.join("toolhost.toml");
    std::fs::write(&config, "[[agents]]\nname = \"dev.agent\"\ndescription = \"d\"\n").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .args(["check-config", "--config", config.to_str().unwrap()])
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("agents[0].name: must be 1-64 of [a-zA-Z0-9_-]"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}
