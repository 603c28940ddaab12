//! Each endpoint's response shape, as OpenAI clients read it.

use serde_json::{Value, json};

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completion_with_n_logprobs_and_token_ids() {
    let rollout = tiny_rollout(4, 256);
    let (server, _) = start(rollout.clone(), options("tiny")).await;
    let addr = server.local_addr();
    let body = json!({
        "model": "tiny", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        "n": 2, "max_tokens": 6, "seed": 3, "logprobs": true, "top_logprobs": 3, "return_token_ids": true,
    });
    let (status, response) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["object"], "chat.completion");
    assert!(response["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(response["model"], "tiny");
    let prompt: Vec<u32> = serde_json::from_value(response["prompt_token_ids"].clone()).unwrap();
    // The prompt is the chat template's rendering, tokenized as the engine sees it.
    let rendered = rollout
        .chat_template()
        .unwrap()
        .render(
            &[json!({"role": "system", "content": "be brief"}), json!({"role": "user", "content": "hello"})],
            true,
            None,
        )
        .unwrap();
    assert_eq!(prompt, rollout.tokenizer().encode(&rendered, false).unwrap());
    let choices = response["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    let mut completion_tokens = 0;
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        assert_eq!(choice["message"]["role"], "assistant");
        let tokens: Vec<u32> = serde_json::from_value(choice["token_ids"].clone()).unwrap();
        let content = choice["logprobs"]["content"].as_array().unwrap();
        assert_eq!(content.len(), tokens.len());
        assert!(!tokens.is_empty() && tokens.len() <= 6);
        completion_tokens += tokens.len();
        for (entry, &token) in content.iter().zip(&tokens) {
            assert_eq!(entry["token"], rollout.tokenizer().decode(&[token], false).unwrap());
            assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
            let top = entry["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 3);
            assert!(top[0]["logprob"].as_f64() >= top[2]["logprob"].as_f64());
        }
        let text = choice["message"]["content"].as_str().unwrap();
        assert_eq!(text, rollout.tokenizer().decode(&tokens, true).unwrap());
        let reason = choice["finish_reason"].as_str().unwrap();
        assert!(reason == "stop" || (reason == "length" && tokens.len() == 6), "{reason}");
    }
    assert_eq!(response["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(response["usage"]["completion_tokens"], completion_tokens);
    assert_eq!(response["usage"]["total_tokens"], prompt.len() + completion_tokens);
    // A seed fixes the tokens.
    let (_, again) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(again["choices"][0]["token_ids"], response["choices"][0]["token_ids"]);
    assert_ne!(again["id"], response["id"]);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_take_text_token_ids_and_batches() {
    let rollout = tiny_rollout(4, 256);
    let (server, _) = start(rollout.clone(), options("tiny")).await;
    let addr = server.local_addr();
    let (status, text) = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 4, "seed": 1, "logprobs": 2, "return_token_ids": true}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(text["object"], "text_completion");
    let choice = &text["choices"][0];
    let prompt: Vec<u32> = serde_json::from_value(choice["prompt_token_ids"].clone()).unwrap();
    assert_eq!(prompt, rollout.tokenizer().encode("abc", true).unwrap());
    let tokens = choice["token_ids"].as_array().unwrap();
    assert_eq!(choice["logprobs"]["tokens"].as_array().unwrap().len(), tokens.len());
    assert_eq!(choice["logprobs"]["token_logprobs"].as_array().unwrap().len(), tokens.len());
    assert_eq!(choice["logprobs"]["top_logprobs"][0].as_object().unwrap().len(), 2);
    // The same prompt as token ids gives the same tokens.
    let (_, ids) =
        post(addr, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 4, "seed": 1, "return_token_ids": true}))
            .await;
    assert_eq!(ids["choices"][0]["token_ids"], choice["token_ids"]);
    assert_eq!(ids["choices"][0]["logprobs"], Value::Null);
    // A batch of two prompts with n = 2: four choices, prompt-major.
    let (status, batch) = post(
        addr,
        "/v1/completions",
        &json!({"prompt": ["ab", "cd"], "n": 2, "max_tokens": 3, "return_token_ids": true}),
    )
    .await;
    assert_eq!(status, 200, "{batch}");
    let choices = batch["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    assert_eq!(choices[1]["prompt_token_ids"], json!(rollout.tokenizer().encode("ab", true).unwrap()));
    assert_eq!(choices[2]["prompt_token_ids"], json!(rollout.tokenizer().encode("cd", true).unwrap()));
    let prompt_tokens =
        rollout.tokenizer().encode("ab", true).unwrap().len() + rollout.tokenizer().encode("cd", true).unwrap().len();
    assert_eq!(batch["usage"]["prompt_tokens"], prompt_tokens);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversations_next_turn_starts_from_the_prefix_cache() {
    // An agent's second turn resends the first turn's messages: the engine copies their keys and values from
    // its prefix cache instead of computing them again, and `/metrics` counts the copied tokens.
    let rollout = tiny_rollout(4, 256);
    let (server, _) = start(rollout.clone(), options("tiny")).await;
    let addr = server.local_addr();
    let mut messages = vec![
        json!({"role": "system", "content": "You answer in three letters."}),
        json!({"role": "user", "content": "abc dab cab"}),
    ];
    let (status, first) =
        post(addr, "/v1/chat/completions", &json!({"messages": messages, "max_tokens": 3, "ignore_eos": true})).await;
    assert_eq!(status, 200);
    let (_, text) = get(addr, "/metrics").await;
    assert_eq!(metric(&text, "trinity_engine_prefix_cache_tokens_total"), 0.0);
    let turn1_prompt = first["usage"]["prompt_tokens"].as_f64().unwrap();
    messages.push(json!({"role": "assistant", "content": first["choices"][0]["message"]["content"]}));
    messages.push(json!({"role": "user", "content": "bad"}));
    let (status, _) =
        post(addr, "/v1/chat/completions", &json!({"messages": messages, "max_tokens": 3, "ignore_eos": true})).await;
    assert_eq!(status, 200);
    let (_, text) = get(addr, "/metrics").await;
    let copied = metric(&text, "trinity_engine_prefix_cache_tokens_total");
    assert!(copied >= turn1_prompt, "{copied} tokens copied, the first turn's prompt had {turn1_prompt}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_metrics() {
    let rollout = tiny_rollout(2, 128);
    let (server, _) = start(rollout.clone(), options("tiny")).await;
    let addr = server.local_addr();
    let (status, models) = get(addr, "/v1/models").await;
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["max_model_len"], 128);
    let (status, health) = get(addr, "/health").await;
    assert_eq!((status, serde_json::from_str::<Value>(&health).unwrap()["status"].clone()), (200, json!("ok")));

    let (status, _) = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post(addr, "/v1/chat/completions", &json!({"messages": []})).await;
    assert_eq!(status, 400);
    let (status, text) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(text.contains("trinity_serve_requests_total{endpoint=\"chat.completions\",status=\"200\"} 1"), "{text}");
    assert!(text.contains("trinity_serve_requests_total{endpoint=\"chat.completions\",status=\"400\"} 1"), "{text}");
    assert_eq!(metric(&text, "trinity_serve_completion_tokens_total"), 3.0);
    assert!(metric(&text, "trinity_serve_prompt_tokens_total") > 0.0);
    assert_eq!(metric(&text, "trinity_serve_time_to_first_token_seconds_count"), 1.0);
    assert_eq!(metric(&text, "trinity_serve_request_duration_seconds_count"), 2.0);
    assert_eq!(metric(&text, "trinity_engine_generated_tokens_total"), 3.0);
    assert_eq!(metric(&text, "trinity_engine_kv_cache_slots"), 2.0);
    assert_eq!(metric(&text, "trinity_serve_pending_experiences"), 1.0);
    assert_eq!(metric(&text, "trinity_model_version"), 0.0);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "not a sample line: {line}");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_temperature_overrides_the_request_and_a_final_message_can_be_continued() {
    let rollout = tiny_rollout(2, 256);
    let forced = trinity_serve::ServeOptions { temperature: Some(0.5), ..options("tiny") };
    let (server, sink) = start(rollout.clone(), forced).await;
    let addr = server.local_addr();
    let body = json!({
        "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hell"}],
        "continue_final_message": true, "temperature": 1.0, "max_tokens": 3, "return_token_ids": true,
    });
    let (status, response) = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    // The prompt stops right after the assistant's partial reply: no end-of-turn, no new generation prompt.
    let prompt: Vec<u32> = serde_json::from_value(response["prompt_token_ids"].clone()).unwrap();
    let text = rollout.tokenizer().decode(&prompt, false).unwrap();
    assert!(text.ends_with("assistanthell"), "{text:?}");
    post(addr, "/feedback", &json!({"msg_ids": [response["id"]], "reward": 1.0})).await;
    post(addr, "/commit", &json!({})).await;
    assert_eq!(sink.all()[0][0].info["temperature"], 0.5, "sampled (and scored) at the forced temperature");
    let (status, _) = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true}),
    )
    .await;
    assert_eq!(status, 400, "there is no final assistant message to continue");
    server.shutdown().await.unwrap();
}
