//! The explorer on a tiny real model (a two-layer Llama with its own tokenizer and ChatML template).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use trinity_buffer::{Task, Taskset};
use trinity_config::buffer::{RolloutArgs, TasksetConfig};
use trinity_engine::EngineConfig;
use trinity_explorer::{
    ExplorerError, ExternalModel, RolloutModel, RunnerOptions, Workflow, WorkflowContext, WorkflowEntry,
    WorkflowFuture, run_tasks,
};

/// A workflow that never finishes, registered in this test binary like any built-in: the timeout test must not
/// depend on how fast the real engine answers.
struct Stalling;

impl Workflow for Stalling {
    fn run<'a>(&'a self, _task: &'a Task, _ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(Vec::new())
        })
    }
}

fn stalling() -> Box<dyn Workflow> {
    Box::new(Stalling)
}

inventory::submit! {
    WorkflowEntry { name: "stalling_workflow", description: "test: never finishes", build: stalling }
}

/// A workflow with a bug: it panics.
struct Panicking;

impl Workflow for Panicking {
    fn run<'a>(&'a self, _task: &'a Task, _ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async { panic!("a bug in the workflow") })
    }
}

fn panicking() -> Box<dyn Workflow> {
    Box::new(Panicking)
}

inventory::submit! {
    WorkflowEntry { name: "panicking_workflow", description: "test: panics", build: panicking }
}

fn tiny_model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tiny/llama_tied")
}

fn rollout_model() -> Arc<RolloutModel> {
    let loaded = trinity_model::load_model(&tiny_model_dir(), tch::Kind::Float, tch::Device::Cpu).unwrap();
    let config = EngineConfig { max_model_len: 64, max_num_seqs: 8, ..EngineConfig::default() };
    Arc::new(RolloutModel::start(loaded, config).unwrap())
}

fn tasks(rows: Vec<serde_json::Value>, workflow: &str) -> Vec<Task> {
    let config = TasksetConfig {
        name: "toy".into(),
        default_workflow_type: Some(workflow.into()),
        repeat_times: Some(3),
        rollout_args: RolloutArgs {
            temperature: Some(1.0),
            max_tokens: Some(6),
            seed: Some(7),
            ..RolloutArgs::default()
        },
        ..TasksetConfig::default()
    };
    let rows = rows.into_iter().map(|r| r.as_object().cloned().unwrap()).collect();
    let taskset = Taskset::from_rows(&config, rows, 0, false, Path::new("toy.jsonl")).unwrap();
    taskset.all_tasks().unwrap()
}

fn options(default_workflow: &str) -> RunnerOptions {
    RunnerOptions {
        concurrency: 4,
        timeout: Duration::from_secs(60),
        max_retries: 1,
        default_workflow: default_workflow.into(),
    }
}

#[tokio::test]
async fn a_batch_yields_scored_groups_in_task_order() {
    let model = rollout_model();
    let rows = vec![json!({"prompt": "ab", "response": "1"}), json!({"prompt": "ba", "response": "2"})];
    let report = run_tasks(Arc::clone(&model), tasks(rows, "simple_workflow"), &options("simple_workflow")).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.groups.len(), 2);
    for (t, group) in report.groups.iter().enumerate() {
        assert_eq!(group.len(), 3, "repeat_times rollouts per task");
        for (run, experience) in group.iter().enumerate() {
            experience.validate().unwrap();
            assert_eq!(experience.eid.task, t as u64);
            assert_eq!(experience.eid.run, run as u64);
            assert!(experience.response_length() >= 1 && experience.response_length() <= 6);
            assert_eq!(experience.logprobs.len(), experience.response_length());
            assert!(experience.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
            assert!(experience.metrics.contains_key("accuracy"), "reward components become metrics");
            assert_eq!(experience.model_version, 0);
        }
        // The group shares its prompt.
        assert!(group.iter().all(|e| e.tokens[..e.prompt_length] == group[0].tokens[..group[0].prompt_length]));
    }
}

#[tokio::test]
async fn failing_tasks_are_counted_and_do_not_stop_the_batch() {
    let model = rollout_model();
    let rows = vec![
        json!({"prompt": "ab", "response": "1"}),
        json!({"question": "no prompt field", "response": "1"}),
        json!({"prompt": "cd", "numbers": [1, 2], "target": 3}),
    ];
    let mut batch = tasks(rows, "simple_workflow");
    batch[2].workflow = Some("countdown".into());
    let report = run_tasks(Arc::clone(&model), batch, &options("simple_workflow")).await;
    assert_eq!(report.groups.len(), 2, "the first and the countdown task succeed: {:?}", report.failures);
    assert_eq!(report.failures.len(), 1);
    assert!(report.failures[0].task.ends_with("#1"), "{:?}", report.failures);
    assert!(report.failures[0].error.to_string().contains("no prompt field `prompt`"), "{}", report.failures[0].error);
    // The failure carries what a run records of it: the workflow, the attempts, the row itself.
    let failure = &report.failures[0];
    assert_eq!((failure.workflow.as_str(), failure.attempts, failure.source.index), ("simple_workflow", 1, 1));
    assert_eq!(failure.source.raw["question"], "no prompt field");
    assert_eq!(report.retries, 0, "a row without a prompt fails the same way every time: no retry");
    assert!(report.groups[1].iter().all(|e| e.metrics.contains_key("score")), "countdown_reward scored it");
}

#[tokio::test]
async fn unknown_workflows_and_timeouts_are_named_failures() {
    let model = rollout_model();
    let rows = vec![json!({"prompt": "ab", "response": "1"})];
    let report = run_tasks(Arc::clone(&model), tasks(rows.clone(), "no_such_workflow"), &options("x")).await;
    assert!(
        matches!(&report.failures[0].error, ExplorerError::UnknownWorkflow { workflow, .. } if workflow == "no_such_workflow")
    );
    let mut quick = options("stalling_workflow");
    quick.timeout = Duration::from_millis(50);
    quick.max_retries = 1;
    let report = run_tasks(Arc::clone(&model), tasks(rows.clone(), "stalling_workflow"), &quick).await;
    assert!(matches!(report.failures[0].error, ExplorerError::Timeout { .. }), "{:?}", report.failures);
    assert_eq!(report.retries, 1, "a timeout may be transient, so it is retried");
    assert_eq!(report.failures[0].attempts, 2);
    // A workflow that panics costs its task, which is reported like any failure; the other task still runs.
    let mut batch = tasks(vec![rows[0].clone(), rows[0].clone()], "simple_workflow");
    batch[0].workflow = Some("panicking_workflow".into());
    let report = run_tasks(model, batch, &options("x")).await;
    assert_eq!(report.groups.len(), 1, "{:?}", report.failures);
    assert_eq!(report.failures.len(), 1);
    let failure = &report.failures[0];
    assert_eq!((failure.task.as_str(), failure.workflow.as_str()), ("toy#0", "panicking_workflow"));
    assert!(failure.error.to_string().contains("panicked"), "{}", failure.error);
}

/// The tiny model with room for the long prompts of Trinity's game and tool workflows (its tokenizer knows few
/// characters, so their prompts shrink to what it knows; the workflows' mechanics are what is tested here).
fn roomy_model() -> Arc<RolloutModel> {
    let loaded = trinity_model::load_model(&tiny_model_dir(), tch::Kind::Float, tch::Device::Cpu).unwrap();
    let config = EngineConfig { max_model_len: 4096, max_num_seqs: 8, ..EngineConfig::default() };
    Arc::new(RolloutModel::start(loaded, config).unwrap())
}

fn one_task(row: serde_json::Value, workflow: &str, workflow_args: serde_json::Value, repeat: u32) -> Vec<Task> {
    let mut batch = tasks(vec![row], workflow);
    for task in &mut batch {
        task.workflow_args = workflow_args.as_object().cloned().unwrap_or_default();
        task.repeat_times = repeat;
        // FrozenLake spends this over the whole conversation (Trinity's response token budget): room for a few
        // turns of observations, which this tokenizer spells out almost a token per character.
        task.rollout_args.max_tokens = Some(if workflow.contains("frozen_lake") { 1500 } else { 4 });
    }
    batch
}

#[tokio::test]
async fn frozen_lake_runs_are_whole_conversations_with_their_answers_masked() {
    let model = roomy_model();
    let args = json!({"desc": ["SF", "FG"], "agent_max_steps": 3});
    let batch = one_task(json!({"prompt": "lake"}), "frozen_lake_workflow", args, 2);
    let report = run_tasks(model, batch, &options("frozen_lake_workflow")).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let group = &report.groups[0];
    assert_eq!(group.len(), 2, "one experience per run");
    assert!(group.iter().any(|e| e.metrics["env_steps"] >= 2.0), "a random model does not find the goal at once");
    for (run, experience) in group.iter().enumerate() {
        experience.validate().unwrap();
        assert_eq!(experience.eid.run, run as u64);
        let turns = experience.metrics["env_steps"] as usize;
        assert!((1..=3).contains(&turns));
        // Answers are actions, the observations between them are context: as many masked runs as turns.
        let mask = &experience.action_mask;
        let answer_runs = mask.windows(2).filter(|w| w[0] && !w[1]).count() + usize::from(mask[mask.len() - 1]);
        assert_eq!(answer_runs, turns, "{mask:?}");
        assert!(mask[0], "the response starts with the first answer");
        assert!(experience.reward == 0.0 || experience.reward == 1.0);
        assert_eq!(experience.info["task_index"], json!({"taskset_id": 0, "index": 0}));
    }
}

#[tokio::test]
async fn step_wise_frozen_lake_records_each_turn_with_its_anchor_state() {
    let model = roomy_model();
    let args = json!({"desc": ["SF", "FG"], "agent_max_steps": 3});
    let batch = one_task(json!({"prompt": "lake"}), "step_wise_frozen_lake_workflow", args, 3);
    let report = run_tasks(model, batch, &options("step_wise_frozen_lake_workflow")).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let turns = &report.groups[0];
    let mut first_states = Vec::new();
    for run in 0..3u64 {
        let of_run: Vec<_> = turns.iter().filter(|e| e.eid.run == run).collect();
        let steps = of_run[0].metrics["env_steps"] as usize;
        assert_eq!(of_run.len(), steps, "one experience per turn of run {run}");
        for (t, experience) in of_run.iter().enumerate() {
            experience.validate().unwrap();
            assert_eq!(experience.eid.step, t as u64);
            // Only this turn's answer is trained; the earlier turns are the prompt.
            assert!(experience.action_mask.iter().all(|&m| m), "{:?}", experience.action_mask);
            assert_eq!(experience.reward, of_run[0].reward, "the episode's reward on every turn");
            let reward = experience.info["step_reward"].as_f64().unwrap();
            // The goal's reward comes on the turn that reaches it, the last one.
            assert_eq!(reward, if t + 1 == steps { experience.reward } else { 0.0 });
            assert!(experience.info["env_state_hash"].as_str().is_some_and(|h| h.len() == 16));
        }
        for pair in of_run.windows(2) {
            assert!(pair[1].prompt_length > pair[0].prompt_length, "each turn's prompt holds the one before");
        }
        first_states.push(of_run[0].info["env_state_hash"].clone());
    }
    // Every run starts on the same tile: the first turns form one anchor group.
    assert!(first_states.iter().all(|h| *h == first_states[0]), "{first_states:?}");
}

#[tokio::test]
async fn sudoku_tool_call_and_math_eval_run_on_the_engine() {
    let model = roomy_model();
    let sudoku = one_task(json!({"prompt": "s"}), "sudoku_workflow", json!({}), 2);
    let report = run_tasks(Arc::clone(&model), sudoku, &options("sudoku_workflow")).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let steps = &report.groups[0];
    // A random model's first answer is no move list: each run ends at its first step with −1.
    assert!(steps.len() >= 2);
    assert!(steps.iter().all(|e| e.validate().is_ok() && e.reward >= -1.0 && e.reward <= 1.0));
    assert_eq!(steps.iter().filter(|e| e.eid.step == 0).count(), 2, "each run starts at step 0");
    assert_eq!(steps.first().map(|e| e.eid.run), Some(0));
    assert_eq!(steps.last().map(|e| e.eid.run), Some(1), "runs in order");

    let row = json!({
        "tools": "[{\"name\": \"clock\", \"parameters\": {}}]",
        "raw_system": "sys",
        "conversations": [{"from": "human", "value": "time?"}],
        "answer": "[{\"name\": \"clock\", \"arguments\": {}}]",
    });
    let report = run_tasks(Arc::clone(&model), one_task(row, "tool_call_workflow", json!({}), 3), &options("x")).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.groups[0].len(), 3);
    assert!(report.groups[0].iter().all(|e| e.reward == 0.0 && e.metrics["accuracy"] == 0.0));

    let row = json!({"question": "ab", "response": "1"});
    let report = run_tasks(model, one_task(row, "math_eval_workflow", json!({}), 3), &options("x")).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.groups[0].len(), 1, "Trinity's eval samples once per task");
    assert!(report.groups[0][0].metrics.contains_key("accuracy"));
}

#[tokio::test]
async fn math_boxed_base_prompts_and_truncated_answers_train_nothing() {
    let model = roomy_model();
    let row = json!({"prompt": "ab", "response": "1"});
    let batch = one_task(row, "math_boxed_workflow", json!({"use_base": true, "with_think": true}), 3);
    let report = run_tasks(model, batch, &options("x")).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    for experience in &report.groups[0] {
        experience.validate().unwrap();
        // The raw-text prompt, not the chat template.
        assert!(!experience.prompt_text.as_deref().unwrap_or("").contains("<|im_start|>"));
        // with_think reaches the reward: no <think> in a random answer costs the format coefficient.
        assert_eq!(experience.metrics["format_score"], -0.1);
        if experience.truncate_status.is_some() {
            assert!(experience.action_mask.iter().all(|m| !m), "a cut answer trains no token");
        }
    }
    assert!(report.groups[0].iter().any(|e| e.truncate_status.is_some()), "four tokens cut some answer short");
}

/// On an external model the runner refuses, before they run, workflows that need the model's tokens; a chat
/// workflow's request to an endpoint that is down is retried and fails naming the URL.
#[tokio::test]
async fn an_external_model_runs_chat_workflows_only() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}/v1");
    let endpoint = ExternalModel::new(&base, "gpt-x", "sk-unit", None, Duration::from_secs(5));
    let model = Arc::new(RolloutModel::external(endpoint));
    let rows = vec![json!({"prompt": "ab", "response": "1"})];
    let report = run_tasks(Arc::clone(&model), tasks(rows.clone(), "frozen_lake_workflow"), &options("x")).await;
    let refused = &report.failures[0];
    assert_eq!(refused.attempts, 0, "refused before it runs");
    let message = refused.error.to_string();
    assert!(message.contains("`frozen_lake_workflow` cannot run on the external model") && message.contains(&base));
    let report = run_tasks(model, tasks(rows, "math_workflow"), &options("x")).await;
    let down = &report.failures[0];
    assert_eq!(down.attempts, 2, "a connection that failed is worth another attempt");
    assert!(matches!(down.error, ExplorerError::External { .. }), "{}", down.error);
    assert!(down.error.to_string().contains(&format!("{base}/chat/completions")), "{}", down.error);
}
