//! Bad requests get OpenAI-style error bodies with the status the clients map to their exceptions.

use serde_json::{Value, json};
use trinity_serve::ServeOptions;

use crate::helpers::*;

fn assert_error(status: u16, body: &Value, want_status: u16, param: Option<&str>, says: &str) {
    assert_eq!(status, want_status, "{body}");
    let error = &body["error"];
    let message = error["message"].as_str().unwrap_or_else(|| panic!("no message: {body}"));
    assert!(message.contains(says), "`{message}` should mention `{says}`");
    assert!(error["type"].is_string(), "{body}");
    assert!(error.get("code").is_some(), "{body}");
    assert_eq!(error["param"].as_str(), param, "{body}");
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_name_what_is_wrong() {
    let rollout = tiny_rollout(2, 48);
    let (server, _) = start(rollout, ServeOptions { max_request_bytes: 4096, ..options("tiny") }).await;
    let addr = server.local_addr();
    let c = "/v1/chat/completions";

    let (s, b) = post(addr, c, &chat(json!({"max_token": 3}))).await;
    assert_error(s, &b, 400, Some("max_token"), "unrecognized request argument supplied: max_token");
    let (s, b) = post(addr, c, &chat(json!({"n": "two"}))).await;
    assert_error(s, &b, 400, Some("n"), "invalid `n`");
    let (s, b) =
        post(addr, c, &json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}))
            .await;
    assert_error(s, &b, 400, Some("messages[0].content[0]"), "only text parts");
    let (s, b) = post(addr, c, &json!({"messages": [{"role": "robot", "content": "x"}]})).await;
    assert_error(s, &b, 400, Some("messages[0].role"), "unknown role `robot`");
    let (s, b) = post(addr, c, &chat(json!({"model": "gpt-4o"}))).await;
    assert_error(s, &b, 404, Some("model"), "the model `gpt-4o` does not exist");
    assert_eq!(b["error"]["code"], "model_not_found");
    let (s, b) = post(addr, c, &chat(json!({"logprobs": true, "top_logprobs": 21}))).await;
    assert_error(s, &b, 400, Some("top_logprobs"), "more than 20");
    let (s, b) = post(addr, c, &chat(json!({"top_logprobs": 2}))).await;
    assert_error(s, &b, 400, Some("top_logprobs"), "needs `logprobs: true`");
    let (s, b) = post(addr, c, &chat(json!({"presence_penalty": 0.5}))).await;
    assert_error(s, &b, 400, Some("presence_penalty"), "not supported");
    let (s, b) = post(addr, c, &chat(json!({"frequency_penalty": 0.0, "logit_bias": {}}))).await;
    assert_eq!(s, 200, "neutral values are accepted: {b}");
    let (s, b) = post(addr, c, &chat(json!({"response_format": {"type": "structural_tag"}}))).await;
    assert_error(s, &b, 400, Some("response_format"), "`structural_tag` is not supported");
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    let named = json!({"type": "function", "function": {"name": "g"}});
    let (s, b) = post(addr, c, &chat(json!({"tools": tools, "tool_choice": named}))).await;
    assert_error(s, &b, 400, Some("tool_choice"), "tool 'g' has not been passed in `tools`");
    let (s, b) = post(addr, c, &chat(json!({"tool_choice": "required"}))).await;
    assert_error(s, &b, 400, Some("tool_choice"), "needs `tools`");
    // The fixture's 48 tokens hold no `[`: after the whitespace cap no token can start the required array.
    let (s, b) = post(addr, c, &chat(json!({"tools": tools, "tool_choice": "required", "max_tokens": 10}))).await;
    assert_error(s, &b, 400, Some("tool_choice"), "allows no token");
    // Nor a `{`: a JSON response format fails the same way, naming its own parameter.
    let (s, b) = post(addr, c, &chat(json!({"response_format": {"type": "json_object"}, "max_tokens": 10}))).await;
    assert_error(s, &b, 400, Some("response_format"), "allows no token");
    let (s, b) = post(addr, c, &chat(json!({"tools": [{"type": "function"}]}))).await;
    assert_error(s, &b, 400, Some("tools[0]"), "each tool");
    let (s, b) = post(addr, c, &chat(json!({"n": 3}))).await;
    assert_error(s, &b, 400, Some("n"), "KV-cache slots");
    let (s, b) = post(addr, c, &chat(json!({"temperature": -1}))).await;
    assert_error(s, &b, 400, Some("temperature"), "-1");

    // A prompt over the engine's limit (max_model_len 48).
    let long = "hello world ".repeat(20);
    let (s, b) = post(addr, c, &json!({"messages": [{"role": "user", "content": long}]})).await;
    assert_error(s, &b, 400, Some("messages"), "too long");
    assert_eq!(b["error"]["code"], "context_length_exceeded");
    let (s, b) = post(addr, "/v1/completions", &json!({"prompt": long})).await;
    assert_error(s, &b, 400, Some("prompt"), "too long");
    let (s, b) = post(addr, "/v1/completions", &json!({"prompt": [3, 4, 999]})).await;
    assert_error(s, &b, 400, Some("prompt"), "outside the vocabulary");
    let (s, b) = post(addr, "/v1/completions", &json!({"prompt": "x", "echo": true})).await;
    assert_error(s, &b, 400, Some("echo"), "not supported");

    // A body over the limit, invalid JSON, an unknown route, a wrong method.
    let (s, b) = post(addr, c, &json!({"messages": [{"role": "user", "content": "x".repeat(5000)}]})).await;
    assert_error(s, &b, 413, None, "larger than 4096 bytes");
    let (s, bytes) = request(addr, "POST", c, Some(b"{not json")).await;
    assert_error(s, &serde_json::from_slice(&bytes).unwrap(), 400, None, "not valid JSON");
    let (s, bytes) = request(addr, "POST", "/v1/embeddings", Some(b"{}")).await;
    assert_error(s, &serde_json::from_slice(&bytes).unwrap(), 404, None, "no route for POST /v1/embeddings");
    let (s, bytes) = request(addr, "GET", c, None).await;
    assert_error(s, &serde_json::from_slice(&bytes).unwrap(), 405, None, "not allowed");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_recorder_refuses_before_generating() {
    let rollout = tiny_rollout(4, 64);
    let (server, _) = start(rollout.clone(), ServeOptions { max_pending_experiences: 3, ..options("tiny") }).await;
    let addr = server.local_addr();
    let (s, _) = post(addr, "/v1/chat/completions", &chat(json!({"n": 2}))).await;
    assert_eq!(s, 200);
    let generated = rollout.engine().stats().generated_tokens;
    let (s, b) = post(addr, "/v1/chat/completions", &chat(json!({"n": 2}))).await;
    assert_error(s, &b, 429, None, "capacity is 3");
    assert_eq!(b["error"]["code"], "too_many_pending_experiences");
    assert_eq!(rollout.engine().stats().generated_tokens, generated, "nothing was generated");
    // One more choice still fits.
    let (s, _) = post(addr, "/v1/chat/completions", &chat(json!({}))).await;
    assert_eq!(s, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_during_shutdown_get_503_while_streams_in_flight_finish() {
    let rollout = tiny_rollout(2, 1024);
    let (server, _) = start(rollout.clone(), options("tiny")).await;
    let addr = server.local_addr();
    // A long stream is in flight on its own connection when shutdown begins.
    let long = tokio::spawn(async move {
        post_stream(addr, "/v1/chat/completions", &chat(json!({"max_tokens": 600, "ignore_eos": true, "stream": true})))
            .await
    });
    while rollout.engine().stats().generated_tokens < 5 {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    // A keep-alive connection opened before shutdown, used after it began.
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    let stopping = tokio::spawn(server.shutdown());
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let request = hyper::Request::get("/health")
        .header("host", addr.to_string())
        .body(http_body_util::Full::new(hyper::body::Bytes::new()))
        .unwrap();
    if let Ok(response) = sender.send_request(request).await {
        // The connection may be closed by the graceful shutdown instead; if it is still open, the answer is 503.
        assert_eq!(response.status().as_u16(), 503);
    }
    let (status, data) = long.await.unwrap();
    assert_eq!(status, 200);
    let chunks = chunks(&data);
    let tokens: usize = chunks.iter().filter(|c| c["choices"][0]["delta"].get("content").is_some()).count();
    assert!(tokens > 0);
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length", "the stream ran to its end");
    stopping.await.unwrap().unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "no longer listening");
}

/// A prompt far over the limit is refused by its length in bytes, before it is tokenized (the engine's own
/// refusal, which counts tokens, says "too long"), and a body far over the longest prompt is refused unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_far_over_the_limit_is_refused_untokenized() {
    // The tool model's vocabulary has every byte, and its longest entry is 50 bytes (the fixture's lacks bytes, so
    // its tokenizer gives no bound).
    let (server, _) = start(tool_rollout(), options("tool")).await;
    let addr = server.local_addr();
    // 700 KB of text: 700 k tokens, against 1023 (at most 51,150 bytes).
    let huge = "ab1 ".repeat(175_000);
    let (s, b) = post(addr, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": huge}]})).await;
    assert_error(s, &b, 400, Some("messages"), "longer than any prompt of 1023 tokens");
    assert_eq!(b["error"]["code"], "context_length_exceeded");
    let (s, b) = post(addr, "/v1/completions", &json!({"prompt": ["ab", huge]})).await;
    assert_error(s, &b, 400, Some("prompt"), "has more than 1023 tokens");
    // The body limit follows the model (1 MiB at least), not the 16 MiB default.
    let (s, b) = post(addr, "/v1/completions", &json!({"prompt": "ab1 ".repeat(300_000)})).await;
    assert_error(s, &b, 413, None, "larger than 1048576 bytes");
    server.shutdown().await.unwrap();
}
