//! Tool calls: tools rendered through the chat template, the model's own `<tool_call>` output parsed into
//! OpenAI `tool_calls` (whole and streamed), and recorded with the tokens that spelled them. The tool model
//! (see `helpers.rs`) emits a fixed call by construction; that is what makes the test deterministic.

use serde_json::{Value, json};
use trinity_serve::ServeOptions;

use crate::helpers::*;

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_tool_call_becomes_tool_calls() {
    let rollout = tool_rollout();
    let (server, sink) = start(rollout.clone(), options("tools")).await;
    let addr = server.local_addr();
    let body = json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": weather_tools(),
        "temperature": 1.0, "return_token_ids": true, "logprobs": true,
    });
    let (status, response) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    // The tools reached the model through the template's `tools` variable.
    let prompt: Vec<u32> = serde_json::from_value(response["prompt_token_ids"].clone()).unwrap();
    let prompt_text = rollout.tokenizer().decode(&prompt, false).unwrap();
    assert!(
        prompt_text.starts_with(
            "<|im_start|>system\n# Tools\n<tools>{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""
        ),
        "{prompt_text}"
    );
    assert!(prompt_text.contains("\"name\": \"get_weather\""), "{prompt_text}");
    assert!(prompt_text.ends_with("<|im_start|>assistant\n"), "{prompt_text}");

    let choice = &response["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let arguments: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Paris"}));
    let tokens: Vec<u32> = serde_json::from_value(choice["token_ids"].clone()).unwrap();
    assert_eq!(
        rollout.tokenizer().decode(&tokens, false).unwrap(),
        format!("<tool_call>{TOOL_CALL_JSON}</tool_call><|im_end|>")
    );

    // The recorded experience holds the tokens that spelled the call, and the raw text.
    post(addr, "/feedback", &json!({"msg_ids": [response["id"]], "reward": 1.0})).await;
    post(addr, "/commit", &json!({})).await;
    let e = &sink.all()[0][0];
    assert_eq!(e.tokens[e.prompt_length..], tokens[..]);
    assert_eq!(e.info["finish_reason"], "tool_calls");
    assert_eq!(e.response_text.as_deref(), Some(format!("<tool_call>{TOOL_CALL_JSON}</tool_call>").as_str()));

    // The call and its result go back into the history: the template renders both.
    let history = json!({
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"},
        ],
        "tools": weather_tools(), "return_token_ids": true, "max_tokens": 1,
    });
    let (status, next) = post(addr, "/v1/chat/completions", &history).await;
    assert_eq!(status, 200, "{next}");
    let prompt: Vec<u32> = serde_json::from_value(next["prompt_token_ids"].clone()).unwrap();
    let prompt_text = rollout.tokenizer().decode(&prompt, false).unwrap();
    assert!(
        prompt_text.contains("<|im_start|>assistant\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call><|im_end|>\n<|im_start|>tool\nsunny<|im_end|>"),
        "{prompt_text}"
    );

    // With tool_choice none the output stays text.
    let mut none = body.clone();
    none["tool_choice"] = json!("none");
    let (_, plain) = post(addr, "/v1/chat/completions", &none).await;
    assert_eq!(plain["choices"][0]["finish_reason"], "stop");
    assert_eq!(plain["choices"][0]["message"]["content"], format!("<tool_call>{TOOL_CALL_JSON}</tool_call>"));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_tool_call_arrives_as_one_delta() {
    let rollout = tool_rollout();
    let (server, _) = start(rollout, options("tools")).await;
    let addr = server.local_addr();
    let body = json!({"messages": [{"role": "user", "content": "Weather?"}], "tools": weather_tools(), "stream": true});
    let (status, data) = post_stream(addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    let chunks = chunks(&data);
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    let text: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
    assert_eq!(text, "", "no part of the call leaks as content");
    let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0][0]["index"], 0);
    assert_eq!(calls[0][0]["function"]["name"], "get_weather");
    assert_eq!(calls[0][0]["function"]["arguments"], r#"{"city":"Paris"}"#);
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    server.shutdown().await.unwrap();
}

/// With a reasoning parser, `<think>` text is `reasoning_content`, whole and streamed, and the tool call is parsed
/// from the answer after it; the recorded experience still holds every sampled token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_is_reasoning_content_and_the_call_follows_it() {
    let rollout = thinking_tool_rollout();
    let parser = trinity_serve::ReasoningParser::from_name("deepseek_r1");
    let (server, sink) = start(rollout, ServeOptions { reasoning_parser: parser, ..options("tools") }).await;
    let addr = server.local_addr();
    let body = json!({"messages": [{"role": "user", "content": "Weather?"}], "tools": weather_tools()});
    let (status, response) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    let message = &response["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], THINK_TEXT);
    assert_eq!(message["content"], Value::Null);
    assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(response["choices"][0]["finish_reason"], "tool_calls");
    post(addr, "/feedback", &json!({"msg_ids": [response["id"]], "reward": 1.0})).await;
    post(addr, "/commit", &json!({})).await;
    let e = &sink.all()[0][0];
    let expected = format!("<think>{THINK_TEXT}</think><tool_call>{TOOL_CALL_JSON}</tool_call>");
    assert_eq!(e.response_text.as_deref(), Some(expected.as_str()));

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, data) = post_stream(addr, "/v1/chat/completions", &streamed).await;
    assert_eq!(status, 200);
    let chunks = chunks(&data);
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    let thinking: String = deltas.iter().filter_map(|d| d["reasoning_content"].as_str()).collect();
    let content: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
    assert_eq!((thinking.as_str(), content.as_str()), (THINK_TEXT, ""), "{data:?}");
    let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0][0]["function"]["arguments"], r#"{"city":"Paris"}"#);

    // Without a parser the thinking is part of the content before the call.
    let (plain, _) = start(thinking_tool_rollout(), options("tools")).await;
    let (_, response) = post(plain.local_addr(), "/v1/chat/completions", &body).await;
    let message = &response["choices"][0]["message"];
    assert_eq!(message["content"], format!("<think>{THINK_TEXT}</think>"));
    assert!(message.get("reasoning_content").is_none(), "{message}");
    server.shutdown().await.unwrap();
    plain.shutdown().await.unwrap();
}
