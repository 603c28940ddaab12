//! `explorer.rollout_model.enable_openai_api` + `enable_history` in a run: `agent_process_workflow` starts an agent
//! program (Python with the official `openai` package) per rollout against its own base URL of the rollout model;
//! the replies it received become the rollout's experiences, token for token, and the run trains on them. The
//! auxiliary model answers on the same URL under its name and is never recorded.

use serde_json::Value;

use crate::support::{grpo_run_config, openai_python, stderr, tiny_model_dir, trinity, workspace_root};

fn agent_dir(rollout_model: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..2).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let script = workspace_root().join("tests/fixtures/agents/two_turn_agent.py");
    let config = format!(
        "{}      default_workflow_type: agent_process_workflow
      workflow_args:
        command: [\"{}\", \"{}\"]
  total_steps: 1
explorer:
  env_vars:
    AGENT_MARK: 7
    OPENAI_BASE_URL: http://nowhere.invalid
  rollout_model:
    dtype: float32
{rollout_model}  auxiliary_models:
    - model_path: {}
      name: judge
      dtype: float32
",
        grpo_run_config(&tiny_model_dir(), 128),
        openai_python().display(),
        script.display(),
        tiny_model_dir().display(),
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    dir
}

fn floats(value: &Value) -> Vec<f64> {
    value.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
}

#[test]
fn an_agent_program_trains_on_exactly_the_replies_it_received() {
    let dir = agent_dir("    enable_openai_api: true\n    enable_history: true\n");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let experiences: Vec<Value> = std::fs::read_to_string(job.join("experiences.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(experiences.len(), 8, "2 tasks × 2 rollouts × 2 rollout-model turns (the judge is not recorded)");
    for e in &experiences {
        let step = e["eid"]["step"].as_u64().unwrap() as usize;
        let call = &e["info"]["calls"][step];
        assert_eq!(e["tokens"], call["tokens"], "the experience holds the tokens the agent received");
        let (recorded, received) = (floats(&e["logprobs"]), floats(&call["logprobs"]));
        assert_eq!(recorded.len(), received.len());
        assert!(recorded.iter().zip(&received).all(|(a, b)| (a - b).abs() < 1e-5), "{recorded:?} vs {received:?}");
        assert_eq!(e["eid"]["run"], e["info"]["rollout"]);
        assert_eq!(e["info"]["env"], "7", "explorer.env_vars reach the program (a number as YAML writes it)");
        let tokens = call["tokens"].as_array().unwrap().len();
        let final_tokens = e["info"]["calls"][1]["tokens"].as_array().unwrap().len();
        assert_eq!(e["reward"].as_f64().unwrap(), (final_tokens % 3) as f64 / 2.0, "{tokens}");
    }
    let metrics = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 1, "one train step ran: {metrics}");
}

#[test]
fn an_agent_workflow_without_the_recorded_api_is_refused_before_the_run() {
    let dir = agent_dir("    enable_openai_api: true\n");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("agent_process_workflow") && err.contains("enable_history: true"), "{err}");

    let dir = agent_dir("    enable_history: true\n");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("explorer.rollout_model.enable_history") && err.contains("enable_openai_api: true"), "{err}");
}
