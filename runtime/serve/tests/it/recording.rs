//! Every returned choice is recorded with exactly the returned tokens and logprobs; feedback rewards it,
//! commit hands the rewarded ones to the sink, grouped.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::*;

fn u32s(value: &Value) -> Vec<u32> {
    serde_json::from_value(value.clone()).unwrap()
}

/// Logprobs as returned (JSON numbers of f32 values) back in f32.
fn chat_logprobs(choice: &Value) -> Vec<f32> {
    choice["logprobs"]["content"].as_array().unwrap().iter().map(|e| e["logprob"].as_f64().unwrap() as f32).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_and_commit_hand_over_exactly_the_returned_tokens() {
    let rollout = tiny_rollout(4, 256);
    let (server, sink) = start(rollout.clone(), options("tiny")).await;
    let addr = server.local_addr();
    let chat = |n: usize| json!({"messages": [{"role": "user", "content": "hello"}], "n": n, "max_tokens": 8, "logprobs": true, "return_token_ids": true});
    let (_, r1) = post(addr, "/v1/chat/completions", &chat(2)).await;
    let (_, r2) = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 5, "logprobs": 0, "return_token_ids": true}),
    )
    .await;
    let (_, r3) = post(addr, "/v1/chat/completions", &chat(1)).await;
    let id1 = r1["id"].as_str().unwrap();
    let id2 = r2["id"].as_str().unwrap();

    let feedback = |body: Value| async move { post(addr, "/feedback", &body).await };
    let (s, b) = feedback(json!({"msg_ids": [format!("{id1}#0")], "reward": 1.0})).await;
    assert_eq!((s, b["updated"].clone()), (200, json!(1)), "{b}");
    let (s, _) = feedback(json!({"msg_ids": [format!("{id1}#1")], "reward": 0.0})).await;
    assert_eq!(s, 200);
    let (s, b) = feedback(json!({"msg_ids": ["chatcmpl-nope", id2, "cmpl-gone#0"], "reward": 9.0})).await;
    assert_eq!(s, 404, "{b}");
    let message = b["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`chatcmpl-nope`") && message.contains("`cmpl-gone#0`") && !message.contains(id2),
        "{message}"
    );
    let (s, b) = feedback(json!({"msg_ids": [id2], "reward": 0.5, "task_id": "t7", "run_id": 3})).await;
    assert_eq!(
        (s, b["updated"].clone(), b["rewarded"].clone(), b["pending"].clone()),
        (200, json!(1), json!(3), json!(4)),
        "{b}"
    );
    let (s, b) = feedback(json!({"msg_ids": [id2], "reward": "high"})).await;
    assert_eq!((s, b["error"]["param"].clone()), (400, json!("reward")));

    let (s, report) = post(addr, "/commit", &json!({})).await;
    assert_eq!(s, 200, "{report}");
    assert_eq!(
        (report["committed"].clone(), report["groups"].clone(), report["pending"].clone()),
        (json!(3), json!(2), json!(1))
    );
    assert_eq!((report["accepted"].clone(), report["step"].clone()), (json!(3), json!(1)), "the sink's report");

    let commits = sink.all();
    assert_eq!(commits.len(), 1);
    let experiences = &commits[0];
    assert_eq!(experiences.len(), 3);
    let prompt1 = u32s(&r1["prompt_token_ids"]);
    for (i, e) in experiences[..2].iter().enumerate() {
        let choice = &r1["choices"][i];
        let tokens = u32s(&choice["token_ids"]);
        assert_eq!(e.tokens[..e.prompt_length], prompt1[..]);
        assert_eq!(e.tokens[e.prompt_length..], tokens[..], "choice {i}: the returned token ids");
        assert_eq!(e.logprobs, chat_logprobs(choice), "choice {i}: the returned logprobs");
        assert_eq!(e.action_mask, vec![true; tokens.len()]);
        assert_eq!(e.reward, if i == 0 { 1.0 } else { 0.0 });
        assert_eq!((e.eid.task, e.eid.run, e.eid.step), (0, i as u64, 0));
        assert_eq!(e.group_id, id1, "the n choices of a response form a group");
        assert_eq!(e.info["response_id"], id1);
        assert_eq!(e.info["choice"], i);
        assert_eq!(e.model_version, 0);
        assert_eq!(e.response_text.as_deref(), choice["message"]["content"].as_str());
        e.validate().unwrap();
    }
    let e = &experiences[2];
    let choice = &r2["choices"][0];
    assert_eq!(e.tokens[..e.prompt_length], u32s(&choice["prompt_token_ids"])[..]);
    assert_eq!(e.tokens[e.prompt_length..], u32s(&choice["token_ids"])[..]);
    let logprobs: Vec<f32> =
        choice["logprobs"]["token_logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    assert_eq!(e.logprobs, logprobs);
    assert_eq!((e.reward, e.group_id.as_str(), e.eid.task), (0.5, "t7", 1));
    assert_eq!((e.info["task_id"].clone(), e.info["run_id"].clone()), (json!("t7"), json!("3")));

    // Committed responses are gone; the unrewarded one stays until rewarded.
    let (s, _) = feedback(json!({"msg_ids": [id1], "reward": 1.0})).await;
    assert_eq!(s, 404);
    let (_, report) = post(addr, "/commit", &json!({})).await;
    assert_eq!((report["committed"].clone(), report["pending"].clone()), (json!(0), json!(1)));
    assert_eq!(sink.all().len(), 1, "an empty commit does not reach the sink");
    let (s, _) = feedback(json!({"msg_ids": [r3["id"]], "reward": -1.0})).await;
    assert_eq!(s, 200);
    let (_, report) = post(addr, "/commit", &json!({})).await;
    assert_eq!(report["committed"], 1);
    let last = &sink.all()[1][0];
    assert_eq!((last.eid.batch, last.reward), (1, -1.0), "the second commit is batch 1");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_commit_keeps_the_experiences() {
    let rollout = tiny_rollout(2, 128);
    let (server, sink) = start(rollout, options("tiny")).await;
    let addr = server.local_addr();
    let (_, r) =
        post(addr, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}))
            .await;
    let (s, _) = post(addr, "/feedback", &json!({"msg_ids": [r["id"]], "reward": 1.0})).await;
    assert_eq!(s, 200);
    sink.refuse.store(true, Ordering::SeqCst);
    let (s, b) = post(addr, "/commit", &json!({})).await;
    assert_eq!(s, 500, "{b}");
    assert!(b["error"]["message"].as_str().unwrap().contains("the buffer is closed"), "{b}");
    sink.refuse.store(false, Ordering::SeqCst);
    let (s, b) = post(addr, "/commit", &json!({})).await;
    assert_eq!((s, b["committed"].clone()), (200, json!(1)), "{b}");
    assert_eq!(sink.all()[0][0].reward, 1.0, "the reward survived the refused commit");
    let (s, b) = post(addr, "/commit", &json!({"force": true})).await;
    assert_eq!((s, b["error"]["param"].clone()), (400, json!("force")));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_synced_mid_request_keep_it_going_and_are_stamped() {
    let rollout = tiny_rollout(2, 1024);
    let (server, sink) = start(rollout.clone(), options("tiny")).await;
    let addr = server.local_addr();
    let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 400, "ignore_eos": true, "return_token_ids": true});
    let request = tokio::spawn(async move { post(addr, "/v1/chat/completions", &body).await });
    let engine = rollout.engine().clone();
    while engine.stats().generated_tokens < 20 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // New weights (the fixture's, halved) arrive between decode steps while the request runs.
    let trained = trinity_model::load_model(&tiny_model_dir(), tch::Kind::Float, tch::Device::Cpu).unwrap();
    let weights: Vec<(String, tch::Tensor)> =
        trained.decoder.named_parameters().unwrap().into_iter().map(|(name, t)| (name, t * 0.5)).collect();
    engine.sync_weights(weights).await.unwrap();
    rollout.set_model_version(1);
    let (status, response) = request.await.unwrap();
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["choices"][0]["token_ids"].as_array().unwrap().len(), 400, "the request ran to its end");
    let (_, after) =
        post(addr, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}))
            .await;
    let ids = json!([response["id"], after["id"]]);
    post(addr, "/feedback", &json!({"msg_ids": ids, "reward": 1.0})).await;
    post(addr, "/commit", &json!({})).await;
    let experiences = &sink.all()[0];
    assert_eq!(experiences[0].model_version, 0, "sampled starting with version 0");
    assert_eq!(experiences[0].info["model_version_end"], 1, "and finished with version 1");
    assert_eq!(experiences[1].model_version, 1);
    assert!(!experiences[1].info.contains_key("model_version_end"));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_counts_each_experience_once_however_often_it_is_named() {
    let (server, _) = start(tiny_rollout(4, 64), options("tiny")).await;
    let addr = server.local_addr();
    let chat = json!({"messages": [{"role": "user", "content": "hello"}], "n": 2, "max_tokens": 3});
    let (_, reply) = post(addr, "/v1/chat/completions", &chat).await;
    let id = reply["id"].as_str().unwrap();
    let ids = json!([id, id, format!("{id}#0"), format!("{id}#1"), format!("{id}#1")]);
    let (s, b) = post(addr, "/feedback", &json!({"msg_ids": ids, "reward": 1.0})).await;
    assert_eq!((s, b["updated"].clone(), b["rewarded"].clone()), (200, json!(2), json!(2)), "{b}");
    let (s, b) =
        post(addr, "/feedback", &json!({"msg_ids": [format!("{id}#0"), format!("{id}#0")], "reward": 0.0})).await;
    assert_eq!((s, b["updated"].clone()), (200, json!(1)), "{b}");
    server.shutdown().await.unwrap();
}

/// Shutdown (what SIGTERM does in mode serve) commits what was rewarded and not yet committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_commits_every_rewarded_experience() {
    let (server, sink) = start(tiny_rollout(4, 64), options("tiny")).await;
    let addr = server.local_addr();
    let chat = json!({"messages": [{"role": "user", "content": "hello"}], "n": 2, "max_tokens": 3});
    let (_, rewarded) = post(addr, "/v1/chat/completions", &chat).await;
    let (_, unrewarded) = post(addr, "/v1/chat/completions", &chat).await;
    let id = rewarded["id"].as_str().unwrap();
    let (s, b) = post(addr, "/feedback", &json!({"msg_ids": [id], "reward": 1.0, "task_id": "t"})).await;
    assert_eq!(s, 200, "{b}");
    server.shutdown().await.unwrap();
    let commits = sink.all();
    assert_eq!(commits.len(), 1, "{commits:?}");
    assert_eq!(commits[0].len(), 2);
    assert!(commits[0].iter().all(|e| e.reward == 1.0 && e.info["response_id"] == id));
    assert!(!commits[0].iter().any(|e| e.info["response_id"] == unrewarded["id"]));
}
