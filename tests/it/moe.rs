//! A mixture-of-experts model through `trinity run`: routing replay (`algorithm.enable_router_replay`) on a tiny
//! random Qwen3-MoE, the one the model crate's fixtures hold (3 layers, the middle one dense, 4 experts, top 2),
//! with the tiny Llama's tokenizer (the same 48 ids).

use std::path::Path;

use serde_json::Value;

use crate::support::{grpo_run_config, stderr, tiny_model_dir, trinity, workspace_root};

/// The Qwen3-MoE fixture's weights and config beside the tiny Llama's tokenizer and chat template, in `dir`.
fn tiny_moe_model(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let moe = workspace_root().join("runtime/model/tests/fixtures/tiny/qwen3_moe");
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(moe.join(file), dir.join(file)).unwrap();
    }
    for file in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"] {
        std::fs::copy(tiny_model_dir().join(file), dir.join(file)).unwrap();
    }
}

/// A GRPO config over `model` (2 tasks × 2 rollouts a step, `steps` steps) with router replay, and its tasks.
fn replay_run_dir(model: &Path, steps: usize, extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..2 * steps).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let config =
        grpo_run_config(model, 40).replace("  repeat_times: 2\n", "  repeat_times: 2\n  enable_router_replay: true\n");
    let config = format!("{config}      default_workflow_type: simple_workflow\n{extra}");
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    dir
}

#[test]
fn router_replay_is_refused_for_a_dense_model_at_dry_run() {
    let dir = replay_run_dir(&tiny_model_dir(), 1, "");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(!output.status.success(), "a dense model has no routing to replay");
    let err = stderr(&output);
    assert!(err.contains("algorithm.enable_router_replay") && err.contains("no mixture-of-experts layer"), "{err}");

    let model = dir.path().join("moe");
    tiny_moe_model(&model);
    let moe = replay_run_dir(&model, 1, "");
    let output = trinity(moe.path(), &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn a_grpo_run_with_router_replay_trains_three_steps_on_a_tiny_qwen3_moe() {
    let models = tempfile::tempdir().unwrap();
    tiny_moe_model(models.path());
    let dir = replay_run_dir(models.path(), 3, "trainer:\n  save_interval: 3\n");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let metrics = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 3, "three steps:\n{metrics}");
    for line in metrics.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        assert!(row["train/pg_loss"].as_f64().is_some_and(f64::is_finite), "{line}");
    }
    assert!(job.join("global_step_3/hf/model.safetensors").exists());
    // Every experience carries the routing its rollout used: one [2 sparse layers, top 2] row for each token the
    // engine read, stored a byte an id.
    let experiences: Vec<Value> = std::fs::read_to_string(job.join("experiences.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(experiences.len(), 12, "3 steps × 2 tasks × 2 runs");
    for e in &experiences {
        let routed = &e["routed_experts"];
        assert_eq!((routed["layers"].as_u64(), routed["top_k"].as_u64()), (Some(2), Some(2)), "{e}");
        assert_eq!(routed["dtype"], "uint8");
        let tokens = e["tokens"].as_array().unwrap().len();
        let data = routed["data"].as_str().unwrap();
        let bytes = data.len() / 4 * 3 - data.matches('=').count();
        assert_eq!(bytes, (tokens - 1) * 4, "{e}");
    }
}

#[test]
fn a_truncated_prompt_gets_placeholder_routing_that_replays() {
    // Task 1's prompt (96 tokens rendered) exceeds max_prompt_tokens: its rollouts are masked placeholders, which
    // the replayed batch runs with the experts in turn.
    let models = tempfile::tempdir().unwrap();
    tiny_moe_model(models.path());
    let dir = replay_run_dir(models.path(), 1, "");
    let long = "ab".repeat(40);
    std::fs::write(
        dir.path().join("tasks.jsonl"),
        format!("{{\"prompt\": \"ab0\", \"response\": \"0\"}}\n{{\"prompt\": \"{long}\", \"response\": \"1\"}}\n"),
    )
    .unwrap();
    let config = std::fs::read_to_string(dir.path().join("config.yaml")).unwrap().replace(
        "  max_response_tokens: 6\n",
        "  max_response_tokens: 6\n  max_prompt_tokens: 30\n  enable_prompt_truncation: true\n",
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let experiences: Vec<Value> = std::fs::read_to_string(dir.path().join("ckpt/p/n/experiences.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let placeholders: Vec<&Value> = experiences.iter().filter(|e| e["truncate_status"] == "prompt_truncated").collect();
    assert_eq!((experiences.len(), placeholders.len()), (4, 2));
    for e in placeholders {
        let tokens = e["tokens"].as_array().unwrap().len();
        // (tokens - 1) rows of 2 layers × 2: ids 0, 1, 2, 3, 0, 1, ... (base64 of bytes 00 01 02 03 ...).
        assert_eq!(e["routed_experts"]["data"].as_str().unwrap().get(..8), Some("AAECAwAB"), "{e}");
        assert_eq!(tokens, 30, "the prompt's first 29 tokens and one masked token");
    }
}
