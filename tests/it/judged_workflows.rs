//! Trinity-RFT 0.6.0's model-judged workflows through `trinity run`, with judges whose replies are known, so the
//! rewards must come out as 0.6.0 computes them from those replies:
//!
//! - a judge model that answers every chat with `[0.5, 1]` (a zero-layer model whose logits follow a chain of
//!   byte tokens), as the auxiliary model of `math_ruler_workflow` / `async_math_ruler_workflow` and as the policy
//!   of `math_trainable_ruler_workflow`, which judges itself;
//! - a loopback OpenAI-compatible endpoint that rates every answer 7 for `rubric_judge_openai_workflow`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tch::{Device, Kind, Tensor};
use trinity_model::WeightSource;

use crate::support::{grpo_run_config, stderr, tiny_model_dir, trinity};
use crate::tool_model::{HIDDEN, IM_END, write_model};

/// What the judge model says.
const VERDICT: &[u8] = b"[0.5, 1]";

/// Each link of the chain `\n → [ → 0 → . → 5 → , → ␣ → 1 → ] → <|im_end|>` in a hidden dimension of its own:
/// the embedding of a link's token is that dimension, the head row of its successor has 10 there (logit 40 after
/// the final norm), every other logit is 0.
struct Chain;

impl WeightSource for Chain {
    fn load(&mut self, name: &str, shape: &[i64]) -> trinity_model::Result<Tensor> {
        let mut tokens: Vec<i64> = vec![i64::from(b'\n')];
        tokens.extend(VERDICT.iter().map(|&b| i64::from(b)));
        tokens.push(IM_END);
        assert!(tokens.len() as i64 - 1 <= HIDDEN);
        let zeros = || Tensor::zeros(shape, (Kind::Float, Device::Cpu));
        Ok(if name.ends_with("norm.weight") {
            Tensor::ones(shape, (Kind::Float, Device::Cpu))
        } else if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
            let t = zeros();
            for (j, link) in tokens.windows(2).enumerate() {
                if name == "model.embed_tokens.weight" {
                    let _ = t.get(link[0]).get(j as i64).fill_(1.0);
                } else {
                    let _ = t.get(link[1]).get(j as i64).fill_(10.0);
                }
            }
            t
        } else {
            zeros()
        })
    }
}

fn write_judge_model(dir: &Path) {
    write_model(dir, &mut Chain);
}

fn experiences(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("ckpt/p/n/experiences.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn metric(e: &serde_json::Value, name: &str) -> f64 {
    e["metrics"][name].as_f64().unwrap_or_else(|| panic!("no metric {name}: {e}"))
}

/// A two-step GRPO run of `workflow` on `policy`, `rest` appended (top-level sections).
fn run_dir(policy: &Path, workflow: &str, rest: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..4).map(|i| format!("{{\"prompt\": \"1+{i}\", \"response\": \"{}\"}}\n", i + 1)).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let config = format!(
        "{}      default_workflow_type: {workflow}\n  total_steps: 2\n{rest}",
        grpo_run_config(policy, 4096).replace("max_response_tokens: 6", "max_response_tokens: 12")
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    dir
}

fn ruler_rewards_are_the_judges_scores(workflow: &str) {
    let judge = tempfile::tempdir().unwrap();
    write_judge_model(judge.path());
    let aux = format!(
        "explorer:\n  rollout_model:\n    dtype: float32\n  auxiliary_models:\n    - model_path: {}\n      name: judge\n      \
         dtype: float32\n      max_model_len: 4096\n      max_response_tokens: 16\n",
        judge.path().display()
    );
    let dir = run_dir(&tiny_model_dir(), workflow, &aux);
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let experiences = experiences(dir.path());
    assert_eq!(experiences.len(), 8, "2 steps × 2 tasks × 2 rollouts");
    for e in &experiences {
        let run = e["eid"]["run"].as_u64().unwrap();
        let want = [0.5, 1.0][run as usize];
        assert_eq!(e["reward"].as_f64(), Some(want), "candidate {run} gets the judge's score {want}: {e}");
        assert_eq!(metric(e, "judge_success"), 1.0);
        assert!(e["metrics"]["gold_reward"].is_number(), "the task's reward is kept as the gold reward: {e}");
    }
}

#[test]
fn math_ruler_rewards_are_the_auxiliary_judges_scores() {
    ruler_rewards_are_the_judges_scores("math_ruler_workflow");
}

#[test]
fn async_math_ruler_rewards_are_the_auxiliary_judges_scores() {
    ruler_rewards_are_the_judges_scores("async_math_ruler_workflow");
}

#[test]
fn the_trainable_ruler_judges_itself_and_trains_its_judgements_when_the_truth_is_known() {
    let policy = tempfile::tempdir().unwrap();
    write_judge_model(policy.path());
    let dir =
        run_dir(policy.path(), "math_trainable_ruler_workflow", "explorer:\n  rollout_model:\n    dtype: float32\n");
    // Four tasks a step, so that both kinds of task occur (the draw is seeded by the task).
    let config =
        std::fs::read_to_string(dir.path().join("config.yaml")).unwrap().replace("batch_size: 2", "batch_size: 4");
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let experiences = experiences(dir.path());
    let (mut judged_only, mut trained_judge) = (0, 0);
    for step in 1..=2u64 {
        for task in 0..4u64 {
            let of = |task: u64| -> Vec<&serde_json::Value> {
                experiences.iter().filter(|e| e["eid"]["batch"] == step && e["eid"]["task"] == task).collect()
            };
            let answers = of(task);
            assert_eq!(answers.len(), 2, "step {step} task {task}");
            let judgements = of(task + (1 << 32));
            if judgements.is_empty() {
                // The truth is hidden: the answers are rewarded with the one judgement's scores.
                judged_only += 1;
                for a in &answers {
                    let want = [0.5, 1.0][a["eid"]["run"].as_u64().unwrap() as usize];
                    assert_eq!(a["reward"].as_f64(), Some(want), "{a}");
                }
                continue;
            }
            // The truth is known: the answers keep their gold rewards and each judgement is rewarded by how close
            // its scores are to the scaled gold rewards.
            trained_judge += 1;
            assert_eq!(judgements.len(), 2, "repeat_times judgements: {judgements:?}");
            let mut answers = answers;
            answers.sort_by_key(|a| a["eid"]["run"].as_u64());
            let scaled: Vec<f64> = answers
                .iter()
                .map(|a| {
                    assert_eq!(a["reward"].as_f64(), Some(metric(a, "gold_reward")), "{a}");
                    (metric(a, "gold_reward") + 0.1) / 1.2
                })
                .collect();
            let want = 1.0 - ((0.5 - scaled[0]).abs() + (1.0 - scaled[1]).abs()) / 2.0;
            for j in &judgements {
                assert!((j["reward"].as_f64().unwrap() - want).abs() < 1e-12, "{j} vs {want}");
                assert_eq!(metric(j, "reward_for_judge"), j["reward"].as_f64().unwrap());
                assert_eq!(metric(j, "judge_success"), 1.0);
                assert!(j["response_text"].as_str().unwrap().contains("[0.5, 1]"), "{j}");
                assert!(!j["tokens"].as_array().unwrap().is_empty(), "the judgement's tokens are trained: {j}");
            }
        }
    }
    assert!(judged_only > 0 && trained_judge > 0, "both kinds of task: {judged_only} hidden, {trained_judge} known");
    let metrics = std::fs::read_to_string(dir.path().join("ckpt/p/n/monitor/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "two train steps: {metrics}");
}

/// Trinity-RFT's trainable RULER example trains 960 experiences a step of the 768 rollouts an explore step makes
/// plus the judgements of a fifth of its groups: with a `train_batch_size` that is not one explore step's output,
/// each train step reads exactly that many in arrival order and carries the rest over, as Trinity's trainer reads
/// its queue.
#[test]
fn a_train_batch_size_above_one_explore_step_reads_fixed_size_batches_in_arrival_order() {
    let policy = tempfile::tempdir().unwrap();
    write_judge_model(policy.path());
    let dir =
        run_dir(policy.path(), "math_trainable_ruler_workflow", "explorer:\n  rollout_model:\n    dtype: float32\n");
    // Four tasks × two rollouts a step, and the judgements of the tasks whose truth is known; ten a train step.
    let config = std::fs::read_to_string(dir.path().join("config.yaml"))
        .unwrap()
        .replace("batch_size: 2", "batch_size: 4\n  train_batch_size: 10")
        .replace("total_steps: 2", "total_steps: 3");
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    let log = stderr(&output);
    assert!(output.status.success(), "{log}");
    assert!(log.contains("each train step reads 10 in arrival order"), "{log}");
    let experiences = experiences(dir.path());
    let made: Vec<usize> =
        (1..=3u64).map(|step| experiences.iter().filter(|e| e["eid"]["batch"] == step).count()).collect();
    assert!(made.iter().all(|&n| n >= 8) && made.iter().any(|&n| n > 8), "some judgements are trained: {made:?}");
    // What a trainer reading batches of ten as soon as they are there carries over after each train step.
    let (mut waiting, mut carried) = (0, Vec::new());
    for n in &made {
        waiting += n;
        while waiting >= 10 {
            waiting -= 10;
            carried.push(waiting as f64);
        }
    }
    let metrics = std::fs::read_to_string(dir.path().join("ckpt/p/n/monitor/metrics.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let train: Vec<&serde_json::Value> = rows.iter().filter(|r| r.get("train/loss").is_some()).collect();
    let got: Vec<f64> = train.iter().map(|r| r["buffer/carried_over"].as_f64().unwrap()).collect();
    assert_eq!(got, carried, "train steps and what each leaves for the next: {metrics}");
    for (i, r) in train.iter().enumerate() {
        assert_eq!(r["step"].as_u64(), Some(i as u64 + 1), "{r}");
    }
    let explored: Vec<f64> = rows.iter().filter_map(|r| r.get("rollout/experience_count")?.as_f64()).collect();
    assert_eq!(explored, made.iter().map(|&n| n as f64).collect::<Vec<_>>(), "one record per explore step");
    assert!(log.contains(&format!("{waiting} experiences are left in the buffer")) || waiting == 0, "{log}");
    let last = train.len();
    assert!(dir.path().join(format!("ckpt/p/n/global_step_{last}")).is_dir(), "the last train step is saved");
}

/// The requests an endpoint received: each one's head and JSON body.
type Requests = Arc<Mutex<Vec<(String, serde_json::Value)>>>;

/// A loopback OpenAI-compatible endpoint answering every chat completion with `reply`; it keeps each request's
/// head and body.
fn judge_endpoint(reply: &str) -> (String, Requests) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let body = serde_json::json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
    })
    .to_string();
    let record = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let (record, body) = (Arc::clone(&record), body.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                loop {
                    let mut head = String::new();
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        head.push_str(&line);
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    let mut request = vec![0; length];
                    reader.read_exact(&mut request).unwrap();
                    record.lock().unwrap().push((head, serde_json::from_slice(&request).unwrap()));
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    writer.write_all(response.as_bytes()).unwrap();
                }
            });
        }
    });
    (format!("http://{address}/v1"), seen)
}

fn rubric_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rubric = r#"[{"description": "is correct", "weight": 2}]"#;
    let rows: String = (0..2).map(|i| format!("{{\"prompt\": \"1+{i}\", \"rubric\": {rubric}}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let config = format!(
        "{}      default_workflow_type: rubric_judge_openai_workflow\n      workflow_args:\n        \
         judge_model_name: rater\n        judge_api_key_env: JUDGE_KEY\n  total_steps: 1\n",
        grpo_run_config(&tiny_model_dir(), 256)
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    dir
}

#[test]
fn the_openai_rubric_judge_rewards_its_rating_times_a_tenth() {
    let (base_url, seen) = judge_endpoint("```json\n{\"rating\": 7}\n```");
    let dir = rubric_dir();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir.path())
        .args(["run", "--config", "config.yaml"])
        .env_remove("RUST_LOG")
        .env("OPENAI_BASE_URL", &base_url)
        .env("JUDGE_KEY", "sk-judge")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let experiences = experiences(dir.path());
    assert_eq!(experiences.len(), 4, "2 tasks × 2 rollouts");
    for e in &experiences {
        // 0.6.0 computes `rating * 0.1`, which is 0.7000000000000001 in Python as here.
        assert_eq!(e["reward"].as_f64(), Some(7.0 * 0.1), "rating 7 → 0.7: {e}");
        assert_eq!(metric(e, "judge_success"), 1.0);
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4, "one request per answer");
    for (head, body) in seen.iter() {
        assert!(head.starts_with("POST /v1/chat/completions"), "{head}");
        assert!(head.to_ascii_lowercase().contains("authorization: bearer sk-judge"), "{head}");
        assert_eq!((body["model"].as_str(), body["temperature"].as_f64()), (Some("rater"), Some(0.0)), "{body}");
        let user = body["messages"][1]["content"].as_str().unwrap();
        assert!(user.contains("Rubric 0 (weight: 2): is correct"), "{user}");
    }
}

#[test]
fn the_openai_rubric_judge_without_its_base_url_is_refused_before_the_run() {
    let dir = rubric_dir();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir.path())
        .args(["run", "--config", "config.yaml", "--dry-run"])
        .env_remove("OPENAI_BASE_URL")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("workflow_args") && err.contains("`OPENAI_BASE_URL`"), "{err}");
}

#[test]
fn math_rm_rewards_with_the_tasksets_reward_and_has_no_default() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tasks.jsonl"), "{\"prompt\": \"1+1\", \"response\": \"2\"}\n".repeat(2)).unwrap();
    let base = format!("{}      default_workflow_type: math_rm_workflow\n", grpo_run_config(&tiny_model_dir(), 64));
    std::fs::write(dir.path().join("config.yaml"), &base).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("default_reward_fn_type") && err.contains("math_rm_workflow"), "{err}");

    let config = format!("{base}      default_reward_fn_type: format_reward\n  total_steps: 1\n");
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    for e in experiences(dir.path()) {
        // The tiny model's text never has the think/answer layout: format_reward's penalty is the whole reward.
        assert_eq!(e["reward"].as_f64(), Some(-0.1), "{e}");
        assert!(!e["prompt_text"].as_str().unwrap().contains("A conversation between"), "no default system prompt");
    }
}
