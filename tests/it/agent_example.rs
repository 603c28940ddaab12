//! `examples/agent/`: its agent program, with the official `openai` package, starts `trinity run` on the example's
//! config in mode serve and in mode train, plays its multi-turn game for two steps on a tiny model that answers
//! with random numbers, rewards and commits every reply, and waits for the weights trained on each commit. The
//! test checks what reached the buffer and the trainer, not only what the agent says.

use std::collections::HashMap;
use std::process::Command;

use serde_json::Value;

use crate::digit_model::write_digit_model;
use crate::support::{openai_python, workspace_root};

/// The `key=value` fields of the agent's line for step `step`.
fn step_line(stdout: &str, step: u64) -> HashMap<String, String> {
    let prefix = format!("step {step}/2 ");
    let line = stdout.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no step {step}:\n{stdout}"));
    line[prefix.len()..]
        .split_whitespace()
        .filter_map(|field| field.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[test]
fn the_agent_example_plays_rewards_commits_and_plays_on_the_weights_trained_on_it() {
    let python = openai_python();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("digits");
    write_digit_model(&model);
    let run_dir = dir.path().join("run");
    let output = Command::new(python)
        .current_dir(dir.path())
        .arg(workspace_root().join("examples/agent/agent.py"))
        .args(["--trinity", env!("CARGO_BIN_EXE_trinity"), "--run-dir", run_dir.to_str().unwrap()])
        .args(["--steps", "2", "--games", "1", "--plays", "2", "--weights-timeout", "60"])
        .args(["--set", &format!("model.model_path={}", model.display())])
        // The tiny model's tokens are bytes: a third turn's prompt is some 450 of them.
        .args(["--set", "model.max_model_len=1024"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the agent failed:\n{stdout}\n{stderr}");

    // 1 game × 2 plays × 3 turns a step; step 2 is played on the weights train step 1 made of step 1's commit.
    let job = run_dir.join("agent/running-total");
    let experiences: Vec<Value> = std::fs::read_to_string(job.join("explorer_experiences.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(experiences.len(), 12, "{stdout}");
    for (step, batch) in [1u64, 2].into_iter().zip(experiences.chunks(6)) {
        let line = step_line(&stdout, step);
        assert_eq!(line["model_version"], (step - 1).to_string(), "{stdout}");
        assert_eq!(line["trained_version"], step.to_string(), "{stdout}");
        assert_eq!(line["committed"], "6", "{stdout}");
        let rewards: Vec<f64> = batch.iter().map(|e| e["reward"].as_f64().unwrap()).collect();
        assert!(rewards.iter().all(|&r| r == 0.0 || r == 1.0), "{rewards:?}");
        let mean = rewards.iter().sum::<f64>() / 6.0;
        assert_eq!(line["mean_reward"], format!("{mean:.3}"), "the agent's rewards are the stored ones");
        for e in batch {
            assert_eq!(e["model_version"], step - 1, "played on the weights of train step {}", step - 1);
            let task = e["info"]["task_id"].as_str().unwrap();
            assert!(task.starts_with(&format!("step{step}-game0-turn")), "{task}");
        }
    }
    // Multi-turn: each later turn's prompt holds the same play's earlier reply and the environment's verdict.
    for e in &experiences {
        let task = e["info"]["task_id"].as_str().unwrap();
        let (game, turn) = task.rsplit_once("turn").unwrap();
        let turn: u32 = turn.parse().unwrap();
        if turn == 0 {
            continue;
        }
        let previous_task = format!("{game}turn{}", turn - 1);
        let previous = experiences
            .iter()
            .find(|p| p["info"]["task_id"] == previous_task.as_str() && p["info"]["run_id"] == e["info"]["run_id"])
            .unwrap_or_else(|| panic!("no {previous_task} of run {}", e["info"]["run_id"]));
        let prompt = e["prompt_text"].as_str().unwrap();
        let reply = previous["response_text"].as_str().unwrap();
        assert!(prompt.contains(&format!("assistant\n{reply}<|im_end|>")), "{prompt:?} lacks {reply:?}");
        assert!(prompt.contains("Correct. Now add") || prompt.contains("Wrong, it is"), "{prompt:?}");
    }
    // The trainer trained each commit as one step, on exactly those experiences.
    let db = rusqlite::Connection::open(job.join("buffer/moves.db")).unwrap();
    for step in [1, 2] {
        let count: i64 = db
            .query_row("SELECT COUNT(*) FROM experiences WHERE consumed = 1 AND train_step = ?1", [step], |r| r.get(0))
            .unwrap();
        assert_eq!(count, 6, "train step {step}");
    }
    let metrics = std::fs::read_to_string(job.join("monitor/trainer/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "{metrics}");
}
