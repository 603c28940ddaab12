//! Hostile plugins against a real engine: each budget stops its own task with a named error, quickly, and the
//! other tasks go on.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::json;
use trinity_explorer::{RunnerOptions, Workflow, WorkflowContext, run_tasks};
use trinity_plugin::{Plugin, PluginLimits, WorkflowPlugin};

use crate::support::{capture_log, log_text, tasks, tiny_model, wasm};

fn hostile_workflow(limits: PluginLimits) -> Arc<WorkflowPlugin> {
    match trinity_plugin::load(&wasm("hostile_workflow"), limits).unwrap() {
        Plugin::Workflow(plugin) => plugin,
        other => panic!("hostile_workflow loaded as {:?}", other.info().kind),
    }
}

/// Runs the hostile workflow on one task with `behavior`; the error's text, or the experiences' count.
async fn run_workflow(plugin: &WorkflowPlugin, behavior: &str, repeat_times: u32) -> Result<usize, String> {
    let task = tasks(vec![json!({"prompt": "go", "behavior": behavior})], "hostile_workflow", repeat_times).remove(0);
    let ctx = WorkflowContext { model: tiny_model(), repeat_times, attempt: 0 };
    plugin.run(&task, &ctx).await.map(|experiences| experiences.len()).map_err(|error| error.to_string())
}

fn register_hostile_workflow() {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        let limits = PluginLimits { max_model_calls: 40, ..PluginLimits::default() };
        trinity_plugin::load_and_register(&wasm("hostile_workflow"), limits, false).unwrap();
    });
}

/// A batch holding a workflow that asks the model 10,000 times and one that returns 200,000 experiences for one
/// turn: each fails its own task with a named error, and the well-behaved tasks of the same batch are kept.
#[tokio::test]
async fn hostile_workflows_cost_only_their_own_tasks() {
    register_hostile_workflow();
    let options = RunnerOptions {
        concurrency: 8,
        timeout: Duration::from_secs(300),
        max_retries: 0,
        default_workflow: "hostile_workflow".into(),
    };
    let rows = ["chatty", "ok", "flood", "ok"].map(|b| json!({"prompt": "go", "behavior": b})).to_vec();
    let report = run_tasks(tiny_model(), tasks(rows, "hostile_workflow", 2), &options).await;
    assert_eq!(report.groups.len(), 2, "the two well-behaved tasks are kept: {:?}", report.failures);
    assert!(report.groups.iter().all(|group| group.len() == 2));
    let errors: Vec<(String, String)> = report.failures.iter().map(|f| (f.task.clone(), f.error.to_string())).collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    let error_of = |index: &str| {
        errors.iter().find(|(task, _)| task.ends_with(index)).map(|(_, error)| error.clone()).unwrap_or_default()
    };
    let (chatty, flood) = (error_of("#0"), error_of("#2"));
    assert!(chatty.contains("hostile_workflow") && chatty.contains("model budget"), "{chatty}");
    assert!(chatty.contains("request 41") && chatty.contains("max_model_calls"), "{chatty}");
    assert!(flood.contains("returned 200000 experiences") && flood.contains("at most 2"), "{flood}");
}

#[tokio::test]
async fn the_token_budget_stops_a_workflow_too() {
    let plugin = hostile_workflow(PluginLimits { max_model_tokens: 20, ..PluginLimits::default() });
    assert_eq!(run_workflow(&plugin, "ok", 2).await, Ok(2));
    let error = run_workflow(&plugin, "chatty", 1).await.unwrap_err();
    assert!(error.contains("hostile_workflow") && error.contains("max_model_tokens"), "{error}");
}

#[tokio::test]
async fn a_workflow_flooding_stderr_is_capped_and_attributed() {
    capture_log();
    let plugin = hostile_workflow(PluginLimits::default());
    assert_eq!(run_workflow(&plugin, "print", 1).await, Ok(1));
    let log = log_text();
    let lines: Vec<&str> = log.lines().filter(|line| line.contains("plugin hostile_workflow stderr")).collect();
    assert!(lines.iter().any(|line| line.contains("bytes of stderr dropped")), "no marker in the log");
    let logged: usize = lines.iter().map(|line| line.len()).sum();
    assert!(logged < 1 << 20, "{logged} bytes of plugin output reached the log");
}

fn register_hostile_reward() {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        let limits = PluginLimits { call_timeout: LOOP_DEADLINE, ..PluginLimits::default() };
        trinity_plugin::load_and_register(&wasm("hostile_reward"), limits, false).unwrap();
    });
}

/// How long the looping reward runs before its deadline stops it.
const LOOP_DEADLINE: Duration = Duration::from_secs(5);

/// A reward that loops until its deadline while other tasks of the run score with the same plugin: the others
/// finish long before the looping call ends (they would wait for it if reward calls ran on the async runtime
/// or on one worker).
#[tokio::test]
async fn a_looping_reward_stalls_only_its_own_task() {
    register_hostile_reward();
    let model = tiny_model();
    let options = RunnerOptions {
        concurrency: 8,
        timeout: Duration::from_secs(60),
        max_retries: 0,
        default_workflow: "simple_workflow".into(),
    };
    let batch = |behavior: &str, n: usize| {
        let rows = (0..n).map(|i| json!({"prompt": format!("a{i}"), "response": "1", "behavior": behavior})).collect();
        let mut batch = tasks(rows, "simple_workflow", 2);
        for task in &mut batch {
            task.reward_fn = Some("hostile_reward".into());
        }
        batch
    };
    let started = Instant::now();
    let looping = async {
        let report = run_tasks(Arc::clone(&model), batch("loop", 1), &options).await;
        (report, started.elapsed())
    };
    let others = async {
        // Start once the looping task is inside its reward call.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let report = run_tasks(Arc::clone(&model), batch("ok", 4), &options).await;
        (report, started.elapsed())
    };
    let ((stuck, stuck_time), (fine, fine_time)) = tokio::join!(looping, others);
    assert_eq!(stuck.failures.len(), 1);
    let error = stuck.failures[0].error.to_string();
    assert!(error.contains("hostile_reward") && error.contains("deadline"), "{error}");
    assert!(stuck_time >= LOOP_DEADLINE, "the loop ended early: {stuck_time:?}");
    assert!(fine.failures.is_empty(), "{:?}", fine.failures);
    assert_eq!(fine.groups.len(), 4);
    assert!(fine_time < stuck_time, "the other tasks waited for the looping reward: {fine_time:?} ≥ {stuck_time:?}");
}
