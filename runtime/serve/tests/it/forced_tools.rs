//! Forced tool choices (`tool_choice: "required"`, a named function) sampled under the tools' JSON schema, and
//! `response_format` `json_object` / `json_schema` sampled under theirs.
//!
//! The tool model's layers are zero: past its fixed chain (which the constraint forbids from the first token),
//! every position's logits are flat, so under the mask it samples uniformly among the allowed tokens of its
//! 256 single bytes: a model that writes garbage unless constrained. Every sample must still come back as
//! calls of the given tools with arguments that match their schemas.

use serde_json::{Value, json};
use trinity_serve::ServeOptions;

use crate::helpers::*;

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        }}},
        {"type": "function", "function": {"name": "stop", "parameters": {
            "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        }}},
    ])
}

/// Whether `arguments` (a JSON text) fits `name`'s parameters in `tools()`.
fn fits(name: &str, arguments: &str) -> bool {
    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(arguments) else { return false };
    let keys: Vec<&str> = args.keys().map(String::as_str).collect();
    match name {
        "get_weather" => {
            args["city"].is_string()
                && args["days"].is_i64()
                && args.get("unit").is_none_or(|u| u == "c" || u == "f")
                && keys.iter().all(|k| ["city", "unit", "days"].contains(k))
        }
        "stop" => args["ok"].is_boolean() && keys == ["ok"],
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_and_named_choices_always_return_calls_that_fit_the_tools() {
    let (server, sink) = start(long_tool_rollout(), options("tools")).await;
    let addr = server.local_addr();
    let mut calls_seen = 0;
    for seed in 0..4 {
        let body = json!({
            "messages": [{"role": "user", "content": "Weather?"}], "tools": tools(), "tool_choice": "required",
            "n": 4, "temperature": 1.0, "seed": seed, "max_tokens": 3000, "return_token_ids": true,
        });
        let (status, response) = post(addr, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{response}");
        for choice in response["choices"].as_array().unwrap() {
            // As vLLM: content "", the engine's finish reason (the sample ended on its end-of-sequence token).
            assert_eq!(choice["finish_reason"], "stop", "{choice}");
            assert_eq!(choice["message"]["content"], "");
            let calls = choice["message"]["tool_calls"].as_array().unwrap();
            assert!(!calls.is_empty());
            for call in calls {
                let name = call["function"]["name"].as_str().unwrap();
                let arguments = call["function"]["arguments"].as_str().unwrap();
                assert!(fits(name, arguments), "{name}({arguments})");
                assert!(call["id"].as_str().unwrap().starts_with("call_"));
                calls_seen += 1;
            }
            let tokens: Vec<u32> = serde_json::from_value(choice["token_ids"].clone()).unwrap();
            assert_eq!(*tokens.last().unwrap() as i64, IM_END, "the sample ends on the end-of-sequence token");
        }
    }
    assert!(calls_seen >= 16);

    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let body = json!({
        "messages": [{"role": "user", "content": "Weather?"}], "tools": tools(), "tool_choice": named,
        "n": 4, "seed": 1, "max_tokens": 3000, "logprobs": true,
    });
    let (status, response) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    for choice in response["choices"].as_array().unwrap() {
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert!(fits("get_weather", calls[0]["function"]["arguments"].as_str().unwrap()), "{choice}");
        // The reported logprobs are the unmasked distribution's: after most tokens 264 flat logits, so
        // ln(1/264); after a newline (the prompt's last token, or whitespace in the JSON) the chain puts logit
        // 40 on `<tool_call>`, which the mask forbids, so the sampled token's unmasked logprob is about -40.
        for entry in choice["logprobs"]["content"].as_array().unwrap() {
            let logprob = entry["logprob"].as_f64().unwrap();
            assert!((logprob - (1.0f64 / 264.0).ln()).abs() < 1e-3 || logprob < -35.0, "{entry}");
        }
    }

    // Recorded like any reply: the experience holds the constrained tokens.
    post(addr, "/feedback", &json!({"msg_ids": [response["id"]], "reward": 1.0})).await;
    post(addr, "/commit", &json!({})).await;
    let experiences = &sink.all()[0];
    assert_eq!(experiences.len(), 4);
    assert_eq!(experiences[0].info["finish_reason"], "stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_required_choice_sends_its_calls_when_it_ends() {
    let (server, _sink) = start(long_tool_rollout(), options("tools")).await;
    let body = json!({
        "messages": [{"role": "user", "content": "Weather?"}], "tools": tools(), "tool_choice": "required",
        "seed": 3, "max_tokens": 3000, "stream": true,
    });
    let (status, data) = post_stream(server.local_addr(), "/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    let chunks = chunks(&data);
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    assert!(deltas.iter().all(|d| d.get("content").is_none_or(|c| c == "" || c.is_null())), "no text goes out");
    let with_calls: Vec<&&Value> = deltas.iter().filter(|d| d.get("tool_calls").is_some()).collect();
    assert_eq!(with_calls.len(), 1);
    for (i, call) in with_calls[0]["tool_calls"].as_array().unwrap().iter().enumerate() {
        assert_eq!(call["index"], i);
        assert!(fits(call["function"]["name"].as_str().unwrap(), call["function"]["arguments"].as_str().unwrap()));
    }
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls", "as vLLM streams it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_parses_forced_tool_calls() {
    let python = crate::openai_client::openai_python();
    let (server, _sink) = start(long_tool_rollout(), options("tools")).await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_forced_tools.py");
    let base = server.base_url();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python).arg(script).args(["--base-url", &base]).output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(!seen["required"].as_array().unwrap().is_empty());
    assert_eq!(seen["named"]["name"], "generate_response");
    assert!(!seen["streamed"].as_array().unwrap().is_empty());
    assert!(seen["parsed"]["city"].is_string() && seen["parsed"]["sunny"].is_boolean(), "{seen}");
}

/// The schema of `json_schema` replies: what `openai`'s `parse` sends for a pydantic model (strict).
fn forecast() -> Value {
    json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["sun", "rain"]}, "maxItems": 3}},
        "required": ["city", "days", "tags"],
        "additionalProperties": false,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_response_formats_return_content_that_fits_whole_and_streamed() {
    let (server, sink) = start(long_tool_rollout(), options("tools")).await;
    let addr = server.local_addr();
    let messages = json!([{"role": "user", "content": "Forecast?"}]);
    let schema =
        json!({"type": "json_schema", "json_schema": {"name": "Forecast", "schema": forecast(), "strict": true}});
    // Twice with the same schema: the second request reuses the first's constraint and its masks.
    for seed in 0..2 {
        let body = json!({"messages": messages, "response_format": schema, "n": 3, "seed": seed, "max_tokens": 3000});
        let (status, response) = post(addr, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{response}");
        for choice in response["choices"].as_array().unwrap() {
            assert_eq!(choice["finish_reason"], "stop", "{choice}");
            assert!(choice["message"].get("tool_calls").is_none_or(Value::is_null), "{choice}");
            let content: Value = serde_json::from_str(choice["message"]["content"].as_str().unwrap()).unwrap();
            let keys: Vec<&str> = content.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(keys, ["city", "days", "tags"], "strict order, nothing else: {content}");
            assert!(content["city"].is_string() && content["days"].is_i64(), "{content}");
            let tags = content["tags"].as_array().unwrap();
            assert!(tags.len() <= 3 && tags.iter().all(|t| t == "sun" || t == "rain"), "{content}");
        }
    }

    let body = json!({"messages": messages, "response_format": {"type": "json_object"}, "n": 3, "seed": 7, "max_tokens": 3000});
    let (status, response) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    for choice in response["choices"].as_array().unwrap() {
        let content: Value = serde_json::from_str(choice["message"]["content"].as_str().unwrap()).unwrap();
        assert!(content.is_object(), "{content}");
    }

    let body = json!({"messages": messages, "response_format": schema, "seed": 5, "max_tokens": 3000, "stream": true});
    let (status, data) = post_stream(addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    let text: String =
        chunks(&data).iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned)).collect();
    let content: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(content.as_object().unwrap().len(), 3, "{content}");

    // Recorded like any reply.
    post(addr, "/feedback", &json!({"msg_ids": [response["id"]], "reward": 1.0})).await;
    post(addr, "/commit", &json!({})).await;
    assert_eq!(sink.all()[0].len(), 3);
}

/// Under a reasoning parser the schema holds the answer only, after the model's `</think>`, as vLLM's structured
/// outputs do: the thinking model still thinks, and its answer fits the format (a forced tool choice alike).
/// Where the prompt already closed the reasoning, the output is held from its first token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_reasoning_parser_the_format_holds_the_answer_after_the_thinking() {
    let parser = trinity_serve::ReasoningParser::from_name("qwen3");
    let (server, _sink) =
        start(long_thinking_tool_rollout(), ServeOptions { reasoning_parser: parser, ..options("tools") }).await;
    let addr = server.local_addr();
    let schema =
        json!({"type": "json_schema", "json_schema": {"name": "Forecast", "schema": forecast(), "strict": true}});
    let user = json!({"role": "user", "content": "Forecast?"});
    let body = json!({"messages": [user], "response_format": schema, "n": 2, "seed": 3, "max_tokens": 3000});
    let (status, response) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    for choice in response["choices"].as_array().unwrap() {
        assert_eq!(choice["message"]["reasoning_content"], THINK_TEXT, "{choice}");
        let content: Value = serde_json::from_str(choice["message"]["content"].as_str().unwrap()).unwrap();
        assert_eq!(content.as_object().unwrap().len(), 3, "{content}");
    }
    let body = json!({
        "messages": [user], "tools": tools(), "tool_choice": "required", "seed": 3, "max_tokens": 3000,
    });
    let (status, response) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    let message = &response["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], THINK_TEXT, "{message}");
    for call in message["tool_calls"].as_array().unwrap() {
        let name = call["function"]["name"].as_str().unwrap();
        assert!(fits(name, call["function"]["arguments"].as_str().unwrap()), "{call}");
    }

    // The reasoning closed in the prompt (an assistant turn that thought, then the user again): the answer is
    // held to the format from its first token, so there is no reasoning.
    let thought = json!({"role": "assistant", "content": "<think>x</think>{}"});
    let body = json!({"messages": [user, thought, user], "response_format": schema, "seed": 3, "max_tokens": 3000});
    let (status, response) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    let message = &response["choices"][0]["message"];
    assert!(message["reasoning_content"].is_null(), "{message}");
    let content: Value = serde_json::from_str(message["content"].as_str().unwrap()).unwrap();
    assert_eq!(content.as_object().unwrap().len(), 3, "{content}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_formats_the_engine_cannot_serve_are_refused_by_name() {
    let (server, _sink) = start(long_tool_rollout(), options("tools")).await;
    let addr = server.local_addr();
    let messages = json!([{"role": "user", "content": "Weather?"}]);
    let both = json!({
        "messages": messages, "tools": tools(), "tool_choice": "required", "response_format": {"type": "json_object"},
    });
    let tag = json!({"messages": messages, "response_format": {"type": "structural_tag", "structures": []}});
    let unknown = json!({"messages": messages, "response_format": {"type": "yaml"}});
    for (body, param) in [(both, "response_format"), (tag, "response_format"), (unknown, "response_format.type")] {
        let (status, response) = post(addr, "/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{response}");
        assert_eq!(response["error"]["param"], param, "{response}");
    }
}
