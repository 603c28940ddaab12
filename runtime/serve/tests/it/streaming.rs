//! Streamed responses carry exactly the tokens and text of the same request answered whole.
//!
//! Logprobs agree up to rounding: the second of two identical requests finds the first one's prompt in the
//! engine's cache and prefills only its last token, a matmul of another shape.

use serde_json::{Value, json};

use crate::helpers::*;

fn token_ids(chunks: &[Value], index: usize) -> Vec<u64> {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().iter())
        .filter(|c| c["index"] == index)
        .flat_map(|c| c["token_ids"].as_array().cloned().unwrap_or_default())
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// Equal JSON but for numbers, which may differ by 1e-5.
fn assert_same_logprobs(a: &Value, b: &Value, what: &str) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() < 1e-5, "{what}: {x} vs {y}");
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{what}");
            x.iter().zip(y).for_each(|(x, y)| assert_same_logprobs(x, y, what));
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>(), "{what}");
            x.iter().for_each(|(k, v)| assert_same_logprobs(v, &y[k], &format!("{what}.{k}")));
        }
        _ => assert_eq!(a, b, "{what}"),
    }
}

fn content(chunks: &[Value], index: usize, field: &str) -> String {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().iter())
        .filter(|c| c["index"] == index)
        .filter_map(|c| if field == "text" { c["text"].as_str() } else { c["delta"]["content"].as_str() })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_equals_the_whole_response() {
    let rollout = tiny_rollout(4, 256);
    let (server, _) = start(rollout, options("tiny")).await;
    let addr = server.local_addr();
    let body = json!({
        "messages": [{"role": "user", "content": "hello"}], "n": 2, "max_tokens": 12, "seed": 9,
        "logprobs": true, "top_logprobs": 2, "return_token_ids": true,
    });
    let (_, whole) = post(addr, "/v1/chat/completions", &body).await;
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, data) = post_stream(addr, "/v1/chat/completions", &streamed).await;
    assert_eq!(status, 200);
    let chunks = chunks(&data);
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(chunks.iter().all(|c| c["id"] == id && c["object"] == "chat.completion.chunk"));
    // The stream opens with each choice's role; the first chunk carries the prompt's ids.
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[1]["choices"][0]["index"], 1);
    assert_eq!(chunks[0]["prompt_token_ids"], whole["prompt_token_ids"]);
    for index in 0..2 {
        let choice = &whole["choices"][index];
        let ids: Vec<u64> = serde_json::from_value(choice["token_ids"].clone()).unwrap();
        assert_eq!(token_ids(&chunks, index), ids, "choice {index}");
        assert_eq!(content(&chunks, index, "content"), choice["message"]["content"].as_str().unwrap());
        let logprobs: Vec<Value> = chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().unwrap().iter())
            .filter(|c| c["index"] == index && c["logprobs"].is_object())
            .flat_map(|c| c["logprobs"]["content"].as_array().unwrap().clone())
            .collect();
        assert_same_logprobs(&Value::Array(logprobs), &choice["logprobs"]["content"], &format!("choice {index}"));
        let finish: Vec<&Value> = chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().unwrap().iter())
            .filter(|c| c["index"] == index && !c["finish_reason"].is_null())
            .map(|c| &c["finish_reason"])
            .collect();
        assert_eq!(finish, vec![&choice["finish_reason"]]);
    }
    // The usage chunk comes last, with no choices.
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], whole["usage"]);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_stop_string_never_reaches_the_client() {
    let rollout = tiny_rollout(2, 256);
    let (server, _) = start(rollout, options("tiny")).await;
    let addr = server.local_addr();
    for seed in 0..8 {
        let body = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 40, "seed": seed, "ignore_eos": true});
        let (_, free) = post(addr, "/v1/chat/completions", &body).await;
        let text = free["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
        // A stop string from the middle of the free-running text.
        let stop: String = text.chars().skip(text.chars().count() / 2).take(3).collect();
        let cut = text.find(&stop).unwrap();
        let mut stopped = body.clone();
        stopped["stop"] = json!([stop]);
        stopped["stream"] = json!(true);
        let (_, data) = post_stream(addr, "/v1/chat/completions", &stopped).await;
        let chunks = chunks(&data);
        assert_eq!(content(&chunks, 0, "content"), text[..cut], "seed {seed}, stop string {stop:?}");
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_completion_equals_the_whole_one() {
    let rollout = tiny_rollout(2, 256);
    let (server, _) = start(rollout, options("tiny")).await;
    let addr = server.local_addr();
    let body = json!({"prompt": "abc", "max_tokens": 10, "seed": 2, "logprobs": 1, "return_token_ids": true});
    let (_, whole) = post(addr, "/v1/completions", &body).await;
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, data) = post_stream(addr, "/v1/completions", &streamed).await;
    let chunks = chunks(&data);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let choice = &whole["choices"][0];
    let ids: Vec<u64> = serde_json::from_value(choice["token_ids"].clone()).unwrap();
    assert_eq!(token_ids(&chunks, 0), ids);
    assert_eq!(content(&chunks, 0, "text"), choice["text"].as_str().unwrap());
    let logprobs: Vec<Value> = chunks
        .iter()
        .filter(|c| c["choices"][0]["logprobs"].is_object())
        .flat_map(|c| c["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap().clone())
        .collect();
    assert_eq!(Value::Array(logprobs), choice["logprobs"]["token_logprobs"]);
    server.shutdown().await.unwrap();
}
